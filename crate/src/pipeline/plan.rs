//! A pipeline written once and run anywhere: its streams (kind and
//! priority), its buffers, and its issue loop (a function of the
//! vocabulary). The GPU runs it (`gpu::plan`); with no GPU a dry run runs the
//! very same loop ([`Plan::dry_run`]), which says what every output element
//! must hold (the GPU's results are verified against that) and, with each
//! operation's cost measured alone, predicts its timeline
//! ([`Plan::predict`]).
//!
//! Every plan has one input host buffer (`host in`, the data), one output
//! host buffer (`host out`), both `elements` long, and `devices` device
//! buffers of the same length; lab 5's and lab 6's experiments are plans.

use super::cells::Cells;
use super::cells::Provenance;
use super::dry_run::DryRun;
use super::issue::{DevRef, HostRef, Issue, StreamRef};
use super::machine::Machine;
use super::op::{Op, OpKind, StreamDecl, StreamKind};
use super::predict::predict;
use super::schedule::Schedule;
use super::timeline::Timeline;
use crate::error::{LabError, Result};
use std::collections::BTreeMap;
use std::sync::Arc;

/// One stream of a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamSpec {
    pub name: String,
    pub kind: StreamKind,
    /// CUDA's numbers: lower runs first; 0 is the default.
    pub priority: i32,
    /// The GPU it belongs to: 0 unless the plan spans several
    /// ([`Self::on_gpu`]).
    pub gpu: usize,
}

impl StreamSpec {
    pub fn new(name: &str, kind: StreamKind, priority: i32) -> StreamSpec {
        StreamSpec { name: name.into(), kind, priority, gpu: 0 }
    }
    /// This stream on GPU `gpu` of the plan.
    pub fn on_gpu(self, gpu: usize) -> StreamSpec {
        StreamSpec { gpu, ..self }
    }
    /// How it is declared to a schedule.
    pub fn decl(&self) -> StreamDecl {
        StreamDecl::new(self.kind, self.priority, self.gpu)
    }
}

/// What a plan's loop is handed: its streams, buffers and sizes.
#[derive(Clone, Debug)]
pub struct Refs {
    pub streams: Vec<StreamRef>,
    pub input: HostRef,
    pub output: HostRef,
    /// The plan's own host buffers beyond `input` and `output`, in the
    /// order it named them ([`Plan::with_host_buffers`]).
    pub hosts: Vec<HostRef>,
    pub devices: Vec<DevRef>,
    pub elements: usize,
}

/// The loop of a plan.
pub type Body = Arc<dyn Fn(&mut dyn Issue, &Refs) -> Result<()> + Send + Sync>;

/// A pipeline's streams, buffers and issue loop (see the module docs).
#[derive(Clone)]
pub struct Plan {
    /// What it is, in a few words (a variant's label).
    pub name: String,
    pub streams: Vec<StreamSpec>,
    /// f32 elements of each buffer.
    pub elements: usize,
    /// How many device buffers.
    pub devices: usize,
    /// The GPU each device buffer lives on (empty: all on GPU 0;
    /// [`Self::placed`]).
    pub device_gpus: Vec<usize>,
    pub body: Body,
    /// Held behind a start gate until issued (the default), or started op
    /// by op as the CPU issues it ([`Self::issued_live`]).
    pub gated: bool,
    /// Elements per batch of the CPU's producer ([`Issue::produce`] writes
    /// batch `b` of the data, elements `b * batch_elements ..`); 0: the
    /// plan has no producer ([`Self::with_producer`]).
    pub batch_elements: usize,
    /// How many times the kernel runs on each element on its way to `host
    /// out`: 1, or one pass per stage of a pipeline over GPUs
    /// ([`Self::with_passes`]).
    pub passes: u8,
    /// The buffers a run is checked on afterwards: `host out` (the
    /// default), or device buffers the rig reads back after the run,
    /// untimed ([`Self::checked_on_devices`]).
    pub checked: Vec<Checked>,
    /// Page-locked host buffers of the plan's own beyond `host in` and
    /// `host out`: (name, elements), none by default.
    pub host_buffers: Vec<(String, usize)>,
    /// The device buffers' names and elements: empty for `device i` of
    /// `elements` each ([`Self::with_device_buffers`]).
    pub device_buffers: Vec<(String, usize)>,
}

/// Which buffer of a plan holds its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checked {
    HostOut,
    /// Device buffer i.
    Device(usize),
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Plan({}: {} streams, {} elements, {} device buffers)", self.name, self.streams.len(), self.elements, self.devices)
    }
}

/// Names of a plan's buffers (the same on the GPU and in the model).
pub const INPUT: &str = "host in";
pub const OUTPUT: &str = "host out";
pub fn device_name(i: usize) -> String {
    format!("device {i}")
}

/// What one operation costs alone, ms, by what it is: (kind, elements).
pub type Costs = BTreeMap<(OpKind, usize), f64>;

/// An allocation that can take a block of its kind and size given back
/// earlier in the loop costs `(kind, elements | REUSED)` where [`Costs`]
/// has it: the driver and the pool hand such a block out again with no new
/// memory to map, which costs a fraction of a fresh allocation.
pub const REUSED: usize = 1 << 62;

/// Per op (by id): whether it is an allocation that can take a block of
/// its memory kind and size released before it and not yet taken again.
pub fn reuses(schedule: &Schedule) -> Vec<bool> {
    let mut released: std::collections::HashMap<(super::op::Memory, usize), usize> = std::collections::HashMap::new();
    schedule
        .ops
        .iter()
        .map(|o| match o.kind {
            OpKind::Free(m) => {
                *released.entry((m, op_elements(o))).or_default() += 1;
                false
            }
            OpKind::Alloc(m) => match released.get_mut(&(m, op_elements(o))) {
                Some(k) if *k > 0 => {
                    *k -= 1;
                    true
                }
                _ => false,
            },
            _ => false,
        })
        .collect()
}

/// Per op (by id): the elements it is costed by in [`Costs`] — its
/// elements ([`op_elements`]), with [`REUSED`] set for an allocation that
/// can take a block given back before it ([`reuses`]).
pub fn cost_keys(schedule: &Schedule) -> Vec<usize> {
    schedule.ops.iter().zip(reuses(schedule)).map(|(o, again)| if again { op_elements(o) | REUSED } else { op_elements(o) }).collect()
}

/// The elements an op moves or computes (its first access), for [`Costs`].
pub fn op_elements(op: &Op) -> usize {
    op.accesses.first().map_or(0, |a| ((a.end - a.start) / 4) as usize)
}

impl Plan {
    pub fn new(
        name: &str,
        streams: Vec<StreamSpec>,
        elements: usize,
        devices: usize,
        body: impl Fn(&mut dyn Issue, &Refs) -> Result<()> + Send + Sync + 'static,
    ) -> Plan {
        Plan {
            name: name.into(),
            streams,
            elements,
            devices,
            device_gpus: Vec::new(),
            body: Arc::new(body),
            gated: true,
            batch_elements: 0,
            passes: 1,
            checked: vec![Checked::HostOut],
            host_buffers: Vec::new(),
            device_buffers: Vec::new(),
        }
    }

    /// This plan with device buffer i in GPU `gpus[i]`'s memory (one GPU
    /// per buffer), for a plan whose streams span several GPUs.
    pub fn placed(self, gpus: Vec<usize>) -> Plan {
        Plan { device_gpus: gpus, ..self }
    }

    /// This plan with its result in device buffers `buffers`, which the
    /// rig reads back after each run (untimed) and checks: a loop whose
    /// download would only add the host link's time and noise to what it
    /// measures.
    pub fn checked_on_devices(self, buffers: &[usize]) -> Plan {
        Plan { checked: buffers.iter().map(|&i| Checked::Device(i)).collect(), ..self }
    }

    /// This plan with page-locked host buffers of its own beyond `host in`
    /// and `host out` (name, elements each): a producer's staging slots.
    pub fn with_host_buffers(self, buffers: &[(&str, usize)]) -> Plan {
        Plan { host_buffers: buffers.iter().map(|&(n, e)| (n.to_string(), e)).collect(), ..self }
    }

    /// This plan with device buffers named and sized as `buffers` says
    /// (name, elements each, at most the plan's `elements`), in place of
    /// `devices` buffers named `device i` of `elements` each.
    pub fn with_device_buffers(self, buffers: &[(&str, usize)]) -> Plan {
        Plan { devices: buffers.len(), device_buffers: buffers.iter().map(|&(n, e)| (n.to_string(), e)).collect(), ..self }
    }

    /// This plan with each of its device buffers `elements` long (at most
    /// the plan's `elements`), named as by default.
    pub fn with_device_buffers_of(self, elements: usize) -> Plan {
        let device_buffers = (0..self.devices).map(|i| (device_name(i), elements)).collect();
        Plan { device_buffers, ..self }
    }

    /// Whether the plan names its device buffers' sizes
    /// ([`Self::with_device_buffers`]); otherwise each is `elements` long.
    pub fn sizes_device_buffers(&self) -> bool {
        !self.device_buffers.is_empty()
    }

    /// Device buffer `i`'s name and elements.
    pub fn device_buffer(&self, i: usize) -> (String, usize) {
        self.device_buffers.get(i).cloned().unwrap_or_else(|| (device_name(i), self.elements))
    }

    /// This plan with every output element computed by `passes` kernels
    /// in turn (a pipeline of that many stages).
    pub fn with_passes(self, passes: u8) -> Plan {
        Plan { passes, ..self }
    }

    /// The GPU device buffer `i` lives on.
    pub fn device_gpu(&self, i: usize) -> usize {
        self.device_gpus.get(i).copied().unwrap_or(0)
    }

    /// The GPUs the plan's streams and buffers use, in order.
    pub fn gpus(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.streams.iter().map(|s| s.gpu).chain(self.device_gpus.iter().copied()).chain([0]).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// This plan with a CPU producer writing batches of `batch_elements`
    /// of the data (the same data `host in` starts with) where its loop says.
    pub fn with_producer(self, batch_elements: usize) -> Plan {
        Plan { batch_elements, ..self }
    }

    /// This plan with no start gate: the GPU starts each op as the CPU
    /// issues it, so the CPU's cost of issuing is in the plan's time.
    pub fn issued_live(self) -> Plan {
        Plan { gated: false, ..self }
    }

    /// Refuses a plan no pipeline can hold.
    pub fn validate(&self) -> Result<()> {
        if self.elements < 2 || self.elements % 2 != 0 {
            return Err(LabError::config(format!("{}: {} elements (give an even number, at least 2)", self.name, self.elements)));
        }
        if self.streams.is_empty() {
            return Err(LabError::config(format!("{}: a plan needs at least one stream", self.name)));
        }
        if !self.device_gpus.is_empty() && self.device_gpus.len() != self.devices {
            return Err(LabError::config(format!(
                "{}: {} device buffers placed on GPUs {:?} (give one GPU per buffer)",
                self.name, self.devices, self.device_gpus
            )));
        }
        if let Some(Checked::Device(i)) = self.checked.iter().find(|c| matches!(c, Checked::Device(i) if *i >= self.devices)) {
            return Err(LabError::config(format!("{}: checked on device buffer {i} of {}", self.name, self.devices)));
        }
        let sizes = self.host_buffers.iter().chain(&self.device_buffers);
        if let Some((name, n)) = sizes.clone().find(|(_, n)| *n < 2 || n % 2 != 0 || *n > self.elements) {
            return Err(LabError::config(format!("{}: buffer {name} of {n} elements (give an even number from 2 to the plan's {})", self.name, self.elements)));
        }
        if !self.device_buffers.is_empty() && self.device_buffers.len() != self.devices {
            return Err(LabError::config(format!("{}: {} device buffers named for {}", self.name, self.device_buffers.len(), self.devices)));
        }
        // A buffer is known by its name (the runner tells two buffers apart
        // by it, and every message names it), so no two may share one.
        let mut seen = std::collections::BTreeSet::new();
        let hosts = [INPUT, OUTPUT].map(String::from).into_iter().chain(self.host_buffers.iter().map(|(n, _)| n.clone()));
        if let Some(n) = hosts.chain((0..self.devices).map(|i| self.device_buffer(i).0)).find(|n| !seen.insert(n.clone())) {
            return Err(LabError::config(format!("{}: two buffers named {n}: a buffer is known by its name, so each needs its own", self.name)));
        }
        if self.checked.is_empty() {
            return Err(LabError::config(format!("{}: a plan is checked on at least one buffer", self.name)));
        }
        if self.batch_elements % 2 != 0 || self.batch_elements > self.elements {
            return Err(LabError::config(format!(
                "{}: producer batches of {} elements (give an even number up to {})",
                self.name, self.batch_elements, self.elements
            )));
        }
        Ok(())
    }

    /// The loop dry run (no GPU): its schedule and where every element came from.
    pub fn dry_run(&self) -> Result<DryRun> {
        self.validate()?;
        let mut m = DryRun::new();
        m.schedule.issued_live = !self.gated;
        m.batch_elements = self.batch_elements;
        let streams = self.streams.iter().map(|s| m.stream_named(s.decl(), &s.name)).collect();
        let (input, output) = (m.host(INPUT, self.elements, true), m.host(OUTPUT, self.elements, false));
        let hosts = self.host_buffers.iter().map(|(name, n)| m.host(name, *n, false)).collect();
        let devices = (0..self.devices)
            .map(|i| {
                let (name, n) = self.device_buffer(i);
                m.device_on(&name, n, self.device_gpu(i))
            })
            .collect();
        let refs = Refs { streams, input, output, hosts, devices, elements: self.elements };
        (self.body)(&mut m, &refs)?;
        Ok(m)
    }

    /// What every element of `host out` must hold after a correct run.
    pub fn expected_output(&self) -> Result<Vec<Provenance>> {
        Ok(Self::output_cells(&self.dry_run()?).to_vec())
    }

    /// `host out`'s cells in a plan's model (the second host buffer
    /// [`Self::dry_run`] makes).
    pub fn output_cells(model: &DryRun) -> &Cells {
        model.host_cells(HostRef(1))
    }

    /// The cells of each buffer a run of this plan is checked on
    /// ([`Self::checked`]) in its model, in that order.
    pub fn checked_cells<'m>(&self, model: &'m DryRun) -> Vec<&'m Cells> {
        self.checked
            .iter()
            .map(|c| match *c {
                Checked::HostOut => Self::output_cells(model),
                Checked::Device(i) => model.device_cells(DevRef(i)),
            })
            .collect()
    }

    /// Each distinct operation of the plan, for measuring it alone.
    pub fn distinct_ops(&self) -> Result<Vec<(OpKind, usize)>> {
        let m = self.dry_run()?;
        let mut v: Vec<(OpKind, usize)> = m.schedule.ops.iter().filter(|o| o.kind.is_device_work()).map(|o| (o.kind, op_elements(o))).collect();
        v.sort();
        v.dedup();
        Ok(v)
    }

    /// The model's (start, end) of every op, ms, from `costs` (each op alone).
    pub fn predict(&self, machine: Machine, costs: &Costs) -> Result<(Schedule, Vec<(f64, f64)>)> {
        let m = self.dry_run()?;
        let times = self.predict_schedule(&m.schedule, machine, costs)?;
        Ok((m.schedule, times))
    }

    /// [`Self::predict`] on the schedule of a model already made.
    pub fn predict_schedule(&self, schedule: &Schedule, machine: Machine, costs: &Costs) -> Result<Vec<(f64, f64)>> {
        let missing = schedule.ops.iter().find(|o| o.kind.is_device_work() && !costs.contains_key(&(o.kind, op_elements(o))));
        if let Some(o) = missing {
            return Err(LabError::config(format!("{}: no cost measured for {} of {} elements ('{}')", self.name, o.kind.label(), op_elements(o), o.label)));
        }
        // An allocation that reuses a block costs as measured for that
        // case where it was, else as a new one.
        let keys = cost_keys(schedule);
        Ok(predict(schedule, machine, |o| costs.get(&(o.kind, keys[o.id])).or_else(|| costs.get(&(o.kind, op_elements(o)))).copied().unwrap_or(0.0)))
    }

    /// The model's total: from the first op's start to the last op's end, ms.
    pub fn predicted_ms(&self, machine: Machine, costs: &Costs) -> Result<f64> {
        Ok(self.prediction(&self.dry_run()?, machine, costs)?.total_ms)
    }

    /// The model's run of this plan, whose model is `model`: each op's
    /// times, the total and the timeline drawn from them.
    pub fn prediction(&self, model: &DryRun, machine: Machine, costs: &Costs) -> Result<Prediction> {
        let times = self.predict_schedule(&model.schedule, machine, costs)?;
        let total_ms = times.iter().map(|t| t.1).fold(0.0, f64::max);
        let us: Vec<(f64, f64)> = times.iter().map(|&(a, b)| (a * 1e3, b * 1e3)).collect();
        let timeline = Timeline::from_schedule("predicted", "queue model", &model.schedule, &us, &model.stream_names());
        Ok(Prediction { times, total_ms, timeline })
    }
}

/// The queue model's run of a plan ([`Plan::prediction`]).
#[derive(Clone, Debug)]
pub struct Prediction {
    /// Each op's (start, end), ms, in schedule order.
    pub times: Vec<(f64, f64)>,
    /// The last op's end, ms.
    pub total_ms: f64,
    pub timeline: Timeline,
}

impl Prediction {
    /// When the op labelled `label` in `schedule` (the plan's) ends, ms.
    pub fn end_of(&self, schedule: &Schedule, label: &str) -> Option<f64> {
        schedule.ops.iter().position(|o| o.label == label).map(|i| self.times[i].1)
    }
}

/// How the download stream learns a chunk's kernel is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitBy {
    StreamWaitEvent,
    EventSynchronize,
    StreamSynchronize,
    ContextSynchronize,
}

impl WaitBy {
    pub const ALL: [WaitBy; 4] = [WaitBy::StreamWaitEvent, WaitBy::EventSynchronize, WaitBy::StreamSynchronize, WaitBy::ContextSynchronize];
    pub fn label(self) -> &'static str {
        match self {
            WaitBy::StreamWaitEvent => "cuStreamWaitEvent (the GPU waits)",
            WaitBy::EventSynchronize => "cuEventSynchronize (the CPU waits)",
            WaitBy::StreamSynchronize => "cuStreamSynchronize (the CPU waits)",
            WaitBy::ContextSynchronize => "cuCtxSynchronize (the CPU waits for all)",
        }
    }
}

/// Uploads, kernels and downloads on three streams, `chunks` chunks over
/// `elements`: each chunk's kernel waits for its upload by `by`, its
/// download for the kernel on the GPU (lab 5's sync-weight and issue-cost
/// pipelines, and the loop `gpu::PlanRig::machine` times the CPU's issuing on).
pub fn stage_streams(name: &str, elements: usize, chunks: usize, by: WaitBy) -> Plan {
    let specs = vec![
        StreamSpec::new("uploads", StreamKind::NonBlocking, 0),
        StreamSpec::new("kernels", StreamKind::NonBlocking, 0),
        StreamSpec::new("downloads", StreamKind::NonBlocking, 0),
    ];
    Plan::new(name, specs, elements, 2, move |p, r| {
        let (up, k, down) = (r.streams[0], r.streams[1], r.streams[2]);
        for c in 0..chunks {
            let (at, n) = chunk(r.elements, chunks, c);
            p.h2d(up, r.devices[0], at, r.input, at, n, &format!("H2D {c}"))?;
            match by {
                WaitBy::StreamWaitEvent | WaitBy::EventSynchronize => {
                    let e = p.event()?;
                    p.record(e, up)?;
                    if by == WaitBy::StreamWaitEvent {
                        p.wait(k, e)?;
                    } else {
                        p.host_wait(e)?;
                    }
                }
                WaitBy::StreamSynchronize => p.host_sync(up)?,
                WaitBy::ContextSynchronize => p.sync_device()?,
            }
            p.compute(k, r.devices[0], at, r.devices[1], at, n, &format!("kernel {c}"))?;
            let computed = p.event()?;
            p.record(computed, k)?;
            p.wait(down, computed)?;
            p.d2h(down, r.output, at, r.devices[1], at, n, &format!("D2H {c}"))?;
        }
        Ok(())
    })
}

/// Chunk `c` of `chunks` over `elements`: an even start and length, the last
/// chunk taking the rest (host copies move whole 8-byte words).
pub fn chunk(elements: usize, chunks: usize, c: usize) -> (usize, usize) {
    let a = (c * elements / chunks) & !1;
    let b = if c + 1 == chunks { elements } else { ((c + 1) * elements / chunks) & !1 };
    (a, b - a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_stream_chunks(chunks: usize) -> Plan {
        Plan::new("chunks", vec![StreamSpec::new("s", StreamKind::NonBlocking, 0)], 64, 2, move |p, r| {
            for c in 0..chunks {
                let (at, n) = chunk(r.elements, chunks, c);
                p.h2d(r.streams[0], r.devices[0], at, r.input, at, n, "up")?;
                p.compute(r.streams[0], r.devices[0], at, r.devices[1], at, n, "kernel")?;
                p.d2h(r.streams[0], r.output, at, r.devices[1], at, n, "down")?;
            }
            Ok(())
        })
    }

    #[test]
    fn the_model_says_what_every_output_element_holds_and_predicts_from_costs() {
        let plan = one_stream_chunks(4);
        let want = plan.expected_output().unwrap();
        assert_eq!(want.len(), 64);
        assert!(want.iter().enumerate().all(|(i, p)| *p == Provenance::Output(i as u32)));
        assert_eq!(plan.distinct_ops().unwrap(), [(OpKind::H2d, 16), (OpKind::Kernel, 16), (OpKind::D2h, 16)]);
        let costs: Costs = [((OpKind::H2d, 16), 1.0), ((OpKind::Kernel, 16), 2.0), ((OpKind::D2h, 16), 1.0)].into();
        assert_eq!(plan.predicted_ms(Machine::engines(2), &costs).unwrap(), 16.0, "one stream is serial");
        let e = plan.predicted_ms(Machine::engines(2), &Costs::new()).unwrap_err().to_string();
        assert!(e.contains("no cost measured for H2D of 16 elements"), "{e}");
        assert_eq!(chunk(10, 3, 2), (6, 4));
        let bad = Plan::new("odd", vec![], 3, 0, |_, _| Ok(()));
        assert!(bad.validate().unwrap_err().to_string().contains("even number"));
    }

    /// The runner tells buffers apart by name: two of one name would be one
    /// buffer on the GPU and two in the model.
    #[test]
    fn two_buffers_of_one_name_are_refused() {
        let twins = one_stream_chunks(2).with_device_buffers(&[("activation", 64), ("activation", 64)]);
        let e = twins.validate().unwrap_err().to_string();
        assert!(e.contains("chunks: two buffers named activation"), "{e}");
        let host_twin = one_stream_chunks(2).with_host_buffers(&[(OUTPUT, 64)]);
        assert!(host_twin.validate().unwrap_err().to_string().contains("two buffers named host out"));
        one_stream_chunks(2).with_device_buffers(&[("in", 64), ("out", 64)]).validate().unwrap();
    }
}
