//! Running a [`Plan`] on the GPU: fresh random input, poisoned output and
//! device buffers (each made on the GPU the plan places it, the first time
//! a plan needs it there), the plan's streams made as it asks (kind, priority), its
//! loop recorded by a deferring [`Runner`] and run with nothing between its
//! driver calls, and every output element checked against what the model
//! says it must hold (`verify`). What the model needs measured (each
//! operation alone, the machine) is in `calibrate`; the same loop issued
//! with bare driver calls, which the runner's issuing is held against, in
//! [`plain`].

mod calibrate;
pub mod plain;
mod verify;

pub use calibrate::{MachineFacts, BACK_TO_BACK, ISSUE_CHUNKS};

use super::nccl::{Communicators, Nccl, NcclCtas};
use super::{ComputeKernel, Dataset, DeviceBuffer, Event, Gpu, GpuIssuer, Graph, HostBuffer, PinnedBuffer, Run, Runner, Stream, TimelineSource};
use crate::error::{LabError, Result};
use crate::measure::pattern;
use crate::pipeline::cells::Cells;
use crate::pipeline::dry_run::DryRun;
use crate::pipeline::op::StreamKind;
use crate::pipeline::plan::{Plan, Refs, INPUT, OUTPUT};
use crate::units::Bytes;
use std::collections::HashMap;

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
    /// Each checked buffer's cells in the plan's model.
    expected: Vec<Cells>,
}

/// One launch of a captured plan ([`PlanRig::replay`]), ms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Replay {
    /// From the launch call to the graph's last op's end (CUDA events).
    pub total_ms: f64,
    /// How long the cuGraphLaunch call held the CPU.
    pub launch_ms: f64,
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

/// Gives `plan`'s loop to `p` on the rig's buffers (`hosts`: input,
/// output): its streams, buffers and loop.
#[allow(clippy::too_many_arguments)]
fn issue<'x>(
    p: &mut Runner<'x>,
    plan: &Plan,
    streams: &[&'x Stream],
    hosts: (&'x mut PinnedBuffer, &'x mut PinnedBuffer, &'x mut [PinnedBuffer]),
    devices: &'x [Vec<Option<DeviceBuffer>>],
    kernel: &'x ComputeKernel,
    iterations: i32,
    dataset: &'x [u64],
) -> Result<()> {
    let stream_refs = streams.iter().zip(&plan.streams).map(|(s, spec)| p.stream(s, &spec.name)).collect();
    let input = p.host(hosts.0, INPUT);
    let output = p.host(hosts.1, OUTPUT);
    let own = hosts.2.iter_mut().zip(&plan.host_buffers).map(|(h, (name, _))| p.host(h, name)).collect();
    let devices = (0..plan.devices)
        .map(|i| {
            let (name, elements) = plan.device_buffer(i);
            p.device_part(placed(devices, plan.device_gpu(i), i)?, 4 * elements, &name)
        })
        .collect::<Result<_>>()?;
    let refs = Refs { streams: stream_refs, input, output, hosts: own, devices, elements: plan.elements };
    let dataset = (plan.batch_elements > 0).then_some(Dataset { words: dataset, batch_elements: plan.batch_elements });
    let mut issuer = GpuIssuer { runner: p, kernel, iterations, dataset };
    (plan.body)(&mut issuer, &refs)
}

/// Device buffer `i` a plan placed on GPU `g` of `devices` (a rig's,
/// [`PlanRig::ready`] made it).
fn placed(devices: &[Vec<Option<DeviceBuffer>>], g: usize, i: usize) -> Result<&DeviceBuffer> {
    devices
        .get(g)
        .and_then(|d| d.get(i))
        .and_then(Option::as_ref)
        .ok_or_else(|| LabError::config(format!("device buffer {i} on the rig's GPU {g} was never made")))
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
    /// A plan's page-locked host buffers of its own, each the size it
    /// asked for (made for the first plan that has them).
    host_buffers: Vec<PinnedBuffer>,
    /// What a plan's producer copies from (ordinary memory, the same data
    /// as `host in`; made for the first plan that has a producer).
    dataset: Vec<u64>,
    /// Per GPU of the rig, the device buffers plans placed there, by the
    /// plans' numbers (a plan's buffer i on GPU g is `devices[g][i]`):
    /// each made when a plan first places it on that GPU, of the size the
    /// plan asks (made again, larger, for a plan that asks more), so that
    /// a GPU holds only the buffers plans put on it. Lab 8's data-parallel
    /// step puts a rank's batch and gradients on its own GPU: the memory
    /// each GPU holds does not grow with the number of GPUs.
    devices: Vec<Vec<Option<DeviceBuffer>>>,
    /// The most device buffers a plan on this rig may have.
    device_slots: usize,
    /// Per GPU, the stream that poisons its buffers before each run.
    setup: Vec<Stream>,
    /// NCCL's communicators, one per GPU of the rig, for plans that
    /// all-reduce ([`Self::with_nccl`], [`Self::set_nccl_ctas`]).
    nccl: Option<Communicators>,
    /// The plans' streams by (GPU, kind, priority), made once and used by
    /// every run (each run ends synchronized): the first work on a new
    /// stream pays the driver's set-up, which a program pays once, not per loop.
    streams: HashMap<StreamKey, Vec<Stream>>,
}

impl PlanRig {
    /// Buffers for plans of up to `elements` f32 and `devices` device
    /// buffers (each made when a plan first uses it: [`Self::device_bytes`]).
    pub fn new(gpu: &Gpu, elements: usize, devices: usize, iterations: i32) -> Result<PlanRig> {
        Self::over(std::slice::from_ref(gpu), elements, devices, iterations)
    }

    /// [`Self::new`] for plans over several GPUs: a plan's GPU g is
    /// `gpus[g]`, and each GPU holds the buffers plans place on it. Peer
    /// access is enabled between every pair that has it (a pair without
    /// it copies through host memory).
    pub fn over(gpus: &[Gpu], elements: usize, devices: usize, iterations: i32) -> Result<PlanRig> {
        let Some(gpu) = gpus.first() else { return Err(LabError::config("a rig needs a GPU")) };
        if elements < 2 || elements % 2 != 0 {
            return Err(LabError::config(format!("{elements} elements: give an even number, at least 2")));
        }
        let bytes = elements.checked_mul(4).ok_or_else(|| LabError::config(format!("{elements} elements is more than memory holds")))?;
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
            host_buffers: Vec::new(),
            dataset: Vec::new(),
            devices: gpus.iter().map(|_| (0..devices.max(1)).map(|_| None).collect()).collect(),
            device_slots: devices.max(1),
            setup: gpus.iter().map(|g| g.stream()).collect::<Result<_>>()?,
            nccl: None,
            streams: HashMap::new(),
        })
    }

    /// This rig with its compute kernel's blocks laid out as `blocks` says
    /// (one resident wave unless asked: see [`super::Blocks`]).
    pub fn with_kernel_blocks(mut self, blocks: super::Blocks) -> PlanRig {
        self.kernel.blocks = blocks;
        self
    }

    /// This rig with NCCL's communicators over all its GPUs, so its plans
    /// may all-reduce, with NCCL's own choice of CTAs
    /// ([`Self::set_nccl_ctas`]).
    pub fn with_nccl(mut self) -> Result<PlanRig> {
        self.set_nccl_ctas(NcclCtas::Default)?;
        Ok(self)
    }

    /// Makes the rig's NCCL communicators over all its GPUs anew, their
    /// collectives using as many CTAs as `ctas` says: the old ones (if
    /// any) are destroyed first, so that two sets never hold the GPUs'
    /// memory at once. NCCL is loaded wherever it is (`gpu::nccl`); a
    /// first all-reduce runs here, so that the connections NCCL makes at
    /// its first call are made outside any timed run (a rig that already
    /// holds communicators of this setting keeps them). A setting out of
    /// NCCL's range is refused before anything changes; one this NCCL
    /// cannot make (a cap, before NCCL 2.17) fails after the old
    /// communicators are gone, and the rig then has none until a setting
    /// is made again.
    pub fn set_nccl_ctas(&mut self, ctas: NcclCtas) -> Result<()> {
        ctas.check()?;
        if self.nccl_ctas() == Some(ctas) {
            // Already made with this setting, and warmed up.
            return Ok(());
        }
        self.nccl = None;
        let comms = Communicators::with_ctas(Nccl::load()?, &self.gpus, ctas)?;
        // Two f32 on each GPU for the first all-reduce, freed once it is done.
        let scratch: Vec<DeviceBuffer> = self.gpus.iter().map(|g| g.alloc(8)).collect::<Result<_>>()?;
        comms.all_reduce_sum(&scratch.iter().collect::<Vec<_>>(), 2, &self.setup.iter().collect::<Vec<_>>())?;
        for s in &self.setup {
            s.synchronize()?;
        }
        drop(scratch);
        self.gpu.bind()?;
        self.nccl = Some(comms);
        Ok(())
    }

    /// The CTA setting of the rig's NCCL communicators, `None` where it
    /// has none.
    pub fn nccl_ctas(&self) -> Option<NcclCtas> {
        self.nccl.as_ref().map(Communicators::ctas)
    }

    /// The GPUs of the rig, by the plans' numbers.
    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    /// The device memory the rig holds for plans' buffers on each of its
    /// GPUs (by the plans' numbers), bytes: what the plans run so far
    /// placed there.
    pub fn device_bytes(&self) -> Vec<u64> {
        self.devices.iter().map(|d| d.iter().flatten().map(|b| b.bytes() as u64).sum()).collect()
    }

    /// Device buffer `i` of a plan placed on the rig's GPU `g`.
    fn device(&self, g: usize, i: usize) -> Result<&DeviceBuffer> {
        placed(&self.devices, g, i)
    }

    /// Runs `plan` once on fresh data and verifies every output element
    /// the model says it writes; `source` times its timeline.
    pub fn run(&mut self, plan: &Plan, source: TimelineSource) -> Result<Run> {
        self.run_modelled(plan, &plan.dry_run()?, source)
    }

    /// [`Self::run`] with the plan's model made once (it holds a cell per
    /// element of every buffer: for repeated runs of a big plan).
    pub fn run_modelled(&mut self, plan: &Plan, model: &DryRun, source: TimelineSource) -> Result<Run> {
        self.ready(plan)?;
        // The model ran the same loop: a plan that races is refused before
        // the GPU runs any of it.
        if let Some(r) = model.schedule.races().first() {
            return Err(LabError::schedule(format!("{}: {}", plan.name, r.what)));
        }
        let expected = plan.checked_cells(model);
        let seed = self.fresh_data(plan)?;
        self.make_streams(plan)?;
        let streams = streams_of(&self.streams, plan);
        let run = {
            let mut p = self.gpu.runner(source, model.schedule.ops.len(), plan.gated)?.deferring()?;
            if let Some(c) = &self.nccl {
                p.use_communicators(c);
            }
            issue(
                &mut p,
                plan,
                &streams,
                (&mut self.host_in, &mut self.host_out, &mut self.host_buffers[..plan.host_buffers.len()]),
                &self.devices,
                &self.kernel,
                self.iterations,
                &self.dataset,
            )?;
            p.finish()?
        };
        if let Some(r) = run.races.first() {
            return Err(LabError::schedule(format!("{}: {}", plan.name, r.what)));
        }
        self.check(plan, &expected, seed)?;
        Ok(run)
    }

    /// Captures `plan`'s loop as a CUDA graph on this rig's buffers (it runs
    /// nothing); [`Self::replay`] launches it. `model` is the plan's.
    pub fn capture(&mut self, plan: &Plan, model: &DryRun) -> Result<CapturedPlan> {
        self.ready(plan)?;
        self.make_streams(plan)?;
        self.make_host_buffers(plan)?;
        let streams = streams_of(&self.streams, plan);
        let started = std::time::Instant::now();
        let (graph, run) = {
            let mut p = self.gpu.capture_runner()?;
            issue(
                &mut p,
                plan,
                &streams,
                (&mut self.host_in, &mut self.host_out, &mut self.host_buffers[..plan.host_buffers.len()]),
                &self.devices,
                &self.kernel,
                self.iterations,
                &self.dataset,
            )?;
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
            expected: plan.checked_cells(model).into_iter().cloned().collect(),
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
        let expected: Vec<&Cells> = c.expected.iter().collect();
        self.check(plan, &expected, seed)?;
        Ok(Replay { total_ms, launch_ms })
    }

    /// Refuses a plan bigger than the rig; makes the device buffers it
    /// places on each GPU where the rig has none of that size yet.
    fn ready(&mut self, plan: &Plan) -> Result<()> {
        self.fits(plan)?;
        self.make_device_buffers(plan)
    }

    /// Refuses a plan bigger than the rig.
    fn fits(&self, plan: &Plan) -> Result<()> {
        plan.validate()?;
        if plan.elements > self.elements || plan.devices > self.device_slots {
            return Err(LabError::config(format!(
                "{}: {} elements and {} device buffers do not fit the rig's {} and {}",
                plan.name, plan.elements, plan.devices, self.elements, self.device_slots
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
        self.make_host_buffers(plan)?;
        for b in &mut self.host_buffers[..plan.host_buffers.len()] {
            pattern::poison(b.words_mut());
        }
        for i in 0..plan.devices {
            let g = plan.device_gpu(i);
            self.setup[g].fill_u32(self.device(g, i)?, pattern::POISON as u32)?;
        }
        Ok(seed)
    }

    /// Makes each device buffer `plan` places on a GPU, of the size it
    /// asks, where the rig holds none there that big (the smaller one
    /// freed first; refused where a captured graph names it).
    fn make_device_buffers(&mut self, plan: &Plan) -> Result<()> {
        for i in 0..plan.devices {
            let (g, (name, elements)) = (plan.device_gpu(i), plan.device_buffer(i));
            // A plan that names its buffers' sizes gets those; any other a
            // buffer of the rig's elements, which every plan of the rig
            // fits (a smaller plan run first leaves none to make again).
            let bytes = 4 * if plan.sizes_device_buffers() { elements } else { self.elements };
            match &self.devices[g][i] {
                Some(b) if b.bytes() >= bytes => continue,
                Some(_) if !self.graphs.is_empty() => {
                    return Err(LabError::config(format!(
                        "{}: its {name} ({}) on GPU {g} is bigger than the rig's buffer there, which a captured graph names: capture it on a rig of its own",
                        plan.name,
                        Bytes(bytes as u64)
                    )))
                }
                _ => {}
            }
            self.devices[g][i] = None;
            let gpu = &self.gpus[g];
            gpu.ensure_free(bytes as u64, &format!("{}: its {name} ({})", plan.name, Bytes(bytes as u64)))?;
            self.devices[g][i] = Some(gpu.alloc(bytes)?);
        }
        self.gpu.bind()
    }

    /// Makes the page-locked host buffers of `plan`'s own, each of the
    /// size it asks for, where the rig's are not that size yet.
    fn make_host_buffers(&mut self, plan: &Plan) -> Result<()> {
        for (i, (_, n)) in plan.host_buffers.iter().enumerate() {
            if self.host_buffers.get(i).is_none_or(|b| b.words().len() != n / 2) {
                if i < self.host_buffers.len() && !self.graphs.is_empty() {
                    // A captured graph names the buffer by its address.
                    return Err(LabError::config(format!(
                        "{}: its host buffers differ in size from those of the plans captured on this rig as graphs: run it on a rig of its own",
                        plan.name
                    )));
                }
                let fresh = PinnedBuffer::new(&self.gpu, 4 * n)?;
                match self.host_buffers.get_mut(i) {
                    Some(b) => *b = fresh,
                    None => self.host_buffers.push(fresh),
                }
            }
        }
        Ok(())
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
}
