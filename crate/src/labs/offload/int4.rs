//! Lab 9's 4-bit weights, on the CPU: a layer's FP16 matrices quantized to
//! symmetric INT4 with one FP16 scale per group of [`GROUP`] values along
//! the input dimension (4.125 bits a weight; llama.cpp's Q4_0 takes a
//! scale per 32, 4.5 bits), packed two to a byte; the values they stand for (each integer times its
//! group's scale, rounded once to FP16: [`Int4Matrix::value_bits`]); and
//! the E4M3 bytes the GPU's dequantization (`kernel::Dequant`) turns them
//! into for the FP8 GEMMs, bit for bit ([`Int4Matrix::e4m3_bits`]; a GPU
//! test holds the kernel to it). FP8's GEMMs, not FP16's: where the GEMMs
//! bound a pass (the largest batches) an FP16 layer takes far longer than
//! an FP8 one (`layer_fused_ms` against `layer_fp8_ms` in the lab's
//! recordings), so a 4-bit pass through FP16 GEMMs could never come near
//! the FP8 pass there.
//! The rig's copy of a network in 4 bits is made by [`quantize_network`]
//! (each layer laid out as [`layer_parts`] says); [`e4m3_layer`] reads a
//! layer of it back as the E4M3 values the GPU's dequantization writes
//! (the CPU's FP8 twin of a 4-bit pass, `cpu::forward_rows_e4m3`, runs
//! over them: what a 4-bit pass is held to, `measure::int4_tolerance`,
//! and what sets its scales), and the tests' `values_layer` as the FP16
//! values it stands for (the CPU's FP16 pass over them against the FP16
//! weights' says what 4 bits cost: [`INT4_ERROR_PER_SQRT_LAYER`]).
//!
//! The layout: a matrix of `rows` (input) x `cols` (output) values,
//! stored by output, as llama.cpp's Q4_0 and the FP8 weights are (each
//! output's inputs in a run: the transpose of the FP16 weights' row-major
//! matrix, what cuBLASLt's FP8 GEMM reads). Byte `j * rows / 2 + k / 2` holds
//! output j's values of inputs k (low nibble, k even) and k + 1 (high
//! nibble), each as its integer plus 8 (1..=15: -7..=7, symmetric). Scale
//! `j * rows / GROUP + k / GROUP` is the largest magnitude of that group of
//! output j's inputs over 7. The GPU turns them into the FP8 pass's E4M3
//! bytes ([`Int4Matrix::e4m3_scale`], [`Int4Matrix::e4m3_bits`]).
//!
//! May use: `network` and `cpu` (the FP16 words' layout, an FP8 layer's
//! weights). No CUDA. (Its tests also use `measure::TOLERANCE` and
//! `measure::pattern` for their weights.)

use super::cpu::{half_bits, E4m3Layer};
#[cfg(test)]
use super::cpu::words_of_halves;
use super::network::Shape;
use rayon::prelude::*;

/// Values a scale covers, along the input dimension.
pub use super::network::INT4_GROUP as GROUP;

/// The largest integer a 4-bit weight takes (symmetric: -7..=7).
const LEVELS: f32 = 7.0;

/// One matrix in 4 bits: the packed integers and the groups' FP16 scales.
#[derive(Clone, Debug, PartialEq)]
pub struct Int4Matrix {
    pub rows: usize,
    pub cols: usize,
    /// Two values a byte, output by output (the module's doc says how).
    pub packed: Vec<u8>,
    /// One FP16 scale (bits) per output and group of its inputs, output
    /// by output.
    pub scales: Vec<u16>,
}

impl Int4Matrix {
    /// Quantizes the `rows` x `cols` FP16 matrix starting at half `at` of
    /// `words` (row-major). `rows` must be a multiple of [`GROUP`].
    pub fn quantize(words: &[u64], at: usize, rows: usize, cols: usize) -> Int4Matrix {
        assert!(rows % GROUP == 0, "a {rows} x {cols} matrix does not split into groups of {GROUP} rows");
        // The values output by output (each output's inputs in a run),
        // made a block of B outputs at a time, the row-major matrix read
        // along its rows: read down its columns instead, each value would
        // be a cache miss of its own (a row of W1 is 16 KiB at d = 2048).
        const B: usize = 64;
        let mut by_output = vec![0f32; rows * cols];
        by_output.par_chunks_mut(B * rows).enumerate().for_each(|(b, block)| {
            let (j0, jn) = (b * B, block.len() / rows);
            for k in 0..rows {
                let from = at + k * cols + j0;
                for jj in 0..jn {
                    block[jj * rows + k] = half::f16::from_bits(half_bits(words, from + jj)).to_f32();
                }
            }
        });
        // Each output: its groups' scales, then its packed inputs.
        let outputs: Vec<(Vec<u16>, Vec<u8>)> = by_output
            .par_chunks(rows)
            .map(|values| {
                let scales: Vec<u16> = values.chunks(GROUP).map(|g| half::f16::from_f32(g.iter().fold(0f32, |a, v| a.max(v.abs())) / LEVELS).to_bits()).collect();
                let mut packed = vec![0u8; rows / 2];
                for (k, &v) in values.iter().enumerate() {
                    let scale = half::f16::from_bits(scales[k / GROUP]).to_f32();
                    let q = if scale > 0.0 { (v / scale).round().clamp(-LEVELS, LEVELS) } else { 0.0 };
                    packed[k / 2] |= ((q as i32 + 8) as u8) << (4 * (k % 2));
                }
                (scales, packed)
            })
            .collect();
        let (scales, packed): (Vec<Vec<u16>>, Vec<Vec<u8>>) = outputs.into_iter().unzip();
        Int4Matrix { rows, cols, packed: packed.concat(), scales: scales.concat() }
    }

    /// The integer of input `k`, output `j` (-7..=7; -8 only from a byte
    /// that no quantization wrote).
    pub fn level(&self, k: usize, j: usize) -> i32 {
        let byte = self.packed[j * self.rows / 2 + k / 2];
        ((byte >> (4 * (k % 2))) & 0xF) as i32 - 8
    }

    /// The scale of input `k`, output `j`, as a float.
    pub fn scale(&self, k: usize, j: usize) -> f32 {
        half::f16::from_bits(self.scales[j * self.rows / GROUP + k / GROUP]).to_f32()
    }

    /// Input `k`, output `j` as FP16 bits: its integer times its group's
    /// scale, rounded once to FP16.
    pub fn value_bits(&self, k: usize, j: usize) -> u16 {
        half::f16::from_f32(self.level(k, j) as f32 * self.scale(k, j)).to_bits()
    }

    /// Every value as FP16 bits, row-major (input by input), as the FP16
    /// weights are laid out: the matrix the 4-bit values stand for.
    pub fn dequantized(&self) -> Vec<u16> {
        (0..self.rows).flat_map(|k| (0..self.cols).map(move |j| self.value_bits(k, j))).collect()
    }

    /// The matrix's one FP8 scale (as the FP8 weights' scale is, its
    /// largest magnitude over E4M3's largest value): the largest group
    /// scale times 7 over 448, which is that scale over 64, exact in FP32.
    pub fn e4m3_scale(&self) -> f32 {
        let largest = self.scales.iter().map(|&b| half::f16::from_bits(b).to_f32().abs()).fold(0f32, f32::max);
        (largest / 64.0).max(f32::MIN_POSITIVE)
    }

    /// Input `k`, output `j` as the E4M3 byte the GPU's dequantization
    /// writes with the matrix scale `scale`: the integer times its group's
    /// factor (the group's scale over `scale`, rounded to FP32), rounded to
    /// FP32, then to E4M3 (to nearest, ties to even).
    pub fn e4m3_bits(&self, k: usize, j: usize, scale: f32) -> u8 {
        float8::F8E4M3::from_f32(self.level(k, j) as f32 * (self.scale(k, j) / scale)).to_bits()
    }

    /// Every value as E4M3 bytes with [`Int4Matrix::e4m3_scale`], output
    /// by output (the FP8 weights' layout), and that scale.
    pub fn e4m3(&self) -> (Vec<u8>, f32) {
        let scale = self.e4m3_scale();
        let bytes = (0..self.cols).into_par_iter().flat_map_iter(|j| (0..self.rows).map(move |k| self.e4m3_bits(k, j, scale))).collect();
        (bytes, scale)
    }

    /// The bytes this matrix crosses the link in: the packed integers and
    /// the scales.
    pub fn bytes(&self) -> usize {
        self.packed.len() + 2 * self.scales.len()
    }
}

/// One layer's weights in 4 bits: W1 (d x 4d), then W2 (4d x d).
pub fn quantize_layer(words: &[u64], shape: Shape, layer: usize) -> (Int4Matrix, Int4Matrix) {
    let (d, at) = (shape.d, layer * 8 * shape.d * shape.d);
    (Int4Matrix::quantize(words, at, d, 4 * d), Int4Matrix::quantize(words, at + 4 * d * d, 4 * d, d))
}


/// Where each part of a 4-bit layer lies in its bytes (a host copy's
/// layer, a GPU slot), as (first byte, bytes): W1's packed integers, W1's
/// scales, W2's packed integers, W2's scales. Each starts on a multiple of
/// 8 bytes where d is a multiple of [`GROUP`] (the kernel reads words).
pub fn layer_parts(d: usize) -> [(usize, usize); 4] {
    let (packed, scales) = (2 * d * d, 8 * d * d / GROUP);
    [(0, packed), (packed, scales), (packed + scales, packed), (2 * packed + scales, scales)]
}

/// Whether a network of width `d` quantizes to 4 bits: W1's inputs (d)
/// split into groups of [`GROUP`].
pub fn fits(d: usize) -> bool {
    d > 0 && d % GROUP == 0
}

/// The whole network in 4 bits, written into `out` (the rig's page-locked
/// copy, [`Shape::layer_bytes_in`] a layer, each laid out as
/// [`layer_parts`] says) from its FP16 weights `words`. Returns each
/// layer's FP8 scales (W1's, W2's: [`Int4Matrix::e4m3_scale`]).
pub fn quantize_network(words: &[u64], shape: Shape, out: &mut [u64]) -> Vec<(f32, f32)> {
    let layer_words4 = shape.layer_bytes_in(super::network::Precision::Int4) / 8;
    assert_eq!(out.len(), shape.layers * layer_words4, "the 4-bit copy does not match the network");
    let parts = layer_parts(shape.d);
    out.par_chunks_mut(layer_words4)
        .enumerate()
        .map(|(l, dst)| {
            let (w1, w2) = quantize_layer(words, shape, l);
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
            for (m, [packed, scales]) in [(&w1, [parts[0], parts[1]]), (&w2, [parts[2], parts[3]])] {
                bytes[packed.0..packed.0 + packed.1].copy_from_slice(&m.packed);
                for (i, s) in m.scales.iter().enumerate() {
                    bytes[scales.0 + 2 * i..scales.0 + 2 * i + 2].copy_from_slice(&s.to_le_bytes());
                }
            }
            (w1.e4m3_scale(), w2.e4m3_scale())
        })
        .collect()
}

/// One matrix of a 4-bit layer's bytes (its packed integers and its
/// groups' scales, as [`layer_parts`] places them), `rows` inputs an
/// output, written output by output into `out` (`rows` values an
/// output, in parallel): `value(its group's FP16 scale, the integer)` for
/// each, the integers -8..=7 (as stored, less 8). `value` is called once
/// per group and integer (a table of a group's sixteen), not per weight.
fn by_output<T: Copy + Default + Send>(bytes: &[u8], (packed, groups): ((usize, usize), (usize, usize)), rows: usize, out: &mut [T], value: &(dyn Fn(half::f16, i32) -> T + Sync)) {
    let (packed, groups) = (&bytes[packed.0..packed.0 + packed.1], &bytes[groups.0..groups.0 + groups.1]);
    out.par_chunks_mut(rows).enumerate().for_each(|(j, column)| {
        for (g, run) in column.chunks_mut(GROUP).enumerate() {
            let at = 2 * (j * rows / GROUP + g);
            let scale = half::f16::from_bits(u16::from_le_bytes([groups[at], groups[at + 1]]));
            let table: [T; 16] = std::array::from_fn(|q| value(scale, q as i32 - 8));
            let first = (j * rows + g * GROUP) / 2;
            for (pair, &b) in run.chunks_mut(2).zip(&packed[first..first + GROUP / 2]) {
                pair[0] = table[(b & 0xF) as usize];
                pair[1] = table[(b >> 4) as usize];
            }
        }
    });
}

/// One layer of the 4-bit copy (its bytes, as [`layer_parts`] lays them
/// out, of width `d`) as the FP16 values it stands for, in the FP16
/// weights' layout (W1 then W2, row-major): each integer times its
/// group's scale, rounded once to FP16, as [`Int4Matrix::value_bits`].
#[cfg(test)]
pub(super) fn values_layer(bytes: &[u8], d: usize) -> Vec<u64> {
    let parts = layer_parts(d);
    let mut halves = vec![0u16; 8 * d * d];
    let (w1, w2) = halves.split_at_mut(4 * d * d);
    for (m, rows, cols, out) in [((parts[0], parts[1]), d, 4 * d, w1), ((parts[2], parts[3]), 4 * d, d, w2)] {
        let mut by_j = vec![0u16; rows * cols];
        by_output(bytes, m, rows, &mut by_j, &|scale, q| half::f16::from_f32(q as f32 * scale.to_f32()).to_bits());
        // Output by output into row-major (input by input).
        out.par_chunks_mut(cols).enumerate().for_each(|(k, row)| {
            for (j, v) in row.iter_mut().enumerate() {
                *v = by_j[j * rows + k];
            }
        });
    }
    words_of_halves(&halves)
}

/// One layer of the 4-bit copy (its bytes, as [`layer_parts`] lays them
/// out, of a network of width `d`) as the GPU's dequantization turns it
/// into E4M3 for FP8's GEMMs with the FP8 scales `scales` (W1's, W2's):
/// each value the E4M3 of its integer times its group's factor, as
/// [`Int4Matrix::e4m3_bits`] gives it (a group's sixteen possible values
/// rounded once, in a table).
pub fn e4m3_layer(bytes: &[u8], d: usize, scales: (f32, f32)) -> E4m3Layer {
    let parts = layer_parts(d);
    let matrix = |m, rows: usize, cols: usize, scale: f32| -> Vec<f32> {
        let mut out = vec![0f32; rows * cols];
        by_output(bytes, m, rows, &mut out, &|group_scale, q| float8::F8E4M3::from_f32(q as f32 * (group_scale.to_f32() / scale)).to_f32());
        out
    };
    E4m3Layer {
        w1t: matrix((parts[0], parts[1]), d, 4 * d, scales.0),
        s1: scales.0,
        w2t: matrix((parts[2], parts[3]), 4 * d, d, scales.1),
        s2: scales.1,
    }
}

/// The whole network's weights as its 4-bit values stand for them
/// ([`Int4Matrix::dequantized`]): FP16 words in the FP16 weights' layout.
#[cfg(test)]
pub fn dequantized_weights(words: &[u64], shape: Shape) -> Vec<u64> {
    let per_layer = shape.layer_bytes_in(super::network::Precision::Int4);
    let mut out = vec![0u64; shape.layers * per_layer / 8];
    quantize_network(words, shape, &mut out);
    let bytes: &[u8] = bytemuck::cast_slice(&out);
    (0..shape.layers).flat_map(|l| values_layer(&bytes[l * per_layer..(l + 1) * per_layer], shape.d)).collect()
}

/// What 4 bits cost a pass, relative to the FP16 weights' pass, per
/// √layer, at most: a 4-bit integer of a uniform weight is off by at most
/// half a step (the group's largest magnitude over 14), about 7% of a
/// weight's root mean square; a layer's two GEMMs move a row by about 10%,
/// and over a few layers the errors add like a random walk. Past that they
/// compound: on the CPU (d = 256, three rows, `int4_cost_by_depth`) a
/// pass of 4, 16, 52 and 96 layers was 0.20-0.21, 0.36-0.41, 0.65-1.02 and
/// 2.20-3.17 off the FP16 pass, where an unrelated row is about 1.4 off
/// (the 4-bit network's activations grow from layer to layer). So what 4
/// bits cost against FP16 is a figure the lab states, not a check; a
/// 4-bit pass is held to its FP8 twin on the CPU (`measure::int4_tolerance`).
pub const INT4_ERROR_PER_SQRT_LAYER: f64 = 0.14;

/// Uniform FP16 weights like the rig's (W1 in ±sqrt(3/d), W2 in
/// ±sqrt(1.5/d)), from the project's pattern of a fixed seed: the 4-bit
/// tests' weights, on the CPU and on the GPU.
#[cfg(test)]
pub(super) fn test_weights(shape: Shape) -> Vec<u64> {
    let d = shape.d;
    let halves: Vec<u16> = (0..shape.layers * 8 * d * d)
        .map(|i| {
            let scale = if (i / (4 * d * d)) % 2 == 0 { (3.0 / d as f32).sqrt() } else { (1.5 / d as f32).sqrt() };
            let uniform = (crate::measure::pattern::word(7, i as u64) >> 11) as f32 / (1u64 << 53) as f32;
            half::f16::from_f32(scale * (2.0 * uniform - 1.0)).to_bits()
        })
        .collect();
    words_of_halves(&halves)
}

#[cfg(test)]
mod tests {
    use super::super::cpu::{forward_rows, relative_error};
    use super::super::measure::TOLERANCE;
    use super::super::network::Precision;
    use super::test_weights as weights;
    use super::*;

    fn input(d: usize, rows: usize) -> Vec<Vec<u16>> {
        (0..rows).map(|r| (0..d).map(|k| half::f16::from_f32((((r * 31 + k * 17) % 200) as f32 / 100.0) - 1.0).to_bits()).collect()).collect()
    }

    #[test]
    fn each_value_is_its_integer_times_its_groups_scale_within_half_a_step() {
        let shape = Shape { layers: 1, d: 128 };
        let words = weights(shape);
        let (w1, _) = quantize_layer(&words, shape, 0);
        assert_eq!((w1.rows, w1.cols, w1.packed.len(), w1.scales.len()), (128, 512, 128 * 256, 512));
        for (k, j) in [(0, 0), (0, 1), (5, 300), (127, 511)] {
            let want = half::f16::from_bits(half_bits(&words, k * 512 + j)).to_f32();
            let scale = w1.scale(k, j);
            let got = half::f16::from_bits(w1.value_bits(k, j)).to_f32();
            assert!(scale > 0.0 && (got - want).abs() <= 0.5 * scale * 1.01 + 1e-6, "({k},{j}): {got} for {want}, scale {scale}");
            assert!((-7..=7).contains(&w1.level(k, j)));
        }
        // Each group's largest magnitude is a full step count.
        let top = (0..128).map(|k| w1.level(k, 7).abs()).max().unwrap();
        assert_eq!(top, 7);
    }

    #[test]
    fn the_e4m3_bytes_are_each_value_over_the_matrix_scale_output_by_output() {
        let shape = Shape { layers: 1, d: 128 };
        let (w1, _) = quantize_layer(&weights(shape), shape, 0);
        let (bytes, scale) = w1.e4m3();
        assert_eq!(bytes.len(), w1.rows * w1.cols);
        for (k, j) in [(0, 0), (1, 0), (0, 1), (77, 300), (127, 511)] {
            let exact = w1.level(k, j) as f32 * w1.scale(k, j);
            let got = float8::F8E4M3::from_bits(bytes[j * w1.rows + k]).to_f32() * scale;
            // E4M3 keeps 3 bits of mantissa (half a step: 1/16 of the
            // value), and its smallest step is 2^-9 of the scale.
            assert!((got - exact).abs() <= exact.abs() / 16.0 + scale * 2f32.powi(-10), "({k},{j}): {got} for {exact}");
        }
        // The largest magnitude is E4M3's largest, exactly.
        let top = bytes.iter().map(|&b| float8::F8E4M3::from_bits(b).to_f32().abs()).fold(0f32, f32::max);
        assert_eq!(top, 448.0);
    }

    #[test]
    fn a_layer_is_4_125_bits_a_weight() {
        let shape = Shape { layers: 1, d: 256 };
        let (w1, w2) = quantize_layer(&weights(shape), shape, 0);
        assert_eq!(w1.bytes() + w2.bytes(), shape.layer_bytes_in(Precision::Int4));
        assert_eq!(8 * shape.layer_bytes_in(Precision::Int4) * 1000 / (8 * 256 * 256), 4125);
    }

    /// The rig's 4-bit copy: each layer's bytes hold W1's packed integers
    /// and scales, then W2's, where `layer_parts` says, each as the
    /// matrix's own; its FP8 scales are each matrix's; the values it
    /// returns are what the matrices stand for.
    #[test]
    fn the_network_copy_lays_each_layer_out_as_its_parts_say() {
        let shape = Shape { layers: 3, d: 128 };
        let words = weights(shape);
        let per_layer = shape.layer_bytes_in(Precision::Int4);
        let parts = layer_parts(shape.d);
        assert_eq!(parts[3].0 + parts[3].1, per_layer, "{parts:?}");
        assert!(parts.iter().all(|&(at, _)| at % 8 == 0), "{parts:?}");
        let mut out = vec![0u64; shape.layers * per_layer / 8];
        let scales = quantize_network(&words, shape, &mut out);
        let bytes: &[u8] = bytemuck::cast_slice(&out);
        for l in 0..shape.layers {
            let (w1, w2) = quantize_layer(&words, shape, l);
            let layer = &bytes[l * per_layer..(l + 1) * per_layer];
            let scale_bytes = |m: &Int4Matrix| m.scales.iter().flat_map(|s| s.to_le_bytes()).collect::<Vec<u8>>();
            assert_eq!(&layer[parts[0].0..parts[0].0 + parts[0].1], w1.packed.as_slice(), "layer {l}: W1's integers");
            assert_eq!(layer[parts[1].0..parts[1].0 + parts[1].1].to_vec(), scale_bytes(&w1), "layer {l}: W1's scales");
            assert_eq!(&layer[parts[2].0..parts[2].0 + parts[2].1], w2.packed.as_slice(), "layer {l}: W2's integers");
            assert_eq!(layer[parts[3].0..parts[3].0 + parts[3].1].to_vec(), scale_bytes(&w2), "layer {l}: W2's scales");
            assert_eq!(scales[l], (w1.e4m3_scale(), w2.e4m3_scale()));
            assert_eq!(values_layer(layer, shape.d), words_of_halves(&[w1.dequantized(), w2.dequantized()].concat()), "layer {l}: the values");
            let e4m3 = e4m3_layer(layer, shape.d, scales[l]);
            for (m, got, scale) in [(&w1, &e4m3.w1t, e4m3.s1), (&w2, &e4m3.w2t, e4m3.s2)] {
                let (want, want_scale) = m.e4m3();
                assert_eq!(scale, want_scale);
                assert!(want.iter().zip(got.iter()).all(|(&b, &v)| float8::F8E4M3::from_bits(b).to_f32() == v), "layer {l}: the E4M3 values");
            }
        }
        assert!(fits(128) && fits(2048) && !fits(64) && !fits(0));
    }

    #[test]
    fn an_all_zero_group_stays_zero_and_never_divides_by_zero() {
        let words = vec![0u64; 128 * 4 / 4];
        let m = Int4Matrix::quantize(&words, 0, 128, 4);
        assert!(m.scales.iter().all(|&s| s == 0) && (0..4).all(|j| m.value_bits(3, j) == 0));
        assert!((0..4).all(|j| m.e4m3_bits(3, j, m.e4m3_scale()) == 0));
    }

    /// The 4-bit pass against the FP16 one over a few layers (what 4 bits
    /// cost), and against the CPU's pass over the same 4-bit values: a
    /// swapped nibble or a doubled scale in one layer is far outside the
    /// lab's FP16 tolerance there.
    #[test]
    fn a_wrong_scale_or_swapped_nibbles_are_far_off_the_4_bit_reference() {
        let shape = Shape { layers: 8, d: 128 };
        let words = weights(shape);
        let x = input(shape.d, 3);
        let worst = |w: &[u64], reference: &[u64]| {
            let (want, _) = forward_rows(reference, shape, &x);
            let (got, _) = forward_rows(w, shape, &x);
            got.iter().zip(&want).map(|(g, w)| relative_error(g, w)).fold(0f64, f64::max)
        };
        let dq = dequantized_weights(&words, shape);
        let cost = worst(&dq, &words);
        let allowed = INT4_ERROR_PER_SQRT_LAYER * (shape.layers as f64).sqrt();
        assert!(cost > 0.05 && cost < allowed, "4 bits cost {cost:.3} over {} layers (allowed {allowed:.3})", shape.layers);
        // Layer 3's W1 with each byte's nibbles swapped (inputs k and k + 1 exchanged).
        let layer_words = shape.layer_bytes() / 8;
        let (w1, _) = quantize_layer(&words, shape, 3);
        let mut flipped = w1.clone();
        flipped.packed.iter_mut().for_each(|b| *b = b.rotate_left(4));
        let mut swapped = dq.clone();
        swapped[3 * layer_words..3 * layer_words + layer_words / 2].copy_from_slice(&words_of_halves(&flipped.dequantized()));
        let e = worst(&swapped, &dq);
        assert!(e > 10.0 * TOLERANCE, "swapped nibbles only {e:.3} off");
        // Layer 5's W2 with every scale doubled.
        let mut doubled = dq.clone();
        let at = 5 * layer_words + layer_words / 2;
        let twice: Vec<u16> = (4 * at..4 * (at + layer_words / 2)).map(|k| half::f16::from_f32(2.0 * half::f16::from_bits(half_bits(&dq, k)).to_f32()).to_bits()).collect();
        doubled[at..at + layer_words / 2].copy_from_slice(&words_of_halves(&twice));
        let e = worst(&doubled, &dq);
        assert!(e > 10.0 * TOLERANCE, "a doubled scale only {e:.3} off");
    }

    /// What 4 bits cost by depth, printed (a few seconds; run with
    /// `cargo test --release -p overlap-lab --lib int4_cost_by_depth -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn int4_cost_by_depth() {
        for layers in [4usize, 16, 52, 96] {
            let shape = Shape { layers, d: 256 };
            let words = weights(shape);
            let x = input(shape.d, 3);
            let (want, _) = forward_rows(&words, shape, &x);
            let (got, _) = forward_rows(&dequantized_weights(&words, shape), shape, &x);
            let e: Vec<String> = got.iter().zip(&want).map(|(g, w)| format!("{:.2}", relative_error(g, w))).collect();
            eprintln!("{layers} layers: each sampled row off the FP16 pass by {}", e.join(", "));
        }
    }
}
