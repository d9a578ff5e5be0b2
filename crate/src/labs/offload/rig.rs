//! Lab 9's rig on a GPU: the model's weights twice in host memory
//! (page-locked, and ordinary pageable memory holding the same bytes), the
//! GPU's ring of layer buffers, the activations, cuBLAS, the ReLU kernel and
//! the streams; and one layer's GPU work (GEMM, ReLU, GEMM) as the driver
//! and library calls of one op.

use super::cpu::rows_of;
use super::kernel::Relu;
use super::Shape;
use crate::error::Result;
use crate::gpu::{trace, Blas, DeviceBuffer, Gpu, HostBuffer, MatrixF16, PageableBuffer, PinnedBuffer, Stream, StreamKind};
use crate::measure::pattern;
use rayon::prelude::*;

/// Two FP16 NaNs: what every buffer the pass writes holds before a run, so
/// a result no layer wrote cannot pass for one.
pub const POISON: u32 = 0x7E00_7E00;

/// Where a layer's hidden activations (batch x 4d) live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hidden {
    /// One buffer made up front, reused by every layer.
    Fixed,
    /// Taken from the stream-ordered pool for each layer and given back
    /// after it (cuMemAllocAsync, cuMemFreeAsync on the compute stream).
    Pool,
}

pub struct OffloadRig {
    pub gpu: Gpu,
    pub shape: Shape,
    pub blas: Blas,
    pub(super) relu: Relu,
    /// The weights, layer after layer (W1 then W2), page-locked.
    pub(super) pinned: PinnedBuffer,
    /// The same bytes in ordinary (pageable) memory.
    pub(super) pageable: PageableBuffer,
    /// The GPU's ring of layer buffers, each one layer's weights.
    pub(super) ring: Vec<DeviceBuffer>,
    /// The activations between layers: layer i reads `act[i % 2]` and writes `act[(i + 1) % 2]`.
    pub(super) act: [DeviceBuffer; 2],
    /// A layer's hidden activations (batch x 4d), where they are made up front.
    pub(super) hidden: DeviceBuffer,
    /// The batch's input (batch x d FP16), fresh for each batch size.
    pub(super) input: PinnedBuffer,
    /// Where a run's output is read back.
    pub(super) output: PinnedBuffer,
    pub(super) compute: Stream,
    pub(super) copy: Stream,
    /// A copy stream at the device's highest priority.
    pub(super) copy_high: Stream,
    setup: Stream,
    pub max_batch: usize,
}

/// Uniform FP16 values in [-scale, scale], four from each word of the pattern.
fn fill_uniform(words: &mut [u64], seed: u64, first_word: u64, scale: f32) {
    words.par_chunks_mut(1 << 14).enumerate().for_each(|(c, chunk)| {
        for (j, w) in chunk.iter_mut().enumerate() {
            let r = pattern::word(seed, first_word + ((c << 14) + j) as u64);
            let mut out = 0u64;
            for q in 0..4 {
                let u = ((r >> (16 * q)) & 0xFFFF) as f32 / 65535.0;
                out |= (half::f16::from_f32(scale * (2.0 * u - 1.0)).to_bits() as u64) << (16 * q);
            }
            *w = out;
        }
    });
}

impl OffloadRig {
    /// The rig for `shape`, batches up to `max_batch` and a ring of `slots`.
    pub fn new(gpu: &Gpu, shape: Shape, max_batch: usize, slots: usize) -> Result<OffloadRig> {
        let _r = trace::range("lab 9: set-up (weights, ring, activations)");
        let (d, lb) = (shape.d, shape.layer_bytes());
        gpu.ensure_free(shape.gpu_bytes(max_batch, slots) as u64 + (64 << 20), &format!("a ring of {slots} layers and the activations of {max_batch} tokens"))?;
        let mut pinned = PinnedBuffer::new(gpu, shape.network_bytes())?;
        // He-style scales keep the activations' size from layer to layer:
        // W1 (d x 4d) in ±sqrt(3/d), W2 (4d x d) in ±sqrt(1.5/d) (ReLU halves the second moment).
        let seed = pattern::fresh_seed();
        let (s1, s2) = ((3.0 / d as f64).sqrt() as f32, (1.5 / d as f64).sqrt() as f32);
        let layer_words = lb / 8;
        pinned.words_mut().par_chunks_mut(layer_words).enumerate().for_each(|(l, w)| {
            let (w1, w2) = w.split_at_mut(layer_words / 2);
            fill_uniform(w1, seed, (l * layer_words) as u64, s1);
            fill_uniform(w2, seed, (l * layer_words + layer_words / 2) as u64, s2);
        });
        let mut pageable = PageableBuffer::new(shape.network_bytes())?;
        pageable.words_mut().par_chunks_mut(1 << 20).zip(pinned.words().par_chunks(1 << 20)).for_each(|(a, b)| a.copy_from_slice(b));
        // (least, greatest): the greatest priority is the lowest number.
        let (_, highest) = gpu.stream_priority_range()?;
        let rig = OffloadRig {
            gpu: gpu.clone(),
            shape,
            blas: Blas::new(gpu)?,
            relu: Relu::load(gpu)?,
            pinned,
            pageable,
            ring: (0..slots).map(|_| gpu.alloc(lb)).collect::<Result<_>>()?,
            act: [gpu.alloc(shape.act_bytes(max_batch))?, gpu.alloc(shape.act_bytes(max_batch))?],
            hidden: gpu.alloc(shape.hidden_bytes(max_batch))?,
            input: PinnedBuffer::new(gpu, shape.act_bytes(max_batch))?,
            output: PinnedBuffer::new(gpu, shape.act_bytes(max_batch))?,
            compute: gpu.stream()?,
            copy: gpu.stream()?,
            copy_high: gpu.stream_of(StreamKind::NonBlocking, highest)?,
            setup: gpu.stream()?,
            max_batch,
        };
        // What --gpu-budget was checked against must be what the rig holds.
        let counted = shape.gpu_bytes(max_batch, slots);
        if rig.gpu_bytes() > counted {
            return Err(crate::error::LabError::config(format!(
                "the rig holds {} of GPU memory, but --gpu-budget counted {} for it",
                crate::units::Bytes(rig.gpu_bytes() as u64),
                crate::units::Bytes(counted as u64)
            )));
        }
        Ok(rig)
    }

    /// The GPU memory the rig holds for a pass: the ring, both activation
    /// buffers, the hidden activations made up front, and the workspace
    /// cuBLAS uses (the one it is given, and keeps).
    pub fn gpu_bytes(&self) -> usize {
        let buffers = self.ring.iter().chain(&self.act).chain([&self.hidden]);
        buffers.map(DeviceBuffer::bytes).sum::<usize>() + self.blas.workspace_bytes()
    }

    /// A fresh input for `batch` tokens (uniform in [-1, 1]); returns its
    /// rows `rows` as FP16 bits.
    pub fn fresh_input(&mut self, batch: usize, rows: &[usize]) -> Vec<Vec<u16>> {
        let words = self.shape.act_bytes(batch) / 8;
        fill_uniform(&mut self.input.words_mut()[..words], pattern::fresh_seed(), 0, 1.0);
        rows_of(self.input.words(), rows, self.shape.d)
    }

    /// Set-up before a run (untimed): every buffer the pass writes
    /// poisoned, the input in `act[0]`.
    pub fn prepare(&self, batch: usize) -> Result<()> {
        for b in self.ring.iter().chain([&self.act[1], &self.hidden]) {
            self.setup.fill_u32(b, POISON)?;
        }
        self.setup.upload(&self.act[0], &self.input, self.shape.act_bytes(batch))
    }

    /// Runs one layer at `batch` tokens on the set-up stream, with its
    /// hidden activations made up front and from the pool, and waits
    /// (untimed): cuBLAS loads its kernels and picks its algorithms at a
    /// shape's first call, which would otherwise land inside the first
    /// timed pass (and hold its start gate shut).
    pub fn warm(&self, batch: usize) -> Result<()> {
        self.prepare(batch)?;
        for hidden in [Some(&self.hidden), None] {
            let work = LayerWork {
                blas: &self.blas,
                relu: &self.relu,
                shape: self.shape,
                batch,
                slot: &self.ring[0],
                input: &self.act[0],
                output: &self.act[1],
                hidden,
            };
            // SAFETY: the rig's own buffers, synchronized below.
            unsafe { work.enqueue(&self.setup) }?;
        }
        self.setup.synchronize()
    }

    /// Rows `rows` of a pass's output over `batch` tokens, as FP16 bits
    /// (read back untimed).
    pub fn output_rows(&mut self, batch: usize, rows: &[usize]) -> Result<Vec<Vec<u16>>> {
        let last = &self.act[self.shape.layers % 2];
        self.setup.download(&mut self.output, last, self.shape.act_bytes(batch))?;
        Ok(rows_of(self.output.words(), rows, self.shape.d))
    }

    /// The weights' bytes as FP16 bits (for the CPU reference).
    pub fn weights(&self) -> &[u64] {
        self.pinned.words()
    }
}

/// One layer's work, as the calls of one op: hidden = act_in · W1, ReLU,
/// act_out = hidden · W2.
pub(super) struct LayerWork<'r> {
    pub blas: &'r Blas,
    pub relu: &'r Relu,
    pub shape: Shape,
    pub batch: usize,
    pub slot: &'r DeviceBuffer,
    pub input: &'r DeviceBuffer,
    pub output: &'r DeviceBuffer,
    pub hidden: Option<&'r DeviceBuffer>,
}

impl LayerWork<'_> {
    /// Enqueues the layer on `st`; with no hidden buffer, its hidden
    /// activations come from the pool on `st` and go back after it.
    ///
    /// # Safety
    /// Every buffer stays allocated until the stream has run the layer.
    pub(super) unsafe fn enqueue(&self, st: &Stream) -> Result<()> {
        let (d, n) = (self.shape.d, self.batch);
        let w = self.slot.span();
        let w1 = MatrixF16 { span: w, at: 0, rows: d, cols: 4 * d };
        let w2 = MatrixF16 { span: w, at: 8 * d * d, rows: 4 * d, cols: d };
        let x = MatrixF16 { span: self.input.span(), at: 0, rows: n, cols: d };
        let y = MatrixF16 { span: self.output.span(), at: 0, rows: n, cols: d };
        let pooled = match self.hidden {
            Some(_) => None,
            None => Some(st.alloc_async(self.shape.hidden_bytes(n))?),
        };
        let h_span = match (self.hidden, &pooled) {
            (Some(h), _) => h.span(),
            (None, Some(p)) => p.span(),
            (None, None) => unreachable!("made above"),
        };
        let h = MatrixF16 { span: h_span, at: 0, rows: n, cols: 4 * d };
        // SAFETY: the caller keeps the buffers alive until the stream ran
        // the layer; a pooled hidden buffer is freed on the same stream,
        // after the calls that use it.
        unsafe {
            self.blas.matmul_f16(st, h, x, w1)?;
            self.relu.enqueue(st, h_span, n * 4 * d)?;
            self.blas.matmul_f16(st, y, h, w2)?;
        }
        match pooled {
            Some(p) => p.free(),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_counts_the_workspace_cublas_uses() {
        // With no layers and no tokens, all a pass holds on the GPU is
        // cuBLAS's workspace: the one the rig's Blas gives it, and keeps.
        let shape = Shape { layers: 4, d: 256 };
        assert_eq!(shape.gpu_bytes(0, 0), crate::gpu::blas::WORKSPACE_BYTES);
    }
}
