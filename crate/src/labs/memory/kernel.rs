//! Lab 6's zero-copy kernel (`kernels/reread.cu`): reads its input once
//! per pass, from device memory or from mapped host memory in place, with
//! an FMA chain per value read. Built on `gpu::Module`'s launch.

use crate::error::{LabError, Result};
use crate::gpu::kernels::{self, compute_reference, KernelSource};
use crate::gpu::{DeviceBuffer, DeviceSpan, Gpu, KernelArg, MappedBuffer, Module, PinnedBuffer, Stream, TimelineSource};
use crate::pipeline::op::{Access, OpKind};

/// `kernels/reread.cu`, for NVRTC.
pub const REREAD: KernelSource = KernelSource {
    file: "reread.cu",
    entry: "reread",
    source: include_str!("../../../../kernels/reread.cu"),
    // Plain global loads (the input may be mapped host memory), explicit
    // FMAs: the chain's constant (-(1 - 2^-10) = 0fBF7FC000) and the pass's
    // accumulation.
    expect_in_ptx: &["ld.global.f32", "fma.rn.f32", "0fBF7FC000", ".visible .entry reread"],
    purpose:
        "reads its input once per pass (device memory or mapped host memory in place), with an FMA chain of tunable length per read: lab 6's zero-copy kernel",
    ..KernelSource::PLAIN
};

/// CPU reference of `reread` for one element: Σ over passes of w_p·f(x),
/// w_p = 0.5 + 0.25 p, summed by FMAs in pass order, where f is the chain
/// of `iterations` FMAs of `compute` (the kernel recomputes it every pass;
/// it gives the same bits each time). iterations = 0: Σ w_p·x.
pub fn reread_reference(x: f32, passes: i32, iterations: i32) -> f32 {
    let a = compute_reference(x, iterations);
    (0..passes).fold(0.0f32, |sum, p| a.mul_add(0.5 + 0.25 * p as f32, sum))
}

/// Where `reread` reads its input from.
pub enum ReadFrom<'a> {
    /// Device memory (copied there first).
    Device(&'a DeviceBuffer),
    /// Mapped pinned host memory, read in place over the host link.
    Mapped(&'a MappedBuffer),
}

/// `kernels/reread.cu`: reads its input once per pass and runs an FMA
/// chain of `iterations` on every value read (lab 6's zero-copy kernel).
pub struct RereadKernel {
    module: Module,
    grid: u32,
    block: u32,
}

impl RereadKernel {
    /// The longest FMA chain per element per pass `run` accepts.
    pub const MAX_ITERATIONS: i32 = kernels::MAX_FMA_CHAIN;

    pub fn load(gpu: &Gpu) -> Result<RereadKernel> {
        let sms = gpu.fingerprint()?.sm_count;
        Ok(RereadKernel { module: Module::load(gpu, &REREAD)?, grid: sms * 8, block: 256 })
    }

    /// # Safety
    /// `input`'s memory stays allocated until the stream has run the kernel.
    unsafe fn enqueue(&self, stream: &Stream, input: DeviceSpan, output: &DeviceBuffer, n: usize, passes: i32, iterations: i32) -> Result<()> {
        if !(0..=Self::MAX_ITERATIONS).contains(&iterations) {
            return Err(LabError::config(format!("reread with {iterations} FMAs per element per pass: give 0 to {}", Self::MAX_ITERATIONS)));
        }
        if n == 0 || n * 4 > input.bytes() || n * 4 > output.bytes() || !(1..=64).contains(&passes) {
            return Err(LabError::config(format!(
                "reread of {n} elements, {passes} passes, does not fit {} -> {} bytes (1 to 64 passes)",
                input.bytes(),
                output.bytes()
            )));
        }
        let args = [KernelArg::Span(input), KernelArg::Span(output.span()), KernelArg::U64(n as u64), KernelArg::I32(passes), KernelArg::I32(iterations)];
        let grid = self.grid.min(n.div_ceil(self.block as usize) as u32).max(1);
        // SAFETY: the arguments match `reread(const float*, float*,
        // unsigned long long, int, int)`; bounds checked above; the caller
        // keeps both alive until the stream has run it.
        unsafe { self.module.launch(stream, grid, self.block, 0, args) }
    }

    /// Runs the kernel over the first `n` elements of `input` into
    /// `output` (`passes` reads, each with a chain of `iterations` FMAs
    /// per element, 0 to `MAX_ITERATIONS`), after uploading `upload`
    /// (pinned host -> the device input) when given, through the runner,
    /// and waits: the device time from the first op's start to the
    /// kernel's end (CUDA events around each op), ms.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        gpu: &Gpu,
        stream: &Stream,
        upload: Option<&mut PinnedBuffer>,
        input: ReadFrom<'_>,
        output: &DeviceBuffer,
        n: usize,
        passes: i32,
        iterations: i32,
    ) -> Result<f64> {
        let (span, read) = match &input {
            ReadFrom::Device(d) => (d.span(), "device input"),
            ReadFrom::Mapped(m) => (m.device_span()?, "mapped input"),
        };
        let mut p = gpu.runner(TimelineSource::Events, 2, false)?;
        let s = p.stream(stream, "zero-copy");
        if let Some(host) = upload {
            let ReadFrom::Device(dst) = input else {
                return Err(LabError::config("an upload goes to a device input, not to mapped host memory"));
            };
            let (h, d) = (p.host(host, "pinned input"), p.device(dst, "device input"));
            p.h2d(s, d, 0, h, 0, n * 4, "upload")?;
        }
        let accesses = vec![Access::read(read, 0, n as u64 * 4), Access::write("output", 0, n as u64 * 4)];
        // SAFETY: the kernel reads `input` and writes `output`, both
        // borrowed for this call, which the runner does not outlive (it
        // synchronizes before it ends); the accesses name both.
        unsafe { p.op(s, OpKind::Kernel, "reread", accesses, move |st| self.enqueue(st, span, output, n, passes, iterations)) }?;
        p.finish()?.ops_ms()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{check_ptx, nvrtc_or_skip};

    #[test]
    fn reread_compiles_to_the_expected_ptx() {
        if nvrtc_or_skip("reread_compiles_to_the_expected_ptx") {
            check_ptx(&REREAD);
        }
    }

    #[test]
    fn reread_reference_without_iterations_is_the_weighted_sum_of_reads() {
        // What reread computed before it had a chain: Σ_p x·w_p by FMAs.
        let old = |x: f32, passes: i32| (0..passes).fold(0.0f32, |a, p| x.mul_add(0.5 + 0.25 * p as f32, a));
        for x in [0.0f32, 1.5, -3.25, 0.123_456_79, f32::MIN_POSITIVE] {
            for passes in [1, 2, 4, 8, 64] {
                assert_eq!(reread_reference(x, passes, 0).to_bits(), old(x, passes).to_bits(), "x {x}, {passes} passes");
            }
        }
        // 1 pass: 0.5 x; 3 passes: (0.5 + 0.75 + 1.0) x.
        assert_eq!(reread_reference(2.0, 1, 0), 1.0);
        assert_eq!(reread_reference(2.0, 3, 0), 4.5);
    }

    #[test]
    fn reread_reference_runs_the_chain_on_every_read() {
        // x = 1, c = -(1 - 2^-10): a1 = 1·c + 1 = 2^-10, a2 = 2^-10·c + 1 =
        // 1 - 2^-10 + 2^-20 (exact in f32: 21 significant bits).
        let a2 = 1.0 - 2f32.powi(-10) + 2f32.powi(-20);
        assert_eq!(compute_reference(1.0, 1), 2f32.powi(-10));
        assert_eq!(compute_reference(1.0, 2), a2);
        // 1 pass: 0.5 a2 (exact); 2 passes: 0.5 a2 + 0.75 a2 = 1.25 a2
        // = 1.25 - 1.25·2^-10 + 1.25·2^-20, rounded once by the FMA:
        // exactly 1.25 - 2^-10 - 2^-12 + 2^-20 + 2^-22 needs 23 bits, fits.
        assert_eq!(reread_reference(1.0, 1, 2), 0.5 * a2);
        let want = 1.25 - 2f32.powi(-10) - 2f32.powi(-12) + 2f32.powi(-20) + 2f32.powi(-22);
        assert_eq!(reread_reference(1.0, 2, 2).to_bits(), want.to_bits());
        assert_ne!(reread_reference(1.0, 2, 2), reread_reference(1.0, 2, 0), "the chain must change the result");
        // Long chains neither blow up nor vanish: near x / (1 - c) ≈ x / 2.
        let long = reread_reference(1.5, 4, 100_000) / (0.5 + 0.75 + 1.0 + 1.25);
        assert!((0.5..1.0).contains(&long), "{long}");
    }
}
