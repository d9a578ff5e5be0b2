//! Lab 6's tests on a GPU. Each says SKIPPED with no GPU (`testing::gpu_or_skip`)
//! and fails instead where `OVERLAP_LAB_REQUIRE_GPU` asks for one; the GPU
//! tests of no one lab are in `crate/tests/gpu.rs`.

use crate::labs::memory::{exercise, measure, probes::BusyWith, MemoryConfig};
use crate::present::progress::ProgressMode;
use crate::testing::{gpu_or_skip, judged_only_on_time};
use std::sync::Arc;

/// Lab 6 at its small preset: every part runs verified; every call is
/// probed beside each kind of busy work; the stall variants run beside
/// their model; the sweeps and zero-copy have every point.
#[test]
fn every_part_runs_verified_beside_its_model() {
    let Some(gpu) = gpu_or_skip("every_part_runs_verified_beside_its_model") else {
        return;
    };
    let cfg = MemoryConfig::small();
    let r = measure::run(&gpu, &cfg, ProgressMode::Quiet).unwrap();
    println!("{}", r.table());
    assert_eq!(r.probes.len(), 3);
    assert!(r.probes.iter().all(|p| p.beside.iter().map(|b| b.busy).eq(BusyWith::ALL)));
    assert!(r.stall.variants.iter().all(|v| v.total_ms.median > 0.0 && v.model_ms > 0.0 && !v.timeline.spans.is_empty()));
    assert_eq!(r.pairs.len(), 3 * cfg.sizes_mib.len());
    assert!(r.traces.iter().all(|t| t.batches.len() == cfg.trace_batches));
    assert_eq!(r.zero_copy.points.len(), cfg.passes.len());
    assert_eq!(r.pin_cost.len(), cfg.pinned_sizes_mib.len());
    // Pinned staging: every variant ran verified (a ring's host functions
    // handed every slot back), the per-batch allocation beside a ring.
    let ring = &r.ring;
    assert_eq!(ring.staging.variants.len(), 1 + cfg.ring_slots.len());
    assert!(ring.host_fn_ms.median > 0.0 && ring.produce_ms.median > 0.0, "{:?}", ring.lines());
    assert!(ring.fewest_slots().is_some() && ring.per_batch().is_some());
    assert!(ring.staging.variants.iter().all(|v| v.total_ms.median > 0.0 && v.model_ms > 0.0));
}

/// A host function's signal wakes the CPU with no polling, in order:
/// a loop that waits for the signal after each upload before writing
/// the same host slot again runs verified, and a wait for a signal
/// that was never made is refused with a message.
#[test]
fn a_signal_hands_a_slot_back_to_the_cpu() {
    use crate::gpu::{PlanRig, TimelineSource};
    use crate::labs::memory::ring::{plan, Staging};
    use crate::pipeline::issue::SignalRef;
    use crate::pipeline::op::StreamKind;
    use crate::pipeline::plan::{Plan, StreamSpec};
    let Some(gpu) = gpu_or_skip("memory::a_signal_hands_a_slot_back_to_the_cpu") else {
        return;
    };
    let mut rig = PlanRig::new(&gpu, 1 << 16, 2, 4).unwrap();
    for staging in [Staging::Ring(1), Staging::Ring(3), Staging::PerBatch] {
        let p = plan(1 << 16, 8, staging);
        rig.run(&p, TimelineSource::Events).unwrap();
    }
    let lost = Plan::new("wait for no signal", vec![StreamSpec::new("s", StreamKind::NonBlocking, 0)], 1 << 10, 1, |p, _| p.host_wait_signal(SignalRef(3)));
    let e = rig.run(&lost, TimelineSource::Off).unwrap_err().to_string();
    assert!(e.contains("signal 3 was never made"), "{e}");
}

/// The exercise's checker live, at the quick size (the notebook's):
/// the given loop fails naming cuMemFree; the fix and a release on the
/// compute stream after waiting for the download run verified and are
/// timed (the verdict on their time is printed).
#[test]
fn the_exercise_checker_judges_live_runs() {
    let Some(gpu) = gpu_or_skip("memory::the_exercise_checker_judges_live_runs") else {
        return;
    };
    let mut rec = crate::labs::memory::fixture::results();
    rec.config = MemoryConfig::quick();
    rec.iterations = 800;
    let given = exercise::check_on_gpu(&gpu, &rec, Arc::new(exercise::given)).unwrap();
    println!("{given}");
    assert!(!given.passed && given.to_string().contains("cuMemFree"), "{given}");
    let fixed = exercise::check_on_gpu(&gpu, &rec, Arc::new(exercise::solution)).unwrap();
    judged_only_on_time(&fixed, "measured, medians", &["your loop takes"]);
    let slow = exercise::check_on_gpu(&gpu, &rec, Arc::new(exercise::frees_on_the_compute_stream)).unwrap();
    judged_only_on_time(&slow, "measured, medians", &["your loop takes"]);
}
