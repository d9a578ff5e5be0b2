//! Lab 9's test on a GPU. Each says SKIPPED with no GPU (`testing::gpu_or_skip`)
//! and fails instead where `OVERLAP_LAB_REQUIRE_GPU` asks for one; the GPU
//! tests of no one lab are in `crate/tests/gpu.rs`.

use crate::present::progress::ProgressMode;
use crate::testing::{gpu_or_skip, judged_only_on_time};

/// Lab 9 on a small model: every variant's passes verified against the
/// CPU (the ring's time beside copy-then-compute's printed), and the live
/// checker timing the ring and naming one slot doing all the work.
#[test]
fn offload_passes_are_verified_and_the_live_checker_judges_a_schedule() {
    use crate::labs::offload::forward::{copy_then_compute, ring, Weights};
    use crate::labs::offload::{exercise, measure as offload, OffloadConfig, Variant};
    let Some(gpu) = gpu_or_skip("offload_passes_are_verified_and_the_live_checker_judges_a_schedule") else {
        return;
    };
    let cfg = OffloadConfig {
        layers: 16,
        d_model: 1024,
        gpu_budget: 256,
        batches: vec![512, 4096],
        warmup: 1,
        repeats: 3,
        python: String::new(),
        sweep_batches: vec![512],
        sweep_budgets: vec![256],
        ..OffloadConfig::default()
    };
    let r = offload::run(&gpu, &cfg, ProgressMode::Quiet).unwrap();
    println!("{}", r.summary());
    assert!(r.verified_passes >= 2 * 6 * 4 && r.max_error < offload::TOLERANCE, "{} passes, {:.1e}", r.verified_passes, r.max_error);
    // FP8 where the GPU has it: every pass within the tolerance the lab states, nothing clipped.
    let fp8 = gpu.compute_capability().unwrap() >= (8, 9);
    match &r.fp8 {
        Some(a) => assert!(a.verified_passes > 0 && a.max_error <= a.tolerance && a.range_used <= 1.0, "{a:?}"),
        None => assert!(!fp8, "no FP8 accuracy on a GPU with FP8: {:?}", r.fp8_missing),
    }
    // The placement sweep: a grid at 256 MiB beside the planner's choice, each placement verified.
    let grid = r.sweeps.iter().find(|s| s.is_grid()).expect("a grid at 256 MiB");
    assert!(grid.measured.len() >= 3 && grid.planned().is_some(), "{grid:?}");
    for p in &r.points {
        let expected = if fp8 { Variant::ALL.len() } else { Variant::ALL.len() - 1 };
        assert_eq!(p.variants.len(), expected);
        let planned = p.variant(Variant::Resident).unwrap().plan.as_ref().unwrap();
        assert!(planned.gpu_bytes <= cfg.gpu_budget << 20, "{planned:?}");
        let ring = p.variant(Variant::RingK).unwrap();
        let serial = p.variant(Variant::Pinned).unwrap();
        println!("{} tokens: the ring {:.3} ms, copy then compute {:.3} ms", p.batch, ring.ms.median, serial.ms.median);
    }
    assert!(!r.timeline.spans.is_empty());
    let rep = exercise::check_on_gpu(&gpu, &r, std::sync::Arc::new(ring)).unwrap();
    judged_only_on_time(&rep, "measured (fastest pass)", &["no overlap", "efficiency"]);
    let rep = exercise::check_on_gpu(
        &gpu,
        &r,
        std::sync::Arc::new(|f: &mut dyn crate::labs::offload::forward::Forward, t: &_| copy_then_compute(f, t, Weights::Pinned)),
    )
    .unwrap();
    assert!(!rep.passed && rep.to_string().contains("one slot of the 3 does all the work"), "{rep}");
}
