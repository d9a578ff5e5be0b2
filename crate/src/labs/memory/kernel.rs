//! Lab 6's zero-copy kernel (`kernels/reread.cu`): reads its input once
//! per pass, from device memory or from mapped host memory in place, with
//! an FMA chain per value read. Built on `gpu::Module`'s launch.

use crate::error::{LabError, Result};
use crate::gpu::kernels;
use crate::gpu::{CopyOp, DeviceBuffer, DeviceSpan, Event, Gpu, KernelArg, MappedBuffer, Module, PinnedBuffer, Stream};

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
        Ok(RereadKernel { module: Module::load(gpu, &kernels::REREAD)?, grid: sms * 8, block: 256 })
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
        unsafe { self.module.launch(stream, grid, self.block, 0, &args) }
    }

    /// Runs the kernel over the first `n` elements of `input` into
    /// `output` (`passes` reads, each with a chain of `iterations` FMAs
    /// per element, 0 to `MAX_ITERATIONS`), after uploading `upload`
    /// (pinned host -> the device input) when given, and waits: the device
    /// time from the first op's start to the kernel's end (CUDA events
    /// `timing`), ms.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        stream: &Stream,
        upload: Option<&PinnedBuffer>,
        input: ReadFrom<'_>,
        output: &DeviceBuffer,
        n: usize,
        passes: i32,
        iterations: i32,
        timing: (&Event, &Event),
    ) -> Result<f64> {
        let span = match &input {
            ReadFrom::Device(d) => d.span(),
            ReadFrom::Mapped(m) => m.device_span()?,
        };
        timing.0.record(stream)?;
        let queued = (|| {
            if let Some(host) = upload {
                let ReadFrom::Device(dst) = input else {
                    return Err(LabError::config("an upload goes to a device input, not to mapped host memory"));
                };
                let mut op = CopyOp::HostToDevice { src: host, dst, bytes: n * 4 };
                op.validate()?;
                // SAFETY: the stream is synchronized below, while the borrows last.
                unsafe { op.enqueue(stream) }?;
            }
            // SAFETY: as above.
            unsafe { self.enqueue(stream, span, output, n, passes, iterations) }?;
            timing.1.record(stream)
        })();
        // Whatever failed, nothing queued may outlive the borrows.
        stream.synchronize()?;
        queued?;
        timing.0.elapsed_ms(timing.1)
    }
}
