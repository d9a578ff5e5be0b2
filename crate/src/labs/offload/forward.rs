//! Lab 9's vocabulary, written once over the runner's two executors: a
//! forward pass speaks of uploading a layer's weights into a slot of the
//! GPU's ring and running a layer from a slot, ordered by events
//! ([`Forward`]). On a GPU each call becomes an op of a
//! [`crate::gpu::Runner`] (the upload a copy of the runner's, the layer the
//! lab's own op: two cuBLAS GEMMs and the ReLU); with no GPU the same calls
//! are recorded on the runner's dry run, whose schedule the queue model
//! times. Either way the schedule's race check sees the same ops, and the
//! pass keeps the lab's own books: which layer each slot holds, which
//! layers ran in which order, what the CPU waited for.

use super::rig::{Hidden, LayerWork, OffloadRig};
use super::Shape;
use crate::error::{LabError, Result};
use crate::gpu::{Run, Runner};
use crate::pipeline::dry_run::DryRun;
use crate::pipeline::issue::{DevRef, EventRef, HostRef, Issue, StreamRef};
use crate::pipeline::op::{Access, OpKind, StreamKind};
use crate::pipeline::schedule::Schedule;
use std::sync::Arc;

/// Which host copy of the weights an upload reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weights {
    /// Page-locked memory: the copy engine reads it directly.
    Pinned,
    /// Ordinary memory: the driver stages it through a buffer of its own,
    /// and the call returns only when the copy is done.
    Pageable,
}

impl Weights {
    /// The host buffer's name in the schedule.
    pub fn buffer(self) -> &'static str {
        match self {
            Weights::Pinned => "weights (pinned)",
            Weights::Pageable => "weights (pageable)",
        }
    }
}

/// What a forward pass may call (see the module docs).
pub trait Forward {
    /// Copies layer `layer`'s weights from `from` into ring slot `slot`, on `s`.
    fn upload(&mut self, s: StreamRef, from: Weights, layer: usize, slot: usize) -> Result<()>;
    /// Runs layer `layer` (GEMM, ReLU, GEMM) with the weights in ring slot
    /// `slot`, on `s`: it reads the previous layer's activations and writes
    /// its own.
    fn layer(&mut self, s: StreamRef, layer: usize, slot: usize) -> Result<()>;
    fn event(&mut self) -> Result<EventRef>;
    /// `e` completes when `s` has done all work issued to it so far.
    fn record(&mut self, e: EventRef, s: StreamRef) -> Result<()>;
    /// Later work on `s` waits (on the GPU) for `e`.
    fn wait(&mut self, s: StreamRef, e: EventRef) -> Result<()>;
    /// The CPU waits for `e`.
    fn host_wait(&mut self, e: EventRef) -> Result<()>;
    /// The CPU waits until `s` has done everything issued to it so far.
    fn host_sync(&mut self, s: StreamRef) -> Result<()>;
}

/// What a forward pass is given.
#[derive(Clone, Copy, Debug)]
pub struct Task {
    pub layers: usize,
    /// Slots in the GPU's ring of layer buffers (0 .. slots).
    pub slots: usize,
    /// A stream for copies and one for the layers.
    pub copy: StreamRef,
    pub compute: StreamRef,
}

/// A forward pass's schedule: a function of the vocabulary.
pub type PassFn = Arc<dyn Fn(&mut dyn Forward, &Task) -> Result<()> + Send + Sync>;

/// What the pass's books found wrong, in issue order.
#[derive(Clone, Debug, Default)]
pub struct Books {
    /// Per slot, the layer whose upload into it was issued last.
    holds: Vec<Option<usize>>,
    /// The layers run so far, in issue order.
    pub ran: Vec<usize>,
    /// Layers that read a slot holding other weights: (layer, slot, what it held).
    pub wrong_weights: Vec<(usize, usize, Option<usize>)>,
    pub pageable_uploads: usize,
    /// The CPU's waits (on an event or a stream).
    pub host_waits: usize,
    /// Slots any call used.
    pub slots_used: Vec<bool>,
    pub uploads: usize,
}

impl Books {
    /// Books of a pass over `slots` slots, before its first call.
    fn new(slots: usize) -> Books {
        Books { holds: vec![None; slots], slots_used: vec![false; slots], ..Books::default() }
    }
}

/// Which executor the calls become.
enum Exec<'r> {
    Gpu(Box<Live<'r>>),
    Model(Box<DryRun>),
}

/// The GPU side of a pass.
struct Live<'r> {
    p: Runner<'r>,
    rig: RigRefs<'r>,
    ring: Vec<DevRef>,
    weights: [HostRef; 2],
}

/// The rig's parts a live pass borrows, apart (the host weights are the runner's).
struct RigRefs<'r> {
    blas: &'r crate::gpu::Blas,
    relu: &'r super::kernel::Relu,
    ring: &'r [crate::gpu::DeviceBuffer],
    act: &'r [crate::gpu::DeviceBuffer; 2],
    hidden: &'r crate::gpu::DeviceBuffer,
}

/// A forward pass being issued (see the module docs).
pub struct Pass<'r> {
    exec: Exec<'r>,
    pub task: Task,
    shape: Shape,
    batch: usize,
    hidden: Hidden,
    pub books: Books,
}

/// Activation buffers' names in the schedule.
const ACT: [&str; 2] = ["activations 0", "activations 1"];
const HIDDEN: &str = "hidden activations";

fn slot_name(slot: usize) -> String {
    format!("ring slot {slot}")
}

/// How a pass's streams are made: the copy stream at the device's highest priority or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Streams {
    pub copy_high: bool,
}

impl<'r> Pass<'r> {
    /// A pass on the GPU: the runner `p` (made by the caller: deferring,
    /// capturing), the rig's buffers, `slots` of its ring.
    pub fn live(mut p: Runner<'r>, rig: &'r mut OffloadRig, batch: usize, slots: usize, streams: Streams, hidden: Hidden) -> Result<Pass<'r>> {
        if slots == 0 || slots > rig.ring.len() || batch == 0 || batch > rig.max_batch {
            return Err(LabError::config(format!(
                "a pass of {batch} tokens over {slots} slots: the rig has {} slots and room for {} tokens",
                rig.ring.len(),
                rig.max_batch
            )));
        }
        let OffloadRig { shape, blas, relu, pinned, pageable, ring, act, hidden: hid, compute, copy, copy_high, .. } = rig;
        let copy_ref = p.stream(if streams.copy_high { copy_high } else { copy }, if streams.copy_high { "copy (high priority)" } else { "copy" });
        let compute_ref = p.stream(compute, "compute");
        let weights = [p.host(pinned, Weights::Pinned.buffer()), p.host(pageable, Weights::Pageable.buffer())];
        let ring_refs = ring[..slots].iter().enumerate().map(|(i, d)| p.device(d, &slot_name(i))).collect();
        let task = Task { layers: shape.layers, slots, copy: copy_ref, compute: compute_ref };
        let shape = *shape;
        Ok(Pass {
            exec: Exec::Gpu(Box::new(Live { p, rig: RigRefs { blas, relu, ring, act, hidden: hid }, ring: ring_refs, weights })),
            task,
            shape,
            batch,
            hidden,
            books: Books::new(slots),
        })
    }

    /// The same pass with no GPU: recorded on the dry run, for the race
    /// check and the queue model.
    pub fn model(shape: Shape, batch: usize, slots: usize, streams: Streams, hidden: Hidden) -> Pass<'static> {
        let mut m = DryRun::new();
        // The queue model only orders priorities against each other: any
        // number below the compute stream's 0 is the copy stream's "higher".
        let copy = m.stream_of(StreamKind::NonBlocking, if streams.copy_high { -5 } else { 0 });
        let compute = m.stream();
        let task = Task { layers: shape.layers, slots, copy, compute };
        Pass { exec: Exec::Model(Box::new(m)), task, shape, batch, hidden, books: Books::new(slots) }
    }

    /// The schedule so far.
    pub fn schedule(&self) -> Option<&Schedule> {
        match &self.exec {
            Exec::Model(m) => Some(&m.schedule),
            Exec::Gpu(_) => None,
        }
    }

    /// Runs a live pass's recorded calls and waits for them.
    pub fn finish(self) -> Result<(Run, Books)> {
        match self.exec {
            Exec::Gpu(live) => Ok((live.p.finish()?, self.books)),
            Exec::Model(_) => Err(LabError::config("a pass on the model has nothing to run")),
        }
    }

    /// Ends a live capturing pass: its graph and schedule.
    pub fn finish_capture(self) -> Result<(crate::gpu::Graph, Run, Books)> {
        match self.exec {
            Exec::Gpu(live) => {
                let (g, run) = live.p.finish_capture()?;
                Ok((g, run, self.books))
            }
            Exec::Model(_) => Err(LabError::config("a pass on the model has nothing to capture")),
        }
    }

    fn check_slot(&mut self, slot: usize, what: &str) -> Result<()> {
        if slot >= self.task.slots {
            return Err(LabError::config(format!("{what}: slot {slot} is not in the ring (slots 0 to {})", self.task.slots - 1)));
        }
        self.books.slots_used[slot] = true;
        Ok(())
    }
    fn check_layer(&self, layer: usize, what: &str) -> Result<()> {
        if layer >= self.task.layers {
            return Err(LabError::config(format!("{what}: the model has layers 0 to {}", self.task.layers - 1)));
        }
        Ok(())
    }
    /// What layer `layer` reads and writes.
    fn layer_accesses(&self, layer: usize, slot: usize) -> Vec<Access> {
        let (lb, ab, hb) = (self.shape.layer_bytes() as u64, self.shape.act_bytes(self.batch) as u64, self.shape.hidden_bytes(self.batch) as u64);
        let mut a = vec![Access::read(&slot_name(slot), 0, lb), Access::read(ACT[layer % 2], 0, ab), Access::write(ACT[(layer + 1) % 2], 0, ab)];
        if self.hidden == Hidden::Fixed {
            a.push(Access::write(HIDDEN, 0, hb));
        }
        a
    }
}

impl Forward for Pass<'_> {
    fn upload(&mut self, s: StreamRef, from: Weights, layer: usize, slot: usize) -> Result<()> {
        let what = format!("upload of layer {layer}");
        self.check_slot(slot, &what)?;
        self.check_layer(layer, &what)?;
        let lb = self.shape.layer_bytes();
        let label = match from {
            Weights::Pinned => format!("H2D layer {layer}"),
            Weights::Pageable => format!("H2D layer {layer} (pageable)"),
        };
        match &mut self.exec {
            Exec::Gpu(live) => {
                let w = live.weights[from as usize];
                live.p.h2d(s, live.ring[slot], 0, w, layer * lb, lb, &label)?;
            }
            Exec::Model(m) => {
                let acc = vec![Access::read(from.buffer(), (layer * lb) as u64, ((layer + 1) * lb) as u64), Access::write(&slot_name(slot), 0, lb as u64)];
                m.op(s, OpKind::H2d, &label, acc)?;
            }
        }
        self.books.holds[slot] = Some(layer);
        self.books.uploads += 1;
        if from == Weights::Pageable {
            self.books.pageable_uploads += 1;
        }
        Ok(())
    }

    fn layer(&mut self, s: StreamRef, layer: usize, slot: usize) -> Result<()> {
        let what = format!("layer {layer}");
        self.check_slot(slot, &what)?;
        self.check_layer(layer, &what)?;
        if self.books.holds[slot] != Some(layer) {
            self.books.wrong_weights.push((layer, slot, self.books.holds[slot]));
        }
        self.books.ran.push(layer);
        let accesses = self.layer_accesses(layer, slot);
        let label = format!("layer {layer}");
        let (shape, batch, hidden) = (self.shape, self.batch, self.hidden);
        match &mut self.exec {
            Exec::Gpu(live) => {
                let r = &live.rig;
                let work = LayerWork {
                    blas: r.blas,
                    relu: r.relu,
                    shape,
                    batch,
                    slot: &r.ring[slot],
                    input: &r.act[layer % 2],
                    output: &r.act[(layer + 1) % 2],
                    hidden: (hidden == Hidden::Fixed).then_some(r.hidden),
                };
                // SAFETY: the layer touches only the rig's buffers (and a
                // pooled buffer it frees on its own stream), which outlive
                // the runner; `accesses` names all of them but the pooled one.
                unsafe { live.p.op(s, OpKind::Kernel, &label, accesses, move |st| work.enqueue(st)) }?;
            }
            Exec::Model(m) => {
                m.op(s, OpKind::Kernel, &label, accesses)?;
            }
        }
        Ok(())
    }

    fn event(&mut self) -> Result<EventRef> {
        match &mut self.exec {
            Exec::Gpu(live) => live.p.event(),
            Exec::Model(m) => m.event(),
        }
    }
    fn record(&mut self, e: EventRef, s: StreamRef) -> Result<()> {
        match &mut self.exec {
            Exec::Gpu(live) => live.p.record(e, s),
            Exec::Model(m) => m.record(e, s),
        }
    }
    fn wait(&mut self, s: StreamRef, e: EventRef) -> Result<()> {
        match &mut self.exec {
            Exec::Gpu(live) => live.p.wait(s, e),
            Exec::Model(m) => m.wait(s, e),
        }
    }
    fn host_wait(&mut self, e: EventRef) -> Result<()> {
        self.books.host_waits += 1;
        match &mut self.exec {
            Exec::Gpu(live) => live.p.host_wait(e),
            Exec::Model(m) => m.host_wait(e),
        }
    }
    fn host_sync(&mut self, s: StreamRef) -> Result<()> {
        self.books.host_waits += 1;
        match &mut self.exec {
            Exec::Gpu(live) => live.p.host_sync(s),
            Exec::Model(m) => m.host_sync(s),
        }
    }
}

// ---- the variants' passes ------------------------------------------------

/// Copy a layer, then run it, on one stream and one slot: what a first
/// program does.
pub fn copy_then_compute(f: &mut dyn Forward, t: &Task, from: Weights) -> Result<()> {
    for i in 0..t.layers {
        f.upload(t.compute, from, i, 0)?;
        f.layer(t.compute, i, 0)?;
    }
    Ok(())
}

/// The ring: the copy stream runs `slots - 1` layers ahead of the compute
/// stream. A layer waits for its upload ("copied"); an upload into a slot
/// waits for the layer that last read it ("freed"). With 2 slots, double
/// buffering.
pub fn ring(f: &mut dyn Forward, t: &Task) -> Result<()> {
    ring_with(f, t, RingOrders::ALL)
}

/// Which orderings a ring pass makes: the lab's own pass makes the two
/// stream waits; the exercise's wrong passes leave one out, or add a CPU
/// wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingOrders {
    /// A layer waits (on the compute stream) for its slot's upload.
    pub layer_waits_for_upload: bool,
    /// An upload waits (on the copy stream) for the layer that last read its slot.
    pub upload_waits_for_layer: bool,
    /// The CPU also waits for each layer's upload before issuing the layer.
    pub cpu_waits_for_upload: bool,
}

impl RingOrders {
    pub const ALL: RingOrders = RingOrders { layer_waits_for_upload: true, upload_waits_for_layer: true, cpu_waits_for_upload: false };
}

/// The ring pass with the orderings `o` makes.
pub fn ring_with(f: &mut dyn Forward, t: &Task, o: RingOrders) -> Result<()> {
    let k = t.slots;
    let copied = (0..k).map(|_| f.event()).collect::<Result<Vec<_>>>()?;
    let freed = (0..k).map(|_| f.event()).collect::<Result<Vec<_>>>()?;
    for (j, &e) in copied.iter().enumerate().take(t.layers) {
        f.upload(t.copy, Weights::Pinned, j, j)?;
        f.record(e, t.copy)?;
    }
    for i in 0..t.layers {
        let s = i % k;
        if o.layer_waits_for_upload {
            f.wait(t.compute, copied[s])?;
        }
        if o.cpu_waits_for_upload {
            f.host_wait(copied[s])?;
        }
        f.layer(t.compute, i, s)?;
        f.record(freed[s], t.compute)?;
        let next = i + k;
        if next < t.layers {
            if o.upload_waits_for_layer {
                f.wait(t.copy, freed[s])?;
            }
            f.upload(t.copy, Weights::Pinned, next, s)?;
            f.record(copied[s], t.copy)?;
        }
    }
    Ok(())
}

/// What each op of a pass costs alone, ms: the queue model's input.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Costs {
    /// One layer's upload from pinned memory.
    pub h2d: f64,
    /// From pageable memory.
    pub h2d_pageable: f64,
    /// One layer's GEMMs and ReLU.
    pub layer: f64,
}

impl Pass<'_> {
    /// The queue model's time for this pass (recorded on the model), ms.
    pub fn predicted_ms(&self, costs: Costs, machine: crate::pipeline::machine::Machine) -> Result<f64> {
        let s = self.schedule().ok_or_else(|| LabError::config("only a pass on the model is predicted"))?;
        let times = crate::pipeline::predict::predict(s, machine, |op| match op.kind {
            OpKind::H2d if op.label.ends_with("(pageable)") => costs.h2d_pageable,
            OpKind::H2d => costs.h2d,
            OpKind::Kernel => costs.layer,
            _ => 0.0,
        });
        Ok(times.iter().map(|t| t.1).fold(0.0, f64::max))
    }
}
