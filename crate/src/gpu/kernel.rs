//! Kernels compiled at run time (NVRTC) and loaded as modules.

use super::{driver, DeviceBuffer, DeviceSpan, Gpu, Stream};
use crate::error::{LabError, Result};
use crate::gpu::kernels::{self, KernelSource};
use std::ffi::c_void;

/// A loaded module holding one kernel.
pub struct Module {
    raw: driver::CUmodule,
    func: driver::CUfunction,
    gpu: Gpu,
}

// SAFETY: module and function handles may be used from any thread.
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

impl Module {
    /// Compiles `k` for this device's architecture and loads it.
    pub fn load(gpu: &Gpu, k: &KernelSource) -> Result<Module> {
        let cc = gpu.fingerprint()?.compute_capability;
        let ptx = kernels::compile_ptx(k, kernels::arch_for(&cc)?)?;
        gpu.bind()?;
        let raw = driver::module_load_ptx(&ptx)?;
        // SAFETY: `raw` was just loaded and is unloaded only on the error path.
        let func = match unsafe { driver::module_function(raw, k.entry) } {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: nothing of the module was launched.
                let _ = unsafe { driver::module_unload(raw) };
                return Err(e);
            }
        };
        Ok(Module { raw, func, gpu: gpu.clone() })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: owned by `self`, unloaded only here; launches were synchronized by their pipelines.
        let _ = unsafe { driver::module_unload(self.raw) };
    }
}

/// `kernels/compute.cu`: out[i] = FMA chain of `iterations` over in[i].
pub struct ComputeKernel {
    module: Module,
    grid: u32,
    block: u32,
}

impl ComputeKernel {
    pub fn load(gpu: &Gpu) -> Result<ComputeKernel> {
        let sms = gpu.fingerprint()?.sm_count;
        // Enough blocks to fill every SM several times; the kernel grid-strides.
        Ok(ComputeKernel { module: Module::load(gpu, &kernels::COMPUTE)?, grid: sms * 8, block: 256 })
    }

    /// Enqueues `out[out_at..out_at+n] = f(in[in_at..in_at+n])` (indices in
    /// f32 elements). The caller keeps both buffers alive until the stream
    /// has run it (a `Pipeline` holds its buffers' borrows until it synchronizes).
    pub(crate) fn enqueue(&self, stream: &Stream, input: DeviceSpan, in_at: usize, output: DeviceSpan, out_at: usize, n: usize, iterations: i32) -> Result<()> {
        if n == 0 || (in_at + n) * 4 > input.bytes || (out_at + n) * 4 > output.bytes || iterations < 0 {
            return Err(LabError::config(format!(
                "compute of {n} elements at {in_at}->{out_at} does not fit buffers of {} and {} bytes (iterations {iterations})",
                input.bytes, output.bytes
            )));
        }
        let mut src = input.ptr + (in_at * 4) as u64;
        let mut dst = output.ptr + (out_at * 4) as u64;
        let mut count = n as u64;
        let mut iters = iterations;
        let mut params = [
            &mut src as *mut u64 as *mut c_void,
            &mut dst as *mut u64 as *mut c_void,
            &mut count as *mut u64 as *mut c_void,
            &mut iters as *mut i32 as *mut c_void,
        ];
        let grid = self.grid.min(n.div_ceil(self.block as usize) as u32).max(1);
        // SAFETY: params match `compute(const float*, float*, unsigned long long, int)`;
        // the driver copies the values at launch; bounds checked above.
        unsafe { driver::launch(self.module.func, grid, self.block, stream.raw(), &mut params) }
    }
}

/// `kernels/row_dot.cu`: one query's dot product with every key row, and
/// a stamp word after the scores.
pub struct RowDotKernel {
    module: Module,
    grid: u32,
    block: u32,
}

/// Where a `row_dot` launch reads and writes.
pub struct RowDotArgs<'b> {
    /// rows x dim f32, row-major.
    pub keys: &'b DeviceBuffer,
    /// queries x dim f32.
    pub queries: &'b DeviceBuffer,
    pub query: usize,
    pub rows: usize,
    pub dim: usize,
    /// rows scores, then one u32 stamp.
    pub scores: &'b DeviceBuffer,
    pub stamp: u32,
}

impl RowDotKernel {
    pub fn load(gpu: &Gpu) -> Result<RowDotKernel> {
        let sms = gpu.fingerprint()?.sm_count;
        // 8 warps a block (a warp per row), enough blocks to fill every SM.
        Ok(RowDotKernel { module: Module::load(gpu, &kernels::ROW_DOT)?, grid: sms * 16, block: 256 })
    }

    /// Enqueues the scores of query `a.query` against every key row. The
    /// caller keeps the buffers alive until the stream has run it.
    pub(crate) fn enqueue(&self, stream: &Stream, a: &RowDotArgs<'_>) -> Result<()> {
        let fits = a.dim % 4 == 0
            && a.dim > 0
            && a.rows > 0
            && a.rows < u32::MAX as usize
            && a.rows * a.dim * 4 <= a.keys.bytes()
            && (a.query + 1) * a.dim * 4 <= a.queries.bytes()
            && (a.rows + 1) * 4 <= a.scores.bytes();
        if !fits {
            return Err(LabError::config(format!(
                "row_dot of {} rows x {} (query {}) does not fit keys {} B, queries {} B, scores {} B (dim must be a multiple of 4)",
                a.rows,
                a.dim,
                a.query,
                a.keys.bytes(),
                a.queries.bytes(),
                a.scores.bytes()
            )));
        }
        let (mut keys, mut queries, mut scores) = (a.keys.ptr(), a.queries.ptr(), a.scores.ptr());
        let (mut query, mut rows, mut dim, mut stamp) = (a.query as i32, a.rows as u32, a.dim as i32, a.stamp);
        let mut params = [
            &mut keys as *mut u64 as *mut c_void,
            &mut queries as *mut u64 as *mut c_void,
            &mut query as *mut i32 as *mut c_void,
            &mut rows as *mut u32 as *mut c_void,
            &mut dim as *mut i32 as *mut c_void,
            &mut scores as *mut u64 as *mut c_void,
            &mut stamp as *mut u32 as *mut c_void,
        ];
        let warps_per_block = self.block as usize / 32;
        let grid = self.grid.min(a.rows.div_ceil(warps_per_block) as u32).max(1);
        // SAFETY: params match `row_dot(const float*, const float*, int,
        // unsigned, int, float*, unsigned)`; bounds checked above.
        unsafe { driver::launch(self.module.func, grid, self.block, stream.raw(), &mut params) }
    }
}

/// Where `reread` reads its input from.
pub enum ReadFrom<'a> {
    /// Device memory (copied there first).
    Device(&'a DeviceBuffer),
    /// Mapped pinned host memory, read in place over the host link.
    Mapped(&'a super::MappedBuffer),
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

    fn enqueue(&self, stream: &Stream, input: DeviceSpan, output: &DeviceBuffer, n: usize, passes: i32, iterations: i32) -> Result<()> {
        if !(0..=Self::MAX_ITERATIONS).contains(&iterations) {
            return Err(LabError::config(format!("reread with {iterations} FMAs per element per pass: give 0 to {}", Self::MAX_ITERATIONS)));
        }
        if n == 0 || n * 4 > input.bytes || n * 4 > output.bytes() || !(1..=64).contains(&passes) {
            return Err(LabError::config(format!(
                "reread of {n} elements, {passes} passes, does not fit {} -> {} bytes (1 to 64 passes)",
                input.bytes,
                output.bytes()
            )));
        }
        let (mut src, mut dst, mut count, mut p, mut iters) = (input.ptr, output.ptr(), n as u64, passes, iterations);
        let mut params = [
            &mut src as *mut u64 as *mut c_void,
            &mut dst as *mut u64 as *mut c_void,
            &mut count as *mut u64 as *mut c_void,
            &mut p as *mut i32 as *mut c_void,
            &mut iters as *mut i32 as *mut c_void,
        ];
        let grid = self.grid.min(n.div_ceil(self.block as usize) as u32).max(1);
        // SAFETY: params match `reread(const float*, float*, unsigned long long, int, int)`; bounds checked above.
        unsafe { driver::launch(self.module.func, grid, self.block, stream.raw(), &mut params) }
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
        upload: Option<&super::PinnedBuffer>,
        input: ReadFrom<'_>,
        output: &DeviceBuffer,
        n: usize,
        passes: i32,
        iterations: i32,
        timing: (&super::Event, &super::Event),
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
                let mut op = super::CopyOp::HostToDevice { src: host, dst, bytes: n * 4 };
                op.validate()?;
                op.enqueue(stream)?;
            }
            self.enqueue(stream, span, output, n, passes, iterations)?;
            timing.1.record(stream)
        })();
        // Whatever failed, nothing queued may outlive the borrows.
        stream.synchronize()?;
        queued?;
        timing.0.elapsed_ms(timing.1)
    }
}
