//! Lab 9's weights in host memory: the page-locked FP16 weights drawn
//! from the project's pattern, and the copies a run asks for beside them
//! ([`Copies`]): the same bytes in pageable memory, FP8 (each matrix
//! transposed and rounded with its own scale) and 4 bits (`int4`'s
//! layout), made side by side; and the tables that round FP16 values to
//! E4M3 and draw uniform FP16 values, each a value's rounding made once.
//!
//! May use: `network`, `cpu` (the FP16 words' layout), `int4` (the 4-bit
//! copy), `error`, `gpu` (page-locked and pageable buffers) and
//! `measure::pattern`.

use super::cpu::half_bits;
use super::int4;
use super::network::{Precision, Shape};
use crate::error::{LabError, Result};
use crate::gpu::{Gpu, HostBuffer, PageableBuffer, PinnedBuffer};
use crate::measure::pattern;
use rayon::prelude::*;

/// The largest finite E4M3 value.
pub const E4M3_MAX: f32 = 448.0;

/// Which host copies of the weights a rig makes besides the page-locked
/// FP16 one every pass can read: each is as large as the network (FP8's
/// half of it) and takes seconds to make, so a run makes only those its
/// passes read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copies {
    /// The same FP16 bytes in ordinary memory (the pageable pass).
    pub pageable: bool,
    /// FP8, where the GPU has FP8 (the FP8 passes).
    pub fp8: bool,
    /// 4 bits, where the GPU has FP8 (the 4-bit pass dequantizes into
    /// E4M3 for FP8's GEMMs) and the width splits into 4-bit groups
    /// ([`int4::fits`]).
    pub int4: bool,
}

impl Copies {
    /// Every copy (the lab's run, whose passes read them all).
    pub const ALL: Copies = Copies { pageable: true, fp8: true, int4: true };
    /// The page-locked FP16 copy alone (a ring of FP16 layers).
    pub const PINNED: Copies = Copies { pageable: false, fp8: false, int4: false };
}

/// Uniform FP16 values in [-scale, scale], four from each word of the
/// pattern: each value is picked by 16 bits of a word, so the 65536 FP16
/// values a scale gives are rounded once, into a table, not once a value
/// (the same bits as rounding each: the weights are 3 billion values).
pub(super) struct UniformF16 {
    table: Vec<u16>,
}

impl UniformF16 {
    pub(super) fn new(scale: f32) -> UniformF16 {
        let table = (0..=u16::MAX).map(|r| half::f16::from_f32(scale * (2.0 * (r as f32 / 65535.0) - 1.0)).to_bits()).collect();
        UniformF16 { table }
    }
    /// Fills `words` with the pattern's words from `first_word` on (of `seed`), as values.
    pub(super) fn fill(&self, words: &mut [u64], seed: u64, first_word: u64) {
        words.par_chunks_mut(1 << 14).enumerate().for_each(|(c, chunk)| {
            for (j, w) in chunk.iter_mut().enumerate() {
                let r = pattern::word(seed, first_word + ((c << 14) + j) as u64);
                let mut out = 0u64;
                for q in 0..4 {
                    out |= (self.table[((r >> (16 * q)) & 0xFFFF) as usize] as u64) << (16 * q);
                }
                *w = out;
            }
        });
    }
}

/// The weights' host copies, made at once: the page-locked FP16 weights
/// written while the FP8 and 4-bit copies' page-locked memory is
/// allocated (a driver call of a second or more each, on threads of their
/// own), then the pageable, FP8 and 4-bit copies made from them side by
/// side. Returns (pinned, pageable, FP8 with its scales, 4-bit with its
/// scales), each as `copies` asks.
#[allow(clippy::type_complexity)]
pub(super) fn host_weights(
    gpu: &Gpu,
    shape: Shape,
    copies: Copies,
) -> Result<(PinnedBuffer, Option<PageableBuffer>, Option<(PinnedBuffer, Vec<(f32, f32)>)>, Option<(PinnedBuffer, Vec<(f32, f32)>)>)> {
    let (d, lb) = (shape.d, shape.layer_bytes());
    std::thread::scope(|scope| {
        let page_locked = |want: bool, bytes: usize| {
            let gpu = gpu.clone();
            want.then(|| scope.spawn(move || PinnedBuffer::new(&gpu, bytes)))
        };
        let fp8_memory = page_locked(copies.fp8, shape.network_bytes() / 2);
        let int4_memory = page_locked(copies.int4, shape.layers * shape.layer_bytes_in(Precision::Int4));
        let mut pinned = PinnedBuffer::new(gpu, shape.network_bytes())?;
        // He-style scales keep the activations' size from layer to layer:
        // W1 (d x 4d) in ±sqrt(3/d), W2 (4d x d) in ±sqrt(1.5/d) (ReLU halves the second moment).
        let seed = pattern::fresh_seed();
        let (w1, w2) = (UniformF16::new((3.0 / d as f64).sqrt() as f32), UniformF16::new((1.5 / d as f64).sqrt() as f32));
        let layer_words = lb / 8;
        pinned.words_mut().par_chunks_mut(layer_words).enumerate().for_each(|(l, w)| {
            let (a, b) = w.split_at_mut(layer_words / 2);
            w1.fill(a, seed, (l * layer_words) as u64);
            w2.fill(b, seed, (l * layer_words + layer_words / 2) as u64);
        });
        let joined = |h: Option<std::thread::ScopedJoinHandle<Result<PinnedBuffer>>>| -> Result<Option<PinnedBuffer>> {
            match h {
                Some(h) => Ok(Some(h.join().map_err(|_| LabError::config("allocating the weights' page-locked memory panicked"))??)),
                None => Ok(None),
            }
        };
        let (fp8_memory, int4_memory) = (joined(fp8_memory)?, joined(int4_memory)?);
        let src = pinned.words();
        let (pageable, (fp8, int4)) = rayon::join(
            || copies.pageable.then(|| pageable_copy(src)).transpose(),
            || {
                rayon::join(
                    || fp8_memory.map(|mut out| fp8_weights(src, shape, &mut out).map(|scales| (out, scales))).transpose(),
                    || {
                        int4_memory.map(|mut out| {
                            let scales = int4::quantize_network(src, shape, out.words_mut());
                            (out, scales)
                        })
                    },
                )
            },
        );
        Ok((pinned, pageable?, fp8?, int4))
    })
}

/// `words` in ordinary pageable memory, written (and so its pages first
/// touched) by every thread at once.
fn pageable_copy(words: &[u64]) -> Result<PageableBuffer> {
    let mut v: Vec<u64> = Vec::new();
    v.try_reserve_exact(words.len()).map_err(|_| LabError::OutOfMemory {
        what: "host",
        call: "malloc",
        bytes: crate::units::Bytes((words.len() * 8) as u64),
    })?;
    v.par_extend(words.par_iter().copied());
    PageableBuffer::from_words(v)
}

/// The weights in FP8 (E4M3), written into `out` (page-locked, half the
/// FP16 network's bytes) from the FP16 weights `src`: per layer W1ᵀ
/// (4d x d) then W2ᵀ (d x 4d), each matrix rounded with its own scale (its
/// largest magnitude over E4M3's largest value); returns the scales.
fn fp8_weights(src: &[u64], shape: Shape, out: &mut PinnedBuffer) -> Result<Vec<(f32, f32)>> {
    let d = shape.d;
    let lb16 = shape.layer_bytes() / 8;
    let lb8 = shape.layer_bytes_in(Precision::Fp8) / 8;
    if src.len() != shape.layers * lb16 || out.words().len() != shape.layers * lb8 {
        return Err(LabError::config("the FP8 weights' buffer does not match the network"));
    }
    let scales = out
        .words_mut()
        .par_chunks_mut(lb8)
        .enumerate()
        .map(|(l, dst)| {
            let layer = &src[l * lb16..(l + 1) * lb16];
            let (dst1, dst2) = dst.split_at_mut(lb8 / 2);
            // W1 is d x 4d at half 0; W2 is 4d x d at half 4d².
            let s1 = transpose_e4m3(layer, 0, d, 4 * d, dst1);
            let s2 = transpose_e4m3(layer, 4 * d * d, 4 * d, d, dst2);
            (s1, s2)
        })
        .collect();
    Ok(scales)
}

/// The largest magnitude of the FP16 values `halves` of `words` (NaNs
/// left out, as `f32::max` leaves them; 0 for none). A finite FP16's
/// magnitude orders as its bits less the sign do, so the bits are
/// compared, in parallel stretches, and only the largest converted.
pub(super) fn f16_amax(words: &[u64], halves: std::ops::Range<usize>) -> f32 {
    const STRETCH: usize = 1 << 16;
    let largest = (0..halves.len().div_ceil(STRETCH))
        .into_par_iter()
        .map(|c| {
            let from = halves.start + c * STRETCH;
            (from..(from + STRETCH).min(halves.end)).map(|k| half_bits(words, k) & 0x7FFF).filter(|&m| m <= 0x7C00).max().unwrap_or(0)
        })
        .max()
        .unwrap_or(0);
    half::f16::from_bits(largest).to_f32()
}

/// FP16 values rounded to E4M3 after division by one scale: the 65536
/// FP16 bit patterns' E4M3 bytes, made once (a table, where a matrix has
/// millions of values to round), each as `F8E4M3::from_f32(x / scale)`.
pub(super) struct E4m3Table {
    table: Vec<u8>,
}

impl E4m3Table {
    pub(super) fn new(scale: f32) -> E4m3Table {
        let table = (0..=u16::MAX).map(|b| float8::F8E4M3::from_f32(half::f16::from_bits(b).to_f32() / scale).to_bits()).collect();
        E4m3Table { table }
    }
    /// The E4M3 byte of the FP16 value `bits`.
    pub(super) fn of(&self, bits: u16) -> u8 {
        self.table[bits as usize]
    }
}

/// Writes the `rows` x `cols` FP16 matrix at half `at` of `words`
/// transposed into `dst` as E4M3 bytes, with the scale it returns.
fn transpose_e4m3(words: &[u64], at: usize, rows: usize, cols: usize, dst: &mut [u64]) -> f32 {
    let amax = f16_amax(words, at..at + rows * cols);
    let scale = (amax / E4M3_MAX).max(f32::MIN_POSITIVE);
    let e4m3 = E4m3Table::new(scale);
    // In tiles of B x B: each tile read row by row (input row k, along the
    // memory), rounded into a small transposed tile, then written out a
    // run of output row j (input column j) at a time.
    const B: usize = 64;
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
    let mut tile = [0u8; B * B];
    for k0 in (0..rows).step_by(B) {
        let kn = B.min(rows - k0);
        for j0 in (0..cols).step_by(B) {
            let jn = B.min(cols - j0);
            for kk in 0..kn {
                let from = at + (k0 + kk) * cols + j0;
                for jj in 0..jn {
                    tile[jj * B + kk] = e4m3.of(half_bits(words, from + jj));
                }
            }
            for jj in 0..jn {
                let to = (j0 + jj) * rows + k0;
                bytes[to..to + kn].copy_from_slice(&tile[jj * B..jj * B + kn]);
            }
        }
    }
    scale
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FP16 values as the words the rig holds, four a word.
    fn words_of(values: &[f32]) -> Vec<u64> {
        let bits: Vec<u16> = values.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
        super::super::cpu::words_of_halves(&bits)
    }

    #[test]
    fn fp8_weights_are_each_matrix_transposed_and_rounded_with_its_scale() {
        // A 2 x 3 matrix: its largest magnitude (4) becomes E4M3's 448.
        let m = [1.0f32, -2.0, 0.5, 4.0, 0.0, -1.0];
        let mut dst = vec![0u64; 1];
        let s = transpose_e4m3(&words_of(&m), 0, 2, 3, &mut dst);
        assert_eq!(s, 4.0 / E4M3_MAX);
        let got: Vec<f32> = (0..6).map(|i| float8::F8E4M3::from_bits((dst[0] >> (8 * i)) as u8).to_f32() * s).collect();
        // Row j of the transpose is column j of the matrix.
        let want = [1.0, 4.0, -2.0, 0.0, 0.5, -1.0];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= w.abs() / 16.0, "{got:?}");
        }
    }

    /// The tables the weights are made through give the very bits that
    /// rounding each value gives: every FP16 value through the E4M3
    /// table, every 16 bits of a pattern word through the uniform one,
    /// and the largest magnitude by bits as by values (NaNs left out).
    #[test]
    fn the_tables_round_as_each_value_would_be() {
        let scale = 0.037f32;
        let e4m3 = E4m3Table::new(scale);
        let uniform = UniformF16::new(scale);
        for b in 0..=u16::MAX {
            let x = half::f16::from_bits(b).to_f32();
            assert_eq!(e4m3.of(b), float8::F8E4M3::from_f32(x / scale).to_bits(), "{b:#06x}");
            let u = b as f32 / 65535.0;
            assert_eq!(uniform.table[b as usize], half::f16::from_f32(scale * (2.0 * u - 1.0)).to_bits());
        }
        let values = [0.5f32, -3.25, f32::NAN, 2.0, -0.0, f32::INFINITY, 1.0, -7.5];
        let words = words_of(&values);
        let by_value = |r: std::ops::Range<usize>| values[r].iter().map(|v| half::f16::from_f32(*v).to_f32().abs()).fold(0f32, f32::max);
        for r in [0..8, 0..5, 1..4, 2..3, 3..3] {
            assert_eq!(f16_amax(&words, r.clone()), by_value(r.clone()), "{r:?}");
        }
    }
}
