//! Lab 4's tests on a GPU. Each says SKIPPED with no GPU (`testing::gpu_or_skip`)
//! and fails instead where `OVERLAP_LAB_REQUIRE_GPU` asks for one; the GPU
//! tests of no one lab are in `crate/tests/gpu.rs`.

use crate::labs::callback::measure;
use crate::labs::callback::rig::CallbackRig;
use crate::labs::callback::{self, exercise, CallbackConfig, Variant};
use crate::present::progress::ProgressMode;
use crate::testing::{gpu_or_skip, judged_only_on_time};

fn small() -> CallbackConfig {
    CallbackConfig { rows: 8192, dim: 64, iterations: 96, slots: 3, cpu_over_gpu: vec![0.5, 2.0], warmup: 0, repeats: 2, ..CallbackConfig::default() }
}

#[test]
fn every_variant_verifies_every_argmin_and_draws_its_threads() {
    let Some(gpu) = gpu_or_skip("every_variant_verifies_every_argmin_and_draws_its_threads") else {
        return;
    };
    let rig = CallbackRig::new(&gpu, &small()).unwrap();
    for v in Variant::ALL {
        let out = rig.run(&v.iteration(), 3, true).unwrap_or_else(|e| panic!("{}: {e}", v.label()));
        let t = out.timeline.unwrap();
        assert!(out.total_ms > 0.0 && out.cpu_ms > 0.0);
        let lanes = t.lanes();
        let want = match v {
            Variant::HostFnOnCompute | Variant::HostFnOnCallbackStream => "CPU: CUDA callback thread",
            Variant::HandOffToWorker => "CPU: worker thread",
            Variant::EventWaitingThread => "CPU: event-waiting thread",
        };
        assert!(lanes.iter().any(|l| l == want) && lanes.iter().any(|l| l == "stream 0: compute"), "{}: {lanes:?}", v.label());
        let argmins = t.spans.iter().filter(|s| s.label.starts_with("argmin ")).count();
        assert_eq!(argmins, 96, "{}", v.label());
        // Every argmin starts after its own D2H ended (device and host clocks aligned).
        for i in 0..96 {
            let d2h_end = t.spans.iter().find(|s| s.label == format!("D2H scores {i}")).unwrap().end_us;
            let arg = t.spans.iter().find(|s| s.label == format!("argmin {i}")).unwrap().start_us;
            assert!(arg >= d2h_end - 50.0, "{}: argmin {i} at {arg} µs before its D2H ended at {d2h_end} µs", v.label());
        }
    }
}

#[test]
fn wrong_wiring_is_caught_on_the_gpu() {
    let Some(gpu) = gpu_or_skip("wrong_wiring_is_caught_on_the_gpu") else {
        return;
    };
    let rig = CallbackRig::new(&gpu, &small()).unwrap();
    let e = rig.run(&exercise::hands_off_without_waiting, 1, false).unwrap_err().to_string();
    assert!(e.contains("not ordered after its D2H") && e.contains("no \"scores ready\" event was recorded"), "{e}");
    // Heavy CPU work so the worker falls behind and slots are reused under it.
    let e = rig.run(&exercise::reuses_slots_by_index, 200, false).unwrap_err().to_string();
    assert!(e.contains("reused too early") || e.contains("overwritten"), "{e}");
    let e = rig.run(&exercise::forgets_the_argmin, 1, false).unwrap_err().to_string();
    assert!(e.contains("argmin was never issued"), "{e}");
    // Two slots taken an iteration: said as the model says it, not as a missing argmin.
    let two_slots = |l: &mut crate::labs::callback::ScoreLoop, t: usize| {
        let _spare = l.take_slot(t)?;
        callback::hand_off_to_worker(l, t)
    };
    let e = rig.run(&two_slots, 1, false).unwrap_err().to_string();
    assert!(e.contains("taken and never copied into") && e.contains("an iteration takes one slot") && !e.contains("never issued"), "{e}");
    // The rig is still usable after every failure: nothing was left in flight.
    rig.run(&callback::hand_off_to_worker, 1, false).unwrap();
}

#[test]
fn the_exercise_checker_times_the_fix_and_names_what_is_wrong_on_the_gpu() {
    let Some(gpu) = gpu_or_skip("the_exercise_checker_times_the_fix_and_names_what_is_wrong_on_the_gpu") else {
        return;
    };
    // The lab's sizes (a GPU iteration long enough to hide a hand-off), fewer iterations.
    let cfg = CallbackConfig { iterations: 128, ..CallbackConfig::default() };
    let rep = exercise::check_on_gpu(&gpu, &cfg, callback::hand_off_to_worker).unwrap();
    judged_only_on_time(&rep, "measured, fastest of", &["no overlap", "efficiency"]);
    let rep = exercise::check_on_gpu(&gpu, &cfg, Variant::HostFnOnCompute.iteration()).unwrap();
    println!("{rep}");
    assert!(!rep.passed && rep.to_string().contains("argmin(s) run in a host function on the compute stream"), "{rep}");
    let rep = exercise::check_on_gpu(&gpu, &cfg, exercise::reuses_slots_by_index).unwrap();
    println!("{rep}");
    assert!(!rep.passed && rep.to_string().contains("reused too early"), "{rep}");
}

#[test]
fn small_sweep_reports_every_variant_against_its_model() {
    let Some(gpu) = gpu_or_skip("small_sweep_reports_every_variant_against_its_model") else {
        return;
    };
    let r = measure::run(&gpu, &small(), ProgressMode::Quiet).unwrap();
    println!("{}", r.table());
    assert_eq!(r.points.len(), 2);
    assert_eq!(r.timelines.len(), 4);
    for p in &r.points {
        assert!(p.passes >= 1 && p.cpu_alone_ms.median > 0.0 && p.cpu_ms() > 0.0);
        for v in Variant::ALL {
            let e = r.efficiency(p, v).unwrap().ratio;
            println!("{}: efficiency {e:.2}", v.label());
            assert!(e.is_finite() && e > 0.0, "{}: efficiency {e}", v.label());
        }
    }
    // 2 points x 4 variants x 2 runs (again, up to twice, for a point
    // whose runs saw a C/G off the asked one), 2 x (2·2 + 1) overhead
    // runs, 4 timelines.
    let sweeps = r.verified_runs - (2 * 5 + 4);
    assert!(sweeps % (4 * 2) == 0 && (2..=6).contains(&(sweeps / 8)), "{} verified runs", r.verified_runs);
}
