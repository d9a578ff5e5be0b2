//! Running a [`Plan`] on the GPU: fresh random input, poisoned output and
//! device buffers, the plan's streams made as it asks (kind, priority), its
//! loop issued through a [`Pipeline`], and every output element checked
//! against what the model says it must hold (the CPU reference of the
//! kernel, the input, or still poison). Also what the model needs measured:
//! each operation alone, and the machine (copy engines, the bidirectional
//! ceiling, how long a CPU thread takes to resume after GPU work).

use super::nccl::{Communicators, Nccl};
use super::{ComputeKernel, Dataset, DeviceBuffer, Event, Gpu, GpuIssuer, Graph, HostBuffer, PinnedBuffer, Pipeline, PipelineRun, Stream, TimelineSource};
use crate::error::{LabError, Result};
use crate::gpu::kernels::compute_reference;
use crate::measure::pattern;
use crate::measure::stats::Summary;
use crate::pipeline::model::{ModelPipeline, Provenance};
use crate::pipeline::plan::{device_name, stage_streams, Costs, Plan, Refs, StreamSpec, WaitBy, INPUT, OUTPUT};
use crate::pipeline::schedule::{Machine, OpKind, StreamKind};
use crate::present::units::Bytes;
use std::collections::HashMap;

/// How many of one op [`PlanRig::alone`] issues back to back to time one.
pub const BACK_TO_BACK: usize = 8;

/// Chunks of the loop [`PlanRig::machine`] times the CPU's issuing on (3
/// GPU ops and 4 event calls each; 192 ops stay behind one gate).
pub const ISSUE_CHUNKS: usize = 64;

/// A plan captured as a CUDA graph on a rig's buffers ([`PlanRig::capture`]).
#[derive(Debug)]
pub struct CapturedPlan {
    rig: u64,
    index: usize,
    /// Host time to record the loop into a graph, and to make it executable, ms.
    pub capture_ms: f64,
    pub instantiate_ms: f64,
    /// The graph's nodes.
    pub nodes: usize,
    expected: Vec<Provenance>,
}

/// One launch of a captured plan ([`PlanRig::replay`]), ms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Replay {
    /// From the launch call to the graph's last op's end (CUDA events).
    pub total_ms: f64,
    /// How long the cuGraphLaunch call held the CPU.
    pub launch_ms: f64,
}

/// `count` ops of `kind` over `n` elements back to back on one stream (a
/// copy between GPUs: from buffer 0 on its source GPU to buffer 1 on its
/// destination, on a stream of the source).
fn alone_plan(kind: OpKind, n: usize, count: usize) -> Plan {
    if let OpKind::AllReduce(ranks) = kind {
        // One stream and one buffer on each of the first `ranks` GPUs.
        let ranks = ranks.max(1) as usize;
        let streams = (0..ranks).map(|g| StreamSpec::new("alone", StreamKind::NonBlocking, 0).on_gpu(g)).collect();
        return Plan::new(&format!("all-reduce of {n} elements over {ranks} GPUs alone"), streams, n.max(2), ranks, move |p, r| {
            let pairs: Vec<_> = r.streams.iter().copied().zip(r.devices.iter().copied()).collect();
            (0..count).try_for_each(|_| p.all_reduce(&pairs, 0, n, "alone"))
        })
        .placed((0..ranks).collect());
    }
    let (from, to) = match kind {
        OpKind::D2d(link) => (link.from as usize, link.to as usize),
        _ => (0, 0),
    };
    let stream = StreamSpec::new("alone", StreamKind::NonBlocking, 0).on_gpu(from);
    Plan::new(&format!("{} of {n} elements alone", kind.label()), vec![stream], n.max(2), 2, move |p, r| {
        let s = r.streams[0];
        for _ in 0..count {
            match kind {
                OpKind::H2d => p.h2d(s, r.devices[0], 0, r.input, 0, n, "alone"),
                OpKind::Kernel => p.compute(s, r.devices[0], 0, r.devices[1], 0, n, "alone"),
                OpKind::D2h => p.d2h(s, r.output, 0, r.devices[1], 0, n, "alone"),
                OpKind::D2d(_) => p.d2d(s, r.devices[1], 0, r.devices[0], 0, n, "alone"),
                other => Err(LabError::config(format!("{} cannot be timed alone", other.label()))),
            }?;
        }
        Ok(())
    })
    .placed(vec![from, to])
}

/// Each distinct op of `plans`, once.
fn distinct_ops(plans: &[&Plan]) -> Result<Vec<(OpKind, usize)>> {
    let mut ops: Vec<(OpKind, usize)> = Vec::new();
    for p in plans {
        ops.extend(p.distinct_ops()?);
    }
    ops.sort();
    ops.dedup();
    Ok(ops)
}

/// The rig's streams for `plan`, in its order: the n-th stream of a kind
/// and priority is the n-th the rig made of them ([`PlanRig::make_streams`]).
fn streams_of<'x>(made: &'x HashMap<StreamKey, Vec<Stream>>, plan: &Plan) -> Vec<&'x Stream> {
    let mut used: HashMap<StreamKey, usize> = HashMap::new();
    plan.streams
        .iter()
        .map(|s| {
            let n = used.entry((s.gpu, s.kind, s.priority)).or_default();
            *n += 1;
            &made[&(s.gpu, s.kind, s.priority)][*n - 1]
        })
        .collect()
}

/// A plan stream's GPU (of the rig's), kind and priority.
type StreamKey = (usize, StreamKind, i32);

/// Issues `plan`'s loop into `p` on the rig's buffers (`hosts`: input,
/// output): its streams, buffers and loop; the host time the loop took, ms.
fn issue<'x>(
    p: &mut Pipeline<'x>,
    plan: &Plan,
    streams: &[&'x Stream],
    hosts: (&'x mut PinnedBuffer, &'x mut PinnedBuffer),
    devices: &'x [Vec<DeviceBuffer>],
    kernel: &'x ComputeKernel,
    iterations: i32,
    dataset: &'x [u64],
) -> Result<f64> {
    let stream_refs = streams.iter().zip(&plan.streams).map(|(s, spec)| p.stream(s, &spec.name)).collect();
    let input = p.host(hosts.0, INPUT);
    let output = p.host(hosts.1, OUTPUT);
    let devices = (0..plan.devices).map(|i| p.device(&devices[plan.device_gpu(i)][i], &device_name(i))).collect();
    let refs = Refs { streams: stream_refs, input, output, devices, elements: plan.elements };
    p.start_clock()?;
    let dataset = (plan.batch_elements > 0).then_some(Dataset { words: dataset, batch_elements: plan.batch_elements });
    let mut issuer = GpuIssuer { pipeline: p, kernel, iterations, dataset };
    let issuing = std::time::Instant::now();
    (plan.body)(&mut issuer, &refs)?;
    Ok(issuing.elapsed().as_secs_f64() * 1e3)
}

/// Buffers, kernel and settings that plans run on, made once.
pub struct PlanRig {
    /// Graphs captured on this rig's buffers (dropped first: they name them).
    graphs: Vec<Graph>,
    /// Tells this rig's captured plans from another's.
    id: u64,
    /// Where graphs are launched, and the events around each launch.
    launch: Stream,
    launched: (Event, Event),
    /// The GPU it runs plans from (a plan's GPU 0).
    gpu: Gpu,
    /// Every GPU a plan may use, by the plan's numbers (`gpus[0]` is `gpu`).
    gpus: Vec<Gpu>,
    /// Loaded on every GPU of the rig.
    kernel: ComputeKernel,
    /// The kernel's work per element (a chain of dependent FMAs).
    pub iterations: i32,
    elements: usize,
    host_in: PinnedBuffer,
    host_out: PinnedBuffer,
    /// What a plan's producer copies from (ordinary memory, the same data
    /// as `host in`; made for the first plan that has a producer).
    dataset: Vec<u64>,
    /// Per GPU of the rig, the device buffers a plan's buffers placed
    /// there use (buffer i of the plan is buffer i of its GPU's).
    devices: Vec<Vec<DeviceBuffer>>,
    /// Per GPU, the stream that poisons its buffers before each run.
    setup: Vec<Stream>,
    /// NCCL's communicators, one per GPU of the rig, for plans that
    /// all-reduce ([`Self::with_nccl`]).
    nccl: Option<Communicators>,
    /// The plans' streams by (GPU, kind, priority), made once and used by
    /// every run (each run ends synchronized): the first work on a new
    /// stream pays the driver's set-up, which a program pays once, not per loop.
    streams: HashMap<StreamKey, Vec<Stream>>,
}

/// What the model needs to know of the machine, as measured.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MachineFacts {
    pub copy_engines: u32,
    /// H2D and D2H of the same size, each alone (lower quartiles) and both
    /// at once (the fastest run), ms.
    pub h2d_ms: f64,
    pub d2h_ms: f64,
    pub both_ms: f64,
    /// From GPU work's end to the next op a CPU thread issues after waiting
    /// for it (cuEventSynchronize, then a launch), ms.
    pub wake_ms: f64,
    /// A kernel of a quarter of the machine's size alone, and
    /// [`BACK_TO_BACK`] of them alternating over two streams in all (ms).
    pub kernel_ms: f64,
    pub kernels_alternating_ms: f64,
    /// The host time to issue one GPU op of a loop ordered by events
    /// (its share of the events' record and wait calls included), ms.
    pub issue_ms: f64,
}

impl MachineFacts {
    /// The queue model's machine.
    pub fn machine(&self) -> Machine {
        Machine {
            host_wake: self.wake_ms.max(0.0),
            issue: self.issue_ms.max(0.0),
            ..Machine::copies_measured(self.copy_engines, self.h2d_ms, self.d2h_ms, self.both_ms)
        }
        .with_kernel_overlap(self.kernel_ms, BACK_TO_BACK, self.kernels_alternating_ms)
    }
}

impl PlanRig {
    /// Buffers for plans of up to `elements` f32 and `devices` device buffers.
    pub fn new(gpu: &Gpu, elements: usize, devices: usize, iterations: i32) -> Result<PlanRig> {
        Self::over(std::slice::from_ref(gpu), elements, devices, iterations)
    }

    /// [`Self::new`] for plans over several GPUs: a plan's GPU g is
    /// `gpus[g]`, and each GPU holds `devices` buffers. Peer access is
    /// enabled between every pair that has it (a pair without it copies
    /// through host memory).
    pub fn over(gpus: &[Gpu], elements: usize, devices: usize, iterations: i32) -> Result<PlanRig> {
        let Some(gpu) = gpus.first() else { return Err(LabError::config("a rig needs a GPU")) };
        if elements < 2 || elements % 2 != 0 {
            return Err(LabError::config(format!("{elements} elements: give an even number, at least 2")));
        }
        let bytes = elements.checked_mul(4).ok_or_else(|| LabError::config(format!("{elements} elements is more than memory holds")))?;
        let mut buffers = Vec::with_capacity(gpus.len());
        for g in gpus {
            g.ensure_free((bytes * devices.max(1)) as u64, &format!("{devices} device buffers of {}", Bytes(bytes as u64)))?;
            buffers.push((0..devices.max(1)).map(|_| g.alloc(bytes)).collect::<Result<Vec<_>>>()?);
        }
        for a in gpus {
            for b in gpus {
                if a.ordinal() != b.ordinal() && a.can_access_peer(b)? {
                    a.enable_peer_access(b)?;
                }
            }
        }
        gpu.bind()?;
        static RIGS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Ok(PlanRig {
            graphs: Vec::new(),
            id: RIGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            launch: gpu.stream()?,
            launched: (gpu.timing_event()?, gpu.timing_event()?),
            gpu: gpu.clone(),
            gpus: gpus.to_vec(),
            kernel: ComputeKernel::load_on(gpus)?,
            iterations,
            elements,
            host_in: PinnedBuffer::new(gpu, bytes)?,
            host_out: PinnedBuffer::new(gpu, bytes)?,
            dataset: Vec::new(),
            devices: buffers,
            setup: gpus.iter().map(|g| g.stream()).collect::<Result<_>>()?,
            nccl: None,
            streams: HashMap::new(),
        })
    }

    /// This rig with NCCL's communicators over all its GPUs, so its plans
    /// may all-reduce. NCCL is loaded wherever it is (`gpu::nccl`); a
    /// first all-reduce runs here, so that the connections NCCL makes at
    /// its first call are made outside any timed run.
    pub fn with_nccl(mut self) -> Result<PlanRig> {
        let comms = Communicators::new(Nccl::load()?, &self.gpus)?;
        let bufs: Vec<&DeviceBuffer> = self.devices.iter().map(|d| &d[0]).collect();
        comms.all_reduce_sum(&bufs, 2, &self.setup.iter().collect::<Vec<_>>())?;
        for s in &self.setup {
            s.synchronize()?;
        }
        self.gpu.bind()?;
        self.nccl = Some(comms);
        Ok(self)
    }

    /// The GPUs of the rig, by the plans' numbers.
    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    /// Runs `plan` once on fresh data and verifies every output element
    /// the model says it writes; `source` times its timeline.
    pub fn run(&mut self, plan: &Plan, source: TimelineSource) -> Result<PipelineRun> {
        self.run_modelled(plan, &plan.model()?, source)
    }

    /// [`Self::run`] with the plan's model made once (it holds a cell per
    /// element of every buffer: for repeated runs of a big plan).
    pub fn run_modelled(&mut self, plan: &Plan, model: &ModelPipeline, source: TimelineSource) -> Result<PipelineRun> {
        self.fits(plan)?;
        let expected = Plan::output_cells(model);
        let seed = self.fresh_data(plan)?;
        self.make_streams(plan)?;
        let streams = streams_of(&self.streams, plan);
        let run = {
            let mut p = self.gpu.pipeline_timed(source, model.schedule.ops.len(), plan.gated)?;
            if let Some(c) = &self.nccl {
                p.use_communicators(c);
            }
            let issue_ms = issue(&mut p, plan, &streams, (&mut self.host_in, &mut self.host_out), &self.devices, &self.kernel, self.iterations, &self.dataset)?;
            PipelineRun { issue_ms, ..p.finish()? }
        };
        if let Some(r) = run.races.first() {
            return Err(LabError::schedule(format!("{}: {}", plan.name, r.what)));
        }
        self.verify(&plan.name, expected, seed)?;
        Ok(run)
    }

    /// Captures `plan`'s loop as a CUDA graph on this rig's buffers (it runs
    /// nothing); [`Self::replay`] launches it. `model` is the plan's.
    pub fn capture(&mut self, plan: &Plan, model: &ModelPipeline) -> Result<CapturedPlan> {
        self.fits(plan)?;
        self.make_streams(plan)?;
        let streams = streams_of(&self.streams, plan);
        let started = std::time::Instant::now();
        let (graph, run) = {
            let mut p = self.gpu.capture_pipeline()?;
            issue(&mut p, plan, &streams, (&mut self.host_in, &mut self.host_out), &self.devices, &self.kernel, self.iterations, &self.dataset)?;
            p.finish_capture()?
        };
        let made_ms = started.elapsed().as_secs_f64() * 1e3;
        if let Some(r) = run.races.first() {
            return Err(LabError::schedule(format!("{}: {}", plan.name, r.what)));
        }
        let captured = CapturedPlan {
            rig: self.id,
            index: self.graphs.len(),
            capture_ms: made_ms - graph.instantiate_ms(),
            instantiate_ms: graph.instantiate_ms(),
            nodes: graph.nodes(),
            expected: Plan::output_cells(model).to_vec(),
        };
        self.graphs.push(graph);
        Ok(captured)
    }

    /// Launches a captured plan once on fresh data and verifies its output:
    /// its time from the launch call to its last op's end (CUDA events).
    pub fn replay(&mut self, plan: &Plan, c: &CapturedPlan) -> Result<Replay> {
        if c.rig != self.id || c.index >= self.graphs.len() {
            return Err(LabError::config(format!("{}: replayed on another rig than the one that captured it", plan.name)));
        }
        let seed = self.fresh_data(plan)?;
        let (start, end) = &self.launched;
        start.record(&self.launch)?;
        let called = std::time::Instant::now();
        // SAFETY: the graph touches only this rig's buffers, which live as
        // long as the rig; nothing else uses them before the synchronize below.
        unsafe { self.graphs[c.index].launch(&self.launch) }?;
        let launch_ms = called.elapsed().as_secs_f64() * 1e3;
        // Launched: wait for it whatever fails, so no buffer is touched
        // again while the graph may still use it.
        let recorded = end.record(&self.launch);
        self.launch.synchronize()?;
        recorded?;
        let total_ms = start.elapsed_ms(end)?;
        self.verify(&plan.name, &c.expected, seed)?;
        Ok(Replay { total_ms, launch_ms })
    }

    /// Refuses a plan bigger than the rig.
    fn fits(&self, plan: &Plan) -> Result<()> {
        plan.validate()?;
        if plan.elements > self.elements || plan.devices > self.devices[0].len() {
            return Err(LabError::config(format!(
                "{}: {} elements and {} device buffers do not fit the rig's {} and {}",
                plan.name,
                plan.elements,
                plan.devices,
                self.elements,
                self.devices[0].len()
            )));
        }
        if plan.gpus().iter().any(|&g| g >= self.gpus.len()) {
            return Err(LabError::config(format!(
                "{}: its streams and buffers use GPUs {:?} of the plan, and this rig holds {} (GPU {})",
                plan.name,
                plan.gpus(),
                self.gpus.len(),
                self.gpus.iter().map(|g| g.ordinal().to_string()).collect::<Vec<_>>().join(", GPU ")
            )));
        }
        Ok(())
    }

    /// Fresh random input, poisoned output and device buffers; the seed.
    fn fresh_data(&mut self, plan: &Plan) -> Result<u64> {
        let seed = pattern::fresh_seed();
        let words = plan.elements / 2;
        pattern::fill_f32(&mut self.host_in.words_mut()[..words], seed);
        if plan.batch_elements > 0 {
            self.dataset.resize(self.elements / 2, 0);
            pattern::fill_f32(&mut self.dataset[..words], seed);
        }
        pattern::poison(&mut self.host_out.words_mut()[..words]);
        for i in 0..plan.devices {
            let g = plan.device_gpu(i);
            self.setup[g].fill_u32(&self.devices[g][i], pattern::POISON as u32)?;
        }
        Ok(seed)
    }

    /// Makes the streams `plan` asks for (kind, priority) that the rig
    /// does not have yet.
    fn make_streams(&mut self, plan: &Plan) -> Result<()> {
        let mut wanted: HashMap<StreamKey, usize> = HashMap::new();
        for s in &plan.streams {
            *wanted.entry((s.gpu, s.kind, s.priority)).or_default() += 1;
        }
        for (key, n) in wanted {
            let have = self.streams.entry(key).or_default();
            while have.len() < n {
                have.push(self.gpus[key.0].stream_of(key.1, key.2)?);
            }
        }
        self.gpu.bind()?;
        Ok(())
    }

    /// Checks `host out` against `expected`: inputs and untouched poison in
    /// full, kernel outputs at the first and last element of every run of
    /// them and about 4096 places between (the CPU reference costs the
    /// kernel's whole FMA chain per element).
    fn verify(&self, plan: &str, expected: &[Provenance], seed: u64) -> Result<()> {
        let got = pattern::as_f32(self.host_out.words());
        let poison = f32::from_bits(pattern::POISON as u32);
        let step = (expected.len() / 4096).max(1);
        // Whether `b` carries on the run `a` is in (the next element of the same source).
        let continues = |a: Provenance, b: Provenance| match (a, b) {
            (Provenance::Output(x), Provenance::Output(y)) | (Provenance::Input(x), Provenance::Input(y)) => y == x.wrapping_add(1),
            (Provenance::Repeated(x, k), Provenance::Repeated(y, k2)) => k == k2 && y == x.wrapping_add(1),
            (Provenance::Summed { first: x, stride, ranks, passes }, Provenance::Summed { first: y, stride: s2, ranks: r2, passes: p2 }) => {
                (stride, ranks, passes) == (s2, r2, p2) && y == x.wrapping_add(1)
            }
            (Provenance::Unset, Provenance::Unset) => true,
            _ => false,
        };
        for (i, want) in expected.iter().enumerate() {
            // The sum of a Summed element's terms' sizes (how far a rounding can move it).
            let mut scale = 0.0f32;
            let edge = i == 0 || i + 1 == expected.len() || !continues(expected[i - 1], *want) || !continues(*want, expected[i + 1]) || i % step == 0;
            let value = match *want {
                Provenance::Unset => poison,
                Provenance::Input(j) => pattern::f32_at(seed, j as usize),
                Provenance::Output(j) if edge => compute_reference(pattern::f32_at(seed, j as usize), self.iterations),
                Provenance::Repeated(j, k) if edge => (0..k).fold(pattern::f32_at(seed, j as usize), |x, _| compute_reference(x, self.iterations)),
                Provenance::Summed { first, stride, ranks, passes } if edge => {
                    let pass = |j: u32| (0..passes).fold(pattern::f32_at(seed, j as usize), |x, _| compute_reference(x, self.iterations));
                    let terms: Vec<f32> = (0..ranks as u32).map(|r| pass(first + r * stride)).collect();
                    scale = terms.iter().map(|t| t.abs()).sum();
                    terms.into_iter().reduce(|sum, x| sum + x).unwrap_or(0.0)
                }
                Provenance::Output(_) | Provenance::Repeated(..) | Provenance::Summed { .. } => continue,
                Provenance::Garbage => {
                    return Err(LabError::schedule(format!(
                        "{plan}: host out element {i} comes from a kernel run on data that was never uploaded, or from a sum of elements no input holds"
                    )))
                }
            };
            // Two ranks' sum is the same whichever adds first; more ranks
            // are summed in an order NCCL chooses (a rounding apart).
            let close = match *want {
                Provenance::Summed { ranks, .. } if ranks > 2 => (got[i] - value).abs() <= 2.0 * f32::EPSILON * ranks as f32 * scale,
                _ => false,
            };
            if got[i].to_bits() != value.to_bits() && !close {
                let what = if got[i].to_bits() == poison.to_bits() { " (never written: still poison)".to_string() } else { String::new() };
                return Err(LabError::wrong_data(format!("{plan}: host out"), i, format!("got {}{what}, expected {value} ({want:?})", got[i])));
            }
        }
        Ok(())
    }

    /// One op of `kind` over `n` elements alone on one stream, ms (median
    /// of `reps` after a warm-up run): [`BACK_TO_BACK`] of them issued back
    /// to back, their span between CUDA events divided by their count. Not
    /// one op's span, nor the pipeline's total: a lone op pays a launch and
    /// a tail that ops back to back hide (measured: 32 chunk copies timed
    /// by their totals summed to 14% more than the pipeline of them took;
    /// timed by their own spans, still 5% more).
    ///
    /// An op over several GPUs (an all-reduce, a copy between GPUs) has no
    /// per-op events to compare across GPUs: it is timed by difference
    /// instead ([`Self::per_repeat_ms`]).
    pub fn alone(&mut self, kind: OpKind, n: usize, reps: usize) -> Result<Summary> {
        let one = alone_plan(kind, n, BACK_TO_BACK);
        if one.gpus().len() > 1 {
            return self.per_repeat_ms(|k| alone_plan(kind, n, k), BACK_TO_BACK, reps);
        }
        self.span_ms(&one, reps).map(|s| s.scaled(1.0 / BACK_TO_BACK as f64))
    }

    /// One repeat's time, ms, by difference: the run of `make(copies)`
    /// minus the run of `make(1)`, over `copies`−1 (each run bracketed by
    /// CUDA events, every output verified), `runs` times after one untimed
    /// run of each. What the plan does besides the repeats (an upload
    /// before, a download after) cancels out, and no per-op timeline is
    /// needed. A pair whose difference is at or below zero measured the
    /// runs' noise, not the repeats (seen on an H100: one pair of 7, copies
    /// of 16 MiB within the GPU, 8 µs each): it is taken again, up to
    /// `runs` more pairs, then the calibration error.
    pub fn per_repeat_ms(&mut self, make: impl Fn(usize) -> Plan, copies: usize, runs: usize) -> Result<Summary> {
        if copies < 2 || runs == 0 {
            return Err(LabError::config(format!("timing a repeat by difference takes at least 2 repeats and 1 run (got {copies} and {runs})")));
        }
        let (one, many) = (make(1), make(copies));
        let (one_model, many_model) = (one.model()?, many.model()?);
        let mut run = |p: &Plan, m| self.run_modelled(p, m, TimelineSource::Off).map(|r| r.total_ms);
        run(&one, &one_model)?;
        run(&many, &many_model)?;
        let mut per_copy = Vec::with_capacity(runs);
        let mut pairs = 0;
        while per_copy.len() < runs {
            if pairs == 2 * runs {
                return Err(LabError::calibration(
                    format!("{}: {copies} repeats did not take measurably longer than one in {pairs} pairs of runs", many.name),
                    "Something else sets the run's time: give a larger size, or more copies",
                ));
            }
            pairs += 1;
            let a = run(&one, &one_model)?;
            let b = run(&many, &many_model)?;
            let ms = (b - a) / (copies - 1) as f64;
            if ms > 0.0 {
                per_copy.push(ms);
            }
        }
        Summary::of(&per_copy)
    }

    /// From the first op's start to the last op's end between CUDA events,
    /// ms (median of `reps` after a warm-up run).
    fn span_ms(&mut self, plan: &Plan, reps: usize) -> Result<Summary> {
        let model = plan.model()?;
        let ops = model.schedule.ops.len();
        self.run_modelled(plan, &model, TimelineSource::Off)?;
        Summary::of_runs(reps, || {
            let t = self.run_modelled(plan, &model, TimelineSource::Events)?.timeline.ok_or_else(|| LabError::config("no timeline"))?;
            if t.spans.len() != ops {
                return Err(LabError::config(format!("{}: {ops} ops left {} spans", plan.name, t.spans.len())));
            }
            let start = t.spans.iter().map(|s| s.start_us).fold(f64::INFINITY, f64::min);
            let end = t.spans.iter().map(|s| s.end_us).fold(f64::NEG_INFINITY, f64::max);
            Ok((end - start) / 1e3)
        })
    }

    /// Every distinct op of `plans`, each alone, ms: the lower quartile of
    /// `reps` runs. This host has slow phases that last seconds (a 2 MiB
    /// H2D read 54 µs instead of 41 through every run of one op), and
    /// interference only ever slows a run: the lower quartile is the op's
    /// typical time, which a slow phase over up to three quarters of the
    /// runs leaves alone.
    pub fn costs(&mut self, plans: &[&Plan], reps: usize) -> Result<Costs> {
        Ok(self.costs_and_fastest(plans, reps)?.0)
    }

    /// [`Self::costs`], and each op's fastest run (what a bound is built from).
    pub fn costs_and_fastest(&mut self, plans: &[&Plan], reps: usize) -> Result<(Costs, Costs)> {
        let (mut typical, mut fastest) = (Costs::new(), Costs::new());
        for (kind, n) in distinct_ops(plans)? {
            let s = self.alone(kind, n, reps)?;
            typical.insert((kind, n), s.middle_range().0);
            fastest.insert((kind, n), s.min);
        }
        Ok((typical, fastest))
    }

    /// The machine as the model needs it: copy engines, an H2D and a D2H of
    /// `n` elements alone and at once, and the wake-up of a CPU thread that
    /// waited for a kernel (medians of `reps`).
    pub fn machine(&mut self, n: usize, reps: usize) -> Result<MachineFacts> {
        let copy_engines = self.gpu.copy_engines()?;
        // Lower quartiles, as for every op alone (see `costs`).
        let h2d_ms = self.alone(OpKind::H2d, n, reps)?.middle_range().0;
        let d2h_ms = self.alone(OpKind::D2h, n, reps)?.middle_range().0;
        let two = vec![StreamSpec::new("up", StreamKind::NonBlocking, 0), StreamSpec::new("down", StreamKind::NonBlocking, 0)];
        // Back to back like the ops alone, and timed by the total with no
        // events between copies (an event after a copy costs its engine a
        // flush); the loop's fixed start-up is shared by all of them.
        let both = Plan::new("H2D and D2H at once", two, n.max(2), 2, move |p, r| {
            for _ in 0..BACK_TO_BACK {
                p.h2d(r.streams[0], r.devices[0], 0, r.input, 0, n, "up")?;
                p.d2h(r.streams[1], r.output, 0, r.devices[1], 0, n, "down")?;
            }
            Ok(())
        });
        let model = both.model()?;
        // The fastest run: this host has slow phases (both directions at once
        // read 1.35 to 1.66 ms for the same pair within minutes), and one
        // would set the ceiling for every run made outside it.
        let both_ms = Summary::of_runs(reps, || Ok(self.run_modelled(&both, &model, TimelineSource::Off)?.total_ms / BACK_TO_BACK as f64))?.min;
        // Kernels of a quarter of `n` alternating over two streams, all
        // issued at once, against the same kernels back to back on one.
        let k = (n / 4).max(1);
        let kernel_ms = self.alone(OpKind::Kernel, k, reps)?.middle_range().0;
        let two = vec![StreamSpec::new("a", StreamKind::NonBlocking, 0), StreamSpec::new("b", StreamKind::NonBlocking, 0)];
        let alternating = Plan::new("kernels alternating over two streams", two, (2 * k).max(2), 2, move |p, r| {
            for i in 0..BACK_TO_BACK {
                p.compute(r.streams[i % 2], r.devices[0], (i % 2) * k, r.devices[1], (i % 2) * k, k, &format!("kernel {i}"))?;
            }
            Ok(())
        });
        let kernels_alternating_ms = self.span_ms(&alternating, reps)?.middle_range().0;
        // Issuing: a loop of uploads, kernels and downloads on three streams
        // ordered by events, issued behind the gate (no waits), per GPU op.
        // Long enough for the steady pace: measured on the lent H100, a loop
        // of 8 chunks took 12 µs an op, of 256 and more 8 to 9 µs.
        let issued = stage_streams("issue a three-stream loop", n.max(2 * ISSUE_CHUNKS), ISSUE_CHUNKS, WaitBy::StreamWaitEvent);
        let model = issued.model()?;
        let ops = model.schedule.ops.len() as f64;
        self.run_modelled(&issued, &model, TimelineSource::Off)?;
        let issue_ms = Summary::of_runs(reps, || Ok(self.run_modelled(&issued, &model, TimelineSource::Off)?.issue_ms / ops))?.median;
        // A short kernel, the CPU waits for it, then issues the next: the
        // gap between the two on the timeline.
        let k = 1 << 14;
        let woken = Plan::new("a CPU thread wakes after a kernel", vec![StreamSpec::new("s", StreamKind::NonBlocking, 0)], 2 * k, 2, move |p, r| {
            let s = r.streams[0];
            p.compute(s, r.devices[0], 0, r.devices[1], 0, k, "before")?;
            let e = p.event()?;
            p.record(e, s)?;
            p.host_wait(e)?;
            p.compute(s, r.devices[0], k, r.devices[1], k, k, "after")
        });
        let wake_ms = Summary::of_runs(reps, || {
            let t = self.run(&woken, TimelineSource::Events)?.timeline.ok_or_else(|| LabError::config("no timeline"))?;
            let at = |label: &str| t.spans.iter().find(|s| s.label == label).map(|s| (s.start_us, s.end_us));
            match (at("before"), at("after")) {
                (Some(b), Some(a)) => Ok((a.0 - b.1) / 1e3),
                _ => Err(LabError::config("the wake-up plan lost a kernel")),
            }
        })?
        .median;
        Ok(MachineFacts { copy_engines, h2d_ms, d2h_ms, both_ms, wake_ms, kernel_ms, kernels_alternating_ms, issue_ms })
    }
}
