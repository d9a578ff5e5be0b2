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
        Module::from_ptx(gpu, &ptx, k.entry)
    }

    /// Loads compiled PTX and finds its entry point `entry`.
    pub fn from_ptx(gpu: &Gpu, ptx: &str, entry: &str) -> Result<Module> {
        gpu.bind()?;
        let raw = driver::module_load_ptx(ptx)?;
        // SAFETY: `raw` was just loaded and is unloaded only on the error path.
        let func = match unsafe { driver::module_function(raw, entry) } {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: nothing of the module was launched.
                let _ = unsafe { driver::module_unload(raw) };
                return Err(e);
            }
        };
        Ok(Module { raw, func, gpu: gpu.clone() })
    }

    /// Where the module's `__device__` variable `name` lives (valid while
    /// the module is loaded).
    pub(crate) fn global(&self, name: &str) -> Result<DeviceSpan> {
        self.gpu.bind()?;
        // SAFETY: `self.raw` is loaded until `self` drops.
        let (ptr, bytes) = unsafe { driver::module_global(self.raw, name) }?;
        Ok(DeviceSpan { ptr, bytes })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: owned by `self`, unloaded only here; launches were synchronized by their pipelines.
        let _ = unsafe { driver::module_unload(self.raw) };
    }
}

/// `kernels/compute.cu`: `out[i]` = FMA chain of `iterations` over `in[i]`,
/// loaded on one GPU or on each of several (a pipeline over GPUs launches
/// it on each stream's own GPU).
pub struct ComputeKernel {
    /// Per GPU: its module and the grid that fills it.
    loaded: Vec<(Module, u32)>,
    block: u32,
}

impl ComputeKernel {
    pub fn load(gpu: &Gpu) -> Result<ComputeKernel> {
        Self::load_on(std::slice::from_ref(gpu))
    }

    /// The kernel loaded on each of `gpus`.
    pub fn load_on(gpus: &[Gpu]) -> Result<ComputeKernel> {
        let loaded = gpus
            .iter()
            .map(|gpu| {
                let sms = gpu.fingerprint()?.sm_count;
                // Enough blocks to fill every SM several times; the kernel grid-strides.
                Ok((Module::load(gpu, &kernels::COMPUTE)?, sms * 8))
            })
            .collect::<Result<Vec<_>>>()?;
        if loaded.is_empty() {
            return Err(LabError::config("the compute kernel needs a GPU to load on"));
        }
        Ok(ComputeKernel { loaded, block: 256 })
    }

    /// Enqueues `out[out_at..out_at+n] = f(in[in_at..in_at+n])` (indices in
    /// f32 elements; refused where they do not fit the spans).
    ///
    /// # Safety
    /// Both spans' memory stays allocated until the stream has run the
    /// kernel (a [`super::Runner`] holds its buffers' borrows until it synchronizes).
    pub unsafe fn enqueue(&self, stream: &Stream, input: DeviceSpan, in_at: usize, output: DeviceSpan, out_at: usize, n: usize, iterations: i32) -> Result<()> {
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
        let gpu = stream.gpu().ordinal();
        let Some((module, grid)) = self.loaded.iter().find(|(m, _)| m.gpu.ordinal() == gpu) else {
            return Err(LabError::config(format!(
                "the compute kernel is not loaded on GPU {gpu} (a stream of GPU {gpu} launches it): load it with ComputeKernel::load_on for every GPU the pipeline uses"
            )));
        };
        let grid = (*grid).min(n.div_ceil(self.block as usize) as u32).max(1);
        // A launch goes to the current context's function: its GPU's.
        if self.loaded.len() > 1 {
            module.gpu.bind()?;
        }
        // SAFETY: params match `compute(const float*, float*, unsigned long long, int)`;
        // the driver copies the values at launch; bounds checked above.
        unsafe { driver::launch(module.func, grid, self.block, stream.raw(), &mut params) }
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

    /// Enqueues the scores of query `a.query` against every key row
    /// (refused where they do not fit the buffers).
    ///
    /// # Safety
    /// The buffers stay allocated until the stream has run the kernel.
    pub unsafe fn enqueue(&self, stream: &Stream, a: &RowDotArgs<'_>) -> Result<()> {
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

    /// # Safety
    /// `input`'s memory stays allocated until the stream has run the kernel.
    unsafe fn enqueue(&self, stream: &Stream, input: DeviceSpan, output: &DeviceBuffer, n: usize, passes: i32, iterations: i32) -> Result<()> {
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

/// Lab 7's tile kernels (kernels/tile_*.cu): which one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum TileKind {
    /// Through registers, sync, compute (kernels/tile_naive.cu).
    Naive,
    /// cuda::memcpy_async through a cuda::pipeline of STAGES slots (kernels/tile_async.cu).
    Async,
    /// Loader, compute and storer warps joined by two pipelines (kernels/tile_warp_specialized.cu).
    WarpSpecialized,
    /// Bulk copies by the tensor memory accelerator (kernels/tile_tma.cu), sm_90 and up.
    Tma,
}

impl TileKind {
    pub const ALL: [TileKind; 4] = [TileKind::Naive, TileKind::Async, TileKind::WarpSpecialized, TileKind::Tma];

    pub fn source(self) -> &'static KernelSource {
        match self {
            TileKind::Naive => &kernels::TILE_NAIVE,
            TileKind::Async => &kernels::TILE_ASYNC,
            TileKind::WarpSpecialized => &kernels::TILE_WARP_SPECIALIZED,
            TileKind::Tma => &kernels::TILE_TMA,
        }
    }

    /// The job of warp `warp` of a block of `threads` threads: only the
    /// warp-specialized kernel gives warps different jobs.
    pub fn warp_role(self, warp: u32, threads: u32) -> Option<&'static str> {
        match self {
            TileKind::WarpSpecialized if warp == 0 => Some("loader"),
            TileKind::WarpSpecialized if warp + 1 == threads / 32 => Some("storer"),
            TileKind::WarpSpecialized => Some("compute"),
            _ => None,
        }
    }

    /// Dynamic shared memory a block needs, bytes: its input slots (a
    /// tile and its halo each) and, for the warp-specialized kernel, its
    /// output slots.
    pub fn smem_bytes(self, shape: TileShape) -> usize {
        let span = shape.tile as usize + 2 * kernels::BLUR_RADIUS;
        let stages = shape.stages as usize;
        4 * match self {
            TileKind::Naive => span,
            TileKind::Async | TileKind::Tma => stages * span,
            TileKind::WarpSpecialized => stages * (span + shape.tile as usize),
        }
    }
}

/// A tile kernel's compile-time settings (-DTILE, -DTHREADS, -DSTAGES).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct TileShape {
    /// Outputs per tile (a multiple of 4).
    pub tile: u32,
    /// Threads per block (a multiple of 32; the warp-specialized kernel
    /// gives one warp to loading and one to storing).
    pub threads: u32,
    /// Tiles in flight per block (the naive kernel has one).
    pub stages: u32,
}

impl TileShape {
    /// The `-D` settings a kernel is compiled with for this shape.
    pub fn defines(self) -> [(&'static str, i64); 3] {
        [("TILE", self.tile as i64), ("THREADS", self.threads as i64), ("STAGES", self.stages as i64)]
    }
}

/// What the driver says of a loaded tile kernel and how it is launched.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelResources {
    /// Registers per thread.
    pub registers: u32,
    /// Shared memory per block, bytes: static (barriers, pipeline state) and dynamic (slots).
    pub static_smem: u32,
    pub dynamic_smem: u32,
    /// Local memory per thread, bytes (spilled registers; 0 is good).
    pub local_bytes: u32,
    /// Blocks that fit on one SM at once (the occupancy calculator), and
    /// the share of the SM's threads they bring.
    pub max_blocks_per_sm: u32,
    pub occupancy: f64,
    /// The launch: blocks per SM used, and the grid (SMs x that).
    pub blocks_per_sm: u32,
    pub grid: u32,
}

use serde::{Deserialize, Serialize};

/// What a warp of a tile kernel is doing (lab 7's warp timeline): the codes
/// are kernels/tile_blur.cuh's PHASE_* values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WarpPhase {
    /// Moving a tile in: loads through registers, or issuing its asynchronous copies.
    Copy,
    /// Waiting: for a tile's copies to land, at a block barrier, for a free slot.
    Wait,
    /// Blurring a tile (and storing it, but in the warp-specialized kernel).
    Compute,
    /// The storer warp writing results to device memory.
    Store,
}

impl WarpPhase {
    pub const ALL: [WarpPhase; 4] = [WarpPhase::Copy, WarpPhase::Wait, WarpPhase::Compute, WarpPhase::Store];
    /// The phase a kernel stamped (PHASE_COPY = 0 .. PHASE_STORE = 3).
    pub fn from_code(code: u32) -> Option<WarpPhase> {
        WarpPhase::ALL.get(code as usize).copied()
    }
    /// Its class on a timeline's span (the name it is recorded by).
    pub fn class(self) -> &'static str {
        match self {
            WarpPhase::Copy => "copy",
            WarpPhase::Wait => "wait",
            WarpPhase::Compute => "compute",
            WarpPhase::Store => "store",
        }
    }
    /// The phase a span's class names.
    pub fn of_class(class: &str) -> Option<WarpPhase> {
        WarpPhase::ALL.into_iter().find(|p| p.class() == class)
    }
    pub fn label(self) -> &'static str {
        match self {
            WarpPhase::Copy => "copy in",
            WarpPhase::Wait => "wait",
            WarpPhase::Compute => "compute",
            WarpPhase::Store => "store",
        }
    }
}

/// One of lab 7's tile kernels, compiled for a shape and loaded.
pub struct TileKernel {
    module: Module,
    kind: TileKind,
    shape: TileShape,
    resources: KernelResources,
    /// Built with -DTILE_TRACE: block 0's warps stamp their phases.
    traced: bool,
}

/// One phase of one warp of block 0 in a traced run, µs from block 0's
/// thread 0's start (a warp may stamp a little before it: no barrier
/// precedes the first tiles).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct WarpSpan {
    pub warp: u32,
    pub phase: WarpPhase,
    /// The block's own tile the phase worked on (0: its first): for a copy,
    /// the tile copied, issued while the block works on an earlier one.
    pub tile: u32,
    pub start_us: f64,
    pub end_us: f64,
}

/// What a traced run of a tile kernel recorded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WarpTrace {
    pub spans: Vec<WarpSpan>,
    /// The SM's cycle counter against the global timer, over block 0's
    /// thread 0's run (in the warp-specialized kernel, the loader's).
    pub ns_per_cycle: f64,
}

impl WarpTrace {
    /// Decodes the kernel's buffers (kernels/tile_blur.cuh): `clock` is
    /// block 0's thread 0's (ns, cycles) at its start and end; `words` holds
    /// 3 per slot, a stamped one being (1 << 63 | warp << 32 | phase << 16
    /// | tile, the low 32 bits of the start and end cycles) and an unused
    /// one zeros. A kernel lasts far less than the 2 s the low 32 bits
    /// take to wrap, so each stamp is its distance from the start cycle.
    pub fn decode(clock: &[u64], words: &[u64]) -> Result<WarpTrace> {
        let [t0, c0, t1, c1] = <[u64; 4]>::try_from(clock).map_err(|_| LabError::Kernel(format!("the warp trace's clock has {} words, not 4", clock.len())))?;
        if t1 <= t0 || c1 <= c0 {
            return Err(LabError::Kernel(format!(
                "the warp trace's clocks did not advance over block 0's run (ns {t0} -> {t1}, cycles {c0} -> {c1}): was the kernel built with TILE_TRACE?"
            )));
        }
        let ns_per_cycle = (t1 - t0) as f64 / (c1 - c0) as f64;
        // SM clocks run from about 0.2 to 5 GHz: anything else is a bad pairing.
        if !(0.2..=5.0).contains(&ns_per_cycle) {
            return Err(LabError::Kernel(format!("the warp trace's clocks give {ns_per_cycle:.3} ns a cycle (ns {t0} -> {t1}, cycles {c0} -> {c1})")));
        }
        let mut spans = Vec::new();
        for w in words.chunks_exact(3).filter(|w| w[0] >> 63 == 1) {
            let code = ((w[0] >> 16) & 0xffff) as u32;
            let phase = WarpPhase::from_code(code).ok_or_else(|| LabError::Kernel(format!("the warp trace holds an unknown phase {code}")))?;
            let at = |low: u64| (low as u32).wrapping_sub(c0 as u32) as i32 as f64 * ns_per_cycle / 1e3;
            spans.push(WarpSpan { warp: ((w[0] >> 32) & 0x7fff_ffff) as u32, phase, tile: (w[0] & 0xffff) as u32, start_us: at(w[1]), end_us: at(w[2]) });
        }
        spans.sort_by(|a, b| (a.warp, a.start_us).partial_cmp(&(b.warp, b.start_us)).unwrap_or(std::cmp::Ordering::Equal));
        Ok(WarpTrace { spans, ns_per_cycle })
    }
}

impl TileKernel {
    /// Compiles kernels/ source of `kind` for `shape` and loads it, with
    /// `blocks_per_sm` blocks per SM (at most what fits).
    pub fn load(gpu: &Gpu, kind: TileKind, shape: TileShape, blocks_per_sm: u32) -> Result<TileKernel> {
        let k = kind.source();
        TileKernel::load_source(gpu, kind, k.file, k.source, shape, blocks_per_sm)
    }

    /// As [`TileKernel::load`], from CUDA C text named `file` (a learner's
    /// edit of a kernel): compile errors come back as NVRTC's log.
    pub fn load_source(gpu: &Gpu, kind: TileKind, file: &str, source: &str, shape: TileShape, blocks_per_sm: u32) -> Result<TileKernel> {
        let ptx = TileKernel::compile(gpu, kind, file, source, shape)?;
        TileKernel::from_ptx(gpu, kind, &ptx, shape, blocks_per_sm)
    }

    /// kernels/ source of `kind` built with -DTILE_TRACE, one block per SM:
    /// for [`TileKernel::warp_trace`] only (the stamps cost time, so timed
    /// runs never use it).
    pub fn load_traced(gpu: &Gpu, kind: TileKind, shape: TileShape) -> Result<TileKernel> {
        let k = kind.source();
        let ptx = TileKernel::compile_with(gpu, kind, k.file, k.source, shape, true)?;
        let mut kernel = TileKernel::from_ptx(gpu, kind, &ptx, shape, 1)?;
        kernel.traced = true;
        Ok(kernel)
    }

    /// Compiles CUDA C text for `kind` at `shape` for this GPU, after the
    /// checks that need no compile: the architecture (the kernel's feature
    /// may be newer than the GPU), the shape, and its shared memory against
    /// what this GPU allows a block. Returns the PTX.
    pub fn compile(gpu: &Gpu, kind: TileKind, file: &str, source: &str, shape: TileShape) -> Result<String> {
        TileKernel::compile_with(gpu, kind, file, source, shape, false)
    }

    fn compile_with(gpu: &Gpu, kind: TileKind, file: &str, source: &str, shape: TileShape, traced: bool) -> Result<String> {
        let k = kind.source();
        let arch = kernels::arch_for(&gpu.fingerprint()?.compute_capability)?;
        kernels::require_arch(k, arch)?;
        let min_threads = if kind == TileKind::WarpSpecialized { 96 } else { 32 };
        if shape.tile == 0
            || shape.tile % 4 != 0
            || shape.threads < min_threads
            || shape.threads % 32 != 0
            || shape.threads > 1024
            || shape.stages == 0
            || shape.stages > 8
        {
            return Err(LabError::config(format!(
                "{}: tile {} (a multiple of 4), {} threads (a multiple of 32 from {min_threads} to 1024), {} stages (1 to 8)",
                k.file, shape.tile, shape.threads, shape.stages
            )));
        }
        let (smem, most) = (kind.smem_bytes(shape) as u32, gpu.max_smem_per_block()?);
        if smem > most {
            return Err(LabError::config(format!(
                "{}: tile {} with {} stages needs {} of shared memory per block; this GPU allows {}: take a smaller tile or fewer stages",
                k.file,
                shape.tile,
                shape.stages,
                crate::units::Bytes(smem as u64),
                crate::units::Bytes(most as u64)
            )));
        }
        let mut defines = shape.defines().to_vec();
        if traced {
            defines.extend([(kernels::TILE_TRACE, 1), ("TRACE_FIRST", kernels::TRACE_FIRST as i64), ("TRACE_TILES", kernels::TRACE_TILES as i64)]);
        }
        kernels::compile_source(file, source, arch, &defines)
    }

    /// Loads PTX that [`TileKernel::compile`] made for this GPU, `kind` and
    /// `shape`, with `blocks_per_sm` blocks per SM (at most what fits).
    pub fn from_ptx(gpu: &Gpu, kind: TileKind, ptx: &str, shape: TileShape, blocks_per_sm: u32) -> Result<TileKernel> {
        let k = kind.source();
        let module = Module::from_ptx(gpu, ptx, k.entry)?;
        let smem = kind.smem_bytes(shape) as u32;
        // SAFETY: the function belongs to `module`, loaded in this context just now.
        let (res, fits) = unsafe {
            let res = driver::func_resources(module.func)?;
            driver::func_set_max_dynamic_smem(module.func, smem)?;
            (res, driver::occupancy_blocks_per_sm(module.func, shape.threads, smem)?)
        };
        if fits == 0 {
            return Err(LabError::config(format!(
                "{}: a block of {} threads with {} of shared memory does not fit on an SM of this GPU: take a smaller tile or fewer stages",
                k.file,
                shape.threads,
                crate::units::Bytes((smem + res.static_smem as u32) as u64)
            )));
        }
        let per_sm = blocks_per_sm.clamp(1, fits);
        let max_threads = gpu.max_threads_per_sm()? as f64;
        let resources = KernelResources {
            registers: res.registers as u32,
            static_smem: res.static_smem as u32,
            dynamic_smem: smem,
            local_bytes: res.local_bytes as u32,
            max_blocks_per_sm: fits,
            occupancy: (fits * shape.threads) as f64 / max_threads,
            blocks_per_sm: per_sm,
            grid: gpu.fingerprint()?.sm_count * per_sm,
        };
        Ok(TileKernel { module, kind, shape, resources, traced: false })
    }

    pub fn kind(&self) -> TileKind {
        self.kind
    }
    pub fn shape(&self) -> TileShape {
        self.shape
    }
    pub fn resources(&self) -> KernelResources {
        self.resources
    }

    /// Runs the kernel once over `tiles` tiles: `output[i]` for i below
    /// tiles x tile, from `padded` (the input with the blur's zero padding
    /// at both ends); returns its time by CUDA events `timing`, ms, after
    /// the stream has finished it.
    pub fn run(&self, stream: &Stream, padded: &DeviceBuffer, output: &DeviceBuffer, tiles: u32, timing: (&super::Event, &super::Event)) -> Result<f64> {
        timing.0.record(stream)?;
        // SAFETY: both buffers are borrowed until the synchronize below.
        let queued = unsafe { self.enqueue(stream, padded.span(), output.span(), tiles) }.and_then(|_| timing.1.record(stream));
        // Whatever failed, nothing queued may outlive the borrows.
        stream.synchronize()?;
        queued?;
        timing.0.elapsed_ms(timing.1)
    }

    /// Enqueues one run over `tiles` tiles (refused where they do not fit
    /// the spans).
    ///
    /// # Safety
    /// Both spans' memory stays allocated until the stream has run the
    /// kernel (a [`super::Runner`] holds its buffers' borrows until it synchronizes).
    pub unsafe fn enqueue(&self, stream: &Stream, padded: DeviceSpan, output: DeviceSpan, tiles: u32) -> Result<()> {
        let n = tiles as usize * self.shape.tile as usize;
        if tiles == 0 || (n + 2 * kernels::BLUR_RADIUS) * 4 > padded.bytes || n * 4 > output.bytes {
            return Err(LabError::config(format!(
                "{} tiles of {} do not fit an input of {} bytes and an output of {} bytes",
                tiles, self.shape.tile, padded.bytes, output.bytes
            )));
        }
        let (mut src, mut dst, mut count) = (padded.ptr, output.ptr, tiles);
        let mut params = [&mut src as *mut u64 as *mut c_void, &mut dst as *mut u64 as *mut c_void, &mut count as *mut u32 as *mut c_void];
        // SAFETY: params match `(const float*, float*, unsigned int)`; the
        // spans hold what `tiles` tiles read and write (checked above), and
        // the caller keeps them alive until the stream has run the launch.
        unsafe { driver::launch_with_smem(self.module.func, self.resources.grid, self.shape.threads, self.resources.dynamic_smem, stream.raw(), &mut params) }
    }

    /// Runs a kernel from [`TileKernel::load_traced`] once over `tiles`
    /// tiles and reads back what block 0's warps stamped.
    pub fn warp_trace(&self, stream: &Stream, padded: &DeviceBuffer, output: &DeviceBuffer, tiles: u32) -> Result<WarpTrace> {
        if !self.traced {
            return Err(LabError::config(format!("{}: a warp trace needs the kernel built with TileKernel::load_traced", self.kind.source().file)));
        }
        let (spans, clock) = (self.module.global(kernels::TRACE_SPANS)?, self.module.global(kernels::TRACE_CLOCK)?);
        // The module (and so its variables) lives as long as `self`.
        stream.fill_span_u32(spans, 0)?;
        stream.fill_span_u32(clock, 0)?;
        // Untimed: the stamps are the measurement.
        // SAFETY: both buffers are borrowed until the synchronize below.
        let queued = unsafe { self.enqueue(stream, padded.span(), output.span(), tiles) };
        stream.synchronize()?;
        queued?;
        WarpTrace::decode(&stream.read_words(clock, 4)?, &stream.read_words(spans, spans.bytes / 8)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warp_trace_decodes_warps_phases_tiles_and_time_from_cycles() {
        // Block 0 ran 2000 ns over 1000 cycles: 2 ns a cycle. Its start
        // cycle's low 32 bits wrap during the run: stamps carry only those.
        let c0 = (7u64 << 32) + u32::MAX as u64 - 99;
        let clock = [5_000, c0, 7_000, c0 + 1000];
        let low = |after: i64| (c0 as i64 + after) as u64 & 0xffff_ffff;
        let span = |warp: u64, phase: u64, tile: u64, a: u64, b: u64| [1 << 63 | warp << 32 | phase << 16 | tile, a, b];
        // Three stamped slots, in any order, among unused (zero) ones.
        // Warp 0 stamps 50 cycles before thread 0 read the start (no barrier comes first).
        let words: Vec<u64> =
            [span(1, 2, 3, low(500), low(600)), [0; 3], span(0, 0, 0, low(-50), low(250)), span(1, 1, 3, low(250), low(500)), [0; 3]].concat();
        let t = WarpTrace::decode(&clock, &words).unwrap();
        assert_eq!(t.ns_per_cycle, 2.0);
        assert_eq!(
            t.spans,
            vec![
                WarpSpan { warp: 0, phase: WarpPhase::Copy, tile: 0, start_us: -0.1, end_us: 0.5 },
                WarpSpan { warp: 1, phase: WarpPhase::Wait, tile: 3, start_us: 0.5, end_us: 1.0 },
                WarpSpan { warp: 1, phase: WarpPhase::Compute, tile: 3, start_us: 1.0, end_us: 1.2 },
            ]
        );
        // A kernel built without TILE_TRACE leaves the clocks at zero; a bad phase is named.
        let e = WarpTrace::decode(&[0; 4], &[]).unwrap_err().to_string();
        assert!(e.contains("did not advance") && e.contains("TILE_TRACE"), "{e}");
        let e = WarpTrace::decode(&clock, &span(0, 9, 0, low(1), low(2))).unwrap_err().to_string();
        assert!(e.contains("unknown phase 9"), "{e}");
        let e = WarpTrace::decode(&[0, 0, 100, 1_000_000], &[]).unwrap_err().to_string();
        assert!(e.contains("0.000 ns a cycle"), "{e}");
        assert!(WarpTrace::decode(&clock[..3], &[]).is_err());
    }

    #[test]
    fn only_the_warp_specialized_kernel_gives_warps_jobs() {
        let roles: Vec<_> = (0..4).map(|w| TileKind::WarpSpecialized.warp_role(w, 128)).collect();
        assert_eq!(roles, [Some("loader"), Some("compute"), Some("compute"), Some("storer")]);
        assert!(TileKind::ALL.iter().filter(|k| **k != TileKind::WarpSpecialized).all(|k| k.warp_role(0, 128).is_none()));
    }
}
