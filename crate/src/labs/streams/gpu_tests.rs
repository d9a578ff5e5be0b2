//! Lab 5's tests on a GPU. Each says SKIPPED with no GPU (`testing::gpu_or_skip`)
//! and fails instead where `OVERLAP_LAB_REQUIRE_GPU` asks for one; the GPU
//! tests of no one lab are in `crate/tests/gpu.rs`.

use crate::labs::streams::{measure, StreamsConfig};
use crate::present::progress::ProgressMode;
use crate::testing::{gpu_or_skip, judged_only_on_time};

/// Lab 5 at its small preset: every variant of every experiment runs,
/// verifies its output and is predicted; the priorities' urgent job is watched.
#[test]
fn every_experiment_runs_verified_beside_its_model() {
    let Some(gpu) = gpu_or_skip("every_experiment_runs_verified_beside_its_model") else {
        return;
    };
    let r = measure::run(&gpu, &StreamsConfig::small(), ProgressMode::Quiet).unwrap();
    println!("{}", r.table());
    assert_eq!(r.experiments.len(), 5);
    for e in &r.experiments {
        for v in &e.variants {
            assert!(v.total_ms.median > 0.0 && v.model_ms > 0.0, "{}: {}", e.name, v.name);
            assert!(!v.timeline.spans.is_empty() && !v.predicted.spans.is_empty());
        }
    }
    let p = r.experiment("priorities").unwrap();
    assert!(p.variants.iter().all(|v| v.watched_ms.is_some() && v.watched_model_ms.is_some()));
    let three = r.experiment("copy-engines").unwrap().variants.iter().find(|v| v.name.starts_with("three-way")).unwrap();
    // At this size fixed costs dominate: only that there is a bound (the full run is judged in the closing note).
    assert!(three.bound_ms.is_some_and(|b| b > 0.0), "{:?}", three.bound_ms);
    // Each CPU thread's per-thread default stream is its own lane; the legacy stream is one.
    let threads = r.experiment("threads").unwrap();
    // (The issuing CPU thread's lane beside them is not counted.)
    let lanes = |i: usize| threads.variants[i].timeline.lanes().iter().filter(|l| !l.starts_with("CPU")).count();
    assert_eq!((lanes(0), lanes(1)), (1, StreamsConfig::small().streams), "{:?}", threads.variants[1].timeline.lanes());
    let ic = r.issue_cost.as_ref().unwrap();
    assert_eq!(ic.points.len(), StreamsConfig::small().issue_chunks.len());
    assert!(ic.points.iter().all(|p| p.nodes >= p.ops
        && p.graph.median > 0.0
        && p.live.median > 0.0
        && p.plain.is_some()
        && p.issue_ratio().is_some_and(|r| r > 0.0)));
    // The live run's timeline draws the CPU's calls beside the GPU's
    // ops: one span per copy and kernel issued, each made before the
    // GPU started that op (a few µs for the two clocks' alignment).
    let t = &ic.timeline;
    let gpu_ops: Vec<_> = t.spans.iter().filter(|s| !s.lane.starts_with("CPU")).collect();
    let calls: Vec<_> = t.spans.iter().filter(|s| s.lane == "CPU main" && s.label.starts_with("issue")).collect();
    println!("issue-cost timeline: {} GPU ops, {} CPU calls, lanes {:?}", gpu_ops.len(), calls.len(), t.lanes());
    // How long the longest call took is printed (a tool's start-up, as
    // CUPTI attaching, would show there), not asserted.
    let longest = calls.iter().map(|s| s.end_us - s.start_us).fold(0.0, f64::max);
    println!("the longest call: {longest:.1} µs in a {:.1} µs timeline", t.end_us());
    for (kind, label) in [("H2D", "issue H2D"), ("kernel", "issue kernel"), ("D2H", "issue D2H")] {
        let mut ops: Vec<_> = gpu_ops.iter().filter(|s| s.label.starts_with(kind)).collect();
        let mut issued: Vec<_> = calls.iter().filter(|s| s.label == label).collect();
        assert_eq!(ops.len(), issued.len(), "{kind}: every op has its call");
        assert!(!ops.is_empty(), "{kind}");
        ops.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
        issued.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
        for (op, call) in ops.iter().zip(&issued) {
            assert!(call.end_us >= call.start_us && call.start_us <= op.start_us + 5.0, "{kind}: call at {} µs, op at {} µs", call.start_us, op.start_us);
        }
    }
}

/// A plan captured as a CUDA graph replays on fresh data and verifies;
/// what a graph cannot hold (a CPU wait, the legacy stream) is refused
/// with the reason, and the rig works on after a refused capture.
#[test]
fn a_captured_plan_replays_verified_and_refuses_what_a_graph_cannot_hold() {
    use crate::gpu::{PlanRig, TimelineSource};
    use crate::labs::streams::issue_cost;
    use crate::pipeline::op::StreamKind;
    use crate::pipeline::plan::{Plan, StreamSpec};
    let Some(gpu) = gpu_or_skip("a_captured_plan_replays_verified_and_refuses_what_a_graph_cannot_hold") else {
        return;
    };
    let n = 1 << 16;
    let mut rig = PlanRig::new(&gpu, n, 3, 16).unwrap();
    let (gated, live) = issue_cost::plans(n, 16);
    let model = gated.dry_run().unwrap();
    let captured = rig.capture(&gated, &model).unwrap();
    println!("{} nodes, capture {:.3} ms, instantiate {:.3} ms", captured.nodes, captured.capture_ms, captured.instantiate_ms);
    assert!(captured.nodes >= 3 * 16, "{captured:?}");
    for _ in 0..3 {
        let r = rig.replay(&gated, &captured).unwrap();
        assert!(r.total_ms > 0.0 && r.launch_ms > 0.0, "{r:?}");
    }
    let run = rig.run(&live, TimelineSource::Events).unwrap();
    assert!(run.issue_ms > 0.0 && run.full_timeline().is_some(), "the replay was timed and traced: issue {} ms", run.issue_ms);
    // The same loop issued by bare driver calls verifies against the same model.
    let plain = rig.plain_stage_loop(&crate::gpu::plan::plain::PlainLoop::new(n, 16).unwrap()).unwrap();
    assert!(plain.total_ms > 0.0 && plain.issue_ms > 0.0, "{plain:?}");
    let waits = Plan::new("waits", vec![StreamSpec::new("s", StreamKind::NonBlocking, 0)], n, 2, |p, r| {
        p.h2d(r.streams[0], r.devices[0], 0, r.input, 0, 1024, "up")?;
        p.host_sync(r.streams[0])
    });
    let e = rig.capture(&waits, &waits.dry_run().unwrap()).unwrap_err().to_string();
    assert!(e.contains("a CPU wait (cuStreamSynchronize) cannot be captured into a CUDA graph"), "{e}");
    let legacy =
        Plan::new("legacy", vec![StreamSpec::new("NULL", StreamKind::Legacy, 0)], n, 2, |p, r| p.h2d(r.streams[0], r.devices[0], 0, r.input, 0, 1024, "up"));
    let e = rig.capture(&legacy, &legacy.dry_run().unwrap()).unwrap_err().to_string();
    assert!(e.contains("legacy NULL stream cannot be captured"), "{e}");
    // The refused captures left nothing capturing.
    rig.replay(&gated, &captured).unwrap();
    rig.run(&gated, TimelineSource::Off).unwrap();
}

/// The exercise's checker live: the given loop fails naming the NULL
/// stream; the fix and a loop with a CPU wait per chunk run verified
/// and are timed (whether each is fast enough is the checker's verdict,
/// printed). At the quick size (the notebook's).
#[test]
fn the_exercise_checker_judges_live_runs() {
    use crate::labs::streams::exercise;
    use std::sync::Arc;
    let Some(gpu) = gpu_or_skip("the_exercise_checker_judges_live_runs") else {
        return;
    };
    let mut rec = crate::labs::streams::fixture::results();
    rec.config = StreamsConfig::quick();
    rec.iterations = 800;
    let given = exercise::check_on_gpu(&gpu, &rec, Arc::new(exercise::given)).unwrap();
    println!("{given}");
    assert!(!given.passed && given.to_string().contains("legacy NULL stream"), "{given}");
    let fixed = exercise::check_on_gpu(&gpu, &rec, Arc::new(exercise::solution)).unwrap();
    judged_only_on_time(&fixed, "measured, medians", &["your loop takes"]);
    let slow = exercise::check_on_gpu(&gpu, &rec, Arc::new(exercise::syncs_every_chunk)).unwrap();
    judged_only_on_time(&slow, "measured, medians", &["your loop takes"]);
}
