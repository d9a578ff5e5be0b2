//! Lab 9's rig on a GPU: the model's weights in host memory (page-locked,
//! ordinary pageable memory holding the same bytes, and page-locked FP8
//! and 4-bit copies where the GPU has FP8 tensor cores; each copy made
//! only where the run asks for it: [`Copies`]), the GPU's layer buffers (a
//! ring, and the layers kept resident: [`Placement`]), the activations,
//! FP8's scales (a 4-bit pass's its own), cuBLAS, the ReLU and
//! dequantization kernels and the streams; one layer's GPU work as the
//! library calls of one op ([`LayerKind`]: GEMM, ReLU, GEMM; the ReLU in
//! the first GEMM's epilogue; both GEMMs in FP8, each quantizing its
//! output in its epilogue; or the 4-bit layer dequantized into E4M3, then
//! FP8's two); and what the CPU holds a 4-bit pass to (its FP8 twin over
//! the same E4M3 bytes, which also sets its scales:
//! [`OffloadRig::calibrate_int4`]).
//!
//! May use: `network`, `cpu` (the FP16 values the weights hold, the
//! sampled rows' largest activations), `int4` (the 4-bit copy and its
//! layout), `host_copies` (the weights' host copies, E4M3's tables),
//! `kernel` (the ReLU, the 4-bit dequantization), `error`,
//! `gpu` and `measure::pattern`.

use super::cpu::{forward_rows_e4m3, half_bits, rows_of, LayerAmax};
pub use super::host_copies::{Copies, E4M3_MAX};
use super::host_copies::{f16_amax, host_weights, E4m3Table, UniformF16};
use super::int4;
use super::kernel::{Dequant, Relu};
pub use super::network::{fp8_slot, LayerKind, Precision};
use super::network::{Placement, Shape};
use crate::error::{LabError, Result};
use crate::gpu::{trace, Blas, DeviceBuffer, DeviceSpan, Fp8Scales, Gpu, HostBuffer, MatrixE4M3, MatrixF16, PageableBuffer, PinnedBuffer, ScalarF32, Stream, StreamKind};
use crate::measure::pattern;
use rayon::prelude::*;

/// Two FP16 NaNs: what every buffer the pass writes holds before a run, so
/// a result no layer wrote cannot pass for one. (Read as FP8 its bytes are
/// 0 and 448, not NaN: an unwritten FP8 row is off the reference by far
/// more than FP8's tolerance, and fails on that.)
pub const POISON: u32 = 0x7E00_7E00;

/// How far above the CPU's sampled rows' largest activation an FP8 scale
/// reaches: the whole batch holds larger ones than three rows do (about
/// 1.5x for a batch of 24576), and E4M3 is a floating-point format, so
/// room above costs range below (3 of its 18 binades), not precision.
pub const FP8_MARGIN: f32 = 8.0;

/// The weights in 4 bits on the host, where the rig has them.
pub(super) struct Int4Weights {
    /// Page-locked, layer after layer, each as [`int4::layer_parts`] lays it out.
    pub host: PinnedBuffer,
    /// Each layer's FP8 scales (W1's, W2's) its dequantization writes E4M3 with.
    pub scales: Vec<(f32, f32)>,
    /// The dequantization kernel.
    pub dequant: Dequant,
}

pub struct OffloadRig {
    pub gpu: Gpu,
    pub shape: Shape,
    pub blas: Blas,
    pub(super) relu: Relu,
    /// The weights, layer after layer (W1 then W2), page-locked.
    pub(super) pinned: PinnedBuffer,
    /// The same bytes in ordinary (pageable) memory, where asked for.
    pub(super) pageable: Option<PageableBuffer>,
    /// The weights in FP8, page-locked, each matrix transposed (a row per
    /// output, as FP8 GEMMs read them: W1ᵀ then W2ᵀ), where the GPU has
    /// FP8; with each matrix's scale (W1's, W2's) per layer.
    pub(super) fp8: Option<(PinnedBuffer, Vec<(f32, f32)>)>,
    /// The weights in 4 bits, where asked for and possible ([`Copies::int4`]).
    pub(super) int4: Option<Int4Weights>,
    /// Where a 4-bit layer is dequantized into E4M3 (one FP8 layer's
    /// bytes), while the rig is placed for 4 bits.
    pub(super) dequantized: Option<DeviceBuffer>,
    /// The GPU's layer buffers, each one layer's weights: the ring's
    /// `placement.ring` slots first, then the resident layers', buffer
    /// `ring + r` holding the r-th of them for good
    /// ([`Placement::resident_layers`]).
    pub(super) ring: Vec<DeviceBuffer>,
    /// How the layer buffers are used, and the weights' precision in them.
    pub(super) placement: Placement,
    pub(super) precision: Precision,
    /// FP8's scales and amax slots ([`fp8_slot`]), where there is FP8.
    pub(super) scales: Option<DeviceBuffer>,
    /// Their host side, page-locked once: the scales go up through it and
    /// the amax comes back through it.
    scales_host: Option<PinnedBuffer>,
    /// The FP8 scales of the activations set last ([`OffloadRig::set_fp8_scales`]), on the host.
    pub(super) host_scales: Vec<f32>,
    /// The same for a 4-bit pass (empty where there is none).
    host_scales_int4: Vec<f32>,
    /// Whose weights' scales the GPU's scale buffer holds now (FP8's or
    /// the 4-bit weights' E4M3 ones), if any.
    scales_for: Option<Precision>,
    /// The batch's input in FP8 (batch x d bytes), where there is FP8.
    input_fp8: Option<PinnedBuffer>,
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

impl OffloadRig {
    /// The rig for `shape`, batches up to `max_batch` and a ring of
    /// `slots`, with the host copies of the weights `copies` asks for (FP8
    /// only where the GPU has it).
    pub fn new(gpu: &Gpu, shape: Shape, max_batch: usize, slots: usize, copies: Copies) -> Result<OffloadRig> {
        let _r = trace::range("lab 9: set-up (weights, ring, activations)");
        let lb = shape.layer_bytes();
        gpu.ensure_free(shape.gpu_bytes(max_batch, slots) as u64 + (64 << 20), &format!("a ring of {slots} layers and the activations of {max_batch} tokens"))?;
        // (least, greatest): the greatest priority is the lowest number.
        let (_, highest) = gpu.stream_priority_range()?;
        let blas = Blas::new(gpu)?;
        // The 4-bit pass runs on FP8's scales and E4M3 input: with FP8 only.
        let copies = Copies { fp8: copies.fp8 && blas.has_fp8(), int4: copies.int4 && copies.fp8 && blas.has_fp8() && int4::fits(shape.d), ..copies };
        let (pinned, pageable, fp8, int4) = host_weights(gpu, shape, copies)?;
        let int4 = match int4 {
            Some((host, scales)) => Some(Int4Weights { host, scales, dequant: Dequant::load(gpu)? }),
            None => None,
        };
        let rig = OffloadRig {
            gpu: gpu.clone(),
            shape,
            relu: Relu::load(gpu)?,
            pinned,
            pageable,
            ring: (0..slots).map(|_| gpu.alloc(lb)).collect::<Result<_>>()?,
            placement: Placement { resident: 0, ring: slots },
            precision: Precision::Fp16,
            scales: if fp8.is_some() { Some(gpu.alloc(fp8_slot::bytes(shape.layers))?) } else { None },
            scales_host: if fp8.is_some() { Some(PinnedBuffer::new(gpu, fp8_slot::bytes(shape.layers))?) } else { None },
            host_scales: Vec::new(),
            host_scales_int4: Vec::new(),
            scales_for: None,
            input_fp8: if fp8.is_some() { Some(PinnedBuffer::new(gpu, shape.act_bytes(max_batch) / 2)?) } else { None },
            fp8,
            int4,
            dequantized: None,
            blas,
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
        rig.check_budget(max_batch)?;
        Ok(rig)
    }

    /// What --gpu-budget was checked against must be what the rig holds.
    fn check_budget(&self, batch: usize) -> Result<()> {
        let counted = self.shape.placement_bytes(batch, self.placement, self.precision);
        if self.gpu_bytes() > counted {
            return Err(LabError::config(format!(
                "the rig holds {} of GPU memory, but --gpu-budget counted {} for it",
                crate::units::Bytes(self.gpu_bytes() as u64),
                crate::units::Bytes(counted as u64)
            )));
        }
        Ok(())
    }

    /// The GPU memory the rig holds for a pass: the layer buffers, both
    /// activation buffers, the hidden activations made up front, FP8's
    /// scales where the pass runs FP8 activations, the dequantized layer
    /// where it is placed for 4 bits, and the workspace cuBLAS uses (the
    /// one it is given, and keeps).
    pub fn gpu_bytes(&self) -> usize {
        let scales = self.scales.iter().filter(|_| self.precision.fp8_activations());
        let buffers = self.ring.iter().chain(&self.act).chain([&self.hidden]).chain(scales).chain(&self.dequantized);
        buffers.map(DeviceBuffer::bytes).sum::<usize>() + self.blas.workspace_bytes()
    }

    /// Whether the rig has FP8 (the GPU's tensor cores and cuBLASLt).
    pub fn has_fp8(&self) -> bool {
        self.fp8.is_some()
    }

    /// Whether the rig runs layers of `kind` (the fused ReLU needs
    /// cuBLASLt's epilogue; FP8 and 4 bits, FP8 tensor cores).
    pub fn runs(&self, kind: LayerKind) -> bool {
        match kind {
            LayerKind::Separate => true,
            LayerKind::Fused => self.blas.has_fused_relu(),
            LayerKind::Fp8 => self.has_fp8(),
            LayerKind::Int4 => self.has_int4(),
        }
    }

    /// Whether the rig has the 4-bit weights ([`Copies::int4`]).
    pub fn has_int4(&self) -> bool {
        self.int4.is_some()
    }

    /// Why the rig has no 4-bit weights, in a line (None where it has them).
    pub fn no_int4(&self) -> Option<String> {
        match (&self.int4, &self.fp8) {
            (Some(_), _) => None,
            (None, None) if !self.blas.has_fp8() => Some(format!("{} (the 4-bit pass dequantizes into E4M3 for FP8's GEMMs)", no_fp8(&self.gpu))),
            (None, _) if !int4::fits(self.shape.d) => {
                Some(format!("d = {} does not split into 4-bit groups of {} inputs", self.shape.d, int4::GROUP))
            }
            (None, _) => Some("the rig was made without the 4-bit weights (and the FP8 ones they run on)".into()),
        }
    }

    /// Calibrates the 4-bit pass's FP8 scales for the batch set last
    /// ([`Self::set_fp8_scales`], whose input scale it shares) and returns
    /// what a 4-bit pass must give for `rows` (indices into the batch):
    /// the CPU's FP8 twin of the pass ([`forward_rows_e4m3`]) over the
    /// E4M3 bytes the dequantization writes, each output's scale set from
    /// its largest magnitude there as [`FP8_MARGIN`] sets FP8's, the GPU's
    /// scales set to the same. None where the rig has no 4-bit weights.
    pub fn calibrate_int4(&mut self, rows: &[usize]) -> Result<Option<Vec<Vec<u16>>>> {
        let Some(w) = &self.int4 else { return Ok(None) };
        if self.host_scales.len() != fp8_slot::count(self.shape.layers) {
            return Err(LabError::config("calibrate the 4-bit pass after the FP8 scales are set"));
        }
        let s_x = self.host_scales[fp8_slot::INPUT];
        let (d, lb) = (self.shape.d, self.shape.layer_bytes_in(Precision::Int4));
        let bytes: &[u8] = bytemuck::cast_slice(w.host.words());
        if bytes.len() < self.shape.layers * lb || w.scales.len() < self.shape.layers {
            return Err(LabError::config("the 4-bit weights do not match the network"));
        }
        let layer = |l: usize| int4::e4m3_layer(&bytes[l * lb..(l + 1) * lb], d, w.scales[l]);
        let (want, amax) = forward_rows_e4m3(self.shape, &self.input_rows(rows), s_x, &activation_scale, &layer);
        self.host_scales_int4 = scale_slots(s_x, &w.scales, &amax);
        // The GPU's set is made this one before the next 4-bit pass ([`Self::prepare`]).
        if self.scales_for == Some(Precision::Int4) {
            self.scales_for = None;
        }
        Ok(Some(want))
    }

    /// Makes the layer buffers `placement`'s in `precision`: the ring's
    /// slots, then each resident layer's buffer with its weights uploaded
    /// (untimed). Refused where the GPU has no FP8 and FP8 is asked for, or the rig has
    /// no 4-bit weights and 4 bits are (`Self::no_int4` says why).
    pub fn place(&mut self, placement: Placement, precision: Precision) -> Result<()> {
        if placement == self.placement && precision == self.precision {
            return Ok(());
        }
        let _r = trace::range(&format!("lab 9: place {} resident + a ring of {}", placement.resident, placement.ring));
        if precision == Precision::Fp8 && self.fp8.is_none() {
            return Err(LabError::Unsupported(no_fp8(&self.gpu)));
        }
        if let (Precision::Int4, Some(why)) = (precision, self.no_int4()) {
            return Err(LabError::Unsupported(why));
        }
        if placement.resident > self.shape.layers {
            return Err(LabError::config(format!("{} resident layers: the network has {}", placement.resident, self.shape.layers)));
        }
        // Nothing may still use the old buffers when they are freed; until
        // the new ones are made and filled the rig holds none (a failure
        // below leaves it empty and consistent, never half placed).
        for s in [&self.compute, &self.copy, &self.copy_high, &self.setup] {
            s.synchronize()?;
        }
        self.ring.clear();
        self.dequantized = None;
        self.placement = Placement { resident: 0, ring: 0 };
        let lb = self.shape.layer_bytes_in(precision);
        let buffers = placement.ring + placement.resident;
        // A 4-bit pass dequantizes each layer into one FP8 layer's bytes.
        let dequantized = if precision == Precision::Int4 { self.shape.layer_bytes_in(Precision::Fp8) } else { 0 };
        self.gpu.ensure_free((buffers * lb + dequantized) as u64 + (64 << 20), &format!("{} resident layers and a ring of {}", placement.resident, placement.ring))?;
        self.ring = (0..buffers).map(|_| self.gpu.alloc(lb)).collect::<Result<_>>()?;
        if dequantized > 0 {
            self.dequantized = Some(self.gpu.alloc(dequantized)?);
        }
        for (r, layer) in placement.resident_layers(self.shape.layers).into_iter().enumerate() {
            let host: &dyn HostBuffer = match (precision, &self.fp8, &self.int4) {
                (Precision::Fp8, Some((w, _)), _) => w,
                (Precision::Int4, _, Some(w)) => &w.host,
                _ => &self.pinned,
            };
            self.setup.upload_range(&self.ring[placement.ring + r], host, layer * lb, lb)?;
        }
        self.placement = placement;
        self.precision = precision;
        Ok(())
    }

    /// One layer's dequantization alone, ms, `repeats` times: every layer
    /// of the network dequantized back to back on the compute stream
    /// (each from the ring's slot `layer % K`, as a pass streams them)
    /// between two events, over the layers. The rig must be placed for 4
    /// bits, its slots holding uploaded layers (the costs alone leave it so).
    pub fn dequantization_alone(&self, repeats: usize) -> Result<Vec<f64>> {
        let (Some(w), Some(out)) = (&self.int4, &self.dequantized) else {
            return Err(LabError::config("the dequantization alone needs the rig placed for 4 bits"));
        };
        let k = self.placement.ring.max(1).min(self.ring.len());
        if k == 0 {
            return Err(LabError::config("the dequantization alone needs a layer buffer"));
        }
        let (start, end) = (self.gpu.timing_event()?, self.gpu.timing_event()?);
        let layers = self.shape.layers;
        let mut ms = Vec::with_capacity(repeats);
        for _ in 0..repeats {
            start.record(&self.compute)?;
            for l in 0..layers {
                // SAFETY: the rig's own buffers, synchronized below before
                // anything else uses or frees them.
                unsafe { dequantize_layer(&w.dequant, &self.compute, self.ring[l % k].span(), out.span(), self.shape.d, w.scales[l]) }?;
            }
            end.record(&self.compute)?;
            self.compute.synchronize()?;
            ms.push(start.elapsed_ms(&end)? / layers as f64);
        }
        Ok(ms)
    }

    /// Sets the FP8 scales from the CPU's sampled rows (`amax`: the input's
    /// and each layer's largest magnitudes there), each [`FP8_MARGIN`]
    /// above them, and quantizes the input with its scale: the delayed
    /// scaling of FP8 inference, calibrated once per batch (untimed).
    pub fn set_fp8_scales(&mut self, batch: usize, amax: &LayerAmax) -> Result<()> {
        let (Some((_, w_scales)), Some(input8)) = (&self.fp8, &mut self.input_fp8) else {
            return Err(LabError::Unsupported(no_fp8(&self.gpu)));
        };
        // The input's largest magnitude, over the whole batch (it is on the
        // host): known exactly, no margin. (`amax.input` is the sampled rows'.)
        let n = batch * self.shape.d;
        let input = self.input.words();
        let input_amax = f32::max(amax.input, f16_amax(input, 0..n));
        let s_x = (input_amax / E4M3_MAX).max(f32::MIN_POSITIVE);
        self.host_scales = scale_slots(s_x, w_scales, amax);
        // The 4-bit pass's are set from its own CPU twin ([`Self::calibrate_int4`]).
        self.host_scales_int4 = Vec::new();
        self.scales_for = None;
        // The input, rounded to E4M3 with its scale, eight values a word.
        let e4m3 = E4m3Table::new(s_x);
        input8.words_mut()[..n.div_ceil(8)].par_iter_mut().enumerate().for_each(|(k, w)| {
            let mut out = 0u64;
            for q in 0..8 {
                let i = 8 * k + q;
                if i < n {
                    out |= (e4m3.of(half_bits(input, i)) as u64) << (8 * q);
                }
            }
            *w = out;
        });
        self.upload_scales(Precision::Fp8)
    }

    /// The scales set last for a pass in `precision`: FP8's
    /// ([`Self::set_fp8_scales`]), or the 4-bit pass's (its weights' E4M3
    /// scales, its activations calibrated on its own CPU twin:
    /// [`Self::calibrate_int4`]); empty where none are set.
    fn scales_of(&self, precision: Precision) -> &[f32] {
        if precision == Precision::Int4 {
            &self.host_scales_int4
        } else {
            &self.host_scales
        }
    }

    /// Uploads the scales set last for a pass in `precision`, and waits
    /// for it (the host side is written again next time).
    fn upload_scales(&mut self, precision: Precision) -> Result<()> {
        let s = self.scales_of(precision).to_vec();
        if s.len() != fp8_slot::count(self.shape.layers) {
            return Err(LabError::config(format!("no FP8 scales set for a pass of {precision:?} weights")));
        }
        let (Some(buf), Some(host)) = (&self.scales, &mut self.scales_host) else {
            return Err(LabError::Unsupported(no_fp8(&self.gpu)));
        };
        let words = host.words_mut();
        words.fill(0);
        for (slot, &v) in s.iter().enumerate() {
            fp8_slot::put(words, slot, v);
        }
        self.setup.upload(buf, host, fp8_slot::bytes(self.shape.layers))?;
        self.setup.synchronize()?;
        self.scales_for = Some(precision);
        Ok(())
    }

    /// The largest share of E4M3's range any FP8 activation of the last
    /// pass took (its amax over what its scale reaches): above 1, values
    /// were clipped.
    pub fn fp8_range_used(&mut self) -> Result<f64> {
        let (Some(buf), Some(host)) = (&self.scales, &mut self.scales_host) else { return Ok(0.0) };
        let layers = self.shape.layers;
        self.setup.download(host, buf, fp8_slot::bytes(layers))?;
        let f = |slot: usize| fp8_slot::get(host.words(), slot);
        let mut worst = 0f64;
        let set = if self.precision == Precision::Int4 { &self.host_scales_int4 } else { &self.host_scales };
        if set.len() != fp8_slot::count(layers) {
            return Err(LabError::config("no FP8 scales set for the pass checked"));
        }
        for l in 0..layers {
            let at = fp8_slot::layer(l);
            for (amax, scale) in [(f(fp8_slot::amax(layers, l)), set[at + 2]), (f(fp8_slot::amax(layers, l) + 1), set[at + 4])] {
                worst = worst.max(amax as f64 / (E4M3_MAX * scale) as f64);
            }
        }
        Ok(worst)
    }

    /// A fresh input for `batch` tokens (uniform in [-1, 1]): its seed,
    /// which makes the same input again ([`Self::input_of`]).
    pub fn fresh_input(&mut self, batch: usize) -> u64 {
        let seed = pattern::fresh_seed();
        self.input_of(batch, seed);
        seed
    }

    /// The input of `seed` for `batch` tokens, in the rig's input buffer.
    pub fn input_of(&mut self, batch: usize, seed: u64) {
        let words = self.shape.act_bytes(batch) / 8;
        UniformF16::new(1.0).fill(&mut self.input.words_mut()[..words], seed, 0);
    }

    /// Rows `rows` of the input, as FP16 bits.
    pub fn input_rows(&self, rows: &[usize]) -> Vec<Vec<u16>> {
        rows_of(self.input.words(), rows, self.shape.d)
    }

    /// Set-up before a run (untimed): every buffer the pass writes
    /// poisoned (the dequantization's too: a layer that read another's
    /// weights fails), the input in `act[0]`, and for FP8 activations the
    /// GPU's scales made the placed precision's set (refused where none
    /// was set for it).
    pub fn prepare(&mut self, batch: usize) -> Result<()> {
        if self.precision.fp8_activations() && self.scales_for != Some(self.precision) {
            self.upload_scales(self.precision)?;
        }
        for b in self.ring[..self.placement.ring].iter().chain([&self.act[1], &self.hidden]).chain(&self.dequantized) {
            self.setup.fill_u32(b, POISON)?;
        }
        match (self.precision, &self.input_fp8) {
            (p, Some(input8)) if p.fp8_activations() => self.setup.upload(&self.act[0], input8, batch * self.shape.d),
            _ => self.setup.upload(&self.act[0], &self.input, self.shape.act_bytes(batch)),
        }
    }

    /// Runs one layer at `batch` tokens on the set-up stream, with its
    /// hidden activations made up front and from the pool, and waits
    /// (untimed): cuBLAS loads its kernels and picks its algorithms at a
    /// shape's first call, which would otherwise land inside the first
    /// timed pass (and hold its start gate shut).
    pub fn warm(&mut self, batch: usize) -> Result<()> {
        if self.precision != Precision::Fp16 {
            return Err(LabError::config("warm the rig on FP16 slots, which every kind of layer fits"));
        }
        self.prepare(batch)?;
        let kinds: &[LayerKind] =
            if self.has_fp8() { &[LayerKind::Separate, LayerKind::Fused, LayerKind::Fp8] } else { &[LayerKind::Separate, LayerKind::Fused] };
        let runs = kinds.iter().map(|&k| (k, Some(&self.hidden))).chain([(LayerKind::Separate, None)]);
        for (kind, hidden) in runs {
            if kind != LayerKind::Separate && !self.blas.has_fused_relu() {
                continue;
            }
            let work = LayerWork {
                blas: &self.blas,
                relu: &self.relu,
                shape: self.shape,
                batch,
                layer: 0,
                kind,
                scales: self.scales.as_ref(),
                slot: &self.ring[0],
                input: &self.act[0],
                output: &self.act[1],
                hidden,
                int4: None,
            };
            // SAFETY: the rig's own buffers, synchronized below.
            unsafe { work.enqueue(&self.setup) }?;
        }
        self.setup.synchronize()
    }

    /// Rows `rows` of a pass's output over `batch` tokens, as FP16 bits
    /// (read back untimed).
    pub fn output_rows(&mut self, batch: usize, rows: &[usize]) -> Result<Vec<Vec<u16>>> {
        let (layers, d) = (self.shape.layers, self.shape.d);
        let last = &self.act[layers % 2];
        if self.precision == Precision::Fp16 {
            self.setup.download(&mut self.output, last, self.shape.act_bytes(batch))?;
            return Ok(rows_of(self.output.words(), rows, d));
        }
        // FP8 activations (FP8's and 4-bit passes): each byte times the
        // last layer's output scale, as FP16.
        self.setup.download(&mut self.output, last, batch * d)?;
        let scale = *self.scales_of(self.precision).get(fp8_slot::layer(layers - 1) + 4).ok_or_else(|| LabError::config("no FP8 scales set for the pass read back"))?;
        let bytes = self.output.words();
        let byte = |i: usize| (bytes[i / 8] >> (8 * (i % 8))) as u8;
        Ok(rows
            .iter()
            .map(|&r| (r * d..(r + 1) * d).map(|i| half::f16::from_f32(float8::F8E4M3::from_bits(byte(i)).to_f32() * scale).to_bits()).collect())
            .collect())
    }

    /// The weights' bytes as FP16 bits (for the CPU reference).
    pub fn weights(&self) -> &[u64] {
        self.pinned.words()
    }
}

/// One layer's work, as the calls of one op: hidden = act_in · W1, ReLU,
/// act_out = hidden · W2, as `kind` says.
pub(super) struct LayerWork<'r> {
    pub blas: &'r Blas,
    pub relu: &'r Relu,
    pub shape: Shape,
    pub batch: usize,
    /// Its place in the network (FP8's scales are per layer).
    pub layer: usize,
    pub kind: LayerKind,
    /// FP8's scales and amax slots ([`fp8_slot`]).
    pub scales: Option<&'r DeviceBuffer>,
    pub slot: &'r DeviceBuffer,
    pub input: &'r DeviceBuffer,
    pub output: &'r DeviceBuffer,
    pub hidden: Option<&'r DeviceBuffer>,
    /// A 4-bit layer's dequantization: the kernel, where it writes the
    /// layer's E4M3 bytes, and the layer's FP8 scales (W1's, W2's).
    pub int4: Option<(&'r Dequant, &'r DeviceBuffer, (f32, f32))>,
}

impl LayerWork<'_> {
    /// Enqueues the layer on `st`; with no hidden buffer, its hidden
    /// activations come from the pool on `st` and go back after it.
    ///
    /// # Safety
    /// Every buffer stays allocated until the stream has run the layer.
    pub(super) unsafe fn enqueue(&self, st: &Stream) -> Result<()> {
        match self.kind {
            // SAFETY: the caller's promise (# Safety), the slot the weights.
            LayerKind::Fp8 => return unsafe { self.enqueue_fp8(st, self.slot.span()) },
            // SAFETY: the caller's promise (# Safety).
            LayerKind::Int4 => return unsafe { self.enqueue_int4(st) },
            LayerKind::Separate | LayerKind::Fused => {}
        }
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
            if self.kind == LayerKind::Fused {
                self.blas.matmul_f16_relu(st, h, x, w1)?;
            } else {
                self.blas.matmul_f16(st, h, x, w1)?;
                self.relu.enqueue(st, h_span, n * 4 * d)?;
            }
            self.blas.matmul_f16(st, y, h, w2)?;
        }
        match pooled {
            Some(p) => p.free(),
            None => Ok(()),
        }
    }

    /// The 4-bit layer: W1 and W2 dequantized from the slot into E4M3, in
    /// the FP8 weights' layout, then the FP8 layer over them.
    ///
    /// # Safety
    /// As for [`Self::enqueue`], and the dequantization's buffer too.
    unsafe fn enqueue_int4(&self, st: &Stream) -> Result<()> {
        let Some((dequant, out, scales)) = self.int4 else {
            return Err(LabError::config("a 4-bit layer needs the rig's dequantization and its buffer"));
        };
        // SAFETY: the caller keeps the slot, the dequantization's buffer
        // and the scale buffer alive until the stream ran the layer (# Safety).
        unsafe {
            dequantize_layer(dequant, st, self.slot.span(), out.span(), self.shape.d, scales)?;
            self.enqueue_fp8(st, out.span())
        }
    }

    /// The FP8 layer with its weights in `w`: hidden = q(ReLU(x · W1) /
    /// s_h), out = q(hidden · W2 / s_y), two cuBLASLt products whose
    /// epilogues round to E4M3 and write each output's amax (weights
    /// stored transposed: W1ᵀ (4d x d) then W2ᵀ (d x 4d)).
    ///
    /// # Safety
    /// As for [`Self::enqueue`], and the scale buffer and `w` too.
    unsafe fn enqueue_fp8(&self, st: &Stream, w: DeviceSpan) -> Result<()> {
        let (d, n, l) = (self.shape.d, self.batch, self.layer);
        let (Some(scales), Some(hidden)) = (self.scales, self.hidden) else {
            return Err(LabError::config("an FP8 layer needs the rig's scales and its hidden buffer"));
        };
        let w1t = MatrixE4M3 { span: w, at: 0, rows: 4 * d, cols: d };
        let w2t = MatrixE4M3 { span: w, at: 4 * d * d, rows: d, cols: 4 * d };
        let x = MatrixE4M3 { span: self.input.span(), at: 0, rows: n, cols: d };
        let h = MatrixE4M3 { span: hidden.span(), at: 0, rows: n, cols: 4 * d };
        let y = MatrixE4M3 { span: self.output.span(), at: 0, rows: n, cols: d };
        let f = |slot| ScalarF32 { span: scales.span(), index: fp8_slot::float(slot) };
        let (at, amax) = (fp8_slot::layer(l), fp8_slot::amax(self.shape.layers, l));
        let first = Fp8Scales { x: f(fp8_slot::input_of(l)), w: f(at), out: f(at + 3), amax: f(amax) };
        let second = Fp8Scales { x: f(at + 2), w: f(at + 1), out: f(at + 5), amax: f(amax + 1) };
        // SAFETY: the caller keeps every buffer alive until the stream ran
        // the layer (# Safety).
        unsafe {
            self.blas.matmul_e4m3(st, h, x, w1t, first, true)?;
            self.blas.matmul_e4m3(st, y, h, w2t, second, false)
        }
    }
}

/// Enqueues one 4-bit layer's dequantization on `st`: its two matrices
/// from `slot` (laid out as [`int4::layer_parts`] says, width `d`) into
/// `out` as FP8's layer (W1ᵀ, then W2ᵀ), with the FP8 scales `scales`.
///
/// # Safety
/// Both spans stay allocated until the stream has run it.
unsafe fn dequantize_layer(dequant: &Dequant, st: &Stream, slot: DeviceSpan, out: DeviceSpan, d: usize, scales: (f32, f32)) -> Result<()> {
    let [p1, q1, p2, q2] = int4::layer_parts(d);
    let part = |span: DeviceSpan, (at, bytes): (usize, usize)| {
        span.part(at, bytes).ok_or_else(|| LabError::config(format!("a 4-bit layer of d = {d}: bytes {at}..{} lie outside its buffer of {}", at + bytes, span.bytes())))
    };
    let half = 4 * d * d;
    // SAFETY: the caller keeps both buffers alive until the stream ran
    // the kernels (# Safety); each span is a part of one of them.
    unsafe {
        dequant.enqueue(st, part(slot, p1)?, part(slot, q1)?, part(out, (0, half))?, d, 4 * d, scales.0)?;
        dequant.enqueue(st, part(slot, p2)?, part(slot, q2)?, part(out, (half, half))?, 4 * d, d, scales.1)
    }
}

/// An FP8 activation's scale from its largest magnitude: [`FP8_MARGIN`]
/// above it, over E4M3's largest value.
pub(super) fn activation_scale(amax: f32) -> f32 {
    (amax * FP8_MARGIN / E4M3_MAX).max(f32::MIN_POSITIVE)
}

/// The scale slots ([`fp8_slot`]) of a pass with the input's scale `s_x`,
/// its weights' scales `w` (W1's, W2's a layer) and its activations'
/// largest magnitudes `amax` (each scale [`FP8_MARGIN`] above them).
fn scale_slots(s_x: f32, w: &[(f32, f32)], amax: &LayerAmax) -> Vec<f32> {
    let mut s = vec![0f32; fp8_slot::count(w.len())];
    s[fp8_slot::INPUT] = s_x;
    for (l, (&(w1, w2), &(h, y))) in w.iter().zip(&amax.layers).enumerate() {
        let at = fp8_slot::layer(l);
        let (s_h, s_y) = (activation_scale(h), activation_scale(y));
        s[at..at + 6].copy_from_slice(&[w1, w2, s_h, 1.0 / s_h, s_y, 1.0 / s_y]);
    }
    s
}

/// Why `gpu` runs no FP8, in a line (the error of an FP8 step asked of it).
pub(super) fn no_fp8(gpu: &Gpu) -> String {
    format!("{} has no FP8 tensor cores cuBLASLt can use (compute capability 8.9 and up)", gpu.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pass's scale slots: the input's, then per layer W1's, W2's, the
    /// hidden activations' and its inverse, the output's and its inverse,
    /// each activation's [`FP8_MARGIN`] above its largest magnitude.
    #[test]
    fn the_scale_slots_hold_each_layers_six_scales_in_order() {
        let amax = LayerAmax { input: 0.0, layers: vec![(56.0, 112.0), (0.0, 28.0)] };
        let s = scale_slots(0.25, &[(1.5, 2.5), (3.5, 4.5)], &amax);
        assert_eq!(s.len(), fp8_slot::count(2));
        assert_eq!(s[fp8_slot::INPUT], 0.25);
        // 56 x 8 / 448 = 1, 112 x 8 / 448 = 2; an all-zero output gets the smallest scale, never 0.
        assert_eq!(s[fp8_slot::layer(0)..fp8_slot::layer(0) + 6], [1.5, 2.5, 1.0, 1.0, 2.0, 0.5]);
        assert_eq!(s[fp8_slot::layer(1)..fp8_slot::layer(1) + 6], [3.5, 4.5, f32::MIN_POSITIVE, 1.0 / f32::MIN_POSITIVE, 0.5, 2.0]);
        assert_eq!(activation_scale(56.0), 1.0);
    }
}
