//! Lab 7's tile kernels (`kernels/tile_*.cu`) as the lab loads and runs
//! them: which kernel ([`TileKind`]: the lab's own and the plain CUDA
//! reference they are held to), its compile-time shape ([`TileShape`], and
//! the blur's vector width, [`VEC_DEFAULT`]), what the driver says of it
//! ([`KernelResources`]), a launch over tiles, and block 0's warp trace
//! ([`WarpTrace`]) from a build with `-DTILE_TRACE`, and the CPU reference
//! of their blur. A build's launches share its module
//! ([`TileKernel::relaunched`]). Built on `gpu::Module`'s launch; nothing
//! else of the crate runs these kernels.
//!
//! May use: `gpu` (modules, launches, NVRTC through `gpu::kernels`),
//! `error`, `units`; rayon for the CPU reference.

use crate::error::{LabError, Result};
use crate::gpu::kernels::{self, KernelHeader, KernelSource};
use crate::gpu::{DeviceBuffer, DeviceSpan, Gpu, KernelArg, Module, Stream};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Lab 7's workload (a 9-tap blur over tiles), shared by its kernels.
pub const TILE_BLUR_H: KernelHeader = KernelHeader { file: "tile_blur.cuh", text: include_str!("../../../../kernels/tile_blur.cuh") };

/// The `-D` setting that builds a tile kernel's warp timeline (see
/// kernels/tile_blur.cuh): never set for timed runs.
pub const TILE_TRACE: &str = "TILE_TRACE";
/// The block's tiles the warp timeline covers: TRACE_TILES tiles from
/// TRACE_FIRST (after the pipelines have filled), given to the kernel as
/// `-D` settings of the same names.
pub const TRACE_FIRST: u32 = 4;
pub const TRACE_TILES: u32 = 8;
/// The warp timeline's spans in the module (3 words each, per warp).
pub const TRACE_SPANS: &str = "tile_trace";
/// Block 0's thread 0's (ns, cycles) at its start and end.
pub const TRACE_CLOCK: &str = "tile_trace_clock";

/// Lab 7's kernels' settings for the compile tests (VEC: the header's
/// default, [`VEC_DEFAULT`]).
const TILE_TEST: &[(&str, i64)] = &[("TILE", 4096), ("THREADS", 256), ("STAGES", 2)];

/// Outputs a thread of a tile kernel computes and stores at once
/// (kernels/tile_blur.cuh's VEC, its default): 4, a float4, three 16-byte
/// shared loads and one 16-byte store for four outputs. 1 is the scalar
/// blur (nine 4-byte shared loads and a 4-byte store an output) that the
/// recordings before the setting ran, and the exercise's given file writes.
pub const VEC_DEFAULT: u32 = 4;
/// The vector widths kernels/tile_blur.cuh takes.
pub const VEC_WIDTHS: [u32; 2] = [1, 4];

pub const TILE_NAIVE: KernelSource = KernelSource {
    file: "tile_naive.cu",
    entry: "tile_naive",
    source: include_str!("../../../../kernels/tile_naive.cu"),
    // Vector loads through registers, stored to shared memory, block syncs;
    // the blur's binomial weight 70/256 (0f3E8C0000), four outputs at a
    // time (16-byte shared loads and global stores).
    expect_in_ptx: &[
        "ld.global.nc.v4",
        "st.shared.v4",
        "bar.sync",
        "fma.rn.f32",
        "0f3E8C0000",
        "ld.shared.v4.f32",
        "st.global.v4.f32",
        ".visible .entry tile_naive",
    ],
    purpose: "lab 7, kernel 1: each tile loaded through registers into shared memory, the block synced, then computed (no load in flight while it computes)",
    test_defines: TILE_TEST,
    headers: &[&TILE_BLUR_H],
    ..KernelSource::PLAIN
};

pub const TILE_ASYNC: KernelSource = KernelSource {
    file: "tile_async.cu",
    entry: "tile_async",
    source: include_str!("../../../../kernels/tile_async.cu"),
    // cuda::memcpy_async through a per-thread cuda::pipeline: 16-byte
    // cp.async in commit groups, waited for oldest first; the blur four
    // outputs at a time.
    expect_in_ptx: &[
        "cp.async.cg.shared.global",
        "cp.async.commit_group",
        "cp.async.wait_group",
        "bar.sync",
        "fma.rn.f32",
        "ld.shared.v4.f32",
        "st.global.v4.f32",
        ".visible .entry tile_async",
    ],
    purpose: "lab 7, kernels 2 and 3: tiles copied to shared memory with cuda::memcpy_async through a cuda::pipeline of STAGES slots (2: double buffering)",
    min_cc: 80,
    test_defines: TILE_TEST,
    headers: &[&TILE_BLUR_H],
};

pub const TILE_WARP_SPECIALIZED: KernelSource = KernelSource {
    file: "tile_warp_specialized.cu",
    entry: "tile_warp_specialized",
    source: include_str!("../../../../kernels/tile_warp_specialized.cu"),
    // The loader's cp.async arriving on the slot's barrier when its copies
    // land; the compute warps' blur four outputs at a time into the output
    // slot; the storer's vector stores to device memory.
    expect_in_ptx: &[
        "cp.async.cg.shared.global",
        "cp.async.mbarrier.arrive.noinc",
        "mbarrier.try_wait",
        "st.shared.v4.f32",
        "st.global.v4",
        ".visible .entry tile_warp_specialized",
    ],
    purpose: "lab 7, kernel 4: a loader warp, compute warps and a storer warp joined by two pipelines of STAGES slots (barrier pairs)",
    min_cc: 80,
    test_defines: TILE_TEST,
    headers: &[&TILE_BLUR_H],
};

pub const TILE_TMA: KernelSource = KernelSource {
    file: "tile_tma.cu",
    entry: "tile_tma",
    source: include_str!("../../../../kernels/tile_tma.cu"),
    // One bulk copy per tile, counted in bytes on the slot's mbarrier; the
    // blur four outputs at a time.
    expect_in_ptx: &[
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
        "mbarrier.expect_tx",
        "fence.proxy.async",
        "st.global.v4.f32",
        ".visible .entry tile_tma",
    ],
    purpose: "lab 7, kernel 5 (Hopper and later): each tile one bulk copy by the tensor memory accelerator, completed on an mbarrier",
    min_cc: 90,
    test_defines: TILE_TEST,
    headers: &[&TILE_BLUR_H],
};

pub const TILE_PLAIN: KernelSource = KernelSource {
    file: "tile_plain.cu",
    entry: "tile_plain",
    source: include_str!("../../../../kernels/tile_plain.cu"),
    // A block-wide cuda::pipeline (its shared state's mbarriers) fed by
    // cuda::memcpy_async(block, ...): 16-byte cp.async arriving on the
    // stage's barrier, waited for by parity; the blur four outputs at a time.
    expect_in_ptx: &[
        "cp.async.cg.shared.global",
        "cp.async.mbarrier.arrive",
        "mbarrier.try_wait.parity",
        "st.global.v4.f32",
        ".visible .entry tile_plain",
    ],
    purpose: "lab 7's plain reference: the tile blur as the CUDA programming guide writes a two-stage pipeline (a block-wide cuda::pipeline, cuda::memcpy_async of the whole block), the yardstick of the lab's own kernels",
    min_cc: 80,
    test_defines: TILE_TEST,
    headers: &[&TILE_BLUR_H],
};

/// The radius of lab 7's blur (kernels/tile_blur.cuh): inputs are padded
/// with this many zeros at each end.
pub const BLUR_RADIUS: usize = 4;

/// CPU reference of lab 7's tile kernels: `out[i] = Σ_k W[k]·padded[i + k]`
/// by FMAs in the kernels' order, bit-exact with them. `padded` holds
/// [`BLUR_RADIUS`] zeros, the input, and as many zeros again. Spread over the host's cores in chunks (each output depends on its
/// window alone, so the result is the same bits as one loop's).
pub fn blur_reference(padded: &[f32], out: &mut [f32]) {
    use rayon::prelude::*;
    // (1 8 28 56 70 56 28 8 1) / 256, exact in f32: kernels/tile_blur.cuh.
    const W: [f32; 9] = [0.003_906_25, 0.031_25, 0.109_375, 0.218_75, 0.273_437_5, 0.218_75, 0.109_375, 0.031_25, 0.003_906_25];
    const CHUNK: usize = 1 << 16;
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, chunk)| {
        for (j, o) in chunk.iter_mut().enumerate() {
            let i = c * CHUNK + j;
            *o = W.iter().zip(&padded[i..i + 2 * BLUR_RADIUS + 1]).fold(0.0f32, |acc, (&w, &x)| w.mul_add(x, acc));
        }
    });
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
    /// The plain CUDA reference: a two-stage block-wide cuda::pipeline as
    /// the CUDA programming guide writes it (kernels/tile_plain.cu); not
    /// one of the lab's lessons, the yardstick of its kernels.
    Plain,
}

impl TileKind {
    pub const ALL: [TileKind; 5] = [TileKind::Naive, TileKind::Async, TileKind::WarpSpecialized, TileKind::Tma, TileKind::Plain];

    pub fn source(self) -> &'static KernelSource {
        match self {
            TileKind::Naive => &TILE_NAIVE,
            TileKind::Async => &TILE_ASYNC,
            TileKind::WarpSpecialized => &TILE_WARP_SPECIALIZED,
            TileKind::Tma => &TILE_TMA,
            TileKind::Plain => &TILE_PLAIN,
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
        let span = shape.tile as usize + 2 * BLUR_RADIUS;
        let stages = shape.stages as usize;
        4 * match self {
            TileKind::Naive => span,
            TileKind::Async | TileKind::Tma | TileKind::Plain => stages * span,
            TileKind::WarpSpecialized => stages * (span + shape.tile as usize),
        }
    }
}

/// A tile kernel's compile-time settings (-DTILE, -DTHREADS, -DSTAGES;
/// the blur's vector width, -DVEC, is given beside it: [`TileKernel::load_with`]).
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
    /// The `-D` settings a kernel is compiled with for this shape, the blur
    /// `vec` outputs wide (-DVEC).
    pub fn defines(self, vec: u32) -> [(&'static str, i64); 4] {
        [("TILE", self.tile as i64), ("THREADS", self.threads as i64), ("STAGES", self.stages as i64), ("VEC", vec as i64)]
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

/// One of lab 7's tile kernels, compiled for a shape and loaded, with its
/// launch (blocks per SM). Launches of one build share its module
/// ([`TileKernel::relaunched`]).
pub struct TileKernel {
    module: Arc<Module>,
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
    /// Compiles kernels/ source of `kind` for `shape` (the blur
    /// [`VEC_DEFAULT`] outputs wide) and loads it, with `blocks_per_sm`
    /// blocks per SM (at most what fits).
    pub fn load(gpu: &Gpu, kind: TileKind, shape: TileShape, blocks_per_sm: u32) -> Result<TileKernel> {
        TileKernel::load_with(gpu, kind, shape, VEC_DEFAULT, blocks_per_sm)
    }

    /// As [`TileKernel::load`], the blur `vec` outputs wide (one of [`VEC_WIDTHS`]).
    pub fn load_with(gpu: &Gpu, kind: TileKind, shape: TileShape, vec: u32, blocks_per_sm: u32) -> Result<TileKernel> {
        let k = kind.source();
        let ptx = TileKernel::compile_with(gpu, kind, k.file, k.source, shape, vec, false)?;
        TileKernel::from_ptx(gpu, kind, &ptx, shape, blocks_per_sm)
    }

    /// kernels/ source of `kind` built with -DTILE_TRACE, one block per SM:
    /// for [`TileKernel::warp_trace`] only (the stamps cost time, so timed
    /// runs never use it).
    pub fn load_traced(gpu: &Gpu, kind: TileKind, shape: TileShape) -> Result<TileKernel> {
        TileKernel::load_traced_with(gpu, kind, shape, VEC_DEFAULT)
    }

    /// As [`TileKernel::load_traced`], the blur `vec` outputs wide.
    pub fn load_traced_with(gpu: &Gpu, kind: TileKind, shape: TileShape, vec: u32) -> Result<TileKernel> {
        let k = kind.source();
        let ptx = TileKernel::compile_with(gpu, kind, k.file, k.source, shape, vec, true)?;
        Ok(TileKernel::from_ptx(gpu, kind, &ptx, shape, 1)?.into_traced())
    }

    /// Compiles CUDA C text for `kind` at `shape` (the blur `vec` outputs
    /// wide where it uses `blur_tile`) for this GPU, after the checks that
    /// need no compile: the architecture (the kernel's feature may be newer
    /// than the GPU), the shape, and its shared memory against what this
    /// GPU allows a block. Returns the PTX.
    pub fn compile(gpu: &Gpu, kind: TileKind, file: &str, source: &str, shape: TileShape, vec: u32) -> Result<String> {
        TileKernel::compile_with(gpu, kind, file, source, shape, vec, false)
    }

    fn compile_with(gpu: &Gpu, kind: TileKind, file: &str, source: &str, shape: TileShape, vec: u32, traced: bool) -> Result<String> {
        let arch = TileKernel::precheck(gpu, kind, shape, vec)?;
        kernels::compile_source(file, source, kind.source().headers, arch, &TileKernel::defines(shape, vec, traced))
    }

    /// The checks of a build of `kind` at `shape` (the blur `vec` outputs
    /// wide) that need no compile, on this GPU: the architecture (the
    /// kernel's feature may be newer than the GPU:
    /// [`LabError::Unsupported`]), the shape, and its shared memory against
    /// what this GPU allows a block. Returns the architecture to compile for.
    pub fn precheck(gpu: &Gpu, kind: TileKind, shape: TileShape, vec: u32) -> Result<&'static str> {
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
            || !VEC_WIDTHS.contains(&vec)
        {
            return Err(LabError::config(format!(
                "{}: tile {} (a multiple of 4), {} threads (a multiple of 32 from {min_threads} to 1024), {} stages (1 to 8), vector width {vec} (1 or 4)",
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
        Ok(arch)
    }

    /// The `-D` settings of a build at `shape`, the blur `vec` outputs
    /// wide, traced or not (the traced build's window with it).
    pub fn defines(shape: TileShape, vec: u32, traced: bool) -> Vec<(&'static str, i64)> {
        let mut defines = shape.defines(vec).to_vec();
        if traced {
            defines.extend([(TILE_TRACE, 1), ("TRACE_FIRST", TRACE_FIRST as i64), ("TRACE_TILES", TRACE_TILES as i64)]);
        }
        defines
    }

    /// Loads PTX that [`TileKernel::compile`] made for this GPU, `kind` and
    /// `shape`, with `blocks_per_sm` blocks per SM (at most what fits).
    pub fn from_ptx(gpu: &Gpu, kind: TileKind, ptx: &str, shape: TileShape, blocks_per_sm: u32) -> Result<TileKernel> {
        let k = kind.source();
        let module = Module::from_ptx(gpu, ptx, k.entry)?;
        let smem = kind.smem_bytes(shape) as u32;
        let (res, fits) = (module.resources()?, module.allow_dynamic_smem(smem, shape.threads)?);
        if fits == 0 {
            return Err(LabError::config(format!(
                "{}: a block of {} threads with {} of shared memory does not fit on an SM of this GPU: take a smaller tile or fewer stages",
                k.file,
                shape.threads,
                crate::units::Bytes((smem + res.static_smem as u32) as u64)
            )));
        }
        let max_threads = gpu.max_threads_per_sm()? as f64;
        let resources = KernelResources {
            registers: res.registers as u32,
            static_smem: res.static_smem as u32,
            dynamic_smem: smem,
            local_bytes: res.local_bytes as u32,
            max_blocks_per_sm: fits,
            occupancy: (fits * shape.threads) as f64 / max_threads,
            blocks_per_sm: 1,
            grid: 0,
        };
        TileKernel { module: Arc::new(module), kind, shape, resources, traced: false }.relaunched(gpu, blocks_per_sm)
    }

    /// The same build (its module shared: no compile, no load) launched
    /// with `blocks_per_sm` blocks per SM (at most what fits: asking
    /// `u32::MAX` takes as many as fit), the grid the SMs times that.
    pub fn relaunched(&self, gpu: &Gpu, blocks_per_sm: u32) -> Result<TileKernel> {
        let per_sm = blocks_per_sm.clamp(1, self.resources.max_blocks_per_sm.max(1));
        let resources = KernelResources { blocks_per_sm: per_sm, grid: gpu.fingerprint()?.sm_count * per_sm, ..self.resources };
        Ok(TileKernel { module: Arc::clone(&self.module), kind: self.kind, shape: self.shape, resources, traced: self.traced })
    }

    /// Whether it was built with -DTILE_TRACE ([`TileKernel::load_traced`]).
    pub fn traced(&self) -> bool {
        self.traced
    }

    /// Marks a kernel loaded from PTX built with -DTILE_TRACE
    /// ([`TileKernel::defines`] with `traced`) as traced, so that
    /// [`TileKernel::warp_trace`] may run it.
    pub fn into_traced(mut self) -> TileKernel {
        self.traced = true;
        self
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

    /// Enqueues one run over `tiles` tiles (refused where they do not fit
    /// the spans).
    ///
    /// # Safety
    /// Both spans' memory stays allocated until the stream has run the
    /// kernel (a [`crate::gpu::Runner`] holds its buffers' borrows until it synchronizes).
    pub unsafe fn enqueue(&self, stream: &Stream, padded: DeviceSpan, output: DeviceSpan, tiles: u32) -> Result<()> {
        let n = tiles as usize * self.shape.tile as usize;
        if tiles == 0 || (n + 2 * BLUR_RADIUS) * 4 > padded.bytes() || n * 4 > output.bytes() {
            return Err(LabError::config(format!(
                "{} tiles of {} do not fit an input of {} bytes and an output of {} bytes",
                tiles,
                self.shape.tile,
                padded.bytes(),
                output.bytes()
            )));
        }
        let args = [KernelArg::Span(padded), KernelArg::Span(output), KernelArg::U32(tiles)];
        // SAFETY: the arguments match `(const float*, float*, unsigned int)`;
        // the spans hold what `tiles` tiles read and write (checked above),
        // and the caller keeps them alive until the stream has run the launch.
        unsafe { self.module.launch(stream, self.resources.grid, self.shape.threads, self.resources.dynamic_smem, args) }
    }

    /// Runs a kernel from [`TileKernel::load_traced`] once over `tiles`
    /// tiles and reads back what block 0's warps stamped.
    pub fn warp_trace(&self, stream: &Stream, padded: &DeviceBuffer, output: &DeviceBuffer, tiles: u32) -> Result<WarpTrace> {
        if !self.traced {
            return Err(LabError::config(format!("{}: a warp trace needs the kernel built with TileKernel::load_traced", self.kind.source().file)));
        }
        self.module.fill_global(stream, TRACE_SPANS, 0)?;
        self.module.fill_global(stream, TRACE_CLOCK, 0)?;
        // Untimed: the stamps are the measurement.
        // SAFETY: both buffers are borrowed until the synchronize below.
        let queued = unsafe { self.enqueue(stream, padded.span(), output.span(), tiles) };
        stream.synchronize()?;
        queued?;
        WarpTrace::decode(&self.module.read_global(stream, TRACE_CLOCK)?, &self.module.read_global(stream, TRACE_SPANS)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{check_ptx, nvrtc_or_skip};

    #[test]
    fn the_tile_kernels_compile_to_the_expected_ptx() {
        if nvrtc_or_skip("the_tile_kernels_compile_to_the_expected_ptx") {
            for k in TileKind::ALL {
                check_ptx(k.source());
            }
        }
    }

    /// Every tile kernel compiles at each vector width: four outputs at a
    /// time load the tile from shared memory 16 bytes at a time, one at a
    /// time 4 bytes; any other width is refused by the header, by name.
    #[test]
    fn every_tile_kernel_compiles_at_each_vector_width_and_no_other() {
        if !nvrtc_or_skip("every_tile_kernel_compiles_at_each_vector_width_and_no_other") {
            return;
        }
        for k in TileKind::ALL.map(TileKind::source) {
            for vec in VEC_WIDTHS {
                let defines: Vec<_> = k.test_defines.iter().copied().chain([("VEC", vec as i64)]).collect();
                let ptx = kernels::compile_ptx_with(k, "compute_90", &defines).unwrap_or_else(|e| panic!("{} VEC={vec}: {e}", k.file));
                let (scalar, vector) = (ptx.contains("ld.shared.f32"), ptx.contains("ld.shared.v4.f32"));
                assert_eq!((scalar, vector), (vec == 1, vec == 4), "{} VEC={vec}: 4-byte shared loads {scalar}, 16-byte {vector}", k.file);
            }
            let defines: Vec<_> = k.test_defines.iter().copied().chain([("VEC", 2)]).collect();
            let e = kernels::compile_ptx_with(k, "compute_90", &defines).unwrap_err().to_string();
            assert!(e.contains("VEC must be 1"), "{}: {e}", k.file);
        }
    }

    #[test]
    fn an_error_in_a_learners_kernel_names_its_own_line_after_the_blur_header() {
        if !nvrtc_or_skip("an_error_in_a_learners_kernel_names_its_own_line_after_the_blur_header") {
            return;
        }
        let src = "// line 1\n#include \"tile_blur.cuh\"\n\nextern \"C\" __global__ void k(float* o) { o[0] = blur_at(o, 0) + missing_name; }\n";
        let e = kernels::compile_source("mine.cu", src, TILE_ASYNC.headers, "compute_90", &[]).unwrap_err().to_string();
        assert!(e.contains("mine.cu(4)") && e.contains("missing_name"), "the error must point at mine.cu line 4:\n{e}");
        let e = kernels::compile_ptx(&TILE_TMA, "compute_80").unwrap_err().to_string();
        assert!(e.contains("tile_tma.cu") && e.contains("9.0") && e.contains("compute_80"), "{e}");
    }

    #[test]
    fn traced_tile_kernels_stamp_the_warp_timeline_and_untraced_ones_do_not() {
        if !nvrtc_or_skip("traced_tile_kernels_stamp_the_warp_timeline_and_untraced_ones_do_not") {
            return;
        }
        for k in TileKind::ALL.map(TileKind::source) {
            let plain = kernels::compile_ptx_with(k, "compute_90", k.test_defines).unwrap_or_else(|e| panic!("{e}"));
            // (libcu++'s barrier waits read %globaltimer for their back-off, so only the buffers tell.)
            assert!(!plain.contains("tile_trace"), "{}: untraced PTX stamps", k.file);
            let traced_defines: Vec<_> = k.test_defines.iter().copied().chain([(TILE_TRACE, 1)]).collect();
            let traced = kernels::compile_ptx_with(k, "compute_90", &traced_defines).unwrap_or_else(|e| panic!("{e}"));
            for needle in [".global .align 8 .b8 tile_trace[", "tile_trace_clock", "%globaltimer", "%clock64"] {
                assert!(traced.contains(needle), "{}: traced PTX lacks `{needle}`", k.file);
            }
            // Plain stores: an atomic counter would make each stamp wait on L2.
            assert!(!traced.contains("atom.global"), "{}: the trace must not wait on atomics", k.file);
        }
    }

    #[test]
    fn blur_reference_weights_sum_to_one_and_see_only_their_window() {
        let r = BLUR_RADIUS;
        // A constant input gives itself back (the weights sum to 1, exactly).
        let padded: Vec<f32> = (0..64 + 2 * r).map(|i| if i < r || i >= 64 + r { 0.0 } else { 3.0 }).collect();
        let mut out = vec![f32::NAN; 64];
        blur_reference(&padded, &mut out);
        assert!(out[r..64 - r].iter().all(|&v| v == 3.0), "{out:?}");
        // Edges see the zero padding.
        assert!(out[0] < 3.0 && out[63] < 3.0);
        // An impulse spreads to the binomial weights, centred.
        let mut impulse = vec![0.0f32; 32 + 2 * r];
        impulse[r + 10] = 256.0;
        let mut out = vec![0.0; 32];
        blur_reference(&impulse, &mut out);
        assert_eq!(&out[6..15], &[1.0, 8.0, 28.0, 56.0, 70.0, 56.0, 28.0, 8.0, 1.0]);
        assert!(out[..6].iter().chain(&out[15..]).all(|&v| v == 0.0));
    }

    /// The reference spread over the cores gives the same bits as one
    /// loop, across the chunks' edges.
    #[test]
    fn the_parallel_reference_is_the_serial_one_bit_for_bit() {
        let n = 3 * (1 << 16) + 5;
        let padded: Vec<f32> = (0..n + 2 * BLUR_RADIUS).map(|i| crate::measure::pattern::f32_at(7, i)).collect();
        let mut out = vec![0.0f32; n];
        blur_reference(&padded, &mut out);
        const W: [f32; 9] = [0.003_906_25, 0.031_25, 0.109_375, 0.218_75, 0.273_437_5, 0.218_75, 0.109_375, 0.031_25, 0.003_906_25];
        for i in [0, 1, (1 << 16) - 1, 1 << 16, (1 << 16) + 1, 2 * (1 << 16), n - 1] {
            let want = W.iter().zip(&padded[i..i + 9]).fold(0.0f32, |acc, (&w, &x)| w.mul_add(x, acc));
            assert_eq!(out[i].to_bits(), want.to_bits(), "output {i}");
        }
    }

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
