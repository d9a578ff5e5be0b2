//! Lab 8's test on the committed recordings in `data/`; the tests that walk every
//! lab of the table are in `crate/tests/recorded.rs`.

use crate::measure::record::{default_data_dir, find_recordings, Record};
use crate::testing::busy;

/// Lab 8's recordings: every copy rate finite and above zero, ours within
/// reach of PyTorch's in the same run, the four at once under their serial
/// sum, a bubble point per micro-batch count asked for, the all-reduce
/// skipped with its reason on one GPU, a pair shown where one was
/// recorded, and the exercise judged on each recording's costs.
#[test]
fn lab8_recordings_load_and_the_exercise_is_judged_on_them() {
    let _busy = busy();
    use crate::labs::multi_gpu::{exercise, pipeline_parallel, recorded_pair, MultiGpuResults, LAB};
    use std::sync::Arc;
    let recs: Vec<(std::path::PathBuf, Record<MultiGpuResults>)> = find_recordings(&default_data_dir(), LAB).expect("lab 8 recordings");
    assert!(recs.len() >= 2, "H100 and H200");
    for (path, rec) in &recs {
        let (r, at) = (&rec.results, path.display());
        assert_eq!(r.peer.len(), r.config.sizes_mib.len(), "{at}");
        for p in &r.peer {
            for s in [&p.one_way, &p.both_ways, &p.staged, &p.host] {
                assert!(s.min > 0.0 && s.max.is_finite() && s.n == r.config.repeats, "{at}: {s:?}");
            }
        }
        let (one, both) = r.against_torch().unwrap_or_else(|| panic!("{at}: no PyTorch reference"));
        assert!(one > 0.8 && both > 0.7, "{at}: ours against PyTorch's {one:.3} one way, {both:.3} both ways");
        let f = &r.four_way;
        assert!(f.together_ms.median < f.serial_ms(), "{at}: the four at once took {} ms, alone one after another {}", f.together_ms.median, f.serial_ms());
        let asked: Vec<usize> = r.pipeline.points.iter().map(|b| b.micro_batches).collect();
        assert_eq!(asked, r.config.micro_batches, "{at}");
        assert_eq!(r.all_reduce.is_ok(), r.several_gpus(), "{at}: {:?}", r.all_reduce.as_ref().err());
        // Issue 53's bars, on every recording that has the parts: each
        // pipeline's bubble within 3 points of (S-1)/(M+S-1) at every
        // micro-batch count (forward, and training under each schedule);
        // NCCL's bus bandwidth at least 95% of PyTorch's at 64 MiB and up;
        // on four GPUs or more, at least 90% hidden at the setting chosen.
        if r.several_gpus() {
            let sweeps = std::iter::once(("forward only", &r.pipeline.points)).chain(r.pipeline.training.iter().map(|t| (t.order.name(), &t.points)));
            for (what, points) in sweeps {
                for b in points {
                    let m = b.measured.as_ref().unwrap_or_else(|| panic!("{at}: {what} at {} has no timeline", b.micro_batches));
                    assert!(
                        (m.median - b.model).abs() <= 0.03,
                        "{at}: {what} at {} micro-batches: bubble {:.3} against {:.3}",
                        b.micro_batches,
                        m.median,
                        b.model
                    );
                }
            }
        }
        if let Ok(a) = &r.all_reduce {
            for (bytes, ours, theirs) in a.bus_by_size() {
                if let (true, Some(t)) = (bytes >= 64 << 20, theirs) {
                    assert!(ours >= 0.95 * t, "{at}: bus bandwidth at {bytes} B {ours:.1} GB/s against PyTorch's {t:.1}");
                }
            }
            if r.gpus.len() >= 4 {
                let (ctas, p) = a.chosen().unwrap_or_else(|| panic!("{at}: no CTA setting hid the communication"));
                assert!(p.hidden() >= 0.90, "{at}: {ctas} hid {:.3}", p.hidden());
            }
        }
        let solved = exercise::check_recorded(rec, Arc::new(pipeline_parallel::events_only));
        assert!(solved.passed, "{at}: {solved}");
        let given = exercise::check_recorded(rec, Arc::new(pipeline_parallel::host_synchronized));
        assert!(!given.passed && given.to_string().contains("host synchronization in the loop"), "{at}: {given}");
    }
    let pair = recorded_pair().unwrap();
    assert_eq!(pair.is_some(), recs.iter().any(|(_, r)| r.results.several_gpus()));
    assert!(pair.is_none_or(|p| p.record.results.several_gpus()));
}
