//! Lab 7's test on the committed recordings in `data/`; the tests that walk every
//! lab of the table are in `crate/tests/recorded.rs`.

use crate::measure::record::{default_data_dir, find_recordings, Record};

/// Lab 7 on both GPUs: every kernel ran (none skipped on Hopper but a
/// launch of the plain reference's sweep that does not fit or repeats
/// another), the best
/// pipelined kernel reaches 90% of the ceiling and beats the naive kernel
/// beyond both spreads; the round's timeline holds the copy and every
/// kernel in order; block 0's warps were traced in four kernels over tiles
/// 4 to 11, each warp through every tile, and the warp-specialized kernel's
/// jobs are told apart.
#[test]
fn lab7_recordings_reach_the_ceiling_and_show_each_warp_and_the_round() {
    use crate::labs::kernel_pipeline::kernel::WarpPhase;
    use crate::labs::kernel_pipeline::warps::{tile_period_us, tile_range};
    use crate::labs::kernel_pipeline::{KernelPipelineResults, Role, LAB};
    let recs: Vec<(std::path::PathBuf, Record<KernelPipelineResults>)> = find_recordings(&default_data_dir(), LAB).expect("lab 7 recordings");
    assert!(recs.len() >= 2, "H100 and H200");
    for (path, rec) in &recs {
        let (r, at) = (&rec.results, path.display());
        for v in &r.variants {
            match &v.skipped {
                None => assert!(v.ms.as_ref().is_some_and(|m| m.n == r.config.repeats), "{at}: {}", v.variant.name),
                Some(why) => assert!(
                    v.variant.role == Role::PlainReference && (why.contains("do not fit") || why.contains("the same launch as")),
                    "{at}: {} skipped: {why}",
                    v.variant.name
                ),
            }
        }
        let ran: Vec<_> = r.variants.iter().filter(|v| v.skipped.is_none()).collect();
        let (best, naive) = (r.best_pipelined().unwrap(), r.by_role(Role::Baseline).unwrap());
        let (b, n) = (best.ms.as_ref().unwrap(), naive.ms.as_ref().unwrap());
        // The ceiling is the fastest device copy of any size the run swept
        // (on the H200 a 4 GiB copy, 5% above the lab's own 256 MiB).
        assert!(r.share(best).unwrap() >= 0.85, "{at}: best {:.3} of the ceiling", r.share(best).unwrap());
        // At least as close to it as the plain CUDA two-stage kernel, in the same run.
        if let Some(plain) = r.plain_reference() {
            assert!(r.share(best).unwrap() >= r.share(plain).unwrap(), "{at}: {} beats the lab's best", plain.variant.name);
        }
        assert!(n.median - b.median > b.middle_spread().max(n.middle_spread()), "{at}: not beyond the spreads");
        let round = r.round.as_ref().unwrap_or_else(|| panic!("{at}: no round timeline"));
        let labels: Vec<&str> = round.spans.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels.len(), ran.len() + 1, "{at}");
        assert!(labels[0].starts_with("D2D copy") && labels[1..].iter().zip(&ran).all(|(l, v)| *l == v.variant.name), "{at}: {labels:?}");
        assert!(round.spans.iter().all(|s| s.end_us - s.start_us > 1.0), "{at}: every op on the round takes time");
        let want: Vec<String> = r.config.diagram_variants().into_iter().map(|v| v.name).collect();
        let got: Vec<String> = r.warps.iter().map(|t| t.title.clone()).collect();
        assert_eq!(got, want, "{at}");
        for t in &r.warps {
            assert_eq!(tile_range(t), Some((4, 11)), "{at}: {}", t.title);
            for lane in t.lanes() {
                let tiles: std::collections::HashSet<u32> = t.spans.iter().filter(|s| s.lane == lane).filter_map(|s| s.index).collect();
                assert_eq!(tiles.len(), 8, "{at}: {} {lane}", t.title);
            }
            // The traced kernel's time a tile is within 35% of the untraced kernel's (its stamps go to shared memory).
            let v = r.variants.iter().find(|v| v.variant.name == t.title).unwrap();
            let tiles_per_block = (r.config.elements() / v.variant.shape.tile as usize) as f64 / v.resources.unwrap().grid as f64;
            let (traced, timed) = (tile_period_us(t).unwrap(), v.ms.as_ref().unwrap().median * 1e3 / tiles_per_block);
            println!("{at}: {:<48} traced {traced:.2} us a tile, timed {timed:.2}", t.title);
            assert!((traced / timed - 1.0).abs() < 0.35, "{at}: {}: traced {traced:.2} vs timed {timed:.2} us a tile", t.title);
        }
        let ws = r.warps.iter().find(|t| t.lanes()[0].ends_with("loader")).unwrap_or_else(|| panic!("{at}: no warp-specialized trace"));
        assert!(ws.lanes().last().unwrap().ends_with("storer") && ws.spans.iter().any(|s| s.class.as_deref() == Some(WarpPhase::Store.class())), "{at}");
    }
}
