//! Lab 2's tests on a GPU. Each says SKIPPED with no GPU (`testing::gpu_or_skip`)
//! and fails instead where `OVERLAP_LAB_REQUIRE_GPU` asks for one; the GPU
//! tests of no one lab are in `crate/tests/gpu.rs`.

use crate::labs::overlap::exercise::{check_on_gpu, downloads_the_input, solution, ChunkTask};
use crate::labs::overlap::measure::Sweep;
use crate::labs::overlap::{measure, Intensity, IssueOrder, OverlapConfig};
use crate::pipeline::op::OpKind;
use crate::present::progress::ProgressMode;
use crate::testing::{gpu_or_skip, judged_only_on_time};

#[test]
fn chunked_pipeline_verifies_and_records_a_timeline() {
    let Some(gpu) = gpu_or_skip("chunked_pipeline_verifies_and_records_a_timeline") else {
        return;
    };
    let mut sweep = Sweep::new(&gpu, 1 << 20).unwrap();
    sweep.rig.iterations = 100;
    for order in [IssueOrder::DepthFirst, IssueOrder::BreadthFirst, IssueOrder::StageStreams] {
        // The rig verifies every output element against the dry run.
        let run = sweep.run(4, 2, order, &OpKind::STAGES, false, crate::gpu::TimelineSource::best()).unwrap();
        assert!(run.races.is_empty(), "{:?}", run.races);
        let t = run.timeline.unwrap();
        println!("timeline source: {}", t.source);
        assert_eq!(t.spans.len(), 12);
        assert!(t.spans.iter().all(|s| s.end_us > s.start_us && s.start_us >= 0.0), "{t:?}");
        if order == IssueOrder::StageStreams {
            assert_eq!(t.lanes(), ["stream 0: uploads", "stream 1: kernels", "stream 2: downloads"]);
        } else {
            assert_eq!(t.lanes(), ["stream 0: s0", "stream 1: s1"]);
        }
        println!("{order:?}: timeline ends at {:.1} µs, events total {:.1} µs", t.end_us(), run.total_ms * 1e3);
    }
    // Each stage alone and the synchronous baseline verify too.
    for stages in [&[OpKind::H2d][..], &[OpKind::Kernel], &[OpKind::D2h]] {
        sweep.run(4, 2, IssueOrder::DepthFirst, stages, false, crate::gpu::TimelineSource::Off).unwrap();
    }
    let sync = sweep.run(1, 1, IssueOrder::DepthFirst, &OpKind::STAGES, true, crate::gpu::TimelineSource::Off).unwrap();
    assert!(sync.races.is_empty() && sync.total_ms > 0.0, "{:?}", sync.races);
    println!("synchronous baseline: the CPU issued for {:.3} ms of {:.3} ms", sync.issue_ms, sync.total_ms);
}

#[test]
fn events_and_cupti_timelines_time_the_same_ops() {
    use crate::gpu::TimelineSource;
    let Some(gpu) = gpu_or_skip("events_and_cupti_timelines_time_the_same_ops") else {
        return;
    };
    if let Err(why) = crate::gpu::driver::activity::probe() {
        crate::testing::skip_unless_required("events_and_cupti_timelines_time_the_same_ops", &format!("CUPTI cannot record here ({why})"));
        return;
    }
    let mut sweep = Sweep::new(&gpu, 1 << 22).unwrap();
    sweep.rig.iterations = 200;
    let mut spans = Vec::new();
    for source in [TimelineSource::Events, TimelineSource::Cupti] {
        let run = sweep.run(8, 2, IssueOrder::DepthFirst, &OpKind::STAGES, false, source).unwrap();
        let t = run.timeline.unwrap();
        assert_eq!(t.source, source.label());
        spans.push(t.spans.iter().map(|s| (s.label.clone(), s.end_us - s.start_us)).collect::<Vec<_>>());
    }
    // The same ops in the same order, each timed by both (how far apart
    // the two clocks put them is printed: events also count queueing at
    // the stream head).
    for ((la, da), (lb, db)) in spans[0].iter().zip(&spans[1]) {
        assert_eq!(la, lb);
        println!("{la}: events {da:.1} µs, cupti {db:.1} µs");
        assert!(*da > 0.0 && *db > 0.0, "{la}: events {da} vs cupti {db}");
    }
}

#[test]
fn small_overlap_sweep_runs_end_to_end() {
    let Some(gpu) = gpu_or_skip("small_overlap_sweep_runs_end_to_end") else {
        return;
    };
    let cfg = OverlapConfig { elements: 2 << 20, chunks: vec![1, 4], streams: vec![1, 2], repeats: 2, warmup: 1, ..OverlapConfig::default() };
    let r = measure::run(&gpu, &cfg, ProgressMode::Quiet).unwrap();
    assert_eq!(r.intensities.len(), 3);
    for ir in &r.intensities {
        assert_eq!(ir.points.len(), cfg.points().len());
        assert!(ir.iterations >= 1);
        assert!(!ir.best_timeline.spans.is_empty() && !ir.best_predicted.spans.is_empty());
        assert!(ir.points.iter().all(|p| p.verified_runs == 3 && p.total_ms.median > 0.0));
    }
    // The calibration's iterations come from timed kernels: printed.
    let cb = r.intensity(Intensity::ComputeBound).unwrap();
    let bal = r.intensity(Intensity::Balanced).unwrap();
    println!("iterations per element: compute-bound {}, balanced {}", cb.iterations, bal.iterations);
    assert!(r.timeline_overhead_pct.is_finite());
}

/// The live checker runs the solution and a one-stream loop verified
/// and times them (whether each overlaps enough is its verdict,
/// printed), and names wrong data.
#[test]
fn the_live_checker_times_right_loops_and_names_wrong_data() {
    let Some(gpu) = gpu_or_skip("the_live_checker_times_right_loops_and_names_wrong_data") else {
        return;
    };
    let timing = ["no overlap", "efficiency"];
    let good = check_on_gpu(&gpu, Intensity::Balanced, 8 << 20, 16, 4, std::sync::Arc::new(solution)).unwrap();
    judged_only_on_time(&good, "measured, fastest of", &timing);
    let one = check_on_gpu(
        &gpu,
        Intensity::Balanced,
        8 << 20,
        16,
        4,
        std::sync::Arc::new(|p: &mut dyn crate::pipeline::issue::Issue, t: &ChunkTask| {
            let only = ChunkTask { streams: vec![t.streams[0]], ..t.clone() };
            solution(p, &only)
        }),
    )
    .unwrap();
    judged_only_on_time(&one, "measured, fastest of", &timing);
    let wrong = check_on_gpu(&gpu, Intensity::Balanced, 8 << 20, 4, 2, std::sync::Arc::new(downloads_the_input)).unwrap();
    println!("{wrong}");
    assert!(!wrong.passed && wrong.to_string().contains("wrong data"), "{wrong}");
}
