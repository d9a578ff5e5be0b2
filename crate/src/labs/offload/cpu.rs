//! The CPU's reference for lab 9: the same forward pass for a few sampled
//! rows of the batch, FP16 values summed in FP32 and rounded to FP16 where
//! the GPU rounds them (after each GEMM), with the same ReLU. The GPU's
//! output is judged row by row against it: summation order differs, so
//! the rows agree to a relative error, not bit for bit. And the FP8
//! pass's twin ([`forward_rows_e4m3`]): E4M3 values summed in FP32 and
//! rounded to E4M3 where the GPU's FP8 GEMMs round them, each scale set
//! from the values it rounds, which a 4-bit pass is held to.
//!
//! May use: `network` and `kernel::relu_bits` (the ReLU on FP16 bits, the
//! kernel's own rule). No CUDA.

use super::kernel::relu_bits;
use super::network::Shape;
use rayon::prelude::*;

/// Every FP16 bit pattern's value (a table is faster than converting).
fn f16_table() -> Vec<f32> {
    (0..=u16::MAX).map(|b| half::f16::from_bits(b).to_f32()).collect()
}

/// The FP16 weights of layer `layer`: (W1, W2) as bit patterns, W1 d x 4d
/// and W2 4d x d row-major, from the weights' words.
fn layer_weights(words: &[u64], shape: Shape, layer: usize) -> &[u64] {
    let lw = shape.layer_bytes() / 8;
    &words[layer * lw..(layer + 1) * lw]
}

/// The `k`-th half of `words`, as bits.
pub(super) fn half_bits(words: &[u64], k: usize) -> u16 {
    (words[k / 4] >> (16 * (k % 4))) as u16
}

/// FP16 values (bits) as the words the weights are held in, four a word
/// (`half_bits`'s inverse); a last word of fewer than four is zero-filled.
pub fn words_of_halves(halves: &[u16]) -> Vec<u64> {
    halves.chunks(4).map(|c| c.iter().enumerate().map(|(q, &b)| (b as u64) << (16 * q)).sum()).collect()
}

/// Rows `rows` of a row-major matrix of `d` halves a row held in `words`.
pub fn rows_of(words: &[u64], rows: &[usize], d: usize) -> Vec<Vec<u16>> {
    rows.iter().map(|&r| (r * d..(r + 1) * d).map(|k| half_bits(words, k)).collect()).collect()
}

/// `out[r][j] = round16(sum_k x[r][k] * w[k][j])` for rows of `x` (values),
/// `w` a `rows_w` x `cols` FP16 matrix starting at half `at` of `words`.
fn product(x: &[Vec<f32>], words: &[u64], at: usize, rows_w: usize, cols: usize, table: &[f32]) -> Vec<Vec<u16>> {
    // Columns in parallel, each block of columns over every row of w once:
    // a row's stretch of w is converted once, for every row of x (each
    // sum still adds its terms in the order of k).
    const BLOCK: usize = 256;
    let blocks: Vec<Vec<Vec<f32>>> = (0..cols.div_ceil(BLOCK))
        .into_par_iter()
        .map(|b| {
            let (j0, j1) = (b * BLOCK, ((b + 1) * BLOCK).min(cols));
            let mut acc = vec![vec![0f32; j1 - j0]; x.len()];
            let mut w = vec![0f32; j1 - j0];
            for k in 0..rows_w {
                let row = at + k * cols;
                if x.iter().all(|xr| xr[k] == 0.0) {
                    continue;
                }
                for (j, wj) in (j0..j1).zip(w.iter_mut()) {
                    *wj = table[half_bits(words, row + j) as usize];
                }
                for (xr, a) in x.iter().zip(acc.iter_mut()) {
                    let v = xr[k];
                    if v == 0.0 {
                        continue;
                    }
                    for (a, &wj) in a.iter_mut().zip(&w) {
                        *a += v * wj;
                    }
                }
            }
            acc
        })
        .collect();
    (0..x.len()).map(|r| blocks.iter().flat_map(|b| b[r].iter().map(|&v| half::f16::from_f32(v).to_bits())).collect()).collect()
}

/// The largest magnitudes of a pass's activations over the sampled rows:
/// the input's, and per layer (its hidden activations after the ReLU, its
/// output). FP8's scales are set from them.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerAmax {
    pub input: f32,
    pub layers: Vec<(f32, f32)>,
}

/// The pass's output for `rows` (each d FP16 values as bits), through
/// every layer, and the activations' largest magnitudes on the way.
pub fn forward_rows(words: &[u64], shape: Shape, rows: &[Vec<u16>]) -> (Vec<Vec<u16>>, LayerAmax) {
    forward_rows_with(shape, rows, &|layer| std::borrow::Cow::Borrowed(layer_weights(words, shape, layer)))
}

/// [`forward_rows`] with each layer's FP16 weights (its words, W1 then W2)
/// given by `layer`: weights held in another form (4 bits) are turned
/// into FP16 a layer at a time, never all at once.
pub fn forward_rows_with<'w>(shape: Shape, rows: &[Vec<u16>], layer_words: &dyn Fn(usize) -> std::borrow::Cow<'w, [u64]>) -> (Vec<Vec<u16>>, LayerAmax) {
    let table = f16_table();
    let d = shape.d;
    let amax_of = |m: &[Vec<f32>]| m.iter().flatten().fold(0f32, |a, v| a.max(v.abs()));
    let mut x: Vec<Vec<u16>> = rows.to_vec();
    let mut amax = LayerAmax { input: 0.0, layers: Vec::with_capacity(shape.layers) };
    for layer in 0..shape.layers {
        let w = layer_words(layer);
        let w = &w[..];
        let xv: Vec<Vec<f32>> = x.iter().map(|r| r.iter().map(|&b| table[b as usize]).collect()).collect();
        if layer == 0 {
            amax.input = amax_of(&xv);
        }
        let h = product(&xv, w, 0, d, 4 * d, &table);
        let hv: Vec<Vec<f32>> = h.iter().map(|r| r.iter().map(|&b| table[relu_bits(b) as usize]).collect()).collect();
        x = product(&hv, w, 4 * d * d, 4 * d, d, &table);
        let yv: Vec<Vec<f32>> = x.iter().map(|r| r.iter().map(|&b| table[b as usize]).collect()).collect();
        amax.layers.push((amax_of(&hv), amax_of(&yv)));
    }
    (x, amax)
}

/// One layer's weights as FP8's GEMMs read them: W1ᵀ (4d x d) and W2ᵀ
/// (d x 4d), each output's inputs in a run, as E4M3 values (unscaled),
/// with each matrix's scale.
#[derive(Clone, Debug, PartialEq)]
pub struct E4m3Layer {
    pub w1t: Vec<f32>,
    pub s1: f32,
    pub w2t: Vec<f32>,
    pub s2: f32,
}

/// `v` rounded to E4M3 as the GPU's epilogue rounds it: to nearest,
/// saturated at ±448 (`satfinite`); its value.
fn e4m3_saturated(v: f32) -> f32 {
    float8::F8E4M3::from_f32(v.clamp(-448.0, 448.0)).to_f32()
}

/// The FP8 pass on the CPU for `rows` (FP16 bits), as the GPU's FP8
/// GEMMs compute it, not as FP16 would: the input rounded to E4M3 with its
/// scale `input_scale`; per layer each product summed in FP32 from E4M3
/// values, times its two inputs' scales, the ReLU after the first, then
/// rounded to E4M3 (saturating) with a scale set from that output's
/// largest magnitude over the rows (`scale_of(amax)`, as the rig sets its
/// scales: calibrated on the very pass it checks); `layer` gives each
/// layer's weights. Returns the last layer's output as FP16 bits (each
/// value times its scale, as the rig reads it back) and the largest
/// magnitudes its scales were set from (`input` left 0: its scale is given).
pub fn forward_rows_e4m3(
    shape: Shape,
    rows: &[Vec<u16>],
    input_scale: f32,
    scale_of: &(dyn Fn(f32) -> f32 + Sync),
    layer: &(dyn Fn(usize) -> E4m3Layer + Sync),
) -> (Vec<Vec<u16>>, LayerAmax) {
    let d = shape.d;
    let table = f16_table();
    let mut x: Vec<Vec<f32>> = rows.iter().map(|r| r.iter().map(|&b| e4m3_saturated(table[b as usize] / input_scale)).collect()).collect();
    let mut amax = LayerAmax { input: 0.0, layers: Vec::with_capacity(shape.layers) };
    // Each row's outputs before rounding: alpha * sum_k x[r][k] * w[j * n + k] (each output's inputs in a run), the ReLU where asked.
    let product = |x: &[Vec<f32>], w: &[f32], n: usize, cols: usize, alpha: f32, relu: bool| -> Vec<Vec<f32>> {
        x.iter()
            .map(|xr| {
                (0..cols)
                    .into_par_iter()
                    .map(|j| {
                        let v = alpha * xr.iter().zip(&w[j * n..(j + 1) * n]).map(|(a, b)| a * b).sum::<f32>();
                        if relu {
                            v.max(0.0)
                        } else {
                            v
                        }
                    })
                    .collect()
            })
            .collect()
    };
    // Rounded to E4M3 with the scale their largest magnitude sets: (values, scale, that magnitude).
    let rounded = |v: Vec<Vec<f32>>| {
        let m = v.iter().flatten().fold(0f32, |a, x| a.max(x.abs()));
        let s = scale_of(m);
        let inverse = 1.0 / s;
        (v.into_iter().map(|r| r.into_iter().map(|x| e4m3_saturated(x * inverse)).collect()).collect::<Vec<Vec<f32>>>(), s, m)
    };
    let mut s_x = input_scale;
    for l in 0..shape.layers {
        let w = layer(l);
        let (h, s_h, m_h) = rounded(product(&x, &w.w1t, d, 4 * d, s_x * w.s1, true));
        let (y, s_y, m_y) = rounded(product(&h, &w.w2t, 4 * d, d, s_h * w.s2, false));
        amax.layers.push((m_h, m_y));
        (x, s_x) = (y, s_y);
    }
    (x.iter().map(|r| r.iter().map(|&v| half::f16::from_f32(v * s_x).to_bits()).collect()).collect(), amax)
}

/// How far `got` is from `want`, relative: |got - want| / |want| over the
/// row (root mean squares); infinite where `got` holds a NaN.
pub fn relative_error(got: &[u16], want: &[u16]) -> f64 {
    let (mut diff, mut norm) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        let (g, w) = (half::f16::from_bits(g).to_f64(), half::f16::from_bits(w).to_f64());
        if !g.is_finite() {
            return f64::INFINITY;
        }
        diff += (g - w) * (g - w);
        norm += w * w;
    }
    (diff / norm.max(f64::MIN_POSITIVE)).sqrt()
}

/// The rows of a batch the reference checks: the first, the middle, the last.
pub fn sampled_rows(batch: usize) -> Vec<usize> {
    let mut r = vec![0, batch / 2, batch - 1];
    r.dedup();
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-layer network of d = 4 with hand-picked weights: the reference
    /// rounds, applies ReLU between the products, and sums as written.
    #[test]
    fn the_reference_is_two_products_with_relu_between() {
        let shape = Shape { layers: 1, d: 4 };
        let h = |v: f32| half::f16::from_f32(v).to_bits();
        // W1 (4 x 16): column j of row k is 1 where j == k, -1 where j == k + 4.
        let mut halves = vec![0u16; 8 * 16];
        for k in 0..4 {
            halves[k * 16 + k] = h(1.0);
            halves[k * 16 + k + 4] = h(-1.0);
        }
        // W2 (16 x 4): rows 0..4 the identity, rows 4..8 minus it.
        for k in 0..4 {
            halves[64 + k * 4 + k] = h(1.0);
            halves[64 + (k + 4) * 4 + k] = h(-1.0);
        }
        let words = words_of_halves(&halves);
        // hidden = [x, -x, 0...]; relu -> [max(x,0), max(-x,0)]; out = max(x,0) - max(-x,0) = x.
        let x = vec![vec![h(1.5), h(-2.0), h(0.25), h(0.0)]];
        let (out, amax) = forward_rows(&words, shape, &x);
        assert_eq!(out, x);
        assert_eq!(amax, LayerAmax { input: 2.0, layers: vec![(2.0, 2.0)] });
        assert!(relative_error(&out[0], &x[0]) < 1e-12);
        let nan = vec![0x7E00u16; 4];
        assert!(relative_error(&nan, &x[0]).is_infinite());
        assert_eq!(sampled_rows(1), vec![0]);
        assert_eq!(sampled_rows(8), vec![0, 4, 7]);
    }

    /// The FP8 twin on a one-layer network of d = 4 whose weights pass
    /// each value through (out = ReLU(x) - ReLU(-x)), with values every
    /// scale represents exactly: it gives the input back, sets each scale
    /// from the largest magnitude it rounds, and saturates at 448 where a
    /// scale is too small for its values, as the GPU's epilogue does.
    #[test]
    fn the_fp8_twin_rounds_where_the_gpu_does_with_scales_from_its_own_values() {
        let shape = Shape { layers: 1, d: 4 };
        // W1ᵀ (16 x 4): output j < 4 is input j, output j + 4 is minus it; W2ᵀ (4 x 16) adds them back.
        let mut w1t = vec![0f32; 16 * 4];
        let mut w2t = vec![0f32; 4 * 16];
        for k in 0..4 {
            w1t[k * 4 + k] = 1.0;
            w1t[(k + 4) * 4 + k] = -1.0;
            w2t[k * 16 + k] = 1.0;
            w2t[k * 16 + k + 4] = -1.0;
        }
        let layer = |_: usize| E4m3Layer { w1t: w1t.clone(), s1: 1.0, w2t: w2t.clone(), s2: 1.0 };
        let h = |v: f32| half::f16::from_f32(v).to_bits();
        let x = vec![vec![h(1.5), h(-2.0), h(0.25), h(0.0)]];
        // Scales of m / 256: every value here lands on an E4M3 value (96, 128, 16; 192, 256, 32).
        let (out, amax) = forward_rows_e4m3(shape, &x, 1.0 / 64.0, &|m| m / 256.0, &layer);
        assert_eq!(out, x);
        assert_eq!(amax, LayerAmax { input: 0.0, layers: vec![(2.0, 2.0)] });
        // A scale of m / 1000 puts each largest magnitude at 1000, past
        // E4M3's 448: clipped there, as `satfinite` clips. The hidden -2
        // (scale 0.002) becomes 448, the output 0.002 x 448 = 0.896 (scale
        // 0.000896) becomes 448 again: -448 x 0.000896 read back.
        let (out, _) = forward_rows_e4m3(shape, &x, 1.0 / 64.0, &|m| m / 1000.0, &layer);
        let got: Vec<f32> = out[0].iter().map(|&b| half::f16::from_bits(b).to_f32()).collect();
        assert!((got[1] - (-448.0 * 0.000896)).abs() < 1e-3 && (got[0] + got[1]).abs() < 1e-6, "{got:?}");
    }
}
