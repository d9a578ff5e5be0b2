//! Lab 9's accuracy: what a pass's sampled rows may be off the CPU's
//! reference (FP16's tolerance, FP8's and the 4-bit pass's against its
//! FP8 twin), the check of a pass's output against it, and the 4-bit
//! passes' errors as they are gathered.
//!
//! May use: `network`, `rig` (a pass's output read back), `cpu`, `error`.

use super::cpu::relative_error;
use super::network::Precision;
use super::rig::OffloadRig;
use crate::error::{LabError, Result};

/// The largest relative error a sampled row may have against the CPU's:
/// FP16 rounding after each GEMM, summed in another order, drifts by far
/// less over the network's layers; a wrong or stale layer is off by ~1.
pub const TOLERANCE: f64 = 3e-2;

/// What an FP8 pass's sampled row may be off the FP16 CPU reference,
/// relative, over `layers` layers: E4M3 keeps 3 bits of mantissa, so each
/// layer's rounding of its inputs, weights and outputs moves a row by
/// about 6%, and the layers' errors add like a random walk (0.06·√L;
/// this allows 0.08·√L, at most 0.9). A wrong or stale layer is off by
/// about 1.4 (an unrelated row), which no depth up to 96 layers allows.
pub fn fp8_tolerance(layers: usize) -> f64 {
    (0.08 * (layers as f64).sqrt()).min(0.9)
}

/// What a 4-bit pass's sampled row may be off the CPU's FP8 twin of it
/// over the very E4M3 bytes its dequantization writes
/// (`cpu::forward_rows_e4m3`), over `layers` layers: FP8's tolerance. The
/// two differ only in their sums, but by more than their order: FP8
/// tensor cores keep fewer bits in a sum than FP32 does (about 14 on
/// Hopper), enough to move a share of each layer's E4M3 roundings by a
/// step, so the GPU and its twin drift apart about as an FP8 pass drifts
/// from FP16 (on an H200: 0.061-0.097 at 4 layers, d = 256; 0.178-0.184 at 16,
/// d = 1024; 0.227-0.275 at 96, d = 2048). Held to an FP16 pass instead it
/// could not be held at all: the 4-bit network's activations grow from
/// layer to layer (its weights' rounding adds to their variance), and
/// there a rounding error compounds far faster (on the CPU at d = 256 and
/// 48 layers, rounding the weights to E4M3 moved the FP16 network's rows
/// 0.18 and the 4-bit network's 1.05; a 96-layer 4-bit pass on the GPU
/// was 2.7 to 9.5 off the FP16 pass). A wrong scale, a swapped nibble or
/// a stale layer is off by far more (an unrelated row: about 1.4).
pub fn int4_tolerance(layers: usize) -> f64 {
    fp8_tolerance(layers)
}

/// The worst relative error of a pass's output rows `out` against `want`
/// (NaN where a row holds one).
pub(super) fn worst_off(out: &[Vec<u16>], want: &[Vec<u16>]) -> f64 {
    out.iter().zip(want).map(|(got, w)| relative_error(got, w)).fold(0f64, worse)
}

/// Checks a pass's output `out` on the sampled rows `rows` (as
/// `OffloadRig::output_rows` reads them; a pass with FP8 activations
/// against FP8's tolerance); returns the worst error.
pub(super) fn verify(rig: &OffloadRig, batch: usize, rows: &[usize], out: &[Vec<u16>], want: &[Vec<u16>], what: &str) -> Result<f64> {
    let d = rig.shape.d;
    let tolerance = match rig.precision {
        Precision::Int4 => int4_tolerance(rig.shape.layers),
        Precision::Fp8 => fp8_tolerance(rig.shape.layers),
        Precision::Fp16 => TOLERANCE,
    };
    let mut worst = 0f64;
    for ((&r, w), got) in rows.iter().zip(want).zip(out) {
        let e = relative_error(got, w);
        // A NaN (a row no layer wrote) fails too.
        if e.is_nan() || e > tolerance {
            return Err(LabError::Verification {
                buffer: "the last layer's activations".into(),
                element: r * d,
                detail: format!("{what}, {batch} tokens: row {r} is {e:.2e} off the CPU reference (tolerance {tolerance:.1e})"),
            });
        }
        worst = worst.max(e);
    }
    Ok(worst)
}

/// The 4-bit passes verified so far (see `results::Int4Accuracy`).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Int4Checked {
    pub passes: usize,
    pub max_error: f64,
    pub off_fp16: f64,
    pub range_used: f64,
}

/// The larger error, NaN where either is (a row no layer wrote stays one).
fn worse(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

impl Int4Checked {
    pub(super) fn merge(self, o: Int4Checked) -> Int4Checked {
        Int4Checked {
            passes: self.passes + o.passes,
            max_error: worse(self.max_error, o.max_error),
            off_fp16: worse(self.off_fp16, o.off_fp16),
            range_used: worse(self.range_used, o.range_used),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use super::super::network::Shape;

    /// The CPU's FP8 twin of a 4-bit pass (`cpu::forward_rows_e4m3` over
    /// the E4M3 bytes the dequantization writes): near the FP16 pass over
    /// the same 4-bit values (E4M3's rounding, a few layers), and far from
    /// itself where one byte's nibbles are swapped or one matrix's scale
    /// is wrong, so a 4-bit pass held to it within its tolerance is
    /// caught at either.
    #[test]
    fn the_fp8_twin_of_a_4_bit_pass_catches_a_swapped_nibble_or_a_wrong_scale() {
        use super::super::cpu::{forward_rows_e4m3, forward_rows_with, relative_error, E4m3Layer};
        use super::super::int4::{e4m3_layer, layer_parts, quantize_network, test_weights as weights, values_layer};
        use super::super::rig::{activation_scale, E4M3_MAX};
        let shape = Shape { layers: 6, d: 128 };
        let per_layer = shape.layer_bytes_in(Precision::Int4);
        let mut out = vec![0u64; shape.layers * per_layer / 8];
        let w_scales = quantize_network(&weights(shape), shape, &mut out);
        let bytes: Vec<u8> = bytemuck::cast_slice(&out).to_vec();
        let layer_bytes = |b: &[u8], l: usize| b[l * per_layer..(l + 1) * per_layer].to_vec();
        let x: Vec<Vec<u16>> = (0..3).map(|r| (0..shape.d).map(|k| half::f16::from_f32((((r * 31 + k * 17) % 200) as f32 / 100.0) - 1.0).to_bits()).collect()).collect();
        let (values_pass, amax) = forward_rows_with(shape, &x, &|l| std::borrow::Cow::Owned(values_layer(&layer_bytes(&bytes, l), shape.d)));
        let twin = |layer: &(dyn Fn(usize) -> E4m3Layer + Sync)| forward_rows_e4m3(shape, &x, amax.input / E4M3_MAX, &activation_scale, layer).0;
        let of = |b: &[u8], s: &[(f32, f32)]| {
            let (b, s) = (b.to_vec(), s.to_vec());
            move |l: usize| e4m3_layer(&layer_bytes(&b, l), shape.d, s[l])
        };
        let worst = |a: &[Vec<u16>], b: &[Vec<u16>]| a.iter().zip(b).map(|(g, w)| relative_error(g, w)).fold(0f64, f64::max);
        let good = twin(&of(&bytes, &w_scales));
        let e = worst(&good, &values_pass);
        assert!(e > 0.0 && e < fp8_tolerance(shape.layers), "the FP8 twin is {e:.3} off the FP16 pass over the same values");
        // Layer 3's W1 with every byte's nibbles swapped.
        let mut swapped = bytes.clone();
        let (at, n) = layer_parts(shape.d)[0];
        swapped[3 * per_layer + at..3 * per_layer + at + n].iter_mut().for_each(|b| *b = b.rotate_left(4));
        let e = worst(&twin(&of(&swapped, &w_scales)), &good);
        let caught = 2.0 * int4_tolerance(shape.layers);
        assert!(e > caught, "swapped nibbles only {e:.3} off");
        // Layer 4's W2 dequantized with twice its scale (its GEMM reads the right one).
        let e = worst(
            &twin(&|l| {
                let mut layer = e4m3_layer(&layer_bytes(&bytes, l), shape.d, w_scales[l]);
                if l == 4 {
                    let wrong = e4m3_layer(&layer_bytes(&bytes, l), shape.d, (w_scales[l].0, 2.0 * w_scales[l].1));
                    layer.w2t = wrong.w2t;
                }
                layer
            }),
            &good,
        );
        assert!(e > caught, "a wrong scale only {e:.3} off");
    }
}
