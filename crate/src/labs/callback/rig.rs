//! Lab 4's rig on a GPU: the keys and queries (small integers, so every
//! dot product is exact in f32), the score slots (device scores and their
//! pinned twins), the two streams, the CPU's reference argmins, and the
//! lab's two GPU ops (row_dot into a slot, the D2H of its scores) as ops of
//! a runner.

use super::kernel::{row_dot_argmin_reference, RowDotArgs, RowDotKernel};
use super::op::ScoreOp;
use super::work::ScoresView;
use super::{CallbackConfig, On};
use crate::error::{LabError, Result};
use crate::gpu::runner::Enqueue;
use crate::gpu::trace;
use crate::gpu::{DeviceBuffer, Gpu, HostBuffer, PinnedBuffer, Runner, Stream};
use crate::measure::pattern;
use crate::pipeline::issue::StreamRef;
use crate::pipeline::lab_op::LabOp;
use crate::pipeline::op::OpId;
use rayon::prelude::*;

/// One slot: device scores and their pinned twin (rows f32 + a stamp).
pub(super) struct ScoreSlot {
    pub(super) dev: DeviceBuffer,
    pub(super) host: PinnedBuffer,
}

pub struct CallbackRig {
    pub gpu: Gpu,
    pub(super) kernel: RowDotKernel,
    pub(super) keys: DeviceBuffer,
    pub(super) queries: DeviceBuffer,
    pub(super) slots: Vec<ScoreSlot>,
    pub(super) compute: Stream,
    pub(super) callback: Stream,
    /// The argmin of every query, from the CPU.
    pub(super) reference: Vec<u32>,
    pub rows: usize,
    pub dim: usize,
    pub iterations: usize,
}

/// Small integers, so every dot product is exact in f32 (see row_dot.cu).
fn small_ints(seed: u64, n: usize) -> Vec<i8> {
    let mut v = vec![0i8; n];
    v.par_chunks_mut(1 << 16).enumerate().for_each(|(c, chunk)| {
        for (j, x) in chunk.iter_mut().enumerate() {
            let i = (c << 16) + j;
            *x = ((pattern::word(seed, (i / 8) as u64) >> (8 * (i % 8))) & 15) as i8 - 8;
        }
    });
    v
}

/// Uploads i8 values as f32 into a fresh device buffer.
fn upload_as_f32(gpu: &Gpu, stream: &Stream, values: &[i8]) -> Result<DeviceBuffer> {
    let bytes = values.len() * 4;
    let mut staging = PinnedBuffer::new(gpu, bytes.next_multiple_of(8))?;
    pattern::as_f32_mut(staging.words_mut())[..values.len()].par_iter_mut().zip(values.par_iter()).for_each(|(d, &v)| *d = v as f32);
    let dev = gpu.alloc(bytes)?;
    stream.upload(&dev, &staging, bytes)?;
    Ok(dev)
}

impl CallbackRig {
    pub fn new(gpu: &Gpu, cfg: &CallbackConfig) -> Result<CallbackRig> {
        cfg.validate()?;
        let (rows, dim, n) = (cfg.rows, cfg.dim, cfg.iterations);
        let slot_bytes = ((rows + 1) * 4).next_multiple_of(8);
        gpu.ensure_free((rows * dim * 4 + n * dim * 4 + cfg.slots * slot_bytes) as u64 + (64 << 20), &format!("{rows} keys of {dim} f32"))?;
        let _r = trace::range("lab 4: set-up (keys, queries, reference)");
        let seed = pattern::fresh_seed();
        let keys = small_ints(seed, rows * dim);
        let queries = small_ints(seed ^ 0x5eed, n * dim);
        let compute = gpu.stream()?;
        let keys_dev = upload_as_f32(gpu, &compute, &keys)?;
        let queries_dev = upload_as_f32(gpu, &compute, &queries)?;
        // The CPU reference, independent of the GPU: integer dot products.
        let reference = queries.par_chunks(dim).map(|q| row_dot_argmin_reference(&keys, q).0).collect();
        let mut slots = Vec::with_capacity(cfg.slots);
        for _ in 0..cfg.slots {
            slots.push(ScoreSlot { dev: gpu.alloc(slot_bytes)?, host: PinnedBuffer::new(gpu, slot_bytes)? });
        }
        Ok(CallbackRig {
            gpu: gpu.clone(),
            kernel: RowDotKernel::load(gpu)?,
            keys: keys_dev,
            queries: queries_dev,
            slots,
            compute,
            callback: gpu.stream()?,
            reference,
            rows,
            dim,
            iterations: n,
        })
    }

    /// The rig's stream for `on`.
    pub(super) fn stream(&self, on: On) -> &Stream {
        match on {
            On::Compute => &self.compute,
            On::Callback => &self.callback,
        }
    }
    /// How many score slots the rig has.
    pub(super) fn slots(&self) -> usize {
        self.slots.len()
    }

    pub(super) fn views(&self) -> Vec<ScoresView> {
        // SAFETY: each slot holds rows + 1 u32 (slot_bytes in `new`), starts
        // page-aligned (cuMemHostAlloc), and lives as long as the rig, which
        // joins every thread and syncs every stream before a run returns.
        self.slots.iter().map(|s| unsafe { ScoresView::new(s.host.words().as_ptr() as *const u32, self.rows) }).collect()
    }

    pub(super) fn row_dot_args(&self, t: usize, slot: usize) -> RowDotArgs<'_> {
        RowDotArgs { keys: &self.keys, queries: &self.queries, query: t, rows: self.rows, dim: self.dim, scores: &self.slots[slot].dev, stamp: t as u32 }
    }

    /// Enqueues the copy of `slot`'s scores (and stamp) into its pinned memory on `stream`.
    ///
    /// # Safety
    /// Nothing reads the slot's pinned memory as Rust data until the copy
    /// has completed on `stream` (the argmins read it through
    /// [`ScoresView`], whose volatile loads may race the copy), and the rig
    /// lives until then.
    pub(super) unsafe fn d2h(&self, stream: &Stream, slot: usize) -> Result<()> {
        let s = &self.slots[slot];
        // SAFETY: the caller keeps the rig, and so both buffers, alive until
        // the copy ran, and reads the pinned side only through views (# Safety).
        unsafe { stream.download_async(&s.host, &s.dev, (self.rows + 1) * 4) }
    }

    /// The calls that put `op` on a stream: query `t`'s row_dot into its
    /// slot's device scores, or the D2H of the slot's scores into its
    /// pinned twin (an argmin or a hand-off is no operation on a stream).
    /// What both executors of the loop's operations enqueue: a runner on
    /// its own ([`CallbackRig::op`]) and the loop's GPU side.
    ///
    /// # Safety
    /// The rig lives until every stream the returned calls go to has run
    /// them, and nothing reads a slot's pinned memory as Rust data until its
    /// copy has completed (the argmins read it through [`ScoresView`]).
    pub(super) unsafe fn enqueue(&self, op: &ScoreOp) -> Result<Enqueue<'_>> {
        match *op {
            ScoreOp::RowDot { t, slot } => {
                let args = self.row_dot_args(t, slot.0);
                // SAFETY: the kernel touches only the rig's buffers, alive
                // until the stream ran it (# Safety).
                Ok(Box::new(move |st| unsafe { self.kernel.enqueue(st, &args) }))
            }
            ScoreOp::D2h { slot, .. } => {
                // SAFETY: the copy's two sides are the rig's slot buffers,
                // alive until the stream ran it, and the pinned side is read
                // only through views (# Safety).
                Ok(Box::new(move |st| unsafe { self.d2h(st, slot.0) }))
            }
            _ => Err(LabError::config(format!("{}: not an operation on a stream", op.label()))),
        }
    }

    /// `op` (a row_dot or a D2H of a slot's scores) as an op of `p` on `s`,
    /// with the kind, label and accesses the loop gives it.
    pub(super) fn op<'r>(&'r self, p: &mut Runner<'r>, s: StreamRef, op: ScoreOp) -> Result<OpId> {
        // SAFETY: the rig outlives the runner, which waits for its streams
        // before it ends; only the argmins read the slots, through views.
        let enqueue = unsafe { self.enqueue(&op) }?;
        // SAFETY: the calls touch only the rig's buffers, which outlive the
        // runner; the op's accesses name both sides of the slot's scores.
        unsafe { p.op(s, op.kind(), &op.label(), op.accesses(), enqueue) }
    }
}
