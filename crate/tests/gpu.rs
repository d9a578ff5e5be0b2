//! Tests that need a GPU and are about no one lab: the runner (deferred,
//! gated, threads at once, races, the legacy stream, memory calls), host
//! memory kinds, the fingerprint, the skipping rules
//! (`OVERLAP_LAB_REQUIRE_GPU`), the topology, NCCL and cuBLAS. With no
//! driver each one says it skipped and passes; on the GPU they run for real
//! (see README: "Testing"). A lab's own GPU tests live in its folder
//! (`crate/src/labs/<lab>/gpu_tests.rs`, run with the crate's unit tests).

use overlap_lab::gpu::{alloc_host, Availability, Gpu, HostBuffer, HostMemoryKind, PinnedBuffer, TimelineSource};
use overlap_lab::measure::pattern;
use overlap_lab::testing::gpu_or_skip;
use overlap_lab::LabError;

const MIB: usize = 1 << 20;

#[test]
fn no_driver_or_bad_ordinal_is_an_error_not_a_panic() {
    match Availability::probe() {
        Availability::NoDriver => {
            assert!(matches!(Gpu::open(0), Err(LabError::NoDriver)));
            assert_eq!(Gpu::open(0).unwrap_err().to_string(), LabError::NoDriver.to_string());
        }
        _ => {
            let e = Gpu::open(999).unwrap_err();
            assert!(matches!(e, LabError::NoDevice { ordinal: 999, .. }), "{e}");
        }
    }
}

/// OVERLAP_LAB_REQUIRE_GPU=1 (set on the GPU machine) turns a skip into a
/// failure, so a run meant for the GPU cannot pass by skipping everything.
#[test]
fn require_gpu_turns_a_skip_into_a_failure() {
    if Availability::probe().is_ready() {
        eprintln!("SKIPPED require_gpu_turns_a_skip_into_a_failure: a GPU is present, so nothing skips");
        return;
    }
    let run = |require: &str| {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "fingerprint_is_complete", "--nocapture", "--test-threads=1"])
            .env(overlap_lab::testing::REQUIRE_GPU_ENV, require)
            .output()
            .unwrap();
        (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    };
    let (ok, text) = run("1");
    assert!(!ok && text.contains("OVERLAP_LAB_REQUIRE_GPU is set but"), "{text}");
    let (ok, text) = run("0");
    assert!(ok && text.contains("SKIPPED fingerprint_is_complete"), "{text}");
}

#[test]
fn fingerprint_is_complete() {
    let Some(gpu) = gpu_or_skip("fingerprint_is_complete") else {
        return;
    };
    let fp = gpu.fingerprint().unwrap();
    println!("{}", fp.describe());
    assert!(!fp.gpu_name.is_empty());
    assert!(fp.sm_count > 0 && fp.memory_bytes > 0 && fp.async_engine_count >= 1);
    assert!(fp.compute_capability.contains('.'));
    assert!(fp.driver_cuda_version.starts_with("1"));
    assert!(!fp.slug().is_empty());
}

#[test]
fn every_host_kind_round_trips_verified() {
    let Some(gpu) = gpu_or_skip("every_host_kind_round_trips_verified") else {
        return;
    };
    let s = gpu.stream().unwrap();
    let dev = gpu.alloc(4 * MIB).unwrap();
    let mut check = PinnedBuffer::new(&gpu, 4 * MIB).unwrap();
    for kind in HostMemoryKind::ALL {
        let mut h = alloc_host(&gpu, kind, 4 * MIB).unwrap();
        assert_eq!((h.kind(), h.bytes()), (kind, 4 * MIB));
        let seed = pattern::fresh_seed();
        pattern::fill(h.words_mut(), seed);
        s.fill_u32(&dev, 0xDEAD_BEEF).unwrap();
        s.upload(&dev, h.as_ref(), 4 * MIB).unwrap();
        pattern::poison(check.words_mut());
        s.download(&mut check, &dev, 4 * MIB).unwrap();
        pattern::verify(check.words(), seed, &format!("{kind} round trip")).unwrap();
    }
}

/// A copy from pageable memory and one from pinned memory, each run
/// through a deferring runner: both complete; only the pinned one may wait
/// behind the start gate. How long each blocked the CPU is printed (lab 1
/// measures it), not asserted.
#[test]
fn pageable_and_pinned_copies_run_and_pageable_ones_are_never_gated() {
    let Some(gpu) = gpu_or_skip("pageable_and_pinned_copies_run_and_pageable_ones_are_never_gated") else {
        return;
    };
    let n = 64 * MIB;
    let (dev, stream) = (gpu.alloc(n).unwrap(), gpu.stream().unwrap());
    for kind in [HostMemoryKind::Pageable, HostMemoryKind::Pinned] {
        let mut h = alloc_host(&gpu, kind, n).unwrap();
        pattern::fill(h.words_mut(), 1);
        let mut last = None;
        for _ in 0..3 {
            let mut p = gpu.runner(TimelineSource::Off, 0, kind.is_page_locked()).unwrap().deferring().unwrap();
            let (s, src, dst) = (p.stream(&stream, "up"), p.host(h.as_mut(), "host"), p.device(&dev, "device"));
            p.h2d(s, dst, 0, src, 0, n, "H2D").unwrap();
            last = Some(p.finish().unwrap());
        }
        let r = last.unwrap();
        println!(
            "{kind}: device {:.3} ms, CPU blocked {:.3} ms ({:.0}% of the device time), gated {}",
            r.total_ms,
            r.issue_ms,
            100.0 * r.issue_ms / r.total_ms,
            r.gated
        );
        assert!(r.total_ms > 0.0 && r.races.is_empty(), "{r:?}");
        if kind == HostMemoryKind::Pageable {
            assert!(!r.gated, "a pageable copy cannot wait behind a closed gate: {r:?}");
        }
    }
}

#[test]
fn threads_at_once_each_issue_their_own_calls_and_refuse_what_orders_them() {
    let Some(gpu) = gpu_or_skip("threads_at_once_each_issue_their_own_calls_and_refuse_what_orders_them") else {
        return;
    };
    let n = 64 * MIB;
    let (up_dev, down_dev) = (gpu.alloc(n).unwrap(), gpu.alloc(n).unwrap());
    let (up, down) = (gpu.stream().unwrap(), gpu.stream().unwrap());
    let mut src = alloc_host(&gpu, HostMemoryKind::Pageable, n).unwrap();
    let mut dst = alloc_host(&gpu, HostMemoryKind::Pageable, n).unwrap();
    let seed = pattern::fresh_seed();
    pattern::fill(src.words_mut(), seed);
    up.upload(&down_dev, src.as_ref(), n).unwrap();
    pattern::poison(dst.words_mut());
    // Two pageable copies, each blocking its own thread, made at once: each
    // thread's calls are timed on their own (whether the loop took less than
    // the two added is printed, not asserted: tests assert no timing).
    let mut best: Option<overlap_lab::gpu::Run> = None;
    for _ in 0..3 {
        let mut p = gpu.runner(TimelineSource::Off, 0, false).unwrap().deferring().unwrap().threads_at_once().unwrap();
        let (su, sd) = (p.stream(&up, "up"), p.stream(&down, "down"));
        let (hs, hd) = (p.host(src.as_mut(), "source"), p.host(dst.as_mut(), "destination"));
        let (du, dd) = (p.device(&up_dev, "up destination"), p.device(&down_dev, "down source"));
        p.h2d(su, du, 0, hs, 0, n, "H2D").unwrap();
        p.issue_from(1).unwrap();
        p.d2h(sd, hd, 0, dd, 0, n, "D2H").unwrap();
        let r = p.finish().unwrap();
        assert!(r.races.is_empty(), "{:?}", r.races);
        best = Some(r);
    }
    let r = best.unwrap();
    let added: f64 = r.issue_ms_by_thread.iter().sum();
    println!("at once: loop {:.3} ms, threads {:?} ms ({:.2} of their sum), device {:.3} ms", r.issue_ms, r.issue_ms_by_thread, r.issue_ms / added, r.total_ms);
    assert_eq!(r.issue_ms_by_thread.len(), 2);
    assert!(r.issue_ms_by_thread.iter().all(|&t| t > 0.0), "each thread made its own call: {r:?}");
    pattern::verify(dst.words(), seed, "D2H made at once").unwrap();
    // A stream shared by two threads, or an event between them, is refused.
    let mut p = gpu.runner(TimelineSource::Off, 0, false).unwrap().deferring().unwrap().threads_at_once().unwrap();
    let su = p.stream(&up, "up");
    let (hs, du) = (p.host(src.as_mut(), "source"), p.device(&up_dev, "up destination"));
    p.h2d(su, du, 0, hs, 0, MIB, "H2D").unwrap();
    p.issue_from(1).unwrap();
    let e = p.h2d(su, du, 0, hs, 0, MIB, "H2D again").unwrap_err().to_string();
    assert!(e.contains("CPU threads 0 and 1 both issue to it"), "{e}");
    let ev = p.event().unwrap();
    let e = p.record(ev, su).unwrap_err().to_string();
    assert!(e.contains("at once"), "{e}");
    // Only a deferring runner makes its threads' calls at once.
    let e = gpu.runner(TimelineSource::Off, 0, false).unwrap().threads_at_once().err().unwrap().to_string();
    assert!(e.contains("deferring"), "{e}");
}

mod pipelines {
    use overlap_lab::gpu::{ComputeKernel, HostBuffer, PinnedBuffer};
    use overlap_lab::measure::pattern;
    use overlap_lab::pipeline::op::OpKind;
    use overlap_lab::testing::gpu_or_skip;

    #[test]
    fn a_missing_event_wait_is_reported_as_a_race() {
        let Some(gpu) = gpu_or_skip("a_missing_event_wait_is_reported_as_a_race") else {
            return;
        };
        let kernel = ComputeKernel::load(&gpu).unwrap();
        let (s0, s1) = (gpu.stream().unwrap(), gpu.stream().unwrap());
        let (din, dout) = (gpu.alloc(1 << 20).unwrap(), gpu.alloc(1 << 20).unwrap());
        let mut host = PinnedBuffer::new(&gpu, 1 << 20).unwrap();
        pattern::fill_f32(host.words_mut(), 1);
        for (with_event, deferred) in [(false, false), (true, false), (false, true), (true, true)] {
            let p = gpu.runner(overlap_lab::gpu::TimelineSource::Off, 4, true).unwrap();
            let mut p = if deferred { p.deferring().unwrap() } else { p };
            let (a, b) = (p.stream(&s0, "copy"), p.stream(&s1, "compute"));
            let h = p.host(&mut host, "host");
            let (i, o) = (p.device(&din, "in"), p.device(&dout, "out"));
            p.h2d(a, i, 0, h, 0, 1 << 20, "upload").unwrap();
            if with_event {
                let e = p.event().unwrap();
                p.record(e, a).unwrap();
                p.wait(b, e).unwrap();
            }
            p.compute(b, &kernel, i, 0, o, 0, 1 << 20, 10, "compute").unwrap();
            let run = p.finish().unwrap();
            assert_eq!(run.races.is_empty(), with_event, "deferred {deferred}: {:?}", run.races);
            assert_eq!(run.schedule.ops.iter().filter(|o| o.kind == OpKind::Kernel).count(), 1);
        }
    }

    /// What lab 5 will show, as a check of the vocabulary: a tiny copy on
    /// the legacy NULL stream waits for a long kernel on a blocking stream
    /// (it starts after the kernel ends), not for one on a non-blocking
    /// stream; the schedule says the same. (Whether the copy then ran
    /// beside the kernel is printed: the GPU may run it later.)
    #[test]
    fn the_legacy_stream_waits_for_blocking_streams_only() {
        let Some(gpu) = gpu_or_skip("the_legacy_stream_waits_for_blocking_streams_only") else {
            return;
        };
        use overlap_lab::gpu::StreamKind;
        let (least, greatest) = gpu.stream_priority_range().unwrap();
        assert!(greatest < least, "this GPU has stream priorities: {greatest}..{least}");
        assert!(gpu.stream_of(StreamKind::NonBlocking, greatest).is_ok());
        let e = gpu.stream_of(StreamKind::Blocking, greatest - 1).err().unwrap().to_string();
        assert!(e.contains("outside this GPU's range"), "{e}");
        let e = gpu.stream_of(StreamKind::Legacy, greatest).err().unwrap().to_string();
        assert!(e.contains("default priority"), "{e}");
        let kernel = ComputeKernel::load(&gpu).unwrap();
        let n = 4 << 20;
        let (din, dout) = (gpu.alloc(4 * n).unwrap(), gpu.alloc(4 * n).unwrap());
        let mut host = PinnedBuffer::new(&gpu, 1 << 16).unwrap();
        let legacy = gpu.stream_of(StreamKind::Legacy, 0).unwrap();
        let scratch = gpu.alloc(1 << 16).unwrap();
        for kind in [StreamKind::Blocking, StreamKind::NonBlocking] {
            let s = gpu.stream_of(kind, 0).unwrap();
            // Events time it: CUPTI names no legacy stream.
            let mut p = gpu.runner(overlap_lab::gpu::TimelineSource::Events, 4, true).unwrap().deferring().unwrap();
            let (a, l) = (p.stream(&s, "work"), p.stream(&legacy, "NULL stream"));
            let h = p.host(&mut host, "host");
            let (i, o, x) = (p.device(&din, "in"), p.device(&dout, "out"), p.device(&scratch, "scratch"));
            p.compute(a, &kernel, i, 0, o, 0, 4 * n, 20000, "long kernel").unwrap();
            p.h2d(l, x, 0, h, 0, 1 << 14, "tiny copy").unwrap();
            let run = p.finish().unwrap();
            let ordered = run.schedule.happens_before(0, 1);
            let tl = run.timeline.unwrap();
            let span = |label: &str| tl.spans.iter().find(|sp| sp.label == label).cloned().unwrap();
            let (k, c) = (span("long kernel"), span("tiny copy"));
            eprintln!("{kind:?}: kernel {:.1}..{:.1} µs, tiny copy {:.1}..{:.1} µs ({})", k.start_us, k.end_us, c.start_us, c.end_us, tl.source);
            assert!(k.end_us > k.start_us && c.end_us > c.start_us, "{k:?} {c:?}");
            match kind {
                StreamKind::Blocking => {
                    assert!(ordered, "the schedule orders the NULL stream after a blocking stream");
                    // Stream order, not speed: the copy cannot start before the kernel ends (a few µs for the timestamps).
                    assert!(c.start_us >= k.end_us - 5.0, "the copy waited for the kernel: {c:?} {k:?}");
                }
                _ => {
                    assert!(!ordered, "a non-blocking stream is not ordered against the NULL stream");
                    println!("non-blocking: the tiny copy ended {} the kernel", if c.end_us < k.end_us { "before" } else { "after" });
                }
            }
        }
    }

    /// Two batches, one per stream, each through scratch memory its stream
    /// allocates and frees; pinned output; a pinned-in-place input; a
    /// blocking alloc and free. Written once, run on the GPU and the model.
    fn memory_loop(
        p: &mut dyn overlap_lab::pipeline::issue::Issue,
        streams: [overlap_lab::pipeline::issue::StreamRef; 2],
        host_in: overlap_lab::pipeline::issue::HostRef,
        dev_out: overlap_lab::pipeline::issue::DevRef,
        n: usize,
    ) -> overlap_lab::Result<overlap_lab::pipeline::issue::HostRef> {
        p.pin(host_in)?;
        let out = p.alloc_pinned(2 * n, "host out")?;
        for (batch, s) in streams.into_iter().enumerate() {
            let x = p.alloc_async(s, n, &format!("scratch {batch}"))?;
            p.h2d(s, x, 0, host_in, batch * n, n, &format!("up {batch}"))?;
            p.compute(s, x, 0, dev_out, batch * n, n, &format!("kernel {batch}"))?;
            p.free_async(s, x)?;
            p.d2h(s, out, batch * n, dev_out, batch * n, n, &format!("down {batch}"))?;
        }
        let y = p.alloc(n, "blocking scratch")?;
        p.sync_device()?;
        p.free(y)?;
        p.unpin(host_in)?;
        Ok(out)
    }

    /// The memory calls of the vocabulary on real streams: the data comes
    /// through, the executor records the same schedule the model does, each
    /// call is timed on the host clock, a release that races is refused
    /// before it is made, and what the loop leaks is released and named.
    #[test]
    fn memory_calls_run_verified_and_record_what_the_model_records() {
        use overlap_lab::gpu::{GpuIssuer, PageableBuffer, TimelineSource};
        use overlap_lab::pipeline::dry_run::DryRun;
        let Some(gpu) = gpu_or_skip("memory_calls_run_verified_and_record_what_the_model_records") else {
            return;
        };
        let kernel = ComputeKernel::load(&gpu).unwrap();
        let n = 1 << 20;
        let (s0, s1) = (gpu.stream().unwrap(), gpu.stream().unwrap());
        let dout = gpu.alloc(8 * n).unwrap();
        let mut host = PageableBuffer::new(8 * n).unwrap();
        let seed = pattern::fresh_seed();
        pattern::fill_f32(host.words_mut(), seed);
        let mut got = vec![0u64; n];
        let mut p = gpu.runner(TimelineSource::Events, 16, true).unwrap();
        let streams = [p.stream(&s0, "batch 0"), p.stream(&s1, "batch 1")];
        let (h, o) = (p.host(&mut host, "host in"), p.device(&dout, "device out"));
        let out = {
            let mut g = GpuIssuer { runner: &mut p, kernel: &kernel, iterations: 10, dataset: None };
            memory_loop(&mut g, streams, h, o, n).unwrap()
        };
        p.host_read("read host out", out, 0, 8 * n, |w| got.copy_from_slice(w)).unwrap();
        let run = p.finish().unwrap();
        assert!(run.races.is_empty(), "{:?}", run.races);
        assert_eq!(run.unreleased, ["host out"], "the loop never freed its pinned output: the pipeline did, and says so");
        let out_f32 = pattern::as_f32(&got);
        for i in (0..2 * n).step_by(997).chain([2 * n - 1]) {
            let want = overlap_lab::gpu::kernels::compute_reference(pattern::f32_at(seed, i), 10);
            assert_eq!(out_f32[i].to_bits(), want.to_bits(), "element {i}: got {}, want {want}", out_f32[i]);
        }
        // The model, given the same loop, records the same operations and order.
        let mut m = DryRun::new();
        let ms = [m.stream(), m.stream()];
        let (mh, mo) = (m.host("host in", 2 * n, true), m.device("device out", 2 * n));
        memory_loop(&mut m, ms, mh, mo, n).unwrap();
        let gpu_ops = &run.schedule.ops[..m.schedule.ops.len()];
        for (g, w) in gpu_ops.iter().zip(&m.schedule.ops) {
            assert_eq!((&g.label, g.kind, g.lane, &g.deps), (&w.label, w.kind, w.lane, &w.deps), "the GPU's schedule and the model's differ");
        }
        // A deferring runner records the same loop before any of it runs,
        // then runs it: the same schedule, the same leftover released.
        let mut p = gpu.runner(TimelineSource::Events, 16, true).unwrap().deferring().unwrap();
        let streams = [p.stream(&s0, "batch 0"), p.stream(&s1, "batch 1")];
        let (h, o) = (p.host(&mut host, "host in"), p.device(&dout, "device out"));
        {
            let mut g = GpuIssuer { runner: &mut p, kernel: &kernel, iterations: 10, dataset: None };
            memory_loop(&mut g, streams, h, o, n).unwrap();
        }
        let e = p.host_read("read host out", out, 0, 8, |_| ()).unwrap_err().to_string();
        assert!(e.contains("use a runner that does not defer"), "{e}");
        let deferred = p.finish().unwrap();
        assert_eq!(deferred.unreleased, ["host out"]);
        for (d, w) in deferred.schedule.ops.iter().zip(&run.schedule.ops) {
            assert_eq!((&d.label, d.kind, d.lane, &d.deps), (&w.label, w.kind, w.lane, &w.deps), "the deferred schedule and the immediate one differ");
        }
        assert!(deferred.timeline.as_ref().is_some_and(|t| t.spans.iter().any(|s| s.label.starts_with("cuMemAllocAsync") && s.end_us > s.start_us)));
        let tl = run.timeline.unwrap();
        for call in ["cuMemHostRegister", "cuMemHostAlloc", "cuMemAllocAsync", "cuMemFreeAsync", "cuMemAlloc ", "cuMemFree ", "cuMemHostUnregister"] {
            let spans: Vec<_> = tl.spans.iter().filter(|s| s.label.starts_with(call)).collect();
            assert!(!spans.is_empty(), "{call} is on the timeline");
            for s in spans {
                assert!(s.end_us >= s.start_us && s.start_us >= 0.0, "{s:?}");
                eprintln!("{:<34} {:>9.1} µs on the CPU ({})", s.label, s.end_us - s.start_us, s.lane);
            }
        }

        // A release on the other stream with nothing ordering it is refused
        // before it is made; ordered by an event, it is made.
        for (ordered, deferred) in [(false, false), (true, false), (false, true), (true, true)] {
            let p = gpu.runner(TimelineSource::Off, 4, true).unwrap();
            let mut p = if deferred { p.deferring().unwrap() } else { p };
            let (a, b) = (p.stream(&s0, "a"), p.stream(&s1, "b"));
            let o = p.device(&dout, "device out");
            let x = p.alloc_async(a, 4 * n, "scratch").unwrap();
            p.compute(a, &kernel, x, 0, o, 0, 4 * n, 1000, "long kernel").unwrap();
            if ordered {
                let e = p.event().unwrap();
                p.record(e, a).unwrap();
                p.wait(b, e).unwrap();
                p.free_async(b, x).unwrap();
            } else {
                let e = p.free_async(b, x).unwrap_err().to_string();
                assert!(e.contains("refused to release memory the GPU may still use: 'cuMemFreeAsync scratch' releases bytes"), "{e}");
            }
            let run = p.finish().unwrap();
            assert_eq!(run.unreleased.is_empty(), ordered, "{:?}", run.unreleased);
            assert_eq!(run.races.iter().any(|r| r.what.contains("'long kernel' may still read")), !ordered, "{:?}", run.races);
        }
        // Absurd and impossible sizes are errors, not crashes.
        let mut p = gpu.runner(TimelineSource::Off, 4, true).unwrap();
        let a = p.stream(&s0, "a");
        assert!(p.alloc_async(a, 0, "nothing").unwrap_err().to_string().contains("allocating 0 bytes"));
        let e = p.alloc_async(a, 1 << 47, "too much").unwrap_err();
        assert!(matches!(e, overlap_lab::LabError::OutOfMemory { .. }), "{e}");
        p.finish().unwrap();
    }
}

mod several_gpus {
    use overlap_lab::gpu::nccl::{Communicators, Nccl};
    use overlap_lab::gpu::topology::Topology;
    use overlap_lab::gpu::{HostBuffer, PinnedBuffer};
    use overlap_lab::testing::{all_gpus, gpu_or_skip};

    #[test]
    fn topology_lists_every_gpu_and_every_path() {
        let Some(_gpu) = gpu_or_skip("topology_lists_every_gpu_and_every_path") else {
            return;
        };
        let t = Topology::discover().unwrap();
        println!("{}", t.describe());
        let n = t.gpus.len();
        assert!(n >= 1 && t.paths.len() == n * (n - 1), "{t:?}");
        assert!(t.gpus.iter().all(|g| !g.name.is_empty() && g.pci_bus_id.contains(':')), "{t:?}");
        if n == 1 {
            assert!(t.describe().contains("one GPU: no peer"));
        }
    }

    #[test]
    fn nccl_sums_every_gpus_buffer() {
        let Some(_gpu) = gpu_or_skip("nccl_sums_every_gpus_buffer") else {
            return;
        };
        let nccl = match Nccl::load() {
            Ok(n) => n,
            Err(e) if overlap_lab::testing::gpus_required() > 0 => panic!("NCCL is needed here: {e}"),
            Err(e) => {
                eprintln!("SKIPPED nccl_sums_every_gpus_buffer: {e}");
                return;
            }
        };
        println!("NCCL {} from {}", nccl.version().unwrap(), nccl.path);
        let gpus = all_gpus();
        let comms = Communicators::new(nccl, &gpus).unwrap();
        let n = 1 << 20;
        let bufs: Vec<_> = gpus.iter().map(|g| g.alloc(n * 4).unwrap()).collect();
        let streams: Vec<_> = gpus.iter().map(|g| g.stream().unwrap()).collect();
        for (i, (b, s)) in bufs.iter().zip(&streams).enumerate() {
            s.fill_u32(b, (i as f32 + 1.0).to_bits()).unwrap();
        }
        comms.all_reduce_sum(&bufs.iter().collect::<Vec<_>>(), n, &streams.iter().collect::<Vec<_>>()).unwrap();
        let want = (1..=gpus.len()).sum::<usize>() as f32;
        for (b, s) in bufs.iter().zip(&streams) {
            s.synchronize().unwrap();
            let mut back = PinnedBuffer::new(b.gpu(), n * 4).unwrap();
            s.download(&mut back, b, n * 4).unwrap();
            let words = back.words();
            for (k, w) in words.iter().enumerate() {
                for half in [*w as u32, (*w >> 32) as u32] {
                    assert_eq!(f32::from_bits(half), want, "word {k}");
                }
            }
        }
        // Mistakes are clear errors.
        let e = comms.all_reduce_sum(&bufs.iter().collect::<Vec<_>>(), n + 1, &streams.iter().collect::<Vec<_>>()).unwrap_err().to_string();
        assert!(e.contains("does not fit"), "{e}");
        let e = Communicators::new(Nccl::load().unwrap(), &[gpus[0].clone(), gpus[0].clone()]).err().unwrap().to_string();
        assert!(e.contains("distinct GPUs"), "{e}");
    }
}

/// cuBLASLt's product with the ReLU in its epilogue writes max(0, x · w):
/// with entries -1, 0 or 1 every sum is an integer FP32 holds exactly, so
/// each output is the CPU's sum rounded once to FP16 and clamped at zero,
/// bit for bit; about half the outputs are negative sums, so the ReLU is
/// seen to act. A shape of the lab's layers' kind (multiples of 16) and
/// a small one (multiples of 8).
#[test]
fn a_gemm_with_the_relu_in_its_epilogue_writes_the_cpus_clamped_product() {
    use overlap_lab::gpu::{Blas, MatrixF16};
    let Some(gpu) = gpu_or_skip("a_gemm_with_the_relu_in_its_epilogue_writes_the_cpus_clamped_product") else {
        return;
    };
    let blas = Blas::new(&gpu).unwrap();
    assert!(blas.has_fused_relu(), "libcublasLt is not loaded beside libcublas");
    let s = gpu.stream().unwrap();
    for (n, k, m) in [(256usize, 1024usize, 512usize), (96, 200, 40)] {
        let seed = pattern::fresh_seed();
        let int = |i: usize| (pattern::word(seed, i as u64) % 3) as f32 - 1.0;
        let x: Vec<f32> = (0..n * k).map(int).collect();
        let w: Vec<f32> = (0..k * m).map(|i| int(n * k + i)).collect();
        let sums: Vec<f32> = (0..n * m).map(|i| (0..k).map(|j| x[i / m * k + j] * w[j * m + i % m]).sum()).collect();
        let want: Vec<f32> = sums.iter().map(|&v| half::f16::from_f32(v.max(0.0)).to_f32()).collect();
        let negative = sums.iter().filter(|&&v| v < 0.0).count();
        assert!(negative > n * m / 4, "{negative} negative sums of {}", n * m);
        let halves = |v: &[f32], words: &mut [u64]| {
            for (i, &f) in v.iter().enumerate() {
                words[i / 4] |= (half::f16::from_f32(f).to_bits() as u64) << (16 * (i % 4));
            }
        };
        let (xb, wb, ob) = (n * k * 2, k * m * 2, n * m * 2);
        let words = |b: usize| b.div_ceil(8) * 8;
        let (mut hx, mut hw, mut ho) =
            (PinnedBuffer::new(&gpu, words(xb)).unwrap(), PinnedBuffer::new(&gpu, words(wb)).unwrap(), PinnedBuffer::new(&gpu, words(ob)).unwrap());
        hx.words_mut().fill(0);
        hw.words_mut().fill(0);
        halves(&x, hx.words_mut());
        halves(&w, hw.words_mut());
        let (dx, dw, dout) = (gpu.alloc(words(xb)).unwrap(), gpu.alloc(words(wb)).unwrap(), gpu.alloc(words(ob)).unwrap());
        s.upload(&dx, &hx, words(xb)).unwrap();
        s.upload(&dw, &hw, words(wb)).unwrap();
        // Poisoned: a NaN in every output before the product.
        s.fill_u32(&dout, 0x7E00_7E00).unwrap();
        let xm = MatrixF16 { span: dx.span(), at: 0, rows: n, cols: k };
        let wm = MatrixF16 { span: dw.span(), at: 0, rows: k, cols: m };
        let om = MatrixF16 { span: dout.span(), at: 0, rows: n, cols: m };
        // SAFETY: the buffers outlive the product, waited for by the download.
        unsafe { blas.matmul_f16_relu(&s, om, xm, wm) }.unwrap();
        s.download(&mut ho, &dout, words(ob)).unwrap();
        for (i, &want) in want.iter().enumerate() {
            let got = half::f16::from_bits((ho.words()[i / 4] >> (16 * (i % 4))) as u16).to_f32();
            assert_eq!(got, want, "{n} x {k} by {k} x {m}: element ({}, {}) of max(0, x · w)", i / m, i % m);
        }
        println!("{n} x {k} by {k} x {m}: every output is the CPU's max(0, x · w), {negative} of them clamped");
    }
    // Shapes that disagree are refused before anything runs.
    let d = gpu.alloc(4096).unwrap();
    let a = MatrixF16 { span: d.span(), at: 0, rows: 8, cols: 8 };
    let b = MatrixF16 { span: d.span(), at: 0, rows: 4, cols: 8 };
    // SAFETY: refused before the GPU is asked anything.
    let e = unsafe { blas.matmul_f16_relu(&s, a, a, b) }.unwrap_err().to_string();
    assert!(e.contains("the shapes disagree"), "{e}");
}

/// cuBLASLt's FP8 product rounds as the CPU does: inputs -1, 0 or 1 (exact
/// in E4M3) with scales that are powers of two, so every sum is exact in
/// FP32 and each output is the CPU's scaled sum rounded once to E4M3 (the
/// `float8` crate, round to nearest even), bit for bit; the ReLU clamps
/// and the amax is the largest magnitude before the output's scale. A
/// shape of the lab's layers' kind and a small one.
#[test]
fn an_fp8_gemm_scales_rounds_and_finds_its_amax_as_the_cpu_does() {
    use overlap_lab::gpu::{Blas, Fp8Scales, MatrixE4M3, ScalarF32};
    let Some(gpu) = gpu_or_skip("an_fp8_gemm_scales_rounds_and_finds_its_amax_as_the_cpu_does") else {
        return;
    };
    let blas = Blas::new(&gpu).unwrap();
    if !blas.has_fp8() {
        println!("skipped: {} has no FP8 tensor cores", gpu.name());
        assert!(gpu.compute_capability().unwrap() < (8, 9), "FP8 refused on a GPU that has it");
        return;
    }
    let s = gpu.stream().unwrap();
    let e4m3 = |v: f32| float8::F8E4M3::from_f32(v).to_bits();
    for (n, k, m, relu) in [(256usize, 1024usize, 512usize, true), (64, 32, 48, false)] {
        let seed = pattern::fresh_seed();
        let int = |i: usize| (pattern::word(seed, i as u64) % 3) as f32 - 1.0;
        let x: Vec<f32> = (0..n * k).map(int).collect();
        // w is m x k: one row per output.
        let w: Vec<f32> = (0..m * k).map(|i| int(n * k + i)).collect();
        // Stored values times their scales: x is 0.5 a unit, w 2; the output is multiplied by 0.25.
        let (sx, sw, sout) = (0.5f32, 2.0f32, 0.25f32);
        let sums: Vec<f32> = (0..n * m).map(|i| (0..k).map(|j| x[i / m * k + j] * w[i % m * k + j]).sum::<f32>() * sx * sw).collect();
        let act: Vec<f32> = sums.iter().map(|&v| if relu { v.max(0.0) } else { v }).collect();
        let amax = act.iter().fold(0f32, |a, v| a.max(v.abs()));
        let want: Vec<u8> = act.iter().map(|&v| e4m3(v * sout)).collect();
        let bytes = |v: &[f32], words: &mut [u64]| {
            for (i, &f) in v.iter().enumerate() {
                words[i / 8] |= (e4m3(f) as u64) << (8 * (i % 8));
            }
        };
        let words = |b: usize| b.div_ceil(8) * 8;
        let (xb, wb, ob) = (n * k, m * k, 2 * n * m);
        let (mut hx, mut hw, mut ho) =
            (PinnedBuffer::new(&gpu, words(xb)).unwrap(), PinnedBuffer::new(&gpu, words(wb)).unwrap(), PinnedBuffer::new(&gpu, words(ob)).unwrap());
        hx.words_mut().fill(0);
        hw.words_mut().fill(0);
        bytes(&x, hx.words_mut());
        bytes(&w, hw.words_mut());
        let (dx, dw, dout) = (gpu.alloc(words(xb)).unwrap(), gpu.alloc(words(wb)).unwrap(), gpu.alloc(words(ob)).unwrap());
        s.upload(&dx, &hx, words(xb)).unwrap();
        s.upload(&dw, &hw, words(wb)).unwrap();
        s.fill_u32(&dout, 0x7F7F_7F7F).unwrap();
        // The scales, each 16-byte aligned as cuBLASLt reads them, and a poisoned amax slot.
        let dscales = gpu.alloc(64).unwrap();
        let mut hs = PinnedBuffer::new(&gpu, 64).unwrap();
        let v = |a: f32| a.to_bits() as u64;
        hs.words_mut().copy_from_slice(&[v(sx), 0, v(sw), 0, v(sout), 0, v(f32::NAN), 0]);
        s.upload(&dscales, &hs, 64).unwrap();
        let at = |slot: usize| ScalarF32 { span: dscales.span(), index: 4 * slot };
        let scales = Fp8Scales { x: at(0), w: at(1), out: at(2), amax: at(3) };
        let xm = MatrixE4M3 { span: dx.span(), at: 0, rows: n, cols: k };
        let wm = MatrixE4M3 { span: dw.span(), at: 0, rows: m, cols: k };
        let om = MatrixE4M3 { span: dout.span(), at: 0, rows: n, cols: m };
        // SAFETY: the buffers outlive the product, waited for by the downloads.
        unsafe { blas.matmul_e4m3(&s, om, xm, wm, scales, relu) }.unwrap();
        s.download(&mut ho, &dout, words(ob)).unwrap();
        s.download(&mut hs, &dscales, 64).unwrap();
        let got_amax = f32::from_bits(hs.words()[6] as u32);
        assert_eq!(got_amax, amax, "{n} x {k} by ({m} x {k})ᵀ: the amax is the largest magnitude before the output's scale");
        for (i, &want) in want.iter().enumerate() {
            let got = (ho.words()[i / 8] >> (8 * (i % 8))) as u8;
            assert_eq!(
                got,
                want,
                "{n} x {k} by ({m} x {k})ᵀ: element ({}, {}): {:?} against the CPU's {:?}",
                i / m,
                i % m,
                float8::F8E4M3::from_bits(got),
                float8::F8E4M3::from_bits(want)
            );
        }
        println!("{n} x {k} by ({m} x {k})ᵀ, relu {relu}: every output is the CPU's E4M3, amax {amax}");
    }
    // Rows that are not a multiple of 16 bytes, or a scale off 16 bytes, are refused before the GPU is asked.
    let d = gpu.alloc(4096).unwrap();
    let sc = ScalarF32 { span: d.span(), index: 0 };
    let scales = Fp8Scales { x: sc, w: sc, out: sc, amax: sc };
    let a = MatrixE4M3 { span: d.span(), at: 0, rows: 8, cols: 24 };
    // SAFETY: refused before the GPU is asked anything.
    let e = unsafe { blas.matmul_e4m3(&s, a, a, a, scales, false) }.unwrap_err().to_string();
    assert!(e.contains("multiple of 16"), "{e}");
    let a = MatrixE4M3 { span: d.span(), at: 0, rows: 16, cols: 16 };
    let off = Fp8Scales { w: ScalarF32 { span: d.span(), index: 1 }, ..scales };
    // SAFETY: as above.
    let e = unsafe { blas.matmul_e4m3(&s, a, a, a, off, false) }.unwrap_err().to_string();
    assert!(e.contains("16-byte aligned"), "{e}");
}

/// cuBLAS keeps the lab's workspace: a product captured into a CUDA graph
/// holds no node that allocates or frees memory, and neither products on
/// changing streams nor the graph's replays draw anything from the
/// device's default pool (where cuBLAS takes its default workspace when a
/// stream change drops ours); every replay's output equals the CPU's. The
/// pool is the process's, shared by tests that run at once, so the check
/// runs alone, in a child process of this test binary.
#[test]
fn a_captured_gemm_keeps_cublas_on_the_labs_workspace_and_allocates_nothing() {
    use overlap_lab::gpu::{Blas, MatrixF16, MemPool};
    use overlap_lab::pipeline::op::{Access, OpKind};
    const NAME: &str = "a_captured_gemm_keeps_cublas_on_the_labs_workspace_and_allocates_nothing";
    const ALONE: &str = "OVERLAP_LAB_TEST_ALONE";
    let Some(gpu) = gpu_or_skip(NAME) else {
        return;
    };
    if std::env::var_os(ALONE).is_none() {
        drop(gpu);
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env(ALONE, "1")
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        println!("{text}");
        assert!(out.status.success() && text.contains("1 passed"), "the check alone in a child process failed:\n{text}");
        return;
    }
    // A long inner dimension and few outputs: the shape cuBLAS splits
    // along k, summing partial products in its workspace. Entries -1, 0 or
    // 1: each sum is an integer the FP32 accumulation holds exactly, so the
    // FP16 output is that sum rounded once, as the CPU rounds it.
    let (n, k, m) = (64usize, 16384usize, 64usize);
    let seed = pattern::fresh_seed();
    let int = |i: usize| (pattern::word(seed, i as u64) % 3) as f32 - 1.0;
    let x: Vec<f32> = (0..n * k).map(int).collect();
    let w: Vec<f32> = (0..k * m).map(|i| int(n * k + i)).collect();
    let want: Vec<f32> = (0..n * m).map(|i| half::f16::from_f32((0..k).map(|j| x[i / m * k + j] * w[j * m + i % m]).sum()).to_f32()).collect();
    let halves = |v: &[f32], words: &mut [u64]| {
        for (i, &f) in v.iter().enumerate() {
            words[i / 4] |= (half::f16::from_f32(f).to_bits() as u64) << (16 * (i % 4));
        }
    };
    let (xb, wb, ob) = (n * k * 2, k * m * 2, n * m * 2);
    let (mut hx, mut hw, mut ho) = (PinnedBuffer::new(&gpu, xb).unwrap(), PinnedBuffer::new(&gpu, wb).unwrap(), PinnedBuffer::new(&gpu, ob).unwrap());
    hx.words_mut().fill(0);
    hw.words_mut().fill(0);
    halves(&x, hx.words_mut());
    halves(&w, hw.words_mut());
    let (dx, dw, dout) = (gpu.alloc(xb).unwrap(), gpu.alloc(wb).unwrap(), gpu.alloc(ob).unwrap());
    let (s1, s2, s3) = (gpu.stream().unwrap(), gpu.stream().unwrap(), gpu.stream().unwrap());
    s1.upload(&dx, &hx, xb).unwrap();
    s1.upload(&dw, &hw, wb).unwrap();
    let xm = MatrixF16 { span: dx.span(), at: 0, rows: n, cols: k };
    let wm = MatrixF16 { span: dw.span(), at: 0, rows: k, cols: m };
    let om = MatrixF16 { span: dout.span(), at: 0, rows: n, cols: m };
    let mut check = |what: &str, s: &overlap_lab::gpu::Stream| {
        s.download(&mut ho, &dout, ob).unwrap();
        for (i, &want) in want.iter().enumerate() {
            let got = half::f16::from_bits((ho.words()[i / 4] >> (16 * (i % 4))) as u16).to_f32();
            assert_eq!(got, want, "{what}: element ({}, {}) of x · w", i / m, i % m);
        }
    };

    let blas = Blas::new(&gpu).unwrap();
    let pool = MemPool::default_of(&gpu).unwrap();
    pool.reset_high_water().unwrap();
    let before = pool.usage().unwrap();
    // Products on two streams, one after the other: each sets its stream,
    // which would drop the workspace were it not given back.
    for (what, s) in [("a product on stream 1", &s1), ("a product on stream 2", &s2)] {
        s.fill_u32(&dout, 0x7E00_7E00).unwrap();
        // SAFETY: the buffers outlive the product, waited for by the download in `check`.
        unsafe { blas.matmul_f16(s, om, xm, wm) }.unwrap();
        check(what, s);
    }
    // The same product captured into a graph on stream 3.
    let mut p = gpu.capture_runner().unwrap();
    let lane = p.stream(&s3, "gemm");
    let gemm = |st: &overlap_lab::gpu::Stream| {
        // SAFETY: the buffers outlive the graph, whose launches are each
        // waited for before the next use of the output.
        unsafe { blas.matmul_f16(st, om, xm, wm) }
    };
    let accesses = vec![Access::read("x", 0, xb as u64), Access::read("w", 0, wb as u64), Access::write("out", 0, ob as u64)];
    // SAFETY: the product touches only x, w and out, named in the accesses,
    // which outlive the runner and the graph.
    unsafe { p.op(lane, OpKind::Kernel, "x · w", accesses, gemm) }.unwrap();
    let (graph, _) = p.finish_capture().unwrap();
    assert_eq!(
        graph.memory_nodes(),
        0,
        "the captured product allocates or frees memory in the graph ({} nodes): cuBLAS is not on the lab's workspace",
        graph.nodes()
    );
    let (free_before, _) = gpu.memory_info().unwrap();
    for replay in 0..3 {
        s3.fill_u32(&dout, 0x7E00_7E00).unwrap();
        // SAFETY: the graph touches x, w and out, which outlive it; the
        // download in `check` waits for the launch before the next use.
        unsafe { graph.launch(&s3) }.unwrap();
        check(&format!("replay {replay}"), &s3);
        // A product on another stream between replays changes the handle's stream again.
        s1.fill_u32(&dout, 0x7E00_7E00).unwrap();
        // SAFETY: as for the products above.
        unsafe { blas.matmul_f16(&s1, om, xm, wm) }.unwrap();
        check(&format!("the product on stream 1 after replay {replay}"), &s1);
    }
    let (free_after, _) = gpu.memory_info().unwrap();
    let high = pool.high_water().unwrap();
    println!(
        "graph of {} nodes, none allocating; default pool: used {} B before, at most {} B since; free device memory {} B before the replays, {} B after",
        graph.nodes(),
        before.used,
        high.used,
        free_before,
        free_after
    );
    assert!(
        high.used <= before.used,
        "cuBLAS drew {} B from the default pool (used {} B before the first product): it is not on the lab's workspace",
        high.used - before.used,
        before.used
    );
}
