//! Running a [`Plan`] on the GPU: fresh random input, poisoned output and
//! device buffers, the plan's streams made as it asks (kind, priority), its
//! loop issued through a [`Pipeline`], and every output element checked
//! against what the model says it must hold (the CPU reference of the
//! kernel, the input, or still poison). Also what the model needs measured:
//! each operation alone, and the machine (copy engines, the bidirectional
//! ceiling, how long a CPU thread takes to resume after GPU work).

use super::{ComputeKernel, DeviceBuffer, Gpu, GpuIssuer, HostBuffer, PinnedBuffer, PipelineRun, Stream, TimelineSource};
use crate::error::{LabError, Result};
use crate::gpu::kernels::compute_reference;
use crate::measure::pattern;
use crate::measure::stats::Summary;
use crate::pipeline::model::{ModelPipeline, Provenance};
use crate::pipeline::plan::{chunk, device_name, Costs, Plan, Refs, StreamSpec, INPUT, OUTPUT};
use crate::pipeline::schedule::{Machine, OpKind, StreamKind};
use crate::present::units::Bytes;

/// How many of one op [`PlanRig::alone`] issues back to back to time one.
pub const BACK_TO_BACK: usize = 8;

/// Buffers, kernel and settings that plans run on, made once.
pub struct PlanRig {
    gpu: Gpu,
    kernel: ComputeKernel,
    /// The kernel's work per element (a chain of dependent FMAs).
    pub iterations: i32,
    elements: usize,
    host_in: PinnedBuffer,
    host_out: PinnedBuffer,
    devices: Vec<DeviceBuffer>,
    /// Poisons the device buffers before each run.
    setup: Stream,
}

/// What the model needs to know of the machine, as measured.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MachineFacts {
    pub copy_engines: u32,
    /// H2D and D2H of the same size, each alone and both at once (ms).
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
        Machine { host_wake: self.wake_ms.max(0.0), issue: self.issue_ms.max(0.0), ..Machine::copies_measured(self.copy_engines, self.h2d_ms, self.d2h_ms, self.both_ms) }.with_kernel_overlap(
            self.kernel_ms,
            BACK_TO_BACK,
            self.kernels_alternating_ms,
        )
    }
}

impl PlanRig {
    /// Buffers for plans of up to `elements` f32 and `devices` device buffers.
    pub fn new(gpu: &Gpu, elements: usize, devices: usize, iterations: i32) -> Result<PlanRig> {
        if elements < 2 || elements % 2 != 0 {
            return Err(LabError::config(format!("{elements} elements: give an even number, at least 2")));
        }
        let bytes = elements.checked_mul(4).ok_or_else(|| LabError::config(format!("{elements} elements is more than memory holds")))?;
        gpu.ensure_free((bytes * devices.max(1)) as u64, &format!("{devices} device buffers of {}", Bytes(bytes as u64)))?;
        let devices = (0..devices.max(1)).map(|_| gpu.alloc(bytes)).collect::<Result<Vec<_>>>()?;
        Ok(PlanRig {
            gpu: gpu.clone(),
            kernel: ComputeKernel::load(gpu)?,
            iterations,
            elements,
            host_in: PinnedBuffer::new(gpu, bytes)?,
            host_out: PinnedBuffer::new(gpu, bytes)?,
            devices,
            setup: gpu.stream()?,
        })
    }

    /// Runs `plan` once on fresh data and verifies every output element
    /// the model says it writes; `source` times its timeline.
    pub fn run(&mut self, plan: &Plan, source: TimelineSource) -> Result<PipelineRun> {
        self.run_modelled(plan, &plan.model()?, source)
    }

    /// [`Self::run`] with the plan's model made once (it holds a cell per
    /// element of every buffer: for repeated runs of a big plan).
    pub fn run_modelled(&mut self, plan: &Plan, model: &ModelPipeline, source: TimelineSource) -> Result<PipelineRun> {
        plan.validate()?;
        if plan.elements > self.elements || plan.devices > self.devices.len() {
            return Err(LabError::config(format!(
                "{}: {} elements and {} device buffers do not fit the rig's {} and {}",
                plan.name,
                plan.elements,
                plan.devices,
                self.elements,
                self.devices.len()
            )));
        }
        let expected = Plan::output_cells(model).to_vec();
        let seed = pattern::fresh_seed();
        let words = plan.elements / 2;
        pattern::fill_f32(&mut self.host_in.words_mut()[..words], seed);
        pattern::poison(&mut self.host_out.words_mut()[..words]);
        for d in &self.devices[..plan.devices] {
            self.setup.fill_u32(d, pattern::POISON as u32)?;
        }
        let streams = plan.streams.iter().map(|s| self.gpu.stream_of(s.kind, s.priority)).collect::<Result<Vec<_>>>()?;
        let run = {
            let mut p = self.gpu.pipeline_timed(source, model.schedule.ops.len(), true)?;
            let stream_refs = streams.iter().zip(&plan.streams).map(|(s, spec)| p.stream(s, &spec.name)).collect();
            let input = p.host(&mut self.host_in, INPUT);
            let output = p.host(&mut self.host_out, OUTPUT);
            let devices = self.devices[..plan.devices].iter().enumerate().map(|(i, d)| p.device(d, &device_name(i))).collect();
            let refs = Refs { streams: stream_refs, input, output, devices, elements: plan.elements };
            let mut issuer = GpuIssuer { pipeline: &mut p, kernel: &self.kernel, iterations: self.iterations, dataset: None };
            let issuing = std::time::Instant::now();
            (plan.body)(&mut issuer, &refs)?;
            let issue_ms = issuing.elapsed().as_secs_f64() * 1e3;
            PipelineRun { issue_ms, ..p.finish()? }
        };
        if let Some(r) = run.races.first() {
            return Err(LabError::schedule(format!("{}: {}", plan.name, r.what)));
        }
        self.verify(&plan.name, &expected, seed)?;
        Ok(run)
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
            (Provenance::Unset, Provenance::Unset) => true,
            _ => false,
        };
        for (i, want) in expected.iter().enumerate() {
            let edge = i == 0 || i + 1 == expected.len() || !continues(expected[i - 1], *want) || !continues(*want, expected[i + 1]) || i % step == 0;
            let value = match *want {
                Provenance::Unset => poison,
                Provenance::Input(j) => pattern::f32_at(seed, j as usize),
                Provenance::Output(j) if edge => compute_reference(pattern::f32_at(seed, j as usize), self.iterations),
                Provenance::Output(_) => continue,
                Provenance::Garbage => {
                    return Err(LabError::schedule(format!("{plan}: host out element {i} comes from a kernel run on data that was never uploaded")))
                }
            };
            if got[i].to_bits() != value.to_bits() {
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
    pub fn alone(&mut self, kind: OpKind, n: usize, reps: usize) -> Result<Summary> {
        let one = Plan::new(
            &format!("{} of {n} elements alone", kind.label()),
            vec![StreamSpec::new("alone", StreamKind::NonBlocking, 0)],
            n.max(2),
            2,
            move |p, r| {
                let s = r.streams[0];
                for _ in 0..BACK_TO_BACK {
                    match kind {
                        OpKind::H2d => p.h2d(s, r.devices[0], 0, r.input, 0, n, "alone"),
                        OpKind::Kernel => p.compute(s, r.devices[0], 0, r.devices[1], 0, n, "alone"),
                        OpKind::D2h => p.d2h(s, r.output, 0, r.devices[1], 0, n, "alone"),
                        other => Err(LabError::config(format!("{} cannot be timed alone", other.label()))),
                    }?;
                }
                Ok(())
            },
        );
        self.span_ms(&one, reps).map(|s| s.scaled(1.0 / BACK_TO_BACK as f64))
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

    /// Every distinct op of `plans`, each alone (medians, ms).
    pub fn costs(&mut self, plans: &[&Plan], reps: usize) -> Result<Costs> {
        let mut ops: Vec<(OpKind, usize)> = Vec::new();
        for p in plans {
            ops.extend(p.distinct_ops()?);
        }
        ops.sort();
        ops.dedup();
        let mut costs = Costs::new();
        for (kind, n) in ops {
            costs.insert((kind, n), self.alone(kind, n, reps)?.median);
        }
        Ok(costs)
    }

    /// The machine as the model needs it: copy engines, an H2D and a D2H of
    /// `n` elements alone and at once, and the wake-up of a CPU thread that
    /// waited for a kernel (medians of `reps`).
    pub fn machine(&mut self, n: usize, reps: usize) -> Result<MachineFacts> {
        let copy_engines = self.gpu.copy_engines()?;
        let h2d_ms = self.alone(OpKind::H2d, n, reps)?.median;
        let d2h_ms = self.alone(OpKind::D2h, n, reps)?.median;
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
        let both_ms = Summary::of_runs(reps, || Ok(self.run_modelled(&both, &model, TimelineSource::Off)?.total_ms / BACK_TO_BACK as f64))?.median;
        // Kernels of a quarter of `n` alternating over two streams, all
        // issued at once, against the same kernels back to back on one.
        let k = (n / 4).max(1);
        let kernel_ms = self.alone(OpKind::Kernel, k, reps)?.median;
        let two = vec![StreamSpec::new("a", StreamKind::NonBlocking, 0), StreamSpec::new("b", StreamKind::NonBlocking, 0)];
        let alternating = Plan::new("kernels alternating over two streams", two, (2 * k).max(2), 2, move |p, r| {
            for i in 0..BACK_TO_BACK {
                p.compute(r.streams[i % 2], r.devices[0], (i % 2) * k, r.devices[1], (i % 2) * k, k, &format!("kernel {i}"))?;
            }
            Ok(())
        });
        let kernels_alternating_ms = self.span_ms(&alternating, reps)?.median;
        // Issuing: a loop of uploads, kernels and downloads on three streams
        // ordered by events, issued behind the gate (no waits), per GPU op.
        let chunks = BACK_TO_BACK;
        let three = ["uploads", "kernels", "downloads"].iter().map(|name| StreamSpec::new(name, StreamKind::NonBlocking, 0)).collect();
        let issued = Plan::new("issue a three-stream loop", three, n.max(2 * chunks), 2, move |p, r| {
            let (up, k, down) = (r.streams[0], r.streams[1], r.streams[2]);
            for c in 0..chunks {
                let (at, len) = chunk(r.elements, chunks, c);
                p.h2d(up, r.devices[0], at, r.input, at, len, "H2D")?;
                let e = p.event()?;
                p.record(e, up)?;
                p.wait(k, e)?;
                p.compute(k, r.devices[0], at, r.devices[1], at, len, "kernel")?;
                let f = p.event()?;
                p.record(f, k)?;
                p.wait(down, f)?;
                p.d2h(down, r.output, at, r.devices[1], at, len, "D2H")?;
            }
            Ok(())
        });
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
