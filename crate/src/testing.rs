//! What tests share (unit, integration, and the GPU-skipping ones): a
//! made-up GPU, temporary folders, skipping where no GPU or NVRTC is, and
//! the helpers labs' fixtures are made with. Each lab's own fixture (its
//! results made up with no GPU) lives in its folder (`labs/<lab>/fixture.rs`)
//! and its table entry names it.

use crate::gpu::MachineFacts;
use crate::lab_kit::experiment::{Experiment, ExperimentResult, VariantResult as ExperimentVariant};
use crate::measure::fingerprint::Fingerprint;
use crate::measure::stats::Summary;
use crate::pipeline::machine::Machine;
use crate::pipeline::plan::Costs;
use crate::pipeline::timeline::Timeline;
use std::path::PathBuf;

pub fn fingerprint() -> Fingerprint {
    Fingerprint::made_up()
}

/// A fresh, empty directory under the system temp dir.
/// Three chunks (H2D, kernel, D2H each) over two streams and a host op,
/// predicted at 100 µs an op on two copy engines: a timeline for tests.
pub fn sample_timeline() -> crate::pipeline::timeline::Timeline {
    use crate::pipeline::op::{Access, OpKind};
    let mut s = crate::pipeline::schedule::Schedule::new();
    for c in 0..3u64 {
        let st = c as usize % 2;
        s.gpu_op(0, st, OpKind::H2d, &format!("H2D chunk {c}"), vec![Access::write("d", c * 8, c * 8 + 8)]);
        s.gpu_op(0, st, OpKind::Kernel, &format!("compute chunk {c}"), vec![Access::read("d", c * 8, c * 8 + 8)]);
        s.gpu_op(0, st, OpKind::D2h, &format!("D2H chunk {c}"), vec![]);
    }
    s.host_op(0, "check", vec![]);
    let t = crate::pipeline::predict::predict(&s, crate::pipeline::machine::Machine::engines(2), |_| 100.0);
    crate::pipeline::timeline::Timeline::from_schedule("predicted", "GPU 0 (Test GPU)", &s, &t, &[])
}

pub fn temp_dir(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("overlap-lab-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// For tests: what names a folder of the machine that ran something,
/// which nothing committed or rendered may hold (outputs name files as the
/// repository does).
pub const MACHINE_FOLDERS: &[&str] = &["/root/", "/work/", "/home/", "/tmp/", ".gpu/", "$OUT"];

/// For tests: a copy of the course's notebooks and lab 7's exercise file
/// in a fresh folder, with no saved verdicts: where a learner's answers
/// can be made up, and the committed notebooks read as a new learner's.
pub fn notebooks_copy(tag: &str) -> PathBuf {
    let from = crate::lab_kit::progress::default_notebooks_dir();
    let to = temp_dir(tag);
    std::fs::create_dir_all(to.join("exercises")).unwrap();
    for e in std::fs::read_dir(&from).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "ipynb") {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
    for e in std::fs::read_dir(from.join("exercises")).unwrap().flatten() {
        std::fs::copy(e.path(), to.join("exercises").join(e.file_name())).unwrap();
    }
    to
}

/// For tests: whether NVRTC is here to compile with; where it is not, the
/// test says it skips, or fails where CI asks for NVRTC
/// (`OVERLAP_LAB_REQUIRE_NVRTC=1`: it installs NVRTC from PyPI).
pub fn nvrtc_or_skip(test: &str) -> bool {
    if crate::gpu::kernels::nvrtc_present() {
        return true;
    }
    assert!(std::env::var_os("OVERLAP_LAB_REQUIRE_NVRTC").is_none(), "{test}: NVRTC required but not found");
    eprintln!("SKIPPED {test}: NVRTC not found");
    false
}

/// For tests: compiles `k` for compute_90 with its test settings and
/// checks its PTX holds what it is meant to, and no FMA the compiler
/// contracted on its own (fmad=false: only the explicit ones). Returns the PTX.
pub fn check_ptx(k: &crate::gpu::kernels::KernelSource) -> String {
    let ptx = crate::gpu::kernels::compile_ptx_with(k, "compute_90", k.test_defines).unwrap_or_else(|e| panic!("{e}"));
    for needle in k.expect_in_ptx {
        assert!(ptx.contains(needle), "{}: PTX lacks `{needle}`:\n{ptx}", k.file);
    }
    assert!(!ptx.contains("mad.f32"), "{}: unexpected contracted mad", k.file);
    ptx
}

/// Set to 1 on a GPU machine: a GPU test that finds no GPU fails instead of
/// skipping, so a run that should have used the GPU cannot pass by skipping.
/// Set to 2 on a machine with two GPUs: the tests of several GPUs then also
/// fail where they find only one, instead of running both sides on GPU 0.
pub const REQUIRE_GPU_ENV: &str = "OVERLAP_LAB_REQUIRE_GPU";

/// Whether [`REQUIRE_GPU_ENV`] asks for a GPU.
pub fn gpu_required() -> bool {
    gpus_required() > 0
}

/// How many GPUs [`REQUIRE_GPU_ENV`] asks for: 0 where unset or "0", the
/// number it names, and 1 for any other non-empty value.
pub fn gpus_required() -> usize {
    match std::env::var(REQUIRE_GPU_ENV) {
        Ok(v) if v.is_empty() => 0,
        Ok(v) => v.trim().parse().unwrap_or(1),
        Err(_) => 0,
    }
}

/// Held by each GPU test for as long as it runs: the GPU tests of one test
/// binary run one at a time. The test harness runs tests on several
/// threads, and a GPU test beside another reads the other's work: CUPTI's
/// activity records are the whole process's (a timeline then holds the
/// other test's kernels), and a calibration that times its repeats finds
/// them slowed by the other test's.
static GPU_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The GPU, held by one test alone ([`gpu_or_skip`]): it derefs to the
/// opened device, and the other GPU tests of this binary wait until it is
/// dropped at the end of the test.
pub struct TestGpu {
    gpu: crate::gpu::Gpu,
    _alone: std::sync::MutexGuard<'static, ()>,
}

impl std::ops::Deref for TestGpu {
    type Target = crate::gpu::Gpu;
    fn deref(&self) -> &crate::gpu::Gpu {
        &self.gpu
    }
}

/// For GPU tests: the opened device, held by this test alone until the
/// returned [`TestGpu`] drops, or None after saying why the test skips.
/// Panics (fails the test) instead when [`REQUIRE_GPU_ENV`] is set.
pub fn gpu_or_skip(test: &str) -> Option<TestGpu> {
    let avail = crate::gpu::Availability::probe();
    if !avail.is_ready() {
        skip_unless_required(test, &avail.reason());
        return None;
    }
    // A test that failed while holding it leaves it poisoned: the next
    // test's GPU is as good as ever.
    let alone = GPU_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    Some(TestGpu { gpu: crate::gpu::Gpu::open(0).expect("GPU present but could not be opened"), _alone: alone })
}

/// Says `SKIPPED test: why`, or fails the test when a GPU is required.
pub fn skip_unless_required(test: &str, why: &str) {
    assert!(!gpu_required(), "{test}: {REQUIRE_GPU_ENV} is set but {why}");
    eprintln!("SKIPPED {test}: {why}");
}

/// A summary of one value (no spread).
pub fn flat(v: f64) -> Summary {
    Summary { median: v, min: v, max: v, n: 1, middle: Some((v, v)) }
}

/// Asserts that a checker's report failed and says `words`.
pub fn fails_with(rep: &crate::lab_kit::check::CheckReport, words: &str) {
    assert!(!rep.passed, "should fail: {rep}");
    assert!(rep.to_string().contains(words), "should say '{words}': {rep}");
}

/// `e` as if every variant measured exactly what the model predicts
/// from `costs` on `facts`' machine (`machine`): the fixtures' results,
/// with real timelines to draw.
pub fn experiment_as_modelled(e: &Experiment, facts: MachineFacts, machine: Machine, costs: &Costs) -> crate::Result<ExperimentResult> {
    let variants = e
        .variants
        .iter()
        .map(|plan| {
            let model = plan.dry_run()?;
            let p = plan.prediction(&model, machine, costs)?;
            let watched = e.watch.and_then(|l| p.end_of(&model.schedule, l));
            Ok(ExperimentVariant {
                name: plan.name.clone(),
                total_ms: flat(p.total_ms),
                model_ms: p.total_ms,
                watched_ms: watched.map(flat),
                watched_model_ms: watched,
                bound_ms: None,
                timeline: Timeline { title: "measured".into(), ..p.timeline.clone() },
                predicted: p.timeline,
            })
        })
        .collect::<crate::Result<Vec<_>>>()?;
    Ok(ExperimentResult::new(e, variants, facts, costs))
}

/// A live checker's report on an answer whose verdict rests on time:
/// printed, saying it timed the answer (its timing note holds `timed`), and
/// holding no problem but a timing verdict (each problem starts with one of
/// `timing`). Tests assert no timing: whether the answer was fast enough is
/// the checker's to say on the GPU (and its timing verdicts are tested on
/// the queue model with recorded costs); what a test asserts is that the
/// answer ran verified and nothing else was found wrong with it.
pub fn judged_only_on_time(rep: &crate::lab_kit::check::CheckReport, timed: &str, timing: &[&str]) {
    println!("{rep}");
    let text = rep.to_string();
    assert!(text.contains(timed), "the checker did not time the answer (no '{timed}'): {text}");
    let other: Vec<&str> = rep.problems().filter(|p| !timing.iter().any(|t| p.starts_with(t))).collect();
    assert!(other.is_empty(), "found wrong beyond its time: {other:?}\n{text}");
}

/// For GPU tests: every GPU of this machine, opened. Fails where the run
/// asks for more GPUs than there are (`OVERLAP_LAB_REQUIRE_GPU=2`), so on a
/// machine meant to have two no test passes by pairing GPU 0 with itself.
pub fn all_gpus() -> Vec<crate::gpu::Gpu> {
    let n = crate::gpu::topology::Topology::discover().unwrap().gpus.len();
    let wanted = gpus_required();
    assert!(n >= wanted, "{} asks for {wanted} GPUs; this machine has {n}", REQUIRE_GPU_ENV);
    println!("{n} GPU(s) here; pairs run GPU 0 with GPU {}; the pipeline has a stage on each", usize::from(n > 1));
    (0..n).map(|i| crate::gpu::Gpu::open(i).unwrap()).collect()
}

/// For recorded-data tests: held alone by a test that times checks, and
/// shared by those that keep the cores busy (rendering, the queue model
/// over whole recordings), so that its times are not the other tests'
/// while those still run beside each other. One per test binary: the
/// crate's unit tests (a lab's own) and `crate/tests/recorded.rs` (the
/// walks over every lab) each hold their own.
static TIMING: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// For a test that keeps the cores busy.
pub fn busy() -> std::sync::RwLockReadGuard<'static, ()> {
    TIMING.read().unwrap_or_else(|e| e.into_inner())
}

/// For a test that times: nothing busy beside it.
pub fn alone() -> std::sync::RwLockWriteGuard<'static, ()> {
    TIMING.write().unwrap_or_else(|e| e.into_inner())
}
