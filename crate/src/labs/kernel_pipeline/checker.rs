//! Lab 7's exercise checker: it compiles the learner's file with NVRTC (a
//! compile error is a failed check quoting NVRTC's log), reads the PTX
//! for the kernel's name and parameters as the lab launches it and for
//! asynchronous copies (`ptx_checks.rs`), and on a GPU checks every output
//! against the CPU reference on fresh random input and times the kernel
//! against the naive one (one block per SM) and the solution, rounds
//! interleaved, saying which of these failed. With no GPU it judges what
//! it can: the compile, the signature, the copies and which parameter is
//! read and which written; with no compiler it says the kernel was not
//! judged.
//!
//! May use: `super::ptx_checks`, `super::kernel`, `super::measure` (the
//! lab's data and its verification), `super::settings`, `super::exercise`
//! (the exercise's constants), `gpu`, `lab_kit::check`, `measure::stats`.

use super::kernel::{TileKernel, TileKind, TileShape};
use super::measure::TileData;
use super::ptx_checks::{launch_problem, pointer_problem, ptx_problem, source_problem, LAUNCH_PARAMS};
use super::settings::KernelPipelineConfig;
use crate::error::Result;
use crate::gpu::kernels;
use crate::gpu::Gpu;
use crate::lab_kit::check::CheckReport;
use crate::measure::stats::Summary;

/// The exercise as the notebook names it.
pub const EXERCISE: &str = "lab 7: a double-buffered tile kernel";

/// The shape the checker compiles the learner's file for: the lab's tile,
/// 256 threads, 2 stages.
pub fn shape(cfg: &KernelPipelineConfig) -> TileShape {
    TileShape { tile: cfg.tile, threads: 256, stages: 2 }
}

/// The blur's vector width of the given file (one output at a time, by
/// `blur_at`): the checker compiles the learner's file, the naive kernel
/// and the solution at it, so a kernel that calls the header's `blur_tile`
/// is timed on its pipeline, not on a wider blur.
pub const GIVEN_VECTOR_WIDTH: u32 = 1;

/// How much slower than the solution (its median time) a kernel may be and
/// still count as double-buffered. One stage of asynchronous copies, which
/// waits for each tile right after issuing it, is far slower than two at
/// the lab's tile size, yet can beat the naive kernel: beating naive alone
/// would not tell them apart.
pub const SOLUTION_SLACK: f64 = 0.15;

/// The problem of a check with no GPU that only says so.
pub(super) const NEEDS_A_GPU: &str =
    "whether every output is right and whether it beats the naive kernel is judged on a GPU: there is none here, so the check is not complete";

/// What this machine has to compile a learner's kernel with: NVRTC, and
/// CUDA's C++ headers for a file that includes them (`#include <...>`).
/// Without them the kernel cannot be compiled, which is no fault of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Toolchain {
    /// libnvrtc loads.
    pub nvrtc: bool,
    /// CUDA's C++ headers were found (else what the search says).
    pub headers: std::result::Result<(), String>,
}

impl Toolchain {
    /// This machine's.
    pub fn here() -> Toolchain {
        Toolchain { nvrtc: kernels::nvrtc_present(), headers: kernels::cuda_include_dirs().map(|_| ()).map_err(|e| e.to_string()) }
    }

    /// Why `source` cannot be compiled here, if it cannot: a finding that
    /// says the kernel was not judged (not that it fails to compile).
    pub fn problem(&self, source: &str) -> Option<String> {
        const NOT_JUDGED: &str = "so your kernel could not be compiled and was not judged: nothing here says it is wrong";
        if !self.nvrtc {
            return Some(format!("NVRTC (libnvrtc.so, CUDA's run-time compiler) was not found on this machine, {NOT_JUDGED}"));
        }
        let includes = source.lines().any(|l| l.trim_start().starts_with("#include <"));
        match &self.headers {
            Err(_) if includes => {
                Some(format!("CUDA's C++ headers, which your file includes (#include <...>), were not found on this machine for NVRTC, {NOT_JUDGED}"))
            }
            _ => None,
        }
    }
}

/// A compile's outcome as the learner reads it: the PTX if the source sets
/// nothing the lab sets, this machine can compile it (`toolchain`), it
/// compiled, the lab could launch it and it copies asynchronously, else
/// the problem recorded in `rep`.
fn read_compile(rep: &mut CheckReport, toolchain: &Toolchain, source: &str, shape: TileShape, compiled: impl FnOnce() -> Result<String>) -> Option<String> {
    if let Some(p) = source_problem(source) {
        rep.problem(p);
        return None;
    }
    if let Some(p) = toolchain.problem(source) {
        rep.problem(p);
        return None;
    }
    match compiled() {
        // A GPU older than the kernel's copies: no fault of the kernel either.
        Err(crate::error::LabError::Unsupported(why)) => rep.problem(format!("this GPU cannot run asynchronous copies ({why}), so your kernel was not judged")),
        Err(e) => rep.problem(format!("your kernel does not compile. NVRTC says:\n{e}")),
        Ok(ptx) => {
            let entry = super::kernel::TILE_ASYNC.entry;
            match launch_problem(&ptx, entry, LAUNCH_PARAMS, TileKind::Async.smem_bytes(shape) as u64)
                .or_else(|| ptx_problem(&ptx))
                .or_else(|| pointer_problem(&ptx, entry))
            {
                Some(p) => rep.problem(p),
                None => {
                    rep.note("it compiles and copies asynchronously (cp.async in its PTX)");
                    return Some(ptx);
                }
            }
        }
    }
    None
}

/// The checks that need no GPU: compile (for sm_90) and read the PTX.
pub fn check_offline(file: &str, source: &str, cfg: &KernelPipelineConfig) -> CheckReport {
    check_offline_with(&Toolchain::here(), file, source, cfg)
}

/// [`check_offline`] with `toolchain` for this machine's.
pub(super) fn check_offline_with(toolchain: &Toolchain, file: &str, source: &str, cfg: &KernelPipelineConfig) -> CheckReport {
    let mut rep = CheckReport::new(EXERCISE);
    let s = shape(cfg);
    if read_compile(&mut rep, toolchain, source, s, || {
        kernels::compile_source(file, source, super::kernel::TILE_ASYNC.headers, "compute_90", &s.defines(GIVEN_VECTOR_WIDTH))
    })
    .is_some()
    {
        rep.problem(NEEDS_A_GPU);
    }
    rep
}

/// The whole check on `gpu`: compile for it (once) and read the PTX, every
/// output against the CPU reference (twice, on fresh inputs), then
/// `cfg.repeats` interleaved rounds of the learner's kernel, the naive one
/// and the solution.
pub fn check_on_gpu(gpu: &Gpu, file: &str, source: &str, cfg: &KernelPipelineConfig) -> Result<CheckReport> {
    let mut rep = CheckReport::new(&format!("{EXERCISE} (live)"));
    let s = shape(cfg);
    let Some(ptx) = read_compile(&mut rep, &Toolchain::here(), source, s, || TileKernel::compile(gpu, TileKind::Async, file, source, s, GIVEN_VECTOR_WIDTH))
    else {
        return Ok(rep);
    };
    let Some(mine) = rep.learner("your kernel", || TileKernel::from_ptx(gpu, TileKind::Async, &ptx, s, 1)) else {
        return Ok(rep);
    };
    // Both blur one output at a time, as the given file does: the learner's
    // kernel is timed against pipelines, not against a wider blur.
    let naive = TileKernel::load_with(gpu, TileKind::Naive, TileShape { stages: 1, ..s }, GIVEN_VECTOR_WIDTH, 1)?;
    let solution = TileKernel::load_with(gpu, TileKind::Async, s, GIVEN_VECTOR_WIDTH, 1)?;
    let mut data = TileData::new(gpu, cfg.elements())?;
    for _ in 0..2 {
        data.refresh()?;
        if let Err(e) = data.verified(&mine, "your kernel's output") {
            let what = data.wrong_tile(s.tile as usize, mine.resources().grid as usize).map_or(String::new(), |w| format!(": {}", wrong_tile_words(w, s.tile)));
            rep.problem(format!("{e}{what}"));
            return Ok(rep);
        }
    }
    rep.note("every output matches the CPU reference, on two fresh random inputs");
    let (mut t_mine, mut t_naive, mut t_sol) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..=cfg.repeats {
        let (a, b, c) = (data.timed(&mine)?, data.timed(&naive)?, data.timed(&solution)?);
        if round > 0 {
            t_mine.push(a);
            t_naive.push(b);
            t_sol.push(c);
        }
    }
    let (m, n, sol) = (Summary::of(&t_mine)?, Summary::of(&t_naive)?, Summary::of(&t_sol)?);
    let speedup = n.median / m.median;
    let clear = n.median - m.median > m.middle_spread().max(n.middle_spread());
    let line = format!(
        "yours {:.4} ms, the naive kernel {:.4} ms ({speedup:.2}x), the solution {:.4} ms ({:.2}x); spreads {:.4} / {:.4} / {:.4} ms",
        m.median,
        n.median,
        sol.median,
        n.median / sol.median,
        m.middle_spread(),
        n.middle_spread(),
        sol.middle_spread()
    );
    let of_solution = m.median / sol.median;
    if !clear {
        rep.problem(format!("{line}: not faster than the naive kernel beyond the spreads: the copies still do not run beside the compute"));
    } else if of_solution > 1.0 + SOLUTION_SLACK {
        rep.problem(format!(
            "{line}: faster than the naive kernel, but {:.0}% slower than the solution: with only one tile in flight the block still waits for each copy",
            100.0 * (of_solution - 1.0)
        ));
    } else {
        rep.note(format!("{line}: double-buffered"));
    }
    Ok(rep)
}

/// What a wrong tile of the learner's outputs holds, in words: where it is
/// (which block computed it, its how-manyth tile) and what went wrong there.
fn wrong_tile_words(w: super::measure::WrongTile, tile: u32) -> String {
    use super::measure::TileHolds;
    let at = format!("output tile {} (block {}'s tile {})", w.tile, w.block, w.k);
    match w.holds {
        TileHolds::Unwritten { outputs } => {
            format!("{at} was never fully written: {outputs} of its {tile} outputs still hold the poison the check filled them with")
        }
        TileHolds::Another { other } => format!(
            "{at} holds exactly the results of tile {other}: the block blurred the data of another tile in its place (a slot, or the tile a slot was filled with, is not the one it computes)"
        ),
        TileHolds::Part { wrong } => format!(
            "{wrong} of the {tile} outputs of {at} are wrong and the rest right: the block read that tile while some of its copies had not yet landed, or while the next tile's copies were already refilling its slot"
        ),
        TileHolds::Whole => format!("every output of {at} is wrong, and it is no other tile's result either"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labs::kernel_pipeline::exercise::solution_source;

    fn nvrtc() -> bool {
        if kernels::nvrtc_present() && kernels::cuda_include_dirs().is_ok() {
            return true;
        }
        assert!(std::env::var_os("OVERLAP_LAB_REQUIRE_NVRTC").is_none(), "NVRTC and CUDA's headers are required here");
        eprintln!("SKIPPED: NVRTC or CUDA's headers not found");
        false
    }

    const GIVEN: &str = include_str!("../../../../notebooks/exercises/07-double-buffered.cu");

    #[test]
    fn the_given_file_compiles_and_is_named_as_not_asynchronous() {
        if !nvrtc() {
            return;
        }
        let rep = check_offline("07-double-buffered.cu", GIVEN, &KernelPipelineConfig::small());
        assert!(!rep.passed && rep.to_string().contains("no asynchronous copy"), "{rep}");
    }

    #[test]
    fn the_solution_passes_what_can_be_judged_without_a_gpu_and_says_the_rest_needs_one() {
        if !nvrtc() {
            return;
        }
        let rep = check_offline("tile_async.cu", solution_source(), &KernelPipelineConfig::small());
        let text = rep.to_string();
        assert!(text.contains("compiles and copies asynchronously") && text.contains("judged on a GPU"), "{text}");
        assert!(!rep.passed, "with no GPU the check is not complete: {text}");
    }

    #[test]
    fn a_compile_error_is_a_failed_check_quoting_nvrtc() {
        if !nvrtc() {
            return;
        }
        let broken = GIVEN.replace("smem4[v] = src[v];", "smem4[v] = src[v]");
        let rep = check_offline("07-double-buffered.cu", &broken, &KernelPipelineConfig::small());
        let text = rep.to_string();
        assert!(!rep.passed && text.contains("does not compile") && text.contains("07-double-buffered.cu("), "{text}");
        assert!(!text.lines().any(|l| l.starts_with("error:") || l.starts_with("Error:")), "a notebook runner would read it as a crash: {text}");
    }

    /// With no NVRTC (or no CUDA headers for a file that includes them) a
    /// right kernel is not told it does not compile: the check says what
    /// this machine lacks and that the kernel was not judged. Runs with or
    /// without NVRTC here (the compile is never reached).
    #[test]
    fn a_missing_compiler_or_headers_is_said_and_the_kernel_not_judged() {
        let cfg = KernelPipelineConfig::small();
        let none = Toolchain { nvrtc: false, headers: Ok(()) };
        let headless = Toolchain { nvrtc: true, headers: Err("searched /usr/local/cuda".into()) };
        for (toolchain, names) in [(&none, "NVRTC (libnvrtc.so, CUDA's run-time compiler) was not found"), (&headless, "CUDA's C++ headers")] {
            for (what, source) in [("the solution", solution_source()), ("the given file", GIVEN)] {
                let rep = check_offline_with(toolchain, "mine.cu", source, &cfg);
                let text = rep.to_string();
                assert!(!rep.passed && text.contains(names) && text.contains("was not judged"), "{what}: {text}");
                for judged in ["does not compile", "no asynchronous copy", "compiles and copies"] {
                    assert!(!text.contains(judged), "{what}: judged the kernel ('{judged}') with no compiler: {text}");
                }
            }
        }
        // Headers matter only to a file that includes them.
        assert_eq!(headless.problem("extern \"C\" __global__ void k() {}"), None);
        assert!(Toolchain { nvrtc: true, headers: Ok(()) }.problem(GIVEN).is_none());
    }
    /// Each (what, source, words) fails the check without a GPU, saying
    /// every one of `words` and none of `not`: the fault is known from the
    /// compile and the PTX.
    fn fails_offline_with(cases: &[(&str, String, &[&str])], cfg: &KernelPipelineConfig, not: &[&str]) {
        for (what, source, words) in cases {
            let rep = check_offline("mine.cu", source, cfg);
            let text = rep.to_string();
            assert!(!rep.passed, "{what} passed: {text}");
            for w in *words {
                assert!(text.contains(w), "{what}: no '{w}' in {text}");
            }
            for n in not {
                assert!(!text.contains(n), "{what}: the fault is known without a GPU, yet the check says '{n}': {text}");
            }
        }
    }

    #[test]
    fn faults_the_compile_or_the_ptx_shows_are_named_without_a_gpu() {
        if !nvrtc() {
            return;
        }
        let cfg = KernelPipelineConfig::small();
        let sol = solution_source();
        let cases: Vec<(&str, String, &[&str])> = vec![
            ("renamed", sol.replace("tile_async(", "my_tile_async("), &["no kernel named tile_async", "my_tile_async"]),
            ("extern \"C\" dropped", sol.replace("extern \"C\" ", ""), &["no kernel named tile_async", "it has: _Z10tile_async"]),
            (
                "static shared memory over the limit",
                sol.replacen("{", "{\n    __shared__ float4 big[4096]; big[threadIdx.x] = make_float4(0, 0, 0, 0); __syncthreads(); out[0] += big[1].x;", 1),
                &["64.0 KiB of static shared memory", "at most 48.0 KiB"],
            ),
            ("STAGES redefined", format!("#define STAGES 1\n{sol}"), &["line 1: your file sets STAGES itself", "-DSTAGES=2"]),
        ];
        fails_offline_with(&cases, &cfg, &["judged on a GPU"]);
        // The given file's guarded default is not a redefinition.
        assert!(source_problem(GIVEN).is_none());
    }

    /// Pointers a learner mixes up, named from the PTX without a GPU; the
    /// solution, the given file and the lab's other kernels use theirs as
    /// the lab passes them.
    #[test]
    fn swapped_or_misused_pointers_are_named_from_the_ptx_without_a_gpu() {
        if !nvrtc() {
            return;
        }
        let cfg = KernelPipelineConfig::small();
        let sol = solution_source();
        let signature = "tile_async(const float* __restrict__ in, float* __restrict__ out, unsigned int tiles)";
        assert!(sol.contains(signature));
        let cases: Vec<(&str, String, &[&str])> = vec![
            (
                "parameters declared in the other order",
                sol.replace(signature, "tile_async(float* __restrict__ out, const float* __restrict__ in, unsigned int tiles)"),
                &["stores into global memory through its first parameter", "const float* in"],
            ),
            (
                "tiles fetched from the output",
                sol.replace("reinterpret_cast<const float4*>(in + ", "reinterpret_cast<const float4*>(out + "),
                &["never reads global memory through its first parameter"],
            ),
            (
                "results written back into the input",
                sol.replace(signature, "tile_async(float* __restrict__ in, float* __restrict__ out, unsigned int tiles)")
                    .replace("blur_tile(s, out + ", "blur_tile(s, in + "),
                &["stores into global memory through its first parameter"],
            ),
        ];
        fails_offline_with(&cases, &cfg, &["judged on a GPU"]);
        let s = shape(&cfg);
        for (name, source) in [("solution", sol), ("given file", GIVEN)] {
            let ptx =
                kernels::compile_source("k.cu", source, super::super::kernel::TILE_ASYNC.headers, "compute_90", &s.defines(super::super::kernel::VEC_DEFAULT))
                    .unwrap();
            assert_eq!(pointer_problem(&ptx, "tile_async"), None, "{name}");
        }
    }

    #[test]
    fn a_changed_signature_is_named_from_the_ptx_without_a_gpu() {
        if !nvrtc() {
            return;
        }
        let cfg = KernelPipelineConfig::small();
        let sig = "tile_async(const float* __restrict__ in, float* __restrict__ out, unsigned int tiles)";
        let sol = solution_source();
        assert!(sol.contains(sig) && GIVEN.contains(sig), "the case below edits the signature both declare");
        let cases: Vec<(&str, String, &[&str])> = vec![
            (
                "a parameter added",
                sol.replace(sig, "tile_async(const float* __restrict__ in, float* __restrict__ out, unsigned int tiles, unsigned int stages)"),
                &[
                    "your kernel tile_async takes 4 parameters in its PTX (.u64, .u64, .u32, .u32)",
                    "the lab launches it with 3",
                    "(const float* in, float* out, unsigned int tiles)",
                ],
            ),
            (
                "a parameter removed",
                sol.replace(sig, "tile_async(const float* __restrict__ in, float* __restrict__ out)").replace(
                    "cuda::pipeline<cuda::thread_scope_thread> pipe",
                    "const unsigned int tiles = 64;\n    cuda::pipeline<cuda::thread_scope_thread> pipe",
                ),
                &["your kernel tile_async takes 2 parameters in its PTX (.u64, .u64)", "the lab launches it with 3"],
            ),
            (
                "parameters reordered",
                sol.replace(sig, "tile_async(unsigned int tiles, const float* __restrict__ in, float* __restrict__ out)"),
                &["parameter 1 of your kernel tile_async is .u32 in its PTX where the lab passes const float* in (.u64)", "in that order"],
            ),
        ];
        fails_offline_with(&cases, &cfg, &["judged on a GPU", "no asynchronous copy"]);
        // The given file and the solution declare what the lab launches
        // (LAUNCH_PARAMS): their offline checks, tested above, get past the signature to the
        // copies (the given file's "no asynchronous copy", the solution's
        // "compiles and copies asynchronously").
    }

    /// Wrong outputs on the GPU are told by where they are (the tile, its
    /// block and place) and what the tile holds, never by a fix.
    #[test]
    fn a_wrong_tile_is_named_by_its_block_and_what_it_holds() {
        use super::super::measure::{TileHolds, WrongTile};
        let at = |holds| WrongTile { tile: 137, block: 5, k: 1, holds };
        let cases = [
            (TileHolds::Unwritten { outputs: 12 }, "12 of its 4096 outputs still hold the poison"),
            (TileHolds::Another { other: 5 }, "holds exactly the results of tile 5: the block blurred the data of another tile"),
            (TileHolds::Part { wrong: 300 }, "300 of the 4096 outputs of output tile 137 (block 5's tile 1) are wrong and the rest right"),
            (TileHolds::Whole, "every output of output tile 137 (block 5's tile 1) is wrong"),
        ];
        for (holds, words) in cases {
            let text = wrong_tile_words(at(holds), 4096);
            assert!(text.contains(words) && text.contains("output tile 137 (block 5's tile 1)"), "{holds:?}: {text}");
            assert_eq!(crate::lab_kit::check::dictated_fix(&text), None, "{text}");
        }
    }
}
