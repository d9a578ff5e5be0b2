//! The CUDA C kernels in `kernels/`, one per file, embedded in the binary and
//! compiled at run time with NVRTC: what a kernel's source is
//! ([`KernelSource`]: its file, entry point, the PTX it is expected to
//! contain, its headers), the compile, and the pipelines' compute kernel
//! ([`COMPUTE`]) with its CPU reference. A lab's own kernels are listed in
//! its folder and its table entry (`Lab::kernels`), so CI (no GPU, NVRTC and
//! CUDA's headers from PyPI) compiles and checks every one of them. Headers
//! of `kernels/` that a kernel includes (`#include "tile_blur.cuh"`) are
//! inlined before NVRTC sees the source; CUDA's own C++ headers (`#include
//! <cuda/pipeline>`) are found on this machine ([`cuda_include_dirs`]).

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
    /// The headers of kernels/ it includes (`#include "name"`).
    pub headers: &'static [&'static KernelHeader],
}

impl KernelSource {
    /// The fields a plain kernel leaves at their defaults (`..KernelSource::PLAIN`).
    pub const PLAIN: KernelSource =
        KernelSource { file: "", entry: "", source: "", expect_in_ptx: &[], purpose: "", min_cc: 0, test_defines: &[], headers: &[] };
}

/// A header in kernels/ that kernels include with `#include "name"`.
#[derive(Debug)]
pub struct KernelHeader {
    pub file: &'static str,
    pub text: &'static str,
}

pub const COMPUTE: KernelSource = KernelSource {
    file: "compute.cu",
    entry: "compute",
    source: include_str!("../../../kernels/compute.cu"),
    // fma.rn.f32: the explicit fmaf chain; ld.global.nc: the read-only input path.
    expect_in_ptx: &["fma.rn.f32", "ld.global.nc.f32", ".visible .entry compute"],
    purpose: "elementwise FMA chain with a tunable number of iterations (arithmetic per byte)",
    ..KernelSource::PLAIN
};

/// The longest FMA chain per element the labs' calibration tries
/// (`labs::calibrate_iterations`) and `reread` accepts.
pub const MAX_FMA_CHAIN: i32 = 1 << 20;

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
    compile_source(k.file, k.source, k.headers, arch, defines)
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
        match k.min_cc {
            90.. => "the tensor memory accelerator came with Hopper",
            89 => "conversions to FP8 came with Ada",
            _ => "cp.async came with Ampere",
        }
    )))
}

/// Compiles CUDA C text: a kernel of kernels/, or a learner's edit of one
/// (named `file` in NVRTC's messages). Includes of kernels/ headers (of
/// `headers`, the kernel's) are inlined; if it includes a system header (`#include <...>`), NVRTC is
/// given CUDA's include directories, and a machine without them gets an
/// error naming every place searched.
pub fn compile_source(file: &str, source: &str, headers: &[&KernelHeader], arch: &'static str, defines: &[(&str, i64)]) -> Result<String> {
    if !nvrtc_present() {
        return Err(LabError::Kernel(format!(
            "{file}: NVRTC (libnvrtc.so) not found: install the CUDA toolkit or `pip install nvidia-cuda-nvrtc` and put its lib/ on LD_LIBRARY_PATH"
        )));
    }
    let text = inline_headers(file, source, headers)?;
    let include_paths = if text.lines().any(|l| l.trim_start().starts_with("#include <")) {
        cuda_include_dirs()?.iter().map(|d| d.display().to_string()).collect()
    } else {
        Vec::new()
    };
    let mut options = vec!["-std=c++17".to_string()];
    options.extend(defines.iter().map(|(name, v)| format!("-D{name}={v}")));
    let key = CompiledKey { file: file.to_string(), text: text.clone(), arch, options: options.clone() };
    if let Some(ptx) = compiled().lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(ptx.clone());
    }
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
        Ok(ptx) => {
            let ptx = ptx.to_src();
            compiled().lock().unwrap_or_else(|e| e.into_inner()).insert(key, ptx.clone());
            Ok(ptx)
        }
        Err(cudarc::nvrtc::CompileError::CompileError { log, .. }) => Err(LabError::Kernel(format!("{file} failed to compile:\n{}", log.to_string_lossy()))),
        Err(e) => Err(LabError::Kernel(format!("{file}: NVRTC error {e:?}"))),
    }
}

/// What one compile was asked: the same text, options and architecture
/// give the same PTX.
#[derive(Clone, PartialEq, Eq, Hash)]
struct CompiledKey {
    file: String,
    text: String,
    arch: &'static str,
    options: Vec<String>,
}

/// Every PTX this process compiled, by what it was asked. NVRTC compiles
/// one program at a time in a process (two threads compiling at once took
/// as long as two compiles in a row, and lab 7's builds on 16 threads
/// about as long as its compiles one after another), and a kernel that includes CUDA's C++ headers takes a second or two, so
/// a build asked again (a notebook cell run twice, a test after another)
/// is not compiled again.
fn compiled() -> &'static std::sync::Mutex<std::collections::HashMap<CompiledKey, String>> {
    static COMPILED: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<CompiledKey, String>>> = std::sync::OnceLock::new();
    COMPILED.get_or_init(Default::default)
}

/// `source` with each `#include "name"` of a kernels/ header replaced by
/// the header's text (once), and a `#line` after it so NVRTC's messages
/// keep the file's own line numbers.
fn inline_headers(file: &str, source: &str, headers: &[&KernelHeader]) -> Result<String> {
    let mut out = String::with_capacity(source.len());
    let mut seen: Vec<&str> = Vec::new();
    for (i, line) in source.lines().enumerate() {
        let quoted = line.trim_start().strip_prefix("#include").map(str::trim).and_then(|r| r.strip_prefix('"')).and_then(|r| r.split('"').next());
        match quoted {
            Some(name) => {
                let h = headers.iter().find(|h| h.file == name).ok_or_else(|| {
                    LabError::Kernel(format!(
                        "{file}, line {}: no header \"{name}\" in kernels/ for it (it may include: {})",
                        i + 1,
                        if headers.is_empty() { "none".to_string() } else { headers.iter().map(|h| h.file).collect::<Vec<_>>().join(", ") }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{check_ptx, nvrtc_or_skip};

    /// A header for the tests of inlining.
    const TWICE_H: KernelHeader = KernelHeader { file: "twice.cuh", text: "#pragma once\n__device__ float twice(float x) { return 2.0f * x; }\n" };

    #[test]
    fn a_build_asked_again_is_not_compiled_again_and_another_is() {
        if !nvrtc_or_skip("a_build_asked_again_is_not_compiled_again_and_another_is") {
            return;
        }
        // A source no other test compiles, so the count is this test's.
        let source = "extern \"C\" __global__ void memo_probe(float* x) { x[threadIdx.x] *= SCALE; }\n";
        let count = || compiled().lock().unwrap().keys().filter(|k| k.file == "memo_probe.cu").count();
        let first = compile_source("memo_probe.cu", source, &[], "compute_80", &[("SCALE", 2)]).unwrap();
        let again = compile_source("memo_probe.cu", source, &[], "compute_80", &[("SCALE", 2)]).unwrap();
        assert_eq!((first == again, count()), (true, 1), "the same build is the same PTX, compiled once");
        let other = compile_source("memo_probe.cu", source, &[], "compute_80", &[("SCALE", 3)]).unwrap();
        assert_ne!(first, other, "another -D is another build");
        assert_eq!(count(), 2);
        // A compile error is not kept: asking again reports it again.
        for _ in 0..2 {
            let e = compile_source("memo_probe.cu", "this is not CUDA", &[], "compute_80", &[]).unwrap_err().to_string();
            assert!(e.contains("memo_probe.cu failed to compile"), "{e}");
        }
        assert_eq!(count(), 2);
    }

    #[test]
    fn the_compute_kernel_compiles_to_the_expected_ptx() {
        if !nvrtc_or_skip("the_compute_kernel_compiles_to_the_expected_ptx") {
            return;
        }
        check_ptx(&COMPUTE);
    }

    #[test]
    fn a_compile_error_carries_nvrtc_log() {
        if !nvrtc_or_skip("a_compile_error_carries_nvrtc_log") {
            return;
        }
        let bad = KernelSource { file: "bad.cu", entry: "bad", source: "extern \"C\" __global__ void bad() { undefined_thing(); }", ..KernelSource::PLAIN };
        let e = compile_ptx(&bad, "compute_90").unwrap_err().to_string();
        assert!(e.contains("bad.cu failed to compile") && e.contains("undefined_thing"), "{e}");
    }

    #[test]
    fn an_error_after_an_inlined_header_names_the_files_own_line() {
        if !nvrtc_or_skip("an_error_after_an_inlined_header_names_the_files_own_line") {
            return;
        }
        let src = "// line 1\n#include \"twice.cuh\"\n\nextern \"C\" __global__ void k(float* o) { o[0] = twice(o[1]) + missing_name; }\n";
        let e = compile_source("mine.cu", src, &[&TWICE_H], "compute_90", &[]).unwrap_err().to_string();
        assert!(e.contains("mine.cu(4)") && e.contains("missing_name"), "the error must point at mine.cu line 4:\n{e}");
    }

    #[test]
    fn an_unknown_header_and_a_too_old_gpu_are_named() {
        let e = compile_source("mine.cu", "#include \"nope.cuh\"\n", &[&TWICE_H], "compute_90", &[]).unwrap_err().to_string();
        if nvrtc_present() {
            assert!(e.contains("line 1") && e.contains("nope.cuh") && e.contains("twice.cuh"), "{e}");
        }
        let hopper = KernelSource { file: "bulk.cu", min_cc: 90, ..KernelSource::PLAIN };
        let e = compile_ptx(&hopper, "compute_80").unwrap_err().to_string();
        assert!(e.contains("bulk.cu") && e.contains("9.0") && e.contains("compute_80"), "{e}");
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
    fn reference_is_deterministic_and_depends_on_iterations() {
        assert_eq!(compute_reference(1.5, 0), 1.5);
        assert_ne!(compute_reference(1.5, 10), compute_reference(1.5, 11));
        assert_ne!(compute_reference(1.5, 100), 1.5, "a skipped kernel must not verify");
        assert_ne!(compute_reference(1.5, 1000), compute_reference(1.25, 1000), "outputs must depend on inputs");
        assert_eq!(compute_reference(-3.25, 1000).to_bits(), compute_reference(-3.25, 1000).to_bits());
        assert!(arch_for("9.0").is_ok() && arch_for("1.0").is_err());
    }
}
