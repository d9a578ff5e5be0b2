//! Lab 9's vocabulary, written once for both executors: a forward pass
//! speaks of uploading a layer's weights into a slot of the GPU's ring and
//! running a layer from a slot (or from a resident layer's own buffer),
//! ordered by events ([`Forward`]). A [`Pass`]
//! holds one executor of the vocabulary ([`LabIssue`]) and never asks
//! which: an upload is the vocabulary's own copy
//! ([`crate::pipeline::issue::Issue::h2d`]), a layer the lab's own
//! operation ([`LayerOp`]: two cuBLAS GEMMs and the ReLU, written once).
//! With no GPU the dry run records them ([`Pass::dry_run`]), and the queue
//! model times its schedule from the costs each op takes alone
//! ([`Costs`], [`predict_pass`]); on a GPU the runner with the rig's
//! layers records and runs them (`live`, the GPU side). Either way the
//! schedule's race check sees the same ops, and the pass keeps the lab's
//! own books: which layer each slot holds, which layers ran in which
//! order, what the CPU waited for. The variants' passes
//! ([`copy_then_compute`], [`ring`]) are written here, once.
//!
//! May use: `network` (the lab's ground floor), `error` and `pipeline`
//! (the vocabulary, the dry run, the queue model). No CUDA: it runs with
//! no GPU.

use super::network::{fp8_slot, LayerKind, Placement, Precision, Shape};
use crate::error::{LabError, Result};
use crate::pipeline::dry_run::DryRun;
use crate::pipeline::issue::{DevRef, EventRef, HostRef, StreamRef};
use crate::pipeline::lab_op::{LabIssue, LabOp};
use crate::pipeline::machine::Machine;
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
    /// The FP8 copy, page-locked (half the bytes of a layer).
    Fp8,
    /// The 4-bit copy, page-locked: packed integers and their groups'
    /// scales (`int4`'s layout; a quarter of a layer's bytes and 3%).
    Int4,
}

impl Weights {
    pub const ALL: [Weights; 4] = [Weights::Pinned, Weights::Pageable, Weights::Fp8, Weights::Int4];
    /// The host buffer's name in the schedule.
    pub fn buffer(self) -> &'static str {
        match self {
            Weights::Pinned => "weights (pinned)",
            Weights::Pageable => "weights (pageable)",
            Weights::Fp8 => "weights (FP8, pinned)",
            Weights::Int4 => "weights (4-bit, pinned)",
        }
    }
    pub fn precision(self) -> Precision {
        match self {
            Weights::Pinned | Weights::Pageable => Precision::Fp16,
            Weights::Fp8 => Precision::Fp8,
            Weights::Int4 => Precision::Int4,
        }
    }
    /// The page-locked copy of the weights in `precision`.
    pub fn pinned_in(precision: Precision) -> Weights {
        match precision {
            Precision::Fp16 => Weights::Pinned,
            Precision::Fp8 => Weights::Fp8,
            Precision::Int4 => Weights::Int4,
        }
    }
}

/// What a forward pass may call (see the module docs).
pub trait Forward {
    /// Copies layer `layer`'s weights from `from` into ring slot `slot`, on `s`.
    fn upload(&mut self, s: StreamRef, from: Weights, layer: usize, slot: usize) -> Result<()>;
    /// Runs layer `layer` (GEMM, ReLU, GEMM) with the weights in slot
    /// `slot`, on `s`: it reads the previous layer's activations and writes
    /// its own. Slots `0 .. slots` are the ring's; slot `slots + r` is the
    /// r-th resident layer's own buffer ([`Task::resident_layers`]).
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
    /// Layers that stay on the GPU ([`Task::resident_layers`]), the r-th in slot `slots + r`.
    pub resident: usize,
    /// The host copy the ring uploads from.
    pub weights: Weights,
    /// A stream for copies and one for the layers.
    pub copy: StreamRef,
    pub compute: StreamRef,
}

impl Task {
    /// The resident layers, in order: spread evenly through the network
    /// ([`Placement::resident_layers`]).
    pub fn resident_layers(&self) -> Vec<usize> {
        Placement { resident: self.resident, ring: self.slots }.resident_layers(self.layers)
    }
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
    /// The host copy each upload read, in issue order (the queue model
    /// costs each upload by it: [`Pass::predicted_ms`]).
    pub uploaded_from: Vec<Weights>,
}

impl Books {
    /// Books of a pass over a ring of `slots` and the resident layers `resident` (in their buffers' order), before its first call.
    fn new(slots: usize, resident: &[usize]) -> Books {
        let holds = (0..slots).map(|_| None).chain(resident.iter().map(|&l| Some(l))).collect();
        Books { holds, slots_used: vec![false; slots + resident.len()], ..Books::default() }
    }
}

/// Where a layer's hidden activations (batch x 4d, between its two
/// GEMMs) live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HiddenActivations {
    /// One buffer made up front, reused by every layer.
    Fixed,
    /// Taken from the stream-ordered pool for each layer and given back
    /// after it (cuMemAllocAsync, cuMemFreeAsync on the compute stream).
    Pool,
}

/// How a pass runs: its layer buffers, streams, hidden activations and layers' kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassSetup {
    pub placement: Placement,
    pub streams: Streams,
    pub hidden: HiddenActivations,
    pub kind: LayerKind,
}

impl PassSetup {
    /// The host copy its uploads read.
    pub fn weights(&self) -> Weights {
        Weights::pinned_in(self.kind.precision())
    }
}

/// One layer's GEMMs and ReLU, the lab's own operation, written once:
/// what it is to the schedule here ([`LabOp`]), what a GPU runs for it in
/// the GPU side's `live::Layers`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerOp {
    pub(super) layer: usize,
    /// The buffer holding its weights (a ring slot, or a resident layer's).
    pub(super) slot: usize,
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

/// A forward pass being issued (see the module docs), on the executor `X`:
/// the dry run ([`Pass::dry_run`]) or the runner with the rig's layers
/// (`Pass::live`, the GPU side's).
pub struct Pass<X> {
    x: X,
    pub task: Task,
    shape: Shape,
    batch: usize,
    hidden: HiddenActivations,
    kind: LayerKind,
    /// The ring's slots, then the resident layers', as the executor knows them.
    ring: Vec<DevRef>,
    /// The resident layers, in their buffers' order.
    kept: Vec<usize>,
    /// The weights' host copies, as the executor knows them (by
    /// [`Weights`]; the FP8 and 4-bit ones where there are).
    weights: [Option<HostRef>; 4],
    pub books: Books,
}

/// Activation buffers' names in the schedule.
const ACT: [&str; 2] = ["activations 0", "activations 1"];
const HIDDEN: &str = "hidden activations";
const FP8_SCALES: &str = "FP8 scales";
/// Where a 4-bit layer is dequantized into E4M3 before its GEMMs.
const DEQUANTIZED: &str = "dequantized layer";

/// Buffer `slot`'s name in the schedule, with a ring of `ring` slots and
/// the resident layers `resident` after it.
pub(super) fn slot_name(slot: usize, ring: usize, resident: &[usize]) -> String {
    match slot.checked_sub(ring).and_then(|r| resident.get(r)) {
        None => format!("ring slot {slot}"),
        Some(layer) => format!("resident layer {layer}"),
    }
}

/// How a pass's streams are made: the copy stream at the device's highest priority or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Streams {
    pub copy_high: bool,
}

impl Pass<DryRun> {
    /// The same pass with no GPU: recorded on the dry run, for the race
    /// check and the queue model.
    pub fn dry_run(shape: Shape, batch: usize, setup: PassSetup) -> Pass<DryRun> {
        let mut dry = DryRun::new();
        // The queue model only orders priorities against each other: any
        // number below the compute stream's 0 is the copy stream's "higher".
        let copy = dry.stream_of(StreamKind::NonBlocking, if setup.streams.copy_high { -5 } else { 0 });
        let compute = dry.stream();
        // The buffers an upload copies between, in f32 elements as the
        // vocabulary counts. The dry run follows no values here (the weights
        // are not the vocabulary's inputs, and may be more elements than it
        // numbers inputs by; the lab checks a pass's output on the GPU).
        let weights = Weights::ALL.map(|w| Some(dry.host(w.buffer(), shape.layers * shape.layer_bytes_in(w.precision()) / 4, false)));
        let (k, resident) = (setup.placement.ring, setup.placement.resident);
        let kept = setup.placement.resident_layers(shape.layers);
        let layer_elements = shape.layer_bytes_in(setup.kind.precision()) / 4;
        let ring = (0..k + kept.len()).map(|i| dry.device(&slot_name(i, k, &kept), layer_elements)).collect();
        let task = Task { layers: shape.layers, slots: k, resident, weights: setup.weights(), copy, compute };
        Pass::new(dry, task, shape, batch, setup, ring, weights)
    }

    /// The ops the dry run recorded so far, with what orders them.
    pub fn ops(&self) -> &Schedule {
        &self.x.schedule
    }
}

impl<X> Pass<X> {
    /// A pass about to be issued on `x` as `setup` says: `task` (its streams
    /// and the host copy it uploads from, as `x` knows them), its layer
    /// buffers `ring` (the ring's slots, then the resident layers') and
    /// the weights' host copies `weights` (by [`Weights`]; None where `x`
    /// has no such copy), each as `x` knows it.
    pub(super) fn new(x: X, task: Task, shape: Shape, batch: usize, setup: PassSetup, ring: Vec<DevRef>, weights: [Option<HostRef>; 4]) -> Pass<X> {
        let kept = setup.placement.resident_layers(shape.layers);
        let books = Books::new(setup.placement.ring, &kept);
        Pass { x, task, shape, batch, hidden: setup.hidden, kind: setup.kind, ring, kept, weights, books }
    }

    /// The executor, with the pass's books (what the GPU side runs).
    pub(super) fn into_parts(self) -> (X, Books) {
        (self.x, self.books)
    }

    fn check_slot(&mut self, slot: usize, what: &str) -> Result<()> {
        if slot >= self.task.slots + self.task.resident {
            let resident = match self.task.resident {
                0 => String::new(),
                r => format!(", resident layers' {} to {}", self.task.slots, self.task.slots + r - 1),
            };
            return Err(LabError::config(format!("{what}: slot {slot} is not in the ring (slots 0 to {}{resident})", self.task.slots as i64 - 1)));
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
        let lb = self.shape.layer_bytes_in(self.kind.precision()) as u64;
        let (ab, hb) = (self.shape.act_bytes(self.batch) as u64, self.shape.hidden_bytes(self.batch) as u64);
        let name = slot_name(slot, self.task.slots, &self.kept);
        let mut a = vec![Access::read(&name, 0, lb), Access::read(ACT[layer % 2], 0, ab), Access::write(ACT[(layer + 1) % 2], 0, ab)];
        if self.hidden == HiddenActivations::Fixed {
            a.push(Access::write(HIDDEN, 0, hb));
        }
        if self.kind == LayerKind::Int4 {
            // Its weights in E4M3, written before its GEMMs read them.
            a.push(Access::write(DEQUANTIZED, 0, self.shape.layer_bytes_in(Precision::Fp8) as u64));
        }
        if self.kind.fp8_gemms() {
            // Its scales (its input's, then its own six) and its two amax slots, 16 bytes a slot.
            let bytes = |slot: usize| (16 * slot) as u64;
            let own = fp8_slot::layer(layer);
            let input = fp8_slot::input_of(layer);
            a.push(Access::read(FP8_SCALES, bytes(input), bytes(input + 1)));
            a.push(Access::read(FP8_SCALES, bytes(own), bytes(own + 6)));
            let amax = fp8_slot::amax(self.shape.layers, layer);
            a.push(Access::write(FP8_SCALES, bytes(amax), bytes(amax + 2)));
        }
        a
    }
}

impl<X: LabIssue<LayerOp>> Forward for Pass<X> {
    fn upload(&mut self, s: StreamRef, from: Weights, layer: usize, slot: usize) -> Result<()> {
        let what = format!("upload of layer {layer}");
        self.check_slot(slot, &what)?;
        self.check_layer(layer, &what)?;
        if slot >= self.task.slots {
            return Err(LabError::config(format!("{what}: slot {slot} is {}'s own buffer, not the ring's", slot_name(slot, self.task.slots, &self.kept))));
        }
        if from.precision() != self.kind.precision() {
            return Err(LabError::config(format!("{what}: {} into a pass of {:?} layers", from.buffer(), self.kind.precision())));
        }
        let Some(host) = self.weights[from as usize] else {
            let why = match from {
                Weights::Fp8 | Weights::Int4 => "this GPU has no FP8, so the rig keeps no FP8 or 4-bit weights",
                _ => "the rig was made without this copy of the weights",
            };
            return Err(LabError::Unsupported(format!("{what}: {why}")));
        };
        let label = match from {
            Weights::Pinned => format!("H2D layer {layer}"),
            Weights::Pageable => format!("H2D layer {layer} (pageable)"),
            Weights::Fp8 => format!("H2D layer {layer} (FP8)"),
            Weights::Int4 => format!("H2D layer {layer} (4-bit)"),
        };
        // In f32 elements, as the vocabulary counts: a layer is 16 d² bytes (8 d² in FP8).
        let n = self.shape.layer_bytes_in(from.precision()) / 4;
        self.x.h2d(s, self.ring[slot], 0, host, layer * n, n, &label)?;
        self.books.holds[slot] = Some(layer);
        self.books.uploads += 1;
        self.books.uploaded_from.push(from);
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
/// buffering. Resident layers ([`Task::resident_layers`]) run from their
/// own buffers where they fall, while the copy stream keeps uploading the
/// streamed layers after them.
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
    let kept = t.resident_layers();
    let streamed: Vec<usize> = (0..t.layers).filter(|i| !kept.contains(i)).collect();
    if !streamed.is_empty() && k == 0 {
        return Err(LabError::config(format!("{} layers to stream and no ring to stream them through", streamed.len())));
    }
    let copied = (0..k).map(|_| f.event()).collect::<Result<Vec<_>>>()?;
    let freed = (0..k).map(|_| f.event()).collect::<Result<Vec<_>>>()?;
    for (j, (&e, &layer)) in copied.iter().zip(&streamed).enumerate() {
        f.upload(t.copy, t.weights, layer, j)?;
        f.record(e, t.copy)?;
    }
    let (mut n, mut r) = (0, 0);
    for i in 0..t.layers {
        if kept.get(r) == Some(&i) {
            f.layer(t.compute, i, k + r)?;
            r += 1;
            continue;
        }
        let s = n % k;
        if o.layer_waits_for_upload {
            f.wait(t.compute, copied[s])?;
        }
        if o.cpu_waits_for_upload {
            f.host_wait(copied[s])?;
        }
        f.layer(t.compute, i, s)?;
        f.record(freed[s], t.compute)?;
        if let Some(&next) = streamed.get(n + k) {
            if o.upload_waits_for_layer {
                f.wait(t.copy, freed[s])?;
            }
            f.upload(t.copy, t.weights, next, s)?;
            f.record(copied[s], t.copy)?;
        }
        n += 1;
    }
    Ok(())
}

/// What each op of a pass costs alone, ms: the queue model's input.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Costs {
    /// One layer's upload from pinned memory (in the pass's precision).
    pub h2d: f64,
    /// From pageable memory.
    pub h2d_pageable: f64,
    /// One layer's GEMMs and ReLU (of the pass's kind).
    pub layer: f64,
}

impl Costs {
    /// One upload from the host copy `from` (the FP8 and 4-bit copies are
    /// pinned: their cost is `h2d`, the pass's precision being theirs).
    pub fn upload(&self, from: Weights) -> f64 {
        match from {
            Weights::Pageable => self.h2d_pageable,
            Weights::Pinned | Weights::Fp8 | Weights::Int4 => self.h2d,
        }
    }
}

impl Pass<DryRun> {
    /// The queue model's time for this pass (recorded on the dry run), ms:
    /// each upload costs what one from its host copy costs alone (the
    /// books say which copy each read, in issue order, as the schedule
    /// holds the uploads), each layer one layer's GEMMs.
    pub fn predicted_ms(&self, costs: Costs, machine: Machine) -> f64 {
        let ops = &self.x.schedule.ops;
        let uploads = ops.iter().filter(|op| op.kind == OpKind::H2d).map(|op| op.id);
        let from: std::collections::HashMap<_, Weights> = uploads.zip(self.books.uploaded_from.iter().copied()).collect();
        let times = crate::pipeline::predict::predict(&self.x.schedule, machine, |op| match op.kind {
            OpKind::H2d => from.get(&op.id).map_or(costs.h2d, |&w| costs.upload(w)),
            OpKind::Kernel => costs.layer,
            _ => 0.0,
        });
        times.iter().map(|t| t.1).fold(0.0, f64::max)
    }
}

/// The queue model's time of `body` as `setup` runs it over `batch`
/// tokens of `shape`, ms (recorded on the dry run).
pub fn predict_pass(
    shape: Shape,
    batch: usize,
    setup: PassSetup,
    body: &dyn Fn(&mut dyn Forward, &Task) -> Result<()>,
    costs: Costs,
    machine: Machine,
) -> Result<f64> {
    let mut f = Pass::dry_run(shape, batch, setup);
    let task = f.task;
    body(&mut f, &task)?;
    Ok(f.predicted_ms(costs, machine))
}

/// The queue model's time of the ring pass as `setup` places it, ms.
pub fn predict(shape: Shape, batch: usize, setup: PassSetup, costs: Costs, machine: Machine) -> Result<f64> {
    predict_pass(shape, batch, setup, &|f, t| ring(f, t), costs, machine)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_on_the_dry_run_records_what_each_upload_and_layer_touches() {
        let shape = Shape { layers: 3, d: 64 };
        let setup = PassSetup {
            placement: Placement { resident: 0, ring: 2 },
            streams: Streams { copy_high: true },
            hidden: HiddenActivations::Fixed,
            kind: LayerKind::Separate,
        };
        let mut f = Pass::dry_run(shape, 8, setup);
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
        let setup = PassSetup {
            placement: Placement { resident: 0, ring: 2 },
            streams: Streams { copy_high: false },
            hidden: HiddenActivations::Pool,
            kind: LayerKind::Separate,
        };
        let mut f = Pass::dry_run(shape, 64, setup);
        let (copy, compute) = (f.task.copy, f.task.compute);
        f.upload(copy, Weights::Pageable, 95, 1).unwrap();
        f.layer(compute, 95, 1).unwrap();
        let s = f.ops();
        let lb = shape.layer_bytes() as u64;
        assert_eq!(s.ops[0].accesses[0], Access::read("weights (pageable)", 95 * lb, 96 * lb));
        assert_eq!(s.ops[1].accesses.len(), 3, "no hidden buffer: the pool's is the layer's own");
        assert!(!s.races().is_empty(), "the layer did not wait for its upload");
    }

    /// A 4-bit pass uploads the 4-bit copy's bytes of a layer, and each
    /// layer writes the dequantization's buffer before FP8's GEMMs read
    /// their scales: the schedule sees both, and no race between layers
    /// on one stream.
    #[test]
    fn a_4_bit_layer_reads_its_packed_slot_and_writes_the_dequantized_layer() {
        let shape = Shape { layers: 4, d: 128 };
        let setup = PassSetup {
            placement: Placement { resident: 1, ring: 2 },
            streams: Streams { copy_high: true },
            hidden: HiddenActivations::Fixed,
            kind: LayerKind::Int4,
        };
        assert_eq!(setup.weights(), Weights::Int4);
        let mut f = Pass::dry_run(shape, 16, setup);
        let task = f.task;
        ring(&mut f, &task).unwrap();
        let s = f.ops();
        assert!(s.races().is_empty(), "{:?}", s.races());
        let lb4 = shape.layer_bytes_in(Precision::Int4) as u64;
        let up = s.ops.iter().find(|o| o.label == "H2D layer 2 (4-bit)").unwrap();
        assert_eq!(up.accesses[0], Access::read("weights (4-bit, pinned)", 2 * lb4, 3 * lb4));
        // Layer 0 is resident; layers 1, 2 and 3 stream through slots 0, 1, 0.
        let l2 = s.ops.iter().find(|o| o.label == "layer 2").unwrap();
        assert_eq!(l2.accesses[0].buffer, "ring slot 1".to_string(), "{:?}", l2.accesses);
        assert!(l2.accesses.contains(&Access::write(DEQUANTIZED, 0, shape.layer_bytes_in(Precision::Fp8) as u64)), "{:?}", l2.accesses);
        let amax = 16 * fp8_slot::amax(4, 2) as u64;
        assert!(l2.accesses.contains(&Access::write(FP8_SCALES, amax, amax + 32)), "{:?}", l2.accesses);
        // FP8's weights are not a 4-bit pass's.
        assert!(f.upload(task.copy, Weights::Fp8, 1, 0).unwrap_err().to_string().contains("into a pass of Int4"));
    }

    #[test]
    fn resident_layers_run_from_their_own_buffers_while_the_ring_fills() {
        let shape = Shape { layers: 6, d: 64 };
        let setup = PassSetup {
            placement: Placement { resident: 2, ring: 2 },
            streams: Streams { copy_high: true },
            hidden: HiddenActivations::Fixed,
            kind: LayerKind::Fp8,
        };
        let mut f = Pass::dry_run(shape, 16, setup);
        let task = f.task;
        ring(&mut f, &task).unwrap();
        let s = f.ops();
        assert!(s.races().is_empty(), "{:?}", s.races());
        assert!(f.books.wrong_weights.is_empty(), "{:?}", f.books.wrong_weights);
        // An FP8 layer writes its own two amax slots and reads its scales.
        let l1 = s.ops.iter().find(|o| o.label == "layer 1").unwrap();
        let amax = 16 * fp8_slot::amax(6, 1) as u64;
        assert!(l1.accesses.contains(&Access::write(FP8_SCALES, amax, amax + 32)), "{:?}", l1.accesses);
        assert_eq!((f.books.ran.as_slice(), f.books.uploads), ([0, 1, 2, 3, 4, 5].as_slice(), 4));
        // Layers 0 and 3 are resident (spread evenly), each in its own buffer.
        let lb8 = shape.layer_bytes_in(Precision::Fp8) as u64;
        for (layer, buffer) in [("layer 0", "resident layer 0"), ("layer 3", "resident layer 3"), ("layer 1", "ring slot 0")] {
            let op = s.ops.iter().find(|o| o.label == layer).unwrap();
            assert_eq!(op.accesses[0], Access::read(buffer, 0, lb8), "{layer}");
        }
        let up = s.ops.iter().find(|o| o.label == "H2D layer 5 (FP8)").unwrap();
        assert_eq!(up.accesses[0], Access::read("weights (FP8, pinned)", 5 * lb8, 6 * lb8));
        // The first streamed uploads are issued before the resident layers run.
        let first_up = s.ops.iter().position(|o| o.label == "H2D layer 1 (FP8)").unwrap();
        assert!(first_up < s.ops.iter().position(|o| o.label == "layer 0").unwrap());
        assert!(s.ops.iter().all(|o| o.label != "H2D layer 3 (FP8)"), "a resident layer is never uploaded in a pass");
        // An upload into a resident buffer, or of the other precision, is refused.
        let (copy, _) = (task.copy, task.compute);
        assert!(f.upload(copy, Weights::Fp8, 0, 2).unwrap_err().to_string().contains("resident layer 0's own buffer"));
        assert!(f.upload(copy, Weights::Pinned, 2, 0).unwrap_err().to_string().contains("into a pass of Fp8"));
        // Every layer resident: no ring, no uploads.
        let all = PassSetup { placement: Placement { resident: 6, ring: 0 }, ..setup };
        let mut f = Pass::dry_run(shape, 16, all);
        let task = f.task;
        ring(&mut f, &task).unwrap();
        assert_eq!((f.books.ran.len(), f.books.uploads), (6, 0));
    }
}
