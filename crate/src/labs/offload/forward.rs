//! Lab 9's vocabulary, written once for both executors: a forward pass
//! speaks of uploading a layer's weights into a slot of the GPU's ring and
//! running a layer from a slot, ordered by events ([`Forward`]). A [`Pass`]
//! holds one executor of the vocabulary ([`LabIssue`]) and never asks
//! which: an upload is the vocabulary's own copy
//! ([`crate::pipeline::issue::Issue::h2d`]), a layer the lab's own
//! operation ([`LayerOp`]: two cuBLAS GEMMs and the ReLU, written once).
//! With no GPU the dry run records them ([`Pass::dry_run`]), and the queue
//! model times its schedule; on a GPU the runner with the rig's layers
//! ([`Layers`], [`Pass::live`]) records and runs them. Either way the
//! schedule's race check sees the same ops, and the pass keeps the lab's
//! own books: which layer each slot holds, which layers ran in which
//! order, what the CPU waited for.

use super::rig::{Hidden, LayerWork, OffloadRig};
use super::Shape;
use crate::error::{LabError, Result};
use crate::gpu::runner::{Enqueue, LabOnGpu, LabRunner, NoHostTask};
use crate::gpu::{Blas, DeviceBuffer, Graph, Run, Runner};
use crate::pipeline::dry_run::DryRun;
use crate::pipeline::issue::{DevRef, EventRef, HostRef, StreamRef};
use crate::pipeline::lab_op::{LabIssue, LabOp, NoCall};
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

/// One layer's GEMMs and ReLU, the lab's own operation, written once:
/// what it is to the schedule here ([`LabOp`]), what a GPU runs for it in
/// [`Layers`]'s [`LabOnGpu`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerOp {
    layer: usize,
    /// The ring slot holding its weights.
    slot: usize,
    accesses: Vec<Access>,
}

impl LabOp for LayerOp {
    fn kind(&self) -> OpKind {
        OpKind::Kernel
    }
    fn label(&self) -> String {
        format!("layer {}", self.layer)
    }
    fn accesses(&self) -> Vec<Access> {
        self.accesses.clone()
    }
}

/// Lab 9's GPU side: the rig's parts a layer uses (the host weights are
/// the runner's, for the uploads) and the pass's sizes.
pub struct Layers<'r> {
    blas: &'r Blas,
    relu: &'r super::kernel::Relu,
    ring: &'r [DeviceBuffer],
    act: &'r [DeviceBuffer; 2],
    /// The hidden activations' buffer; None: each layer takes them from the pool.
    hidden: Option<&'r DeviceBuffer>,
    shape: Shape,
    batch: usize,
}

// SAFETY: a layer's calls touch only the rig's buffers, borrowed for 'r so
// they outlive the runner, and, with no hidden buffer, one it takes from
// the pool and frees on its own stream after the calls that use it; its
// accesses name its slot, both activation buffers and the hidden one
// (`Pass::layer_accesses`).
unsafe impl<'r> LabOnGpu<'r> for Layers<'r> {
    type Op = LayerOp;
    type Call = NoCall;
    type Task = NoHostTask;

    fn enqueue(&mut self, op: &LayerOp) -> Result<Enqueue<'r>> {
        let (ring, act) = (self.ring, self.act);
        let slot = ring.get(op.slot).ok_or_else(|| LabError::config(format!("layer {}: slot {} is not in the ring", op.layer, op.slot)))?;
        let work = LayerWork {
            blas: self.blas,
            relu: self.relu,
            shape: self.shape,
            batch: self.batch,
            slot,
            input: &act[op.layer % 2],
            output: &act[(op.layer + 1) % 2],
            hidden: self.hidden,
        };
        // SAFETY: every buffer stays allocated until the runner has
        // synchronized (this impl's contract, above).
        Ok(Box::new(move |st| unsafe { work.enqueue(st) }))
    }
}

/// A forward pass being issued (see the module docs), on the executor `X`:
/// the dry run ([`Pass::dry_run`]) or the runner with the rig's layers
/// ([`Pass::live`]).
pub struct Pass<X> {
    x: X,
    pub task: Task,
    shape: Shape,
    batch: usize,
    hidden: Hidden,
    /// The ring's slots, as the executor knows them.
    ring: Vec<DevRef>,
    /// The weights' two host copies, as the executor knows them (by [`Weights`]).
    weights: [HostRef; 2],
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

impl<'r> Pass<LabRunner<'r, Layers<'r>>> {
    /// A pass on the GPU: the runner `p` (made by the caller: deferring,
    /// capturing), the rig's buffers, `slots` of its ring.
    pub fn live(mut p: Runner<'r>, rig: &'r mut OffloadRig, batch: usize, slots: usize, streams: Streams, hidden: Hidden) -> Result<Self> {
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
        let (shape, hid): (Shape, &'r DeviceBuffer) = (*shape, hid);
        let layers = Layers { blas, relu, ring, act, hidden: (hidden == Hidden::Fixed).then_some(hid), shape, batch };
        Ok(Pass { x: LabRunner::new(p, layers), task, shape, batch, hidden, ring: ring_refs, weights, books: Books::new(slots) })
    }

    /// Runs the pass's recorded calls and waits for them.
    pub fn finish(self) -> Result<(Run, Books)> {
        Ok((self.x.runner.finish()?, self.books))
    }

    /// Ends a capturing pass: its graph and schedule.
    pub fn finish_capture(self) -> Result<(Graph, Run, Books)> {
        let (g, run) = self.x.runner.finish_capture()?;
        Ok((g, run, self.books))
    }
}

impl Pass<DryRun> {
    /// The same pass with no GPU: recorded on the dry run, for the race
    /// check and the queue model.
    pub fn dry_run(shape: Shape, batch: usize, slots: usize, streams: Streams, hidden: Hidden) -> Pass<DryRun> {
        let mut dry = DryRun::new();
        // The queue model only orders priorities against each other: any
        // number below the compute stream's 0 is the copy stream's "higher".
        let copy = dry.stream_of(StreamKind::NonBlocking, if streams.copy_high { -5 } else { 0 });
        let compute = dry.stream();
        // The buffers an upload copies between, in f32 elements as the
        // vocabulary counts. The dry run follows no values here (the weights
        // are not the vocabulary's inputs, and may be more elements than it
        // numbers inputs by; the lab checks a pass's output on the GPU).
        let layer_elements = shape.layer_bytes() / 4;
        let weights = [Weights::Pinned, Weights::Pageable].map(|w| dry.host(w.buffer(), shape.layers * layer_elements, false));
        let ring = (0..slots).map(|i| dry.device(&slot_name(i), layer_elements)).collect();
        let task = Task { layers: shape.layers, slots, copy, compute };
        Pass { x: dry, task, shape, batch, hidden, ring, weights, books: Books::new(slots) }
    }

    /// The ops the dry run recorded so far, with what orders them.
    pub fn ops(&self) -> &Schedule {
        &self.x.schedule
    }
}

impl<X> Pass<X> {
    fn check_slot(&mut self, slot: usize, what: &str) -> Result<()> {
        if slot >= self.task.slots {
            return Err(LabError::config(format!("{what}: slot {slot} is not in the ring (slots 0 to {})", self.task.slots - 1)));
        }
        self.books.slots_used[slot] = true;
        Ok(())
    }
    fn check_layer(&self, layer: usize, what: &str) -> Result<()> {
        if layer >= self.task.layers {
            return Err(LabError::config(format!("{what}: the network has layers 0 to {}", self.task.layers - 1)));
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

impl<X: LabIssue<LayerOp>> Forward for Pass<X> {
    fn upload(&mut self, s: StreamRef, from: Weights, layer: usize, slot: usize) -> Result<()> {
        let what = format!("upload of layer {layer}");
        self.check_slot(slot, &what)?;
        self.check_layer(layer, &what)?;
        let label = match from {
            Weights::Pinned => format!("H2D layer {layer}"),
            Weights::Pageable => format!("H2D layer {layer} (pageable)"),
        };
        // In f32 elements, as the vocabulary counts: a layer is 16 d² bytes.
        let n = self.shape.layer_bytes() / 4;
        self.x.h2d(s, self.ring[slot], 0, self.weights[from as usize], layer * n, n, &label)?;
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
        self.x.lab_op(s, LayerOp { layer, slot, accesses })?;
        Ok(())
    }

    fn event(&mut self) -> Result<EventRef> {
        self.x.event()
    }
    fn record(&mut self, e: EventRef, s: StreamRef) -> Result<()> {
        self.x.record(e, s)
    }
    fn wait(&mut self, s: StreamRef, e: EventRef) -> Result<()> {
        self.x.wait(s, e)
    }
    fn host_wait(&mut self, e: EventRef) -> Result<()> {
        self.books.host_waits += 1;
        self.x.host_wait(e)
    }
    fn host_sync(&mut self, s: StreamRef) -> Result<()> {
        self.books.host_waits += 1;
        self.x.host_sync(s)
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

impl Pass<DryRun> {
    /// The queue model's time for this pass (recorded on the dry run), ms.
    pub fn predicted_ms(&self, costs: Costs, machine: crate::pipeline::machine::Machine) -> f64 {
        let times = crate::pipeline::predict::predict(&self.x.schedule, machine, |op| match op.kind {
            OpKind::H2d if op.label.ends_with("(pageable)") => costs.h2d_pageable,
            OpKind::H2d => costs.h2d,
            OpKind::Kernel => costs.layer,
            _ => 0.0,
        });
        times.iter().map(|t| t.1).fold(0.0, f64::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_on_the_dry_run_records_what_each_upload_and_layer_touches() {
        let shape = Shape { layers: 3, d: 64 };
        let mut f = Pass::dry_run(shape, 8, 2, Streams { copy_high: true }, Hidden::Fixed);
        let task = f.task;
        ring(&mut f, &task).unwrap();
        let lb = shape.layer_bytes() as u64;
        let s = f.ops();
        let up = s.ops.iter().find(|o| o.label == "H2D layer 2").unwrap();
        assert_eq!(up.kind, OpKind::H2d);
        assert_eq!(up.accesses, [Access::read("weights (pinned)", 2 * lb, 3 * lb), Access::write("ring slot 0", 0, lb)]);
        let layer = s.ops.iter().find(|o| o.label == "layer 1").unwrap();
        assert_eq!(layer.kind, OpKind::Kernel);
        assert_eq!(layer.accesses[..3], [Access::read("ring slot 1", 0, lb), Access::read(ACT[1], 0, 2 * 64 * 8), Access::write(ACT[0], 0, 2 * 64 * 8)]);
        assert!(s.races().is_empty(), "{:?}", s.races());
        assert_eq!((f.books.ran.as_slice(), f.books.uploads), ([0, 1, 2].as_slice(), 3));
    }

    #[test]
    fn the_dry_run_uploads_a_network_of_more_elements_than_it_numbers_inputs_by() {
        // 96 layers of d = 8192: 96 GiB of weights, 25.8 billion f32 elements.
        let shape = Shape { layers: 96, d: 8192 };
        let mut f = Pass::dry_run(shape, 64, 2, Streams { copy_high: false }, Hidden::Pool);
        let (copy, compute) = (f.task.copy, f.task.compute);
        f.upload(copy, Weights::Pageable, 95, 1).unwrap();
        f.layer(compute, 95, 1).unwrap();
        let s = f.ops();
        let lb = shape.layer_bytes() as u64;
        assert_eq!(s.ops[0].accesses[0], Access::read("weights (pageable)", 95 * lb, 96 * lb));
        assert_eq!(s.ops[1].accesses.len(), 3, "no hidden buffer: the pool's is the layer's own");
        assert!(!s.races().is_empty(), "the layer did not wait for its upload");
    }
}
