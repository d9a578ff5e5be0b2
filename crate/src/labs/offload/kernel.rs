//! Lab 9's kernels of its own: the activation between a layer's two GEMMs
//! (`kernels/relu_f16.cu`), ReLU in place on FP16 values, and its rule on
//! one value's bits for the CPU's reference; and the 4-bit weights'
//! dequantization into the FP8 GEMMs' E4M3 bytes (`kernels/dequant_int4.cu`,
//! whose CPU twin is `int4::Int4Matrix::e4m3_bits`), launched by
//! [`Dequant`] (the 4-bit pass's layers, `rig::LayerWork`).
//!
//! May use: `error`, `gpu` (NVRTC, the launch) and `network` (the 4-bit
//! layout's group).

use super::network::INT4_GROUP as GROUP;
use crate::error::{LabError, Result};
use crate::gpu::kernels::KernelSource;
use crate::gpu::{DeviceSpan, Gpu, KernelArg, Module, Stream};

/// `kernels/relu_f16.cu`, for NVRTC.
pub const RELU_F16: KernelSource = KernelSource {
    file: "relu_f16.cu",
    entry: "relu_f16",
    source: include_str!("../../../../kernels/relu_f16.cu"),
    // One 64-bit load and store per four halves, a grid-stride loop.
    expect_in_ptx: &["ld.global.u64", "st.global.u64", ".visible .entry relu_f16"],
    purpose: "ReLU in place on FP16 values held as bits, four to a 64-bit word (lab 9's activation)",
    ..KernelSource::PLAIN
};

/// `kernels/dequant_int4.cu`, for NVRTC.
pub const DEQUANT_INT4: KernelSource = KernelSource {
    file: "dequant_int4.cu",
    entry: "dequant_int4_e4m3",
    source: include_str!("../../../../kernels/dequant_int4.cu"),
    // The packed integers and scales through the read-only path; one IEEE
    // division a group's factor, then E4M3 by pairs; one 64-bit store of
    // eight bytes.
    expect_in_ptx: &[
        "ld.global.nc.u32",
        "ld.global.nc.u16",
        "cvt.f32.f16",
        "div.rn.f32",
        "cvt.rn.satfinite.e4m3x2.f32",
        "st.global.u64",
        ".visible .entry dequant_int4_e4m3",
    ],
    purpose: "4-bit weights (two a byte, an FP16 scale per 128 inputs) into the FP8 GEMMs' E4M3 bytes (lab 9's 4-bit variant)",
    min_cc: 89,
    test_defines: DEQUANT_DEFINES,
    ..KernelSource::PLAIN
};

/// The loaded kernel and its launch shape.
pub struct Relu {
    module: Module,
    grid: u32,
}

impl Relu {
    pub fn load(gpu: &Gpu) -> Result<Relu> {
        let sms = gpu.fingerprint()?.sm_count;
        Ok(Relu { module: Module::load(gpu, &RELU_F16)?, grid: sms * 8 })
    }

    /// Enqueues ReLU over the first `halves` FP16 values of `span`.
    ///
    /// # Safety
    /// The span stays allocated until the stream has run the kernel.
    pub unsafe fn enqueue(&self, stream: &Stream, span: DeviceSpan, halves: usize) -> Result<()> {
        if halves == 0 || halves % 4 != 0 || halves * 2 > span.bytes() {
            return Err(LabError::config(format!("ReLU over {halves} halves of a buffer of {} bytes (give a multiple of 4 that fits)", span.bytes())));
        }
        let words = (halves / 4) as u64;
        let grid = self.grid.min(words.div_ceil(256) as u32).max(1);
        // SAFETY: the arguments match `relu_f16(unsigned long long*,
        // unsigned long long)`; the range fits the span (checked above).
        unsafe { self.module.launch(stream, grid, 256, 0, [KernelArg::Span(span), KernelArg::U64(words)]) }
    }
}

/// The `-D` settings the dequantization kernel is compiled with: the
/// group its scales cover, `int4`'s.
const DEQUANT_DEFINES: &[(&str, i64)] = &[("GROUP", GROUP as i64)];

/// The loaded dequantization kernel and its launch shape.
pub struct Dequant {
    module: Module,
    grid: u32,
}

impl Dequant {
    pub fn load(gpu: &Gpu) -> Result<Dequant> {
        let sms = gpu.fingerprint()?.sm_count;
        Ok(Dequant { module: Module::load_with(gpu, &DEQUANT_INT4, DEQUANT_DEFINES)?, grid: sms * 8 })
    }

    /// Enqueues the dequantization of a `rows` x `cols` matrix of 4-bit
    /// weights (`packed` and `scales` in `int4`'s layout) into E4M3 bytes
    /// with the matrix scale `matrix_scale`, output by output, in `out`.
    ///
    /// # Safety
    /// The spans stay allocated until the stream has run the kernel.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn enqueue(&self, stream: &Stream, packed: DeviceSpan, scales: DeviceSpan, out: DeviceSpan, rows: usize, cols: usize, matrix_scale: f32) -> Result<()> {
        if rows == 0 || rows % GROUP != 0 || cols == 0 {
            return Err(LabError::config(format!("4-bit dequantization of a {rows} x {cols} matrix (rows: a multiple of {GROUP})")));
        }
        if !(matrix_scale.is_finite() && matrix_scale > 0.0) {
            return Err(LabError::config(format!("4-bit dequantization with the FP8 scale {matrix_scale} (give a positive finite scale)")));
        }
        let (need_packed, need_scales, need_out) = (rows * cols / 2, 2 * (rows / GROUP) * cols, rows * cols);
        if packed.bytes() < need_packed || scales.bytes() < need_scales || out.bytes() < need_out {
            return Err(LabError::config(format!(
                "4-bit dequantization of a {rows} x {cols} matrix needs {need_packed}, {need_scales} and {need_out} bytes of packed values, scales and output; given {}, {} and {}",
                packed.bytes(),
                scales.bytes(),
                out.bytes()
            )));
        }
        let words = (rows * cols / 8) as u64;
        let grid = self.grid.min(words.div_ceil(256) as u32).max(1);
        let args = [
            KernelArg::Span(packed),
            KernelArg::Span(scales),
            KernelArg::Span(out),
            KernelArg::U64(rows as u64),
            KernelArg::U64(cols as u64),
            KernelArg::U32(matrix_scale.to_bits()),
        ];
        // SAFETY: the arguments match `dequant_int4_e4m3(const unsigned
        // int*, const unsigned short*, unsigned long long*, unsigned long
        // long, unsigned long long, unsigned int)`, compiled with this
        // module's GROUP; each span holds what the kernel reads or writes
        // for this shape (checked above).
        unsafe { self.module.launch(stream, grid, 256, 0, args) }
    }
}

/// What the kernel does to one half's bits, for the CPU reference.
pub fn relu_bits(h: u16) -> u16 {
    if h & 0x8000 != 0 {
        0
    } else {
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{check_ptx, nvrtc_or_skip};

    #[test]
    fn relu_compiles_to_the_expected_ptx() {
        if nvrtc_or_skip("relu_compiles_to_the_expected_ptx") {
            check_ptx(&RELU_F16);
        }
    }

    #[test]
    fn dequant_int4_compiles_to_the_expected_ptx() {
        if nvrtc_or_skip("dequant_int4_compiles_to_the_expected_ptx") {
            check_ptx(&DEQUANT_INT4);
        }
    }

    #[test]
    fn relu_clears_negative_halves_only() {
        let one = half::f16::from_f32(1.5).to_bits();
        let minus = half::f16::from_f32(-2.0).to_bits();
        assert_eq!(relu_bits(one), one);
        assert_eq!(relu_bits(minus), 0);
        assert_eq!(relu_bits(0x8000), 0, "-0 becomes +0");
        // The kernel's mask, word-wise, agrees with the per-half rule.
        let v: u64 = (one as u64) | (minus as u64) << 16 | (0x8000u64) << 32 | (0x3c00u64) << 48;
        let negative = (v >> 15) & 0x0001_0001_0001_0001;
        let kept = v & !(negative * 0xFFFF);
        for i in 0..4 {
            assert_eq!((kept >> (16 * i)) as u16, relu_bits((v >> (16 * i)) as u16), "half {i}");
        }
    }
}
