//! The CUDA C kernels in `kernels/`, one per file, embedded in the binary and
//! compiled at run time with NVRTC. Listed in one table, with the PTX each is
//! expected to contain, so CI (no GPU, NVRTC from PyPI) can compile and check
//! every one of them.

use crate::error::{LabError, Result};

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
}

pub const COMPUTE: KernelSource = KernelSource {
    file: "compute.cu",
    entry: "compute",
    source: include_str!("../../../kernels/compute.cu"),
    // fma.rn.f32: the explicit fmaf chain; ld.global.nc: the read-only input path.
    expect_in_ptx: &["fma.rn.f32", "ld.global.nc.f32", ".visible .entry compute"],
    purpose: "elementwise FMA chain with a tunable number of iterations (arithmetic per byte)",
};

pub const ROW_DOT: KernelSource = KernelSource {
    file: "row_dot.cu",
    entry: "row_dot",
    source: include_str!("../../../kernels/row_dot.cu"),
    // v4 loads through the read-only path, a warp-shuffle reduction, explicit FMAs.
    expect_in_ptx: &["ld.global.nc.v4.f32", "shfl.sync.bfly.b32", "fma.rn.f32", ".visible .entry row_dot"],
    purpose: "one query's dot product with every key row (a warp per row), plus a stamp word naming the iteration",
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
};

/// Every kernel, in one table.
/// The longest FMA chain per element the labs' calibration tries
/// (`labs::calibrate_iterations`) and `reread` accepts.
pub const MAX_FMA_CHAIN: i32 = 1 << 20;

pub const ALL: &[&KernelSource] = &[&COMPUTE, &ROW_DOT, &REREAD];

/// Whether libnvrtc can be loaded (on CI: from the nvidia-cuda-nvrtc wheel
/// via LD_LIBRARY_PATH; on a GPU machine: from the CUDA toolkit).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles a kernel to PTX for `arch` (e.g. "compute_90"). A compile error
/// carries NVRTC's log.
pub fn compile_ptx(k: &KernelSource, arch: &'static str) -> Result<String> {
    if !nvrtc_present() {
        return Err(LabError::Kernel(format!(
            "{}: NVRTC (libnvrtc.so) not found: install the CUDA toolkit or `pip install nvidia-cuda-nvrtc` and put its lib/ on LD_LIBRARY_PATH",
            k.file
        )));
    }
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        // Only explicit fmaf() may fuse, so the CPU reference matches exactly.
        fmad: Some(false),
        name: Some(k.file.to_string()),
        ..Default::default()
    };
    match cudarc::nvrtc::compile_ptx_with_opts(k.source, opts) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(cudarc::nvrtc::CompileError::CompileError { log, .. }) => {
            Err(LabError::Kernel(format!("{} failed to compile:\n{}", k.file, log.to_string_lossy())))
        }
        Err(e) => Err(LabError::Kernel(format!("{}: NVRTC error {e:?}", k.file))),
    }
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
            let ptx = compile_ptx(k, "compute_90").unwrap_or_else(|e| panic!("{e}"));
            for needle in k.expect_in_ptx {
                assert!(ptx.contains(needle), "{}: PTX lacks `{needle}`:\n{ptx}", k.file);
            }
            // fmad=false: the only FMAs are the explicit ones; no stray mul+add fusion.
            assert!(!ptx.contains("mad.f32"), "{}: unexpected contracted mad", k.file);
        }
    }

    #[test]
    fn a_compile_error_carries_nvrtc_log() {
        if !nvrtc_or_skip("a_compile_error_carries_nvrtc_log") {
            return;
        }
        let bad =
            KernelSource { file: "bad.cu", entry: "bad", source: "extern \"C\" __global__ void bad() { undefined_thing(); }", expect_in_ptx: &[], purpose: "" };
        let e = compile_ptx(&bad, "compute_90").unwrap_err().to_string();
        assert!(e.contains("bad.cu failed to compile") && e.contains("undefined_thing"), "{e}");
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
