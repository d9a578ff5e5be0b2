//! Lab 8's tests on a GPU. Each says SKIPPED with no GPU (`testing::gpu_or_skip`)
//! and fails instead where `OVERLAP_LAB_REQUIRE_GPU` asks for one; the GPU
//! tests of no one lab are in `crate/tests/gpu.rs`.

use crate::gpu::{Gpu, PlanRig, TimelineSource};
use crate::labs::multi_gpu::pipeline_parallel::{bubble, bubble_model, events_only, placement, plan, plan_over};
use crate::pipeline::op::{OpKind, StreamKind};
use crate::pipeline::plan::{Plan, StreamSpec};
use crate::testing::{all_gpus, gpu_or_skip, judged_only_on_time};
use std::sync::Arc;

#[test]
fn a_copy_within_one_gpu_runs_verified_and_cupti_names_it() {
    let Some(gpu) = gpu_or_skip("a_copy_within_one_gpu_runs_verified_and_cupti_names_it") else {
        return;
    };
    // Upload, copy to a second buffer on the GPU, compute from there, download.
    let p = Plan::new("d2d", vec![StreamSpec::new("s", StreamKind::NonBlocking, 0)], 1 << 20, 3, |p, r| {
        let (s, n) = (r.streams[0], r.elements);
        p.h2d(s, r.devices[0], 0, r.input, 0, n, "up")?;
        p.d2d(s, r.devices[1], 0, r.devices[0], 0, n, "copy on the GPU")?;
        p.compute(s, r.devices[1], 0, r.devices[2], 0, n, "kernel")?;
        p.d2h(s, r.output, 0, r.devices[2], 0, n, "down")
    });
    let mut rig = PlanRig::new(&gpu, 1 << 20, 4, 64).unwrap();
    let run = rig.run(&p, TimelineSource::best()).unwrap();
    let t = run.timeline.expect("a timeline");
    println!("timeline source: {}", t.source);
    let copy = t.spans.iter().find(|s| s.label == "copy on the GPU").unwrap();
    assert!(matches!(copy.kind, OpKind::D2d(l) if !l.is_peer()), "{copy:?}");
    assert!(copy.end_us > copy.start_us, "{copy:?}");
    // A plan needing a second GPU on a rig of one is a clear error.
    let two = plan("two", 4, 1 << 16, Arc::new(events_only));
    let e = rig.run(&two, TimelineSource::Off).unwrap_err().to_string();
    assert!(e.contains("this rig holds 1"), "{e}");
}

/// One way, both ways and staged, measured by difference and verified,
/// beside PyTorch's copy between the same GPUs (the pair where there
/// are two; copies within GPU 0 where there is one).
#[test]
fn copies_between_gpus_are_measured_three_ways_beside_pytorch() {
    use crate::labs::multi_gpu::measure::{peer_point, Timing};
    use crate::labs::multi_gpu::reference::torch_peer;
    let Some(_gpu) = gpu_or_skip("copies_between_gpus_are_measured_three_ways_beside_pytorch") else {
        return;
    };
    let gpus = all_gpus();
    let pair = if gpus.len() > 1 { (0, 1) } else { (0, 0) };
    let gpus = &gpus[..gpus.len().min(2)];
    let bytes = 64 << 20;
    let mut rig = PlanRig::over(gpus, bytes / 4, 2, 64).unwrap();
    let t = Timing { copies: 6, runs: 3 };
    let p = peer_point(&mut rig, bytes, pair, 8, t).unwrap();
    println!(
        "GPU {} -> GPU {}: one way {:.1} GB/s, both ways {:.1} GB/s, staged {:.1} GB/s",
        pair.0, pair.1, p.one_way.median, p.both_ways.median, p.staged.median
    );
    assert!(p.one_way.median > 0.0 && p.both_ways.median > 0.0 && p.staged.median > 0.0, "{p:?}");
    match torch_peer("python3", pair, bytes, (t.copies, t.runs)) {
        Ok(torch) => {
            println!("PyTorch {}: one way {:.1} GB/s, both ways {:.1} GB/s", torch.torch, torch.one_way.median, torch.both_ways.median);
            assert!(torch.one_way.median > 0.0 && torch.both_ways.median > 0.0);
        }
        Err(why) => eprintln!("no PyTorch reference here: {why}"),
    }
}

/// Every GPU copying to the next at once, verified, beside each copy
/// alone (three GPUs or more; two make both ways).
#[test]
fn a_ring_copies_every_gpus_buffer_to_the_next_verified() {
    use crate::labs::multi_gpu::measure::{ring_point, Timing};
    let test = "a_ring_copies_every_gpus_buffer_to_the_next_verified";
    let Some(_gpu) = gpu_or_skip(test) else {
        return;
    };
    let gpus = all_gpus();
    if gpus.len() < 3 {
        eprintln!("SKIPPED {test}: a ring needs three GPUs; this machine has {}", gpus.len());
        return;
    }
    let bytes = 64 << 20;
    let mut rig = PlanRig::over(&gpus, bytes / 4, 2 * gpus.len(), 64).unwrap();
    let r = ring_point(&mut rig, bytes, gpus.len(), Timing { copies: 5, runs: 3 }).unwrap();
    let alone: Vec<String> = r.alone.iter().map(|s| format!("{:.1}", s.median)).collect();
    println!("ring of {}: {:.1} GB/s a link; alone {}", gpus.len(), r.per_link.median, alone.join(", "));
    assert!(r.per_link.median > 0.0 && r.alone.iter().all(|s| s.median > 0.0), "{r:?}");
}

/// An upload, a download, a copy to the other GPU (within GPU 0 where
/// there is one) and a kernel, each alone and all at once, verified
/// (how the four at once compare with their sum is printed).
#[test]
fn four_ops_alone_and_at_once_run_verified() {
    use crate::labs::multi_gpu::measure::{four_way, Timing};
    let Some(_gpu) = gpu_or_skip("four_ops_alone_and_at_once_run_verified") else {
        return;
    };
    let gpus = all_gpus();
    let peer = usize::from(gpus.len() > 1);
    let gpus = &gpus[..gpus.len().min(2)];
    let bytes = 64 << 20;
    let mut rig = PlanRig::over(gpus, bytes / 4, 5, 256).unwrap();
    let f = four_way(&mut rig, bytes, peer, Timing { copies: 5, runs: 3 }).unwrap();
    let alone: Vec<String> = f.alone_ms.iter().map(|s| format!("{:.3}", s.median)).collect();
    println!(
        "four-way to GPU {peer}: alone (H2D, D2H, copy, kernel) {} ms; together {:.3} ms; bound {:.3}, serial {:.3}",
        alone.join(", "),
        f.together_ms.median,
        f.bound_ms(),
        f.serial_ms()
    );
    assert!(f.together_ms.median > 0.0 && f.alone_ms.iter().all(|s| s.median > 0.0), "{f:?}");
}

/// The loop runs verified with a stage on every GPU there is (two
/// stages on GPU 0 where there is one: the same code path, not the
/// lab's number) and its bubble is read off each run's timeline.
#[test]
fn the_bubble_is_measured_from_each_runs_timeline() {
    use crate::labs::multi_gpu::measure::bubble_point;
    let Some(_gpu) = gpu_or_skip("the_bubble_is_measured_from_each_runs_timeline") else {
        return;
    };
    let gpus = all_gpus();
    let at = placement(gpus.len());
    let n = 1 << 22;
    let mut rig = PlanRig::over(&gpus, n, 2 * at.len(), 4096).unwrap();
    for mb in [1, 4] {
        let b = bubble_point(&mut rig, n, mb, &at, 2).unwrap();
        println!(
            "stages on GPUs {at:?}, {mb} micro-batches: bubble {:?} (model {:.3}), {:.3} ms",
            b.measured.as_ref().map(|m| m.median),
            b.model,
            b.total_ms.median
        );
        // A share of the run's time: never below 0 or past 1 (how much
        // of it is idle is printed above).
        let m = b.measured.expect("CUPTI timelines here");
        assert!(m.median >= 0.0 && m.median < 1.0, "{m:?}");
    }
}

/// The exercise's live checker: the events-only loop runs and is
/// timed (its bubble, the verdict on time, printed), the
/// host-synchronized one fails naming its waits (both stages on GPU 0
/// where there is one GPU: the checks that do not need two still run).
#[test]
fn the_live_checker_times_events_and_names_host_waits() {
    use crate::labs::multi_gpu::exercise::check_on_gpu;
    use crate::labs::multi_gpu::pipeline_parallel::host_synchronized;
    let Some(_gpu) = gpu_or_skip("the_live_checker_times_events_and_names_host_waits") else {
        return;
    };
    use crate::labs::multi_gpu::{measure::pipeline_rig, MultiGpuConfig};
    let gpus = all_gpus();
    let at = placement(gpus.len());
    // Stages calibrated as the lab's are (a few ms each): stages of a
    // few µs would be judged on the launch and event latencies between
    // the GPUs, which no loop can hide.
    let cfg = MultiGpuConfig { pipeline_mib: 16, stage_ms: 4.0, ..MultiGpuConfig::quick() };
    let n = cfg.pipeline_mib << 18;
    let (mut rig, _) = pipeline_rig(&gpus, &cfg).unwrap();
    let good = check_on_gpu(&mut rig, 8, n, &at, Arc::new(events_only));
    judged_only_on_time(&good, "measured (cupti timeline)", &["bubble:"]);
    let bad = check_on_gpu(&mut rig, 8, n, &at, Arc::new(host_synchronized));
    assert!(!bad.passed && bad.to_string().contains("host synchronization in the loop"), "{bad}");
}

/// NCCL for a rig's plans, or None (skipped) where it is missing and not required.
fn nccl_rig(test: &str, gpus: &[Gpu], elements: usize, devices: usize) -> Option<PlanRig> {
    match PlanRig::over(gpus, elements, devices, 64).unwrap().with_nccl() {
        Ok(rig) => Some(rig),
        Err(e) if crate::testing::gpus_required() > 0 => panic!("NCCL is needed here: {e}"),
        Err(e) => {
            eprintln!("SKIPPED {test}: {e}");
            None
        }
    }
}

/// The gradient all-reduce as a plan: every GPU's gradients summed by
/// NCCL in the vocabulary, serial and overlapped, verified element by
/// element against the sum over the GPUs (over one GPU the sum is the
/// element itself: the code path, not the lab's number).
#[test]
fn an_all_reduce_in_a_plan_sums_every_gpus_gradients_verified() {
    use crate::labs::multi_gpu::all_reduce::{device_bytes_per_gpu, plan as grads, Shape, Sync};
    use crate::labs::multi_gpu::measure::{all_reduce_point, Timing};
    let test = "an_all_reduce_in_a_plan_sums_every_gpus_gradients_verified";
    let Some(_gpu) = gpu_or_skip(test) else {
        return;
    };
    let gpus = all_gpus();
    let gpus = &gpus[..];
    let ranks = gpus.len();
    let per_gpu = 1 << 20;
    let Some(mut rig) = nccl_rig(test, gpus, per_gpu * ranks, 2 * ranks) else {
        return;
    };
    let (_, greatest) = gpus[0].stream_priority_range().unwrap();
    let shape = Shape { per_gpu, bucket: per_gpu / 4, ranks, comm_priority: greatest };
    for sync in Sync::ALL {
        let p = grads(shape, 2, sync);
        let run = rig.run(&p, TimelineSource::best()).unwrap();
        assert!(run.races.is_empty(), "{:?}", run.races);
        let parts = run.schedule.ops.iter().filter(|o| o.kind == OpKind::AllReduce(ranks as u8)).count();
        assert_eq!(parts, 2 * 4 * ranks, "{sync:?}");
        match &run.timeline {
            Some(t) => println!("{sync:?}: {:.3} ms, timeline ({}) lanes {:?}", run.total_ms, t.source, t.lanes()),
            None => println!("{sync:?}: {:.3} ms, no timeline", run.total_ms),
        }
    }
    // Each GPU holds its own rank's batch and gradients, the same bytes
    // whatever the number of GPUs (not every rank's on every GPU).
    assert_eq!(rig.device_bytes(), vec![device_bytes_per_gpu(shape); ranks], "{ranks} GPU(s)");
    println!("{ranks} GPU(s): {} bytes of buffers on each", device_bytes_per_gpu(shape));
    // A rank list that does not match the communicators is a clear error.
    let wrong = Plan::new("wrong ranks", vec![StreamSpec::new("s", StreamKind::NonBlocking, 0)], 64, 2, |p, r| {
        p.all_reduce(&[(r.streams[0], r.devices[0]), (r.streams[0], r.devices[1])], 0, 8, "two ranks on one stream")
    });
    let e = rig.run(&wrong, TimelineSource::Off).unwrap_err().to_string();
    assert!(e.contains("two ranks on GPU 0"), "{e}");
    // One bucket size measured as the lab does.
    rig.iterations = 256;
    let pt = all_reduce_point(&mut rig, shape, gpus[0].copy_engines().unwrap(), Timing { copies: 3, runs: 3 }).unwrap();
    println!(
        "{ranks} rank(s), buckets of {} B: one sum {:.4} ms, kernel {:.4} ms, serial step {:.3} ms, overlapped {:.3} ms, model {:.3} ms",
        pt.bucket_bytes, pt.all_reduce_ms.median, pt.kernel_ms.median, pt.serial_ms.median, pt.overlapped_ms.median, pt.predicted_ms
    );
    assert!(pt.serial_ms.median > 0.0 && pt.overlapped_ms.median > 0.0 && pt.predicted_ms > 0.0, "{pt:?}");
    // A plan that all-reduces on a rig made without NCCL says what to do.
    let mut plain = PlanRig::over(gpus, per_gpu * ranks, 2 * ranks, 64).unwrap();
    let e = plain.run(&grads(shape, 1, Sync::Serial), TimelineSource::Off).unwrap_err().to_string();
    assert!(e.contains("PlanRig::with_nccl"), "{e}");
}

/// The notebook's live check of the exercise: events are timed (the
/// verdict printed), host waits fail by name, on this machine's GPUs
/// (both stages on GPU 0 with one).
#[test]
fn the_notebooks_live_check_calibrates_the_stages_and_judges_the_loop() {
    use crate::labs::multi_gpu::exercise::check_live;
    use crate::labs::multi_gpu::pipeline_parallel::host_synchronized;
    use crate::labs::multi_gpu::MultiGpuConfig;
    let Some(gpu) = gpu_or_skip("the_notebooks_live_check_calibrates_the_stages_and_judges_the_loop") else {
        return;
    };
    let cfg = MultiGpuConfig { pipeline_mib: 8, stage_ms: 4.0, ..MultiGpuConfig::quick() };
    let good = check_live(&gpu, &cfg, Arc::new(events_only)).unwrap();
    judged_only_on_time(&good, "measured (", &["bubble:"]);
    let bad = check_live(&gpu, &cfg, Arc::new(host_synchronized)).unwrap();
    assert!(!bad.passed && bad.to_string().contains("host synchronization in the loop"), "{bad}");
}

/// A stage on each GPU (two at least), events only: verified, a lane
/// for every GPU, a copy per micro-batch and hop, the bubble printed
/// beside (S-1)/(M+S-1).
#[test]
fn a_stage_on_every_gpu_runs_verified_with_the_bubble_printed_beside_the_model() {
    let test = "a_stage_on_every_gpu_runs_verified_with_the_bubble_printed_beside_the_model";
    let Some(_gpu) = gpu_or_skip(test) else {
        return;
    };
    let gpus = all_gpus();
    if gpus.len() < 2 {
        eprintln!("SKIPPED {test}: this machine has one GPU");
        return;
    }
    let at = placement(gpus.len());
    let (mb, n) = (8, 1 << 22);
    let mut rig = PlanRig::over(&gpus, n, 2 * at.len(), 4096).unwrap();
    let p = plan_over("events only", mb, n, Arc::new(events_only), &at);
    let run = rig.run(&p, TimelineSource::best()).unwrap();
    assert!(run.races.is_empty(), "{:?}", run.races);
    let t = run.timeline.expect("a timeline (CUPTI)");
    let lanes = t.lanes();
    println!("{lanes:?}\n{}", t.source);
    for g in 0..at.len() {
        assert!(lanes.iter().any(|l| l.starts_with(&format!("GPU {g} ·"))), "GPU {g}: {lanes:?}");
    }
    assert_eq!(t.spans.iter().filter(|s| matches!(s.kind, OpKind::D2d(l) if l.is_peer())).count(), mb * (at.len() - 1));
    let spans: Vec<(f64, f64)> = t.spans.iter().map(|s| (s.start_us, s.end_us)).collect();
    assert_eq!(spans.len(), run.schedule.ops.len(), "a span per op, in order");
    let b = bubble(&run.schedule, &spans).unwrap();
    println!("{} stages: bubble {:.3} vs model {:.3}: {:?}", at.len(), b.fraction(), bubble_model(at.len(), mb), b.per_gpu);
    assert!((0.0..1.0).contains(&b.fraction()), "a share of the run's time: {b:?}");
    // The pair's plan on a rig over every GPU runs too.
    let two = rig.run(&plan("pair", mb, n, Arc::new(events_only)), TimelineSource::Off).unwrap();
    assert!(two.races.is_empty());
}
