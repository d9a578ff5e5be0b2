//! Lab 7's kernels built for a run, each build once: a build is what NVRTC
//! compiles (the kernel, its shape, the blur's vector width, traced or
//! not: [`Build`]), and kernels that differ only in their launch (blocks
//! per SM) share one. The distinct builds are compiled at once, spread
//! over the host's cores (NVRTC is thread-safe, each build its own
//! program), and each is loaded once, on the thread that compiled it, as
//! soon as it is compiled (loading is the driver's own compile of the PTX
//! to the GPU's code, as long again), and every kernel of it is a launch
//! of that module
//! ([`TileKernel::relaunched`]). A launch of the plain CUDA
//! reference's sweep that would repeat another is skipped, saying why
//! ([`yardstick_skip`]).
//!
//! May use: `super::kernel`, `super::settings`, `super::results` (a
//! kernel's result), `gpu` (the compile through `gpu::kernels`, NVTX
//! ranges), `error`.

use super::kernel::{KernelResources, TileKernel, TileKind, TileShape, TRACE_FIRST, TRACE_TILES};
use super::results::VariantResult;
use super::settings::{BlocksPerSm, Role, Variant};
use crate::error::{LabError, Result};
use crate::gpu::{kernels, Gpu};

/// The most threads compiling at once: NVRTC with CUDA's C++ headers takes
/// a few hundred MB a program, and more threads than builds gain nothing.
pub const MAX_COMPILE_THREADS: usize = 16;

/// What NVRTC compiles for a kernel: the same build serves every launch of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Build {
    pub kind: TileKind,
    pub shape: TileShape,
    /// The blur's vector width (-DVEC).
    pub vec: u32,
    /// Built with -DTILE_TRACE (block 0's warps stamp their phases).
    pub traced: bool,
}

impl Build {
    /// The build `v` runs (traced or not).
    pub fn of(v: &Variant, traced: bool) -> Build {
        Build { kind: v.kind, shape: v.shape, vec: v.vector_width, traced }
    }
}

/// The distinct builds of `variants` (untraced) and of `traced` (traced),
/// in the order first needed.
pub fn distinct(variants: &[Variant], traced: &[Variant]) -> Vec<Build> {
    let mut out: Vec<Build> = Vec::new();
    for b in variants.iter().map(|v| Build::of(v, false)).chain(traced.iter().map(|v| Build::of(v, true))) {
        if !out.contains(&b) {
            out.push(b);
        }
    }
    out
}

/// How many threads compile `jobs` builds: the host's cores, at most
/// [`MAX_COMPILE_THREADS`] and at most one a build.
pub fn compile_threads(jobs: usize) -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_COMPILE_THREADS).min(jobs).max(1)
}

/// Compiles each job (a build and the architecture to compile it for) to
/// PTX on `threads` threads, each taking the next job not yet taken, and
/// hands each job's PTX or error to `done` on the calling thread as it
/// comes (so a build can be loaded while others still compile): the
/// compile threads make no CUDA call.
pub fn compile_each(jobs: &[(Build, &'static str)], threads: usize, done: impl FnMut(usize, Result<String>)) {
    compile_then(jobs, threads, |_, ptx| ptx, done)
}

/// [`compile_each`] with `then` applied to each job's PTX on the thread
/// that compiled it (loading it there: the driver compiles PTX to the
/// GPU's code as it loads a module, a second compile worth spreading over
/// the cores), its result handed to `done` on the calling thread.
pub fn compile_then<T: Send>(
    jobs: &[(Build, &'static str)],
    threads: usize,
    then: impl Fn(usize, Result<String>) -> T + Sync,
    mut done: impl FnMut(usize, T),
) {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            let (tx, next, then) = (tx.clone(), &next, &then);
            scope.spawn(move || loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((b, arch)) = jobs.get(i) else { break };
                let k = b.kind.source();
                let ptx = kernels::compile_source(k.file, k.source, k.headers, arch, &TileKernel::defines(b.shape, b.vec, b.traced));
                if tx.send((i, then(i, ptx))).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        for (i, ptx) in rx {
            done(i, ptx);
        }
    });
}

/// [`compile_each`], collected: each job's PTX or error, in the jobs' order.
pub fn compile_all(jobs: &[(Build, &'static str)], threads: usize) -> Vec<Result<String>> {
    let mut out: Vec<Option<Result<String>>> = jobs.iter().map(|_| None).collect();
    compile_each(jobs, threads, |i, ptx| out[i] = Some(ptx));
    out.into_iter().map(|r| r.unwrap_or_else(|| Err(LabError::Kernel("a build was not compiled".into())))).collect()
}

/// Why a launch of the plain CUDA reference's sweep is not run, if it is
/// not (`res`: its build's resources at the launch asked; `before`: the
/// launches of the run before it): a count of blocks per SM more than fit
/// (it would launch as many as fit, a launch of its own), or the same
/// launch as one before it (as many as fit being a count already asked).
/// The lab's own kernels are never skipped here.
pub fn yardstick_skip(v: &Variant, res: &KernelResources, before: &[(&Variant, KernelResources)]) -> Option<String> {
    if v.role != Role::PlainReference {
        return None;
    }
    let asked = BlocksPerSm(v.blocks_per_sm);
    if asked != BlocksPerSm::MAX && asked.0 > res.max_blocks_per_sm {
        return Some(format!("{} blocks per SM do not fit: {} do (the launch with as many blocks as fit)", asked.0, res.max_blocks_per_sm));
    }
    before
        .iter()
        .find(|(w, r)| w.role == Role::PlainReference && Build::of(w, false) == Build::of(v, false) && r.blocks_per_sm == res.blocks_per_sm)
        .map(|(w, _)| format!("the same launch as {} ({} blocks per SM)", w.name, res.blocks_per_sm))
}

/// Whether block 0 of a kernel of `tile`-output tiles over `n` outputs, at
/// one block per SM on `sms` SMs, gets the tiles a warp timeline covers
/// (a traced build is compiled only where it will be drawn).
pub fn trace_window_fits(n: usize, tile: u32, sms: u32) -> bool {
    let tiles = n / tile.max(1) as usize;
    tiles.div_ceil(sms.max(1) as usize) >= (TRACE_FIRST + TRACE_TILES) as usize
}

/// What a run's builds made.
pub struct Built {
    /// Per variant, in order: its result so far (its resources, or skipped and why).
    pub results: Vec<VariantResult>,
    /// Per variant: its kernel, where it runs.
    pub kernels: Vec<Option<TileKernel>>,
    /// Per traced variant asked: its traced kernel (one block per SM), or why not.
    pub traced: Vec<(Variant, Result<TileKernel>)>,
    /// Distinct builds compiled, the threads that compiled them, and the
    /// wall time of the compiles and loads, s.
    pub builds: usize,
    pub threads: usize,
    pub seconds: f64,
}

/// Builds every variant of a run and the traced builds of `traced`: the
/// checks that need no compile, then every distinct build compiled at
/// once ([`compile_each`]), each loaded once as it comes and launched per
/// variant.
/// A variant this GPU cannot run (a kernel newer than it) is kept with the
/// reason, as is a launch of the plain reference's sweep that would repeat
/// another; any other failure (a compile error, a shape that does not
/// fit) ends the run, as it did when each kernel was built alone.
pub fn build_all(gpu: &Gpu, variants: Vec<Variant>, traced: &[Variant]) -> Result<Built> {
    let started = std::time::Instant::now();
    let builds = distinct(&variants, traced);
    // The checks that need the GPU but no compile, on this thread.
    let checked: Vec<Result<&'static str>> = builds.iter().map(|b| TileKernel::precheck(gpu, b.kind, b.shape, b.vec)).collect();
    let jobs: Vec<(Build, &'static str)> = builds.iter().zip(&checked).filter_map(|(b, c)| c.as_ref().ok().map(|arch| (*b, *arch))).collect();
    let threads = compile_threads(jobs.len());
    // Each build loaded once (untraced at one block per SM; relaunched per
    // variant), on the thread that compiled it, as soon as it is compiled.
    let mut by_job: Vec<Option<Result<TileKernel>>> = jobs.iter().map(|_| None).collect();
    let load = |i: usize, ptx: Result<String>| {
        let b = jobs[i].0;
        let _range = crate::gpu::trace::range(&format!("load {:?} {:?}{}", b.kind, b.shape, if b.traced { " traced" } else { "" }));
        ptx.and_then(|ptx| TileKernel::from_ptx(gpu, b.kind, &ptx, b.shape, 1)).map(|k| if b.traced { k.into_traced() } else { k })
    };
    compile_then(&jobs, threads, load, |i, kernel| by_job[i] = Some(kernel));
    let mut by_job = by_job.into_iter();
    let mut loaded: Vec<(Build, Result<TileKernel>)> = Vec::with_capacity(builds.len());
    for (b, check) in builds.iter().zip(checked) {
        let kernel = match check {
            Err(e) => Err(e),
            Ok(_) => by_job.next().flatten().unwrap_or_else(|| Err(LabError::Kernel(format!("{b:?} was not compiled")))),
        };
        loaded.push((*b, kernel));
    }
    let index =
        |loaded: &[(Build, Result<TileKernel>)], b: Build| loaded.iter().position(|(x, _)| *x == b).ok_or_else(|| LabError::Kernel(format!("no build {b:?}")));
    let (mut results, mut kernels) = (Vec::with_capacity(variants.len()), Vec::with_capacity(variants.len()));
    let mut launched: Vec<(Variant, KernelResources)> = Vec::new();
    for v in variants {
        let at = index(&loaded, Build::of(&v, false))?;
        let kernel = match &loaded[at].1 {
            Ok(k) => k.relaunched(gpu, v.blocks_per_sm)?,
            Err(LabError::Unsupported(why)) => {
                results.push(VariantResult { skipped: Some(why.clone()), variant: v, resources: None, ms: None });
                kernels.push(None);
                continue;
            }
            // Any other failure ends the run, as it is.
            Err(_) => return Err(loaded.swap_remove(at).1.err().unwrap_or_else(|| LabError::Kernel("a failed build".into()))),
        };
        let res = kernel.resources();
        let before: Vec<(&Variant, KernelResources)> = launched.iter().map(|(w, r)| (w, *r)).collect();
        if let Some(why) = yardstick_skip(&v, &res, &before) {
            results.push(VariantResult { variant: v, skipped: Some(why), resources: None, ms: None });
            kernels.push(None);
            continue;
        }
        launched.push((v.clone(), res));
        results.push(VariantResult { variant: v, skipped: None, resources: Some(res), ms: None });
        kernels.push(Some(kernel));
    }
    let mut traced_kernels = Vec::with_capacity(traced.len());
    for v in traced {
        let k = match index(&loaded, Build::of(v, true)) {
            Ok(at) => std::mem::replace(&mut loaded[at].1, Err(LabError::Kernel(format!("{}: its traced build was taken", v.name)))),
            Err(e) => Err(e),
        };
        traced_kernels.push((v.clone(), k));
    }
    Ok(Built { results, kernels, traced: traced_kernels, builds: builds.len(), threads, seconds: started.elapsed().as_secs_f64() })
}

#[cfg(test)]
mod tests {
    use super::super::settings::KernelPipelineConfig;
    use super::*;

    /// The headline run's kernels come from far fewer builds than kernels:
    /// a launch is not a build, and the plain reference's sweep adds a
    /// build per tile, not per launch.
    #[test]
    fn kernels_that_differ_only_in_their_launch_share_one_build() {
        let c = KernelPipelineConfig::headline();
        let v = c.variants();
        let traced = c.diagram_variants();
        let b = distinct(&v, &traced);
        // naive 1, async 3 tiles x 4 stages, warp-specialized 2, TMA 2,
        // plain 3 tiles; and 4 traced.
        assert_eq!(b.iter().filter(|b| !b.traced).count(), 1 + 12 + 2 + 2 + 3, "{b:?}");
        assert_eq!(b.iter().filter(|b| b.traced).count(), 4);
        assert_eq!(v.len(), 2 + 24 + 2 + 2 + 12);
        assert!(b.iter().filter(|b| b.traced).all(|t| b.contains(&Build { traced: false, ..*t })), "every traced build has its untraced twin");
        assert!((1..=MAX_COMPILE_THREADS).contains(&compile_threads(b.len())) && compile_threads(1) == 1 && compile_threads(0) == 1);
    }

    /// On an H200 a block of tile 8192 at two stages (64 KiB) fits 3 to an
    /// SM: its 4 blocks per SM are skipped, its as many as fit runs; where
    /// as many as fit is a count already asked, it is skipped as that one.
    #[test]
    fn a_yardstick_launch_that_does_not_fit_or_repeats_another_is_skipped() {
        let c = KernelPipelineConfig::default();
        let plain: Vec<Variant> = c.variants().into_iter().filter(|v| v.role == Role::PlainReference && v.shape.tile == 8192).collect();
        let res = |fits: u32, bps: u32| KernelResources {
            registers: 32,
            static_smem: 64,
            dynamic_smem: 65_600,
            local_bytes: 0,
            max_blocks_per_sm: fits,
            occupancy: 0.375,
            blocks_per_sm: bps,
            grid: 132 * bps,
        };
        let (one, two, four, max) = (&plain[0], &plain[1], &plain[2], &plain[3]);
        assert_eq!(four.blocks_per_sm, 4);
        let before = [(one, res(3, 1)), (two, res(3, 2))];
        assert_eq!(yardstick_skip(four, &res(3, 3), &before).as_deref(), Some("4 blocks per SM do not fit: 3 do (the launch with as many blocks as fit)"));
        assert_eq!(yardstick_skip(max, &res(3, 3), &before), None);
        // Where only 2 fit, as many as fit is the launch of 2 blocks per SM.
        let e = yardstick_skip(max, &res(2, 2), &before).unwrap();
        assert_eq!(e, "the same launch as plain CUDA reference (2 stages), tile 8192, 2 blocks per SM (2 blocks per SM)");
        // The lab's own kernels are never skipped here.
        let sweep = c.variants().into_iter().find(|v| v.role == Role::Sweep && v.blocks_per_sm == u32::MAX).unwrap();
        assert_eq!(yardstick_skip(&sweep, &res(1, 1), &[(&sweep, res(1, 1))]), None);
    }

    #[test]
    fn a_traced_build_is_made_only_where_block_0_gets_the_window() {
        // 12 tiles for each of 132 SMs: block 0 gets tiles 0 to 11, the window 4 to 11.
        assert!(trace_window_fits(132 * 12 * 1024, 1024, 132));
        assert!(!trace_window_fits(132 * 11 * 1024, 1024, 132));
        // The small preset's 1 MiB: 2 tiles a block.
        let s = KernelPipelineConfig::small();
        assert!(!trace_window_fits(s.elements(), s.tile, 132));
        let h = KernelPipelineConfig::headline();
        assert!(h.diagram_variants().iter().all(|v| trace_window_fits(h.elements(), v.shape.tile, 132)));
    }

    /// The compile threads return each build's PTX in the jobs' order, an
    /// error where one fails, the others still compiled.
    #[test]
    fn builds_compiled_on_several_threads_come_back_in_order() {
        if !crate::testing::nvrtc_or_skip("builds_compiled_on_several_threads_come_back_in_order") {
            return;
        }
        let shape = |stages| TileShape { tile: 1024, threads: 128, stages };
        let job = |kind, stages, vec| (Build { kind, shape: shape(stages), vec, traced: false }, "compute_90");
        let jobs = [job(TileKind::Async, 1, 4), job(TileKind::Naive, 1, 4), job(TileKind::Async, 3, 1), job(TileKind::Naive, 1, 2), job(TileKind::Plain, 2, 4)];
        let out = compile_all(&jobs, 3);
        assert_eq!(out.len(), jobs.len());
        for (i, r) in out.iter().enumerate() {
            match i {
                3 => assert!(r.as_ref().unwrap_err().to_string().contains("VEC must be 1"), "{r:?}"),
                _ => {
                    let ptx = r.as_ref().unwrap_or_else(|e| panic!("job {i}: {e}"));
                    let k = jobs[i].0.kind.source();
                    assert!(ptx.contains(&format!(".visible .entry {}", k.entry)), "job {i}");
                }
            }
        }
        // The same build on one thread gives the same PTX.
        assert_eq!(compile_all(&jobs[2..3], 1)[0].as_ref().unwrap(), out[2].as_ref().unwrap());
    }
}
