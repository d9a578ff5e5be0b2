//! Lab 9's pass on a GPU: the vocabulary's executor with the rig's layers
//! ([`Layers`]: what a GPU runs for each [`LayerOp`], on the runner), and
//! a [`Pass`] made from the rig as placed ([`Pass::live`]), run or
//! captured as a CUDA graph.
//!
//! May use: `network`, `forward` (the pass it runs), `rig` (the buffers
//! it runs on), `kernel` (the ReLU's and the dequantization's types),
//! `error`, `gpu` (the runner) and `pipeline` (its calls).

use super::forward::{slot_name, Books, HiddenActivations, LayerOp, Pass, PassSetup, Task, Weights};
use super::network::{LayerKind, Shape};
use super::rig::{Int4Weights, LayerWork, OffloadRig};
use crate::error::{LabError, Result};
use crate::gpu::runner::{Enqueue, LabOnGpu, LabRunner, NoHostTask};
use crate::gpu::{Blas, DeviceBuffer, Graph, Run, Runner};
use crate::pipeline::lab_op::NoCall;

/// A 4-bit pass's dequantization: the kernel, the buffer it writes each
/// layer's E4M3 bytes into, and each layer's FP8 scales (W1's, W2's).
type Dequantization<'r> = (&'r super::kernel::Dequant, &'r DeviceBuffer, &'r [(f32, f32)]);

/// The rig's parts a layer uses on the GPU (the host weights are the
/// runner's, for the uploads) and the pass's sizes.
pub struct Layers<'r> {
    blas: &'r Blas,
    relu: &'r super::kernel::Relu,
    kind: LayerKind,
    scales: Option<&'r DeviceBuffer>,
    ring: &'r [DeviceBuffer],
    act: &'r [DeviceBuffer; 2],
    /// The hidden activations' buffer; None: each layer takes them from the pool.
    hidden: Option<&'r DeviceBuffer>,
    /// A 4-bit pass's dequantization.
    int4: Option<Dequantization<'r>>,
    shape: Shape,
    batch: usize,
}

// SAFETY: a layer's calls touch only the rig's buffers, borrowed for 'r so
// they outlive the runner, and, with no hidden buffer, one it takes from
// the pool and frees on its own stream after the calls that use it; its
// accesses name its slot, both activation buffers and the hidden one, and
// for an FP8 or 4-bit layer the scales it reads and the two amax slots it
// writes, and for a 4-bit layer the dequantization's buffer
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
            layer: op.layer,
            kind: self.kind,
            scales: self.scales,
            slot,
            input: &act[op.layer % 2],
            output: &act[(op.layer + 1) % 2],
            hidden: self.hidden,
            int4: self.int4.map(|(kernel, out, scales)| (kernel, out, scales[op.layer])),
        };
        // SAFETY: every buffer stays allocated until the runner has
        // synchronized (this impl's contract, above).
        Ok(Box::new(move |st| unsafe { work.enqueue(st) }))
    }
}

impl<'r> Pass<LabRunner<'r, Layers<'r>>> {
    /// A pass on the GPU: the runner `p` (made by the caller: deferring,
    /// capturing), the rig's buffers as placed ([`OffloadRig::place`]: the
    /// setup's placement and precision).
    pub fn live(mut p: Runner<'r>, rig: &'r mut OffloadRig, batch: usize, setup: PassSetup) -> Result<Self> {
        let placed = (rig.placement, rig.precision);
        if placed != (setup.placement, setup.kind.precision()) || batch == 0 || batch > rig.max_batch {
            return Err(LabError::config(format!(
                "a pass of {batch} tokens with {} in {:?}: the rig holds {} in {:?} and has room for {} tokens",
                setup.placement.label(),
                setup.kind.precision(),
                placed.0.label(),
                placed.1,
                rig.max_batch
            )));
        }
        let OffloadRig { shape, blas, relu, pinned, pageable, fp8, int4, dequantized, ring, act, hidden: hid, scales, compute, copy, copy_high, .. } = rig;
        let streams = setup.streams;
        let copy_ref = p.stream(if streams.copy_high { copy_high } else { copy }, if streams.copy_high { "copy (high priority)" } else { "copy" });
        let compute_ref = p.stream(compute, "compute");
        let pageable_ref = pageable.as_mut().map(|w| p.host(w, Weights::Pageable.buffer()));
        let fp8_ref = fp8.as_mut().map(|(w, _)| p.host(w, Weights::Fp8.buffer()));
        let (int4_ref, int4) = match int4 {
            Some(Int4Weights { host, scales, dequant, .. }) => {
                let host = p.host(host, Weights::Int4.buffer());
                (Some(host), dequantized.as_ref().map(|out| (&*dequant, out, scales.as_slice())))
            }
            None => (None, None),
        };
        let weights = [Some(p.host(pinned, Weights::Pinned.buffer())), pageable_ref, fp8_ref, int4_ref];
        let k = setup.placement.ring;
        let kept = setup.placement.resident_layers(shape.layers);
        let ring_refs = ring.iter().enumerate().map(|(i, d)| p.device(d, &slot_name(i, k, &kept))).collect();
        let task = Task { layers: shape.layers, slots: k, resident: setup.placement.resident, weights: setup.weights(), copy: copy_ref, compute: compute_ref };
        let (shape, hid): (Shape, &'r DeviceBuffer) = (*shape, hid);
        let hidden = (setup.hidden == HiddenActivations::Fixed).then_some(hid);
        let layers = Layers { blas, relu, kind: setup.kind, scales: scales.as_ref(), ring, act, hidden, int4, shape, batch };
        Ok(Pass::new(LabRunner::new(p, layers), task, shape, batch, setup, ring_refs, weights))
    }

    /// Runs the pass's recorded calls and waits for them.
    pub fn finish(self) -> Result<(Run, Books)> {
        let (x, books) = self.into_parts();
        Ok((x.runner.finish()?, books))
    }

    /// Ends a capturing pass: its graph and schedule.
    pub fn finish_capture(self) -> Result<(Graph, Run, Books)> {
        let (x, books) = self.into_parts();
        let (g, run) = x.runner.finish_capture()?;
        Ok((g, run, books))
    }
}
