//! Lab 7's tests on a GPU. Each says SKIPPED with no GPU (`testing::gpu_or_skip`)
//! and fails instead where `OVERLAP_LAB_REQUIRE_GPU` asks for one; the GPU
//! tests of no one lab are in `crate/tests/gpu.rs`.

use crate::labs::kernel_pipeline::builds::build_all;
use crate::labs::kernel_pipeline::exercise::{check_on_gpu, solution_source};
use crate::labs::kernel_pipeline::kernel::{TileKernel, TileKind, TileShape, WarpPhase};
use crate::labs::kernel_pipeline::measure::TileData;
use crate::labs::kernel_pipeline::{KernelPipelineConfig, Role, Variant};
use crate::testing::{gpu_or_skip, judged_only_on_time};
use crate::LabError;

#[test]
fn every_tile_kernel_verifies_at_every_stage_count_or_says_why_it_cannot_run() {
    let Some(gpu) = gpu_or_skip("every_tile_kernel_verifies_at_every_stage_count_or_says_why_it_cannot_run") else {
        return;
    };
    // 37 tiles of 1024 over a grid of one block per SM: blocks with
    // several tiles, with one, and with none.
    let mut data = TileData::new(&gpu, 37 * 1024).unwrap();
    for kind in TileKind::ALL {
        for stages in 1..=4 {
            let shape = TileShape { tile: 1024, threads: 128, stages };
            let k = match TileKernel::load(&gpu, kind, shape, 1) {
                Err(LabError::Unsupported(why)) => {
                    eprintln!("{kind:?}: {why}");
                    continue;
                }
                other => other.unwrap_or_else(|e| panic!("{kind:?} {shape:?}: {e}")),
            };
            let r = k.resources();
            assert!(r.registers > 0 && r.grid > 0 && r.max_blocks_per_sm >= 1 && r.occupancy > 0.0, "{kind:?}: {r:?}");
            data.refresh().unwrap();
            // Poisons the output, runs, and checks every element against the CPU reference.
            data.verified(&k, &format!("{kind:?} {shape:?}")).unwrap_or_else(|e| panic!("{e}"));
            assert!(data.timed(&k).unwrap() > 0.0);
        }
    }
    // A shape that cannot fit says so before any launch.
    let e = TileKernel::load(&gpu, TileKind::Async, TileShape { tile: 1 << 16, threads: 256, stages: 4 }, 1).err().unwrap().to_string();
    assert!(e.contains("shared memory") && e.contains("smaller tile"), "{e}");
}

/// Traced builds: block 0's warps stamp every phase of their tiles 4
/// to 11, one after another, with outputs still right; an untraced
/// kernel refuses to trace; one round puts the copy and each kernel on
/// the stream in order.
#[test]
fn traced_kernels_show_each_warp_s_phases_and_a_round_shows_every_kernel() {
    let Some(gpu) = gpu_or_skip("traced_kernels_show_each_warp_s_phases_and_a_round_shows_every_kernel") else {
        return;
    };
    // 12 tiles of 1024 per SM: block 0 gets 12, tiles 0 to 11, of which 4 to 11 are traced.
    let sms = gpu.fingerprint().unwrap().sm_count as usize;
    let mut data = TileData::new(&gpu, sms * 12 * 1024).unwrap();
    data.refresh().unwrap();
    let mut named = Vec::new();
    for kind in TileKind::ALL {
        let shape = TileShape { tile: 1024, threads: 256, stages: 3 };
        let traced = match TileKernel::load_traced(&gpu, kind, shape) {
            Err(LabError::Unsupported(why)) => {
                eprintln!("{kind:?}: {why}");
                continue;
            }
            other => other.unwrap_or_else(|e| panic!("{kind:?}: {e}")),
        };
        let t = data.warp_timeline(&gpu, &traced, &format!("{kind:?}")).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        let lanes = t.lanes();
        assert_eq!(lanes.len(), 8, "{kind:?}: a lane per warp: {lanes:?}");
        for lane in &lanes {
            let spans: Vec<_> = t.spans.iter().filter(|s| &s.lane == lane).collect();
            let tiles: std::collections::HashSet<_> = spans.iter().filter_map(|s| s.index).collect();
            // The TMA kernel's thread 0 also stamps the copies it issues: still 8 tiles.
            assert_eq!(tiles.len(), 8, "{kind:?} {lane}: {tiles:?}");
            for w in spans.windows(2) {
                assert!(w[0].start_us <= w[0].end_us && w[0].end_us <= w[1].start_us + 1e-3, "{kind:?} {lane}: phases overlap: {:?} {:?}", w[0], w[1]);
            }
            assert!(spans.iter().any(|s| s.class.as_deref() == Some(WarpPhase::Wait.class())), "{kind:?} {lane}: no wait stamped");
            // Each warp's job: the loader copies, the storer stores, every other warp computes.
            let has = |p: WarpPhase| spans.iter().any(|s| s.class.as_deref() == Some(p.class()));
            let job = lane.split(": ").nth(1);
            assert_eq!(has(WarpPhase::Copy), job == Some("loader") || job.is_none() && (kind != TileKind::Tma || lane == "warp 0"), "{kind:?} {lane}");
            assert_eq!(has(WarpPhase::Compute), job.is_none() || job == Some("compute"), "{kind:?} {lane}");
            assert_eq!(has(WarpPhase::Store), job == Some("storer"), "{kind:?} {lane}");
        }
        // (No bound on time: under compute-sanitizer a kernel runs a thousand times slower.)
        let makespan = t.makespan_us();
        let period = crate::labs::kernel_pipeline::warps::tile_period_us(&t).unwrap();
        assert!(period > 0.0 && period * 7.0 < makespan, "{kind:?}: a tile every {period} us, 8 tiles in {makespan} us");
        assert_eq!(crate::labs::kernel_pipeline::warps::tile_range(&t), Some((4, 11)), "{kind:?}");
        if kind == TileKind::WarpSpecialized {
            assert!(lanes[0] == "warp 0: loader" && lanes[7] == "warp 7: storer", "{lanes:?}");
            assert!(t.spans.iter().any(|s| s.class.as_deref() == Some(WarpPhase::Store.class())));
        }
        println!("{kind:?}: 8 tiles in {makespan:.2} us over {} spans", t.spans.len());
        let untraced = TileKernel::load(&gpu, kind, shape, 1).unwrap();
        let e = untraced.warp_trace(&gpu.stream().unwrap(), &gpu.alloc(4096).unwrap(), &gpu.alloc(4096).unwrap(), 1);
        assert!(e.unwrap_err().to_string().contains("load_traced"));
        named.push((format!("{kind:?}"), untraced));
    }
    let refs: Vec<(&str, &TileKernel)> = named.iter().map(|(n, k)| (n.as_str(), k)).collect();
    let round = data.round_timeline(&gpu, &refs).unwrap().expect("a timeline");
    let labels: Vec<&str> = round.spans.iter().map(|s| s.label.as_str()).collect();
    assert_eq!(labels[0], "D2D copy of the input");
    let copy = &round.spans[0];
    assert!(matches!(copy.kind, crate::pipeline::op::OpKind::D2d(l) if !l.is_peer()), "{copy:?} ({})", round.source);
    assert_eq!(&labels[1..], refs.iter().map(|(n, _)| *n).collect::<Vec<_>>().as_slice());
    // Each op was timed: a span that ends after it starts.
    assert!(round.spans.iter().all(|s| s.end_us > s.start_us), "{:?}", round.spans);
    // A run too small for the window says so instead of drawing nothing.
    let mut small = TileData::new(&gpu, sms * 1024).unwrap();
    small.refresh().unwrap();
    let traced = TileKernel::load_traced(&gpu, TileKind::Naive, TileShape { tile: 1024, threads: 256, stages: 1 }).unwrap();
    let e = small.warp_timeline(&gpu, &traced, "naive").unwrap_err().to_string();
    assert!(e.contains("block 0 gets 1 tiles") && e.contains("tiles 4 to 11") && e.contains("--mib"), "{e}");
    println!("round on {} ({}): {:.1} us", round.lanes()[0], round.source, round.makespan_us());
}

/// Lab 7's yardstick: the plain CUDA reference's sweep, built as the lab
/// builds it (each tile's build compiled once, launched at each count of
/// blocks per SM), every launch that runs verified bit for bit against the
/// CPU reference on fresh input, at the grid it says; a launch skipped is
/// one that does not fit or repeats another, said so.
#[test]
fn the_yardsticks_sweep_verifies_its_output_at_every_configuration() {
    let Some(gpu) = gpu_or_skip("the_yardsticks_sweep_verifies_its_output_at_every_configuration") else {
        return;
    };
    // The lab's launches and tiles, on 64 MiB: every block gets several tiles.
    let cfg = KernelPipelineConfig { mib: 64, ..KernelPipelineConfig::default() };
    let plain: Vec<Variant> = cfg.variants().into_iter().filter(|v| v.role == Role::PlainReference).collect();
    assert_eq!(plain.len(), cfg.sweep_tiles.len() * cfg.plain_blocks_per_sm.len());
    let built = build_all(&gpu, plain, &[]).unwrap();
    assert_eq!(built.builds, cfg.sweep_tiles.len(), "a build per tile, not per launch");
    let sms = gpu.fingerprint().unwrap().sm_count;
    let mut data = TileData::new(&gpu, cfg.elements()).unwrap();
    let mut ran = Vec::new();
    for pass in 0..2 {
        // Fresh input each pass; each run poisons the output first.
        data.refresh().unwrap();
        for (r, k) in built.results.iter().zip(&built.kernels) {
            let name = &r.variant.name;
            match (k, &r.skipped) {
                (Some(k), None) => {
                    let res = k.resources();
                    let want = if r.variant.blocks_per_sm == u32::MAX { res.max_blocks_per_sm } else { r.variant.blocks_per_sm };
                    assert_eq!((res.blocks_per_sm, res.grid), (want, sms * want), "{name}: {res:?}");
                    assert_eq!(r.resources, Some(res), "{name}");
                    data.verified(k, name).unwrap_or_else(|e| panic!("{name}: {e}"));
                    if pass == 0 {
                        println!("{name}: {} blocks per SM, grid {}, every output right", res.blocks_per_sm, res.grid);
                        ran.push((r.variant.shape.tile, r.variant.blocks_per_sm));
                    }
                }
                (None, Some(why)) => {
                    assert!(why.contains("do not fit") || why.contains("the same launch as"), "{name}: {why}");
                    if pass == 0 {
                        println!("{name}: skipped: {why}");
                    }
                }
                other => panic!("{name}: {:?}", other.1),
            }
        }
    }
    // Every tile ran at one block per SM, and at as many as fit unless
    // that is a count already run (a GPU with less shared memory).
    for &t in &cfg.sweep_tiles {
        let max_ran = ran.contains(&(t, u32::MAX))
            || built.results.iter().any(|r| {
                (r.variant.shape.tile, r.variant.blocks_per_sm) == (t, u32::MAX) && r.skipped.as_ref().is_some_and(|w| w.contains("the same launch as"))
            });
        assert!(ran.contains(&(t, 1)) && max_ran, "tile {t}: {ran:?}");
    }
}

/// The checker on the GPU: the solution's outputs all match and it is
/// timed, the given naive file fails on its copies, a kernel that reads
/// the wrong slot fails on its outputs, and one that waits for each
/// tile right after issuing it runs right and is timed (the verdicts on
/// time are printed: tests assert no timing).
#[test]
fn the_live_checker_verifies_and_times_the_solution_and_names_each_mistake() {
    let Some(gpu) = gpu_or_skip("the_live_checker_verifies_and_times_the_solution_and_names_each_mistake") else {
        return;
    };
    let cfg = KernelPipelineConfig { mib: 64, repeats: 7, ..KernelPipelineConfig::default() };
    let sol = check_on_gpu(&gpu, "tile_async.cu", solution_source(), &cfg).unwrap();
    judged_only_on_time(&sol, "every output matches the CPU reference", &["yours "]);
    let given = include_str!("../../../../notebooks/exercises/07-double-buffered.cu");
    let rep = check_on_gpu(&gpu, "07-double-buffered.cu", given, &cfg).unwrap();
    assert!(!rep.passed && rep.to_string().contains("no asynchronous copy"), "{rep}");
    let wrong_slot = solution_source().replace("const float* s = smem + (k % STAGES) * SPAN;", "const float* s = smem;");
    assert_ne!(wrong_slot, solution_source());
    let rep = check_on_gpu(&gpu, "wrong-slot.cu", &wrong_slot, &cfg).unwrap();
    println!("{rep}");
    assert!(!rep.passed && rep.to_string().contains("CPU reference"), "{rep}");
    // Issue one tile, wait for it at once: a pipeline with nothing in flight.
    let serial = solution_source().replace("fetched < k + STAGES", "fetched < k + 1");
    assert_ne!(serial, solution_source());
    let rep = check_on_gpu(&gpu, "serial.cu", &serial, &cfg).unwrap();
    judged_only_on_time(&rep, "every output matches the CPU reference", &["yours "]);
}
