//! The CUDA C kernels in `kernels/`, one per file, embedded in the binary and
//! compiled at run time with NVRTC. Listed in one table, with the PTX each is
//! expected to contain, so CI (no GPU, NVRTC and CUDA's headers from PyPI)
//! can compile and check every one of them. Headers of `kernels/` that a
//! kernel includes (`#include "tile_blur.cuh"`) are inlined before NVRTC
//! sees the source; CUDA's own C++ headers (`#include <cuda/pipeline>`) are
//! found on this machine ([`cuda_include_dirs`]).

use crate::error::{LabError, Result};
use std::path::{Path, PathBuf};

/// One kernel source file.
#[derive(Debug)]
pub struct KernelSource {
    /// File name under kernels/.
    pub file: &'static str,
    /// The `extern "C"` entry point.
    pub entry: &'static str,
    pub source: &'static str,
    /// PTX instructions the kernel is meant to compile to (checked in tests).
    pub expect_in_ptx: &'static [&'static str],
    /// What the kernel is for.
    pub purpose: &'static str,
    /// The oldest compute capability it is written for, x10 (80: cp.async;
    /// 90: the tensor memory accelerator); 0 for any.
    pub min_cc: u32,
    /// The `-D` settings the tests compile it with (the labs pass their own).
    pub test_defines: &'static [(&'static str, i64)],
}

/// The fields a plain kernel leaves at their defaults.
const PLAIN: KernelSource = KernelSource { file: "", entry: "", source: "", expect_in_ptx: &[], purpose: "", min_cc: 0, test_defines: &[] };

/// A header in kernels/ that kernels include with `#include "name"`.
#[derive(Debug)]
pub struct KernelHeader {
    pub file: &'static str,
    pub text: &'static str,
}

/// Lab 7's workload (a 9-tap blur over tiles), shared by its kernels.
pub const TILE_BLUR_H: KernelHeader = KernelHeader { file: "tile_blur.cuh", text: include_str!("../../../kernels/tile_blur.cuh") };

/// Every header in kernels/.
pub const HEADERS: &[&KernelHeader] = &[&TILE_BLUR_H];

pub const COMPUTE: KernelSource = KernelSource {
    file: "compute.cu",
    entry: "compute",
    source: include_str!("../../../kernels/compute.cu"),
    // fma.rn.f32: the explicit fmaf chain; ld.global.nc: the read-only input path.
    expect_in_ptx: &["fma.rn.f32", "ld.global.nc.f32", ".visible .entry compute"],
    purpose: "elementwise FMA chain with a tunable number of iterations (arithmetic per byte)",
    ..PLAIN
};

pub const ROW_DOT: KernelSource = KernelSource {
    file: "row_dot.cu",
    entry: "row_dot",
    source: include_str!("../../../kernels/row_dot.cu"),
    // v4 loads through the read-only path, a warp-shuffle reduction, explicit FMAs.
    expect_in_ptx: &["ld.global.nc.v4.f32", "shfl.sync.bfly.b32", "fma.rn.f32", ".visible .entry row_dot"],
    purpose: "one query's dot product with every key row (a warp per row), plus a stamp word naming the iteration",
    ..PLAIN
};

pub const REREAD: KernelSource = KernelSource {
    file: "reread.cu",
    entry: "reread",
    source: include_str!("../../../kernels/reread.cu"),
    // Plain global loads (the input may be mapped host memory), explicit
    // FMAs: the chain's constant (-(1 - 2^-10) = 0fBF7FC000) and the pass's
    // accumulation.
    expect_in_ptx: &["ld.global.f32", "fma.rn.f32", "0fBF7FC000", ".visible .entry reread"],
    purpose:
        "reads its input once per pass (device memory or mapped host memory in place), with an FMA chain of tunable length per read: lab 6's zero-copy kernel",
    ..PLAIN
};

/// Lab 7's test settings: 4096 outputs a tile, 256 threads, 2 stages.
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

/// Lab 7's kernels' settings for the compile tests.
const TILE_TEST: &[(&str, i64)] = &[("TILE", 4096), ("THREADS", 256), ("STAGES", 2)];

pub const TILE_NAIVE: KernelSource = KernelSource {
    file: "tile_naive.cu",
    entry: "tile_naive",
    source: include_str!("../../../kernels/tile_naive.cu"),
    // Vector loads through registers, stored to shared memory, block syncs;
    // the blur's binomial weight 70/256 (0f3E8C0000).
    expect_in_ptx: &["ld.global.nc.v4", "st.shared.v4", "bar.sync", "fma.rn.f32", "0f3E8C0000", ".visible .entry tile_naive"],
    purpose: "lab 7, kernel 1: each tile loaded through registers into shared memory, the block synced, then computed (no load in flight while it computes)",
    test_defines: TILE_TEST,
    ..PLAIN
};

pub const TILE_ASYNC: KernelSource = KernelSource {
    file: "tile_async.cu",
    entry: "tile_async",
    source: include_str!("../../../kernels/tile_async.cu"),
    // cuda::memcpy_async through a per-thread cuda::pipeline: cp.async in
    // commit groups, waited for oldest first.
    expect_in_ptx: &["cp.async.cg.shared.global", "cp.async.commit_group", "cp.async.wait_group", "bar.sync", "fma.rn.f32", ".visible .entry tile_async"],
    purpose: "lab 7, kernels 2 and 3: tiles copied to shared memory with cuda::memcpy_async through a cuda::pipeline of STAGES slots (2: double buffering)",
    min_cc: 80,
    test_defines: TILE_TEST,
};

pub const TILE_WARP_SPECIALIZED: KernelSource = KernelSource {
    file: "tile_warp_specialized.cu",
    entry: "tile_warp_specialized",
    source: include_str!("../../../kernels/tile_warp_specialized.cu"),
    // The loader's cp.async arriving on the slot's barrier when its copies
    // land; the storer's vector stores to device memory.
    expect_in_ptx: &[
        "cp.async.cg.shared.global",
        "cp.async.mbarrier.arrive.noinc",
        "mbarrier.try_wait",
        "st.global.v4",
        ".visible .entry tile_warp_specialized",
    ],
    purpose: "lab 7, kernel 4: a loader warp, compute warps and a storer warp joined by two pipelines of STAGES slots (barrier pairs)",
    min_cc: 80,
    test_defines: TILE_TEST,
};

pub const TILE_TMA: KernelSource = KernelSource {
    file: "tile_tma.cu",
    entry: "tile_tma",
    source: include_str!("../../../kernels/tile_tma.cu"),
    // One bulk copy per tile, counted in bytes on the slot's mbarrier.
    expect_in_ptx: &[
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
        "mbarrier.expect_tx",
        "fence.proxy.async",
        ".visible .entry tile_tma",
    ],
    purpose: "lab 7, kernel 5 (Hopper and later): each tile one bulk copy by the tensor memory accelerator, completed on an mbarrier",
    min_cc: 90,
    test_defines: TILE_TEST,
};

/// Every kernel, in one table.
/// The longest FMA chain per element the labs' calibration tries
/// (`labs::calibrate_iterations`) and `reread` accepts.
pub const MAX_FMA_CHAIN: i32 = 1 << 20;

pub const ALL: &[&KernelSource] = &[&COMPUTE, &ROW_DOT, &REREAD, &TILE_NAIVE, &TILE_ASYNC, &TILE_WARP_SPECIALIZED, &TILE_TMA];

/// Whether libnvrtc can be loaded (on CI: from the nvidia-cuda-nvrtc wheel
/// via LD_LIBRARY_PATH; on a GPU machine: from the CUDA toolkit).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles a kernel to PTX for `arch` (e.g. "compute_90"). A compile error
/// carries NVRTC's log.
pub fn compile_ptx(k: &KernelSource, arch: &'static str) -> Result<String> {
    compile_ptx_with(k, arch, &[])
}

/// Compiles a kernel with `-D` settings (`("STAGES", 2)`).
pub fn compile_ptx_with(k: &KernelSource, arch: &'static str, defines: &[(&str, i64)]) -> Result<String> {
    require_arch(k, arch)?;
    compile_source(k.file, k.source, arch, defines)
}

/// Whether `k` may be compiled for `arch`: [`LabError::Unsupported`],
/// naming the feature, if the architecture predates it.
pub fn require_arch(k: &KernelSource, arch: &str) -> Result<()> {
    if arch_cc(arch)? >= k.min_cc {
        return Ok(());
    }
    Err(LabError::Unsupported(format!(
        "{} needs compute capability {}.{} or later ({}), and was asked for {arch}",
        k.file,
        k.min_cc / 10,
        k.min_cc % 10,
        if k.min_cc >= 90 { "the tensor memory accelerator came with Hopper" } else { "cp.async came with Ampere" }
    )))
}

/// Compiles CUDA C text: a kernel of kernels/, or a learner's edit of one
/// (named `file` in NVRTC's messages). Includes of kernels/ headers are
/// inlined; if it includes a system header (`#include <...>`), NVRTC is
/// given CUDA's include directories, and a machine without them gets an
/// error naming every place searched.
pub fn compile_source(file: &str, source: &str, arch: &'static str, defines: &[(&str, i64)]) -> Result<String> {
    if !nvrtc_present() {
        return Err(LabError::Kernel(format!(
            "{file}: NVRTC (libnvrtc.so) not found: install the CUDA toolkit or `pip install nvidia-cuda-nvrtc` and put its lib/ on LD_LIBRARY_PATH"
        )));
    }
    let text = inline_headers(file, source)?;
    let include_paths = if text.lines().any(|l| l.trim_start().starts_with("#include <")) {
        cuda_include_dirs()?.iter().map(|d| d.display().to_string()).collect()
    } else {
        Vec::new()
    };
    let mut options = vec!["-std=c++17".to_string()];
    options.extend(defines.iter().map(|(name, v)| format!("-D{name}={v}")));
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        // Only explicit fmaf() may fuse, so the CPU reference matches exactly.
        fmad: Some(false),
        name: Some(file.to_string()),
        include_paths,
        options,
        ..Default::default()
    };
    match cudarc::nvrtc::compile_ptx_with_opts(&text, opts) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(cudarc::nvrtc::CompileError::CompileError { log, .. }) => Err(LabError::Kernel(format!("{file} failed to compile:\n{}", log.to_string_lossy()))),
        Err(e) => Err(LabError::Kernel(format!("{file}: NVRTC error {e:?}"))),
    }
}

/// `source` with each `#include "name"` of a kernels/ header replaced by
/// the header's text (once), and a `#line` after it so NVRTC's messages
/// keep the file's own line numbers.
fn inline_headers(file: &str, source: &str) -> Result<String> {
    let mut out = String::with_capacity(source.len());
    let mut seen: Vec<&str> = Vec::new();
    for (i, line) in source.lines().enumerate() {
        let quoted = line.trim_start().strip_prefix("#include").map(str::trim).and_then(|r| r.strip_prefix('"')).and_then(|r| r.split('"').next());
        match quoted {
            Some(name) => {
                let h = HEADERS.iter().find(|h| h.file == name).ok_or_else(|| {
                    LabError::Kernel(format!(
                        "{file}, line {}: no header \"{name}\" in kernels/ (there are: {})",
                        i + 1,
                        HEADERS.iter().map(|h| h.file).collect::<Vec<_>>().join(", ")
                    ))
                })?;
                if !seen.contains(&h.file) {
                    seen.push(h.file);
                    out.extend(h.text.lines().filter(|l| l.trim() != "#pragma once").map(|l| format!("{l}\n")));
                }
                out += &format!("#line {} \"{file}\"\n", i + 2);
            }
            None => {
                out += line;
                out.push('\n');
            }
        }
    }
    Ok(out)
}

/// Where CUDA's C++ headers are on this machine: a directory holding
/// `cuda/pipeline` (CUDA 13 keeps it in `include/cccl`, CUDA 12 in
/// `include`) and one holding `cooperative_groups.h`, under the first of:
/// $CUDA_HOME, $CUDA_PATH, /usr/local/cuda, /usr/local/cuda-*, /opt/cuda,
/// /usr, and the PyPI wheels beside NVRTC (`nvidia/cu13/include` next to a
/// `lib/` on LD_LIBRARY_PATH that holds libnvrtc). The error names every
/// place searched and how to install them.
pub fn cuda_include_dirs() -> Result<Vec<PathBuf>> {
    find_headers(&include_roots(std::env::var_os("CUDA_HOME"), std::env::var_os("CUDA_PATH"), std::env::var_os("LD_LIBRARY_PATH")))
}

/// The first of `roots` with CUDA's C++ headers, or the error naming them all.
fn find_headers(roots: &[PathBuf]) -> Result<Vec<PathBuf>> {
    if let Some(dirs) = roots.iter().find_map(|r| headers_under(r)) {
        return Ok(dirs);
    }
    Err(LabError::Kernel(format!(
        "CUDA's C++ headers (cuda/pipeline, cuda/barrier, cooperative_groups.h) were not found; searched:\n{}\n\
         Set CUDA_HOME to a CUDA toolkit (12.x or 13.x), or `pip install \"nvidia-cuda-cccl==13.0.*\" \"nvidia-cuda-runtime==13.0.*\"` \
         into the environment whose nvidia/cu13/lib holds NVRTC",
        roots.iter().map(|r| format!("  {}", r.display())).collect::<Vec<_>>().join("\n")
    )))
}

/// The places [`cuda_include_dirs`] looks, in order.
fn include_roots(cuda_home: Option<std::ffi::OsString>, cuda_path: Option<std::ffi::OsString>, ld_path: Option<std::ffi::OsString>) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = [cuda_home, cuda_path].into_iter().flatten().filter(|v| !v.is_empty()).map(PathBuf::from).collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    let mut versioned: Vec<PathBuf> = std::fs::read_dir("/usr/local")
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("cuda-"))).collect())
        .unwrap_or_default();
    versioned.sort();
    versioned.reverse();
    roots.extend(versioned);
    roots.push(PathBuf::from("/opt/cuda"));
    roots.push(PathBuf::from("/usr"));
    for dir in ld_path.iter().flat_map(std::env::split_paths) {
        let has_nvrtc = std::fs::read_dir(&dir).is_ok_and(|d| d.flatten().any(|e| e.file_name().to_string_lossy().starts_with("libnvrtc.so")));
        if has_nvrtc {
            if let Some(parent) = dir.parent() {
                roots.push(parent.to_path_buf());
            }
        }
    }
    let mut unique = Vec::new();
    for r in roots {
        if !unique.contains(&r) {
            unique.push(r);
        }
    }
    unique
}

/// The include directories under `root` if it has both kinds of header.
fn headers_under(root: &Path) -> Option<Vec<PathBuf>> {
    let include = root.join("include");
    let cccl = include.join("cccl");
    let pipeline = [&cccl, &include].into_iter().find(|d| d.join("cuda/pipeline").is_file())?;
    include.join("cooperative_groups.h").is_file().then(|| if pipeline == &include { vec![include.clone()] } else { vec![include.clone(), cccl.clone()] })
}

/// The compute capability (x10) of an NVRTC architecture name ("compute_90" -> 90).
pub fn arch_cc(arch: &str) -> Result<u32> {
    arch.strip_prefix("compute_")
        .or_else(|| arch.strip_prefix("sm_"))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| LabError::Kernel(format!("not an NVRTC architecture: {arch}")))
}

/// NVRTC's virtual architecture name for a compute capability like "9.0".
pub fn arch_for(compute_capability: &str) -> Result<&'static str> {
    Ok(match compute_capability {
        "7.0" => "compute_70",
        "7.5" => "compute_75",
        "8.0" => "compute_80",
        "8.6" => "compute_86",
        "8.7" => "compute_87",
        "8.9" => "compute_89",
        "9.0" => "compute_90",
        "10.0" => "compute_100",
        "12.0" => "compute_120",
        other => return Err(LabError::Kernel(format!("no NVRTC architecture known for compute capability {other}"))),
    })
}

/// CPU reference of `compute` for one element (bit-exact: fmaf == mul_add).
pub fn compute_reference(x: f32, iterations: i32) -> f32 {
    let mut a = x;
    for _ in 0..iterations {
        // 1 - 2^-10, exact in f32: the same literal as kernels/compute.cu.
        #[allow(clippy::excessive_precision)]
        let c = -0.999_023_437_5;
        a = a.mul_add(c, x);
    }
    a
}

/// CPU reference of `reread` for one element: Σ over passes of w_p·f(x),
/// w_p = 0.5 + 0.25 p, summed by FMAs in pass order, where f is the chain
/// of `iterations` FMAs of `compute` (the kernel recomputes it every pass;
/// it gives the same bits each time). iterations = 0: Σ w_p·x.
pub fn reread_reference(x: f32, passes: i32, iterations: i32) -> f32 {
    let a = compute_reference(x, iterations);
    (0..passes).fold(0.0f32, |sum, p| a.mul_add(0.5 + 0.25 * p as f32, sum))
}

/// The radius of lab 7's blur (kernels/tile_blur.cuh): inputs are padded
/// with this many zeros at each end.
pub const BLUR_RADIUS: usize = 4;

/// CPU reference of lab 7's tile kernels: `out[i] = Σ_k W[k]·padded[i + k]`
/// by FMAs in the kernels' order, bit-exact with them. `padded` holds
/// [`BLUR_RADIUS`] zeros, the input, and as many zeros again.
pub fn blur_reference(padded: &[f32], out: &mut [f32]) {
    // (1 8 28 56 70 56 28 8 1) / 256, exact in f32: kernels/tile_blur.cuh.
    const W: [f32; 9] = [0.003_906_25, 0.031_25, 0.109_375, 0.218_75, 0.273_437_5, 0.218_75, 0.109_375, 0.031_25, 0.003_906_25];
    for (i, o) in out.iter_mut().enumerate() {
        *o = W.iter().zip(&padded[i..i + 2 * BLUR_RADIUS + 1]).fold(0.0f32, |acc, (&w, &x)| w.mul_add(x, acc));
    }
}

/// CPU reference of `row_dot` followed by an argmin: the first key row whose
/// dot product with `query` is smallest, and that product. Integer
/// arithmetic, so it is exact and independent of the GPU's summation order.
pub fn row_dot_argmin_reference(keys: &[i8], query: &[i8]) -> (u32, i32) {
    let dim = query.len();
    let mut best = (0u32, i32::MAX);
    for (r, row) in keys.chunks_exact(dim).enumerate() {
        let s: i32 = row.iter().zip(query).map(|(&k, &q)| k as i32 * q as i32).sum();
        if s < best.1 {
            best = (r as u32, s);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CI sets OVERLAP_LAB_REQUIRE_NVRTC=1 (it installs NVRTC from PyPI), so
    /// a missing NVRTC fails there instead of skipping.
    fn nvrtc_or_skip(test: &str) -> bool {
        if nvrtc_present() {
            return true;
        }
        assert!(std::env::var_os("OVERLAP_LAB_REQUIRE_NVRTC").is_none(), "{test}: NVRTC required but not found");
        eprintln!("SKIPPED {test}: NVRTC not found");
        false
    }

    #[test]
    fn every_kernel_compiles_to_the_expected_ptx() {
        if !nvrtc_or_skip("every_kernel_compiles_to_the_expected_ptx") {
            return;
        }
        for k in ALL {
            let ptx = compile_ptx_with(k, "compute_90", k.test_defines).unwrap_or_else(|e| panic!("{e}"));
            for needle in k.expect_in_ptx {
                assert!(ptx.contains(needle), "{}: PTX lacks `{needle}`:\n{ptx}", k.file);
            }
            // fmad=false: the only FMAs are the explicit ones; no stray mul+add fusion.
            assert!(!ptx.contains("mad.f32"), "{}: unexpected contracted mad", k.file);
        }
    }

    #[test]
    fn traced_tile_kernels_stamp_the_warp_timeline_and_untraced_ones_do_not() {
        if !nvrtc_or_skip("traced_tile_kernels_stamp_the_warp_timeline_and_untraced_ones_do_not") {
            return;
        }
        for k in [&TILE_NAIVE, &TILE_ASYNC, &TILE_WARP_SPECIALIZED, &TILE_TMA] {
            let plain = compile_ptx_with(k, "compute_90", k.test_defines).unwrap_or_else(|e| panic!("{e}"));
            // (libcu++'s barrier waits read %globaltimer for their back-off, so only the buffers tell.)
            assert!(!plain.contains("tile_trace"), "{}: untraced PTX stamps", k.file);
            let traced_defines: Vec<_> = k.test_defines.iter().copied().chain([(TILE_TRACE, 1)]).collect();
            let traced = compile_ptx_with(k, "compute_90", &traced_defines).unwrap_or_else(|e| panic!("{e}"));
            for needle in [".global .align 8 .b8 tile_trace[", "tile_trace_clock", "%globaltimer", "%clock64"] {
                assert!(traced.contains(needle), "{}: traced PTX lacks `{needle}`", k.file);
            }
            // Plain stores: an atomic counter would make each stamp wait on L2.
            assert!(!traced.contains("atom.global"), "{}: the trace must not wait on atomics", k.file);
        }
    }

    #[test]
    fn a_compile_error_carries_nvrtc_log() {
        if !nvrtc_or_skip("a_compile_error_carries_nvrtc_log") {
            return;
        }
        let bad = KernelSource { file: "bad.cu", entry: "bad", source: "extern \"C\" __global__ void bad() { undefined_thing(); }", ..PLAIN };
        let e = compile_ptx(&bad, "compute_90").unwrap_err().to_string();
        assert!(e.contains("bad.cu failed to compile") && e.contains("undefined_thing"), "{e}");
    }

    #[test]
    fn an_error_after_an_inlined_header_names_the_files_own_line() {
        if !nvrtc_or_skip("an_error_after_an_inlined_header_names_the_files_own_line") {
            return;
        }
        let src = "// line 1\n#include \"tile_blur.cuh\"\n\nextern \"C\" __global__ void k(float* o) { o[0] = blur_at(o, 0) + missing_name; }\n";
        let e = compile_source("mine.cu", src, "compute_90", &[]).unwrap_err().to_string();
        assert!(e.contains("mine.cu(4)") && e.contains("missing_name"), "the error must point at mine.cu line 4:\n{e}");
    }

    #[test]
    fn an_unknown_header_and_a_too_old_gpu_are_named() {
        let e = compile_source("mine.cu", "#include \"nope.cuh\"\n", "compute_90", &[]).unwrap_err().to_string();
        if nvrtc_present() {
            assert!(e.contains("line 1") && e.contains("nope.cuh") && e.contains("tile_blur.cuh"), "{e}");
        }
        let e = compile_ptx(&TILE_TMA, "compute_80").unwrap_err().to_string();
        assert!(e.contains("tile_tma.cu") && e.contains("9.0") && e.contains("compute_80"), "{e}");
        assert!(arch_cc("compute_90").unwrap() == 90 && arch_cc("sm_100").unwrap() == 100 && arch_cc("90").is_err());
    }

    #[test]
    fn cuda_headers_are_found_in_each_layout_and_the_miss_names_every_place() {
        let tmp = std::env::temp_dir().join(format!("overlap-lab-headers-{}", std::process::id()));
        let touch = |p: &Path| {
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "").unwrap();
        };
        // CUDA 12: everything in include/; CUDA 13 (and the PyPI wheels): cuda/ in include/cccl.
        let (v12, v13, half) = (tmp.join("cuda-12"), tmp.join("cu13"), tmp.join("only-cccl"));
        touch(&v12.join("include/cuda/pipeline"));
        touch(&v12.join("include/cooperative_groups.h"));
        touch(&v13.join("include/cccl/cuda/pipeline"));
        touch(&v13.join("include/cooperative_groups.h"));
        touch(&half.join("include/cccl/cuda/pipeline"));
        assert_eq!(find_headers(std::slice::from_ref(&v12)).unwrap(), vec![v12.join("include")]);
        assert_eq!(find_headers(&[half.clone(), v13.clone()]).unwrap(), vec![v13.join("include"), v13.join("include/cccl")]);
        let e = find_headers(&[half.clone(), tmp.join("absent")]).unwrap_err().to_string();
        assert!(e.contains(&half.display().to_string()) && e.contains("absent") && e.contains("CUDA_HOME") && e.contains("nvidia-cuda-cccl"), "{e}");
        // NVRTC's lib/ on LD_LIBRARY_PATH puts its parent last; CUDA_HOME comes first; no root twice.
        touch(&v13.join("lib/libnvrtc.so.13"));
        let roots = include_roots(Some(v12.clone().into()), Some(v12.clone().into()), Some(std::env::join_paths([v13.join("lib"), tmp.join("x")]).unwrap()));
        assert_eq!(roots.first(), Some(&v12));
        assert_eq!(roots.last(), Some(&v13));
        assert_eq!(roots.iter().filter(|r| **r == v12).count(), 1);
        std::fs::remove_dir_all(&tmp).unwrap();
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

    #[test]
    fn reference_is_deterministic_and_depends_on_iterations() {
        assert_eq!(compute_reference(1.5, 0), 1.5);
        assert_ne!(compute_reference(1.5, 10), compute_reference(1.5, 11));
        assert_ne!(compute_reference(1.5, 100), 1.5, "a skipped kernel must not verify");
        assert_ne!(compute_reference(1.5, 1000), compute_reference(1.25, 1000), "outputs must depend on inputs");
        assert_eq!(compute_reference(-3.25, 1000).to_bits(), compute_reference(-3.25, 1000).to_bits());
        assert!(arch_for("9.0").is_ok() && arch_for("1.0").is_err());
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

    #[test]
    fn row_dot_reference_finds_the_first_smallest_product() {
        // rows: [1,1] [-1,0] [0,-1] [2,2] against query [1,1]: sums 2, -1, -1, 4.
        let keys = [1i8, 1, -1, 0, 0, -1, 2, 2];
        assert_eq!(row_dot_argmin_reference(&keys, &[1, 1]), (1, -1), "ties go to the first row");
        assert_eq!(row_dot_argmin_reference(&keys, &[-1, -1]), (3, -4));
    }

    #[test]
    fn every_kernel_file_is_in_the_table() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels");
        let mut files: Vec<String> =
            std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|f| f.ends_with(".cu")).collect();
        files.sort();
        let mut listed: Vec<String> = ALL.iter().map(|k| k.file.to_string()).collect();
        listed.sort();
        assert_eq!(files, listed, "kernels/ and kernels::ALL disagree");
    }
}
