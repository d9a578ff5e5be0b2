//! Lab 1's tests on the committed recordings in `data/`; the tests that walk every
//! lab of the table are in `crate/tests/recorded.rs`.

use crate::gpu::HostMemoryKind;
use crate::labs::bandwidth::{exercise, model, BandwidthResults, Direction, LAB};
use crate::measure::record::{default_data_dir, find_recordings, Record};
use crate::testing::busy;
use crate::Bytes;

fn recordings() -> Vec<(std::path::PathBuf, Record<BandwidthResults>)> {
    find_recordings(&default_data_dir(), LAB).expect("data/ holds a lab 1 recording")
}

#[test]
fn recordings_are_complete_and_verified() {
    for (path, rec) in recordings() {
        let r = &rec.results;
        assert_eq!(r.transfers.len(), r.config.kinds.len() * r.config.directions.len() * r.config.sizes().len(), "{}", path.display());
        assert!(r.transfers.iter().all(|p| p.verified_samples == r.config.warmup + r.config.repeats));
        assert!(!rec.command.is_empty() && !rec.fingerprint.gpu_uuid.is_empty());
        assert!(!r.pin_cost.is_empty());
        // Sanity, not a speed target: pinned beats pageable at the largest size.
        let big = r.largest_size().unwrap();
        let pinned = r.point(HostMemoryKind::Pinned, Direction::H2d, big).unwrap();
        let pageable = r.point(HostMemoryKind::Pageable, Direction::H2d, big).unwrap();
        assert!(pinned.gbps.median > pageable.gbps.median);
    }
}

#[test]
fn solutions_pass_on_recorded_data() {
    let _busy = busy();
    for (_, rec) in recordings() {
        let r = &rec.results;
        for d in [Direction::H2d, Direction::D2h] {
            let big = r.largest_size().unwrap();
            let bw = r.point(HostMemoryKind::Pinned, d, big).unwrap().gbps.median;
            let small = r.config.min_bytes;
            let t0 = r.point(HostMemoryKind::Pinned, d, small).unwrap().device_ms.median * 1e3 - small.0 as f64 / (bw * 1e3);
            let rep = exercise::check_transfer_model(r, HostMemoryKind::Pinned, d, |b| t0 + b as f64 / (bw * 1e3));
            assert!(rep.passed, "{rep}");
        }
        // Exercise 2 as notebook 01 asks it: a rule for memory allocated
        // per use, asked at every size and direction priced.
        let how = model::Acquisition::EveryUse;
        let rule = |d: Direction, at: Bytes| {
            let c = r.pin_cost.iter().find(|c| c.bytes == at).unwrap();
            let copy = |k| r.point(k, d, at).unwrap().device_ms.median;
            let saved = copy(HostMemoryKind::Pageable) - copy(HostMemoryKind::Pinned);
            if saved <= 0.0 {
                f64::INFINITY
            } else {
                ((c.pinned_reused.total_ms() - c.pageable_reused.total_ms()) / saved).max(0.0)
            }
        };
        let rep = exercise::check_break_even_rule(r, how, rule);
        assert!(rep.passed, "{rep}");
        let (d, at) = (Direction::D2h, Bytes(16 << 20));
        let truth =
            model::break_even(r).into_iter().find(|b| b.acquisition == how && b.direction == d && b.bytes == at).and_then(|b| b.copies).expect("16 MiB priced");
        assert!(truth > 1.0, "the notebook's case asks for a real number of copies, not 'at once': {truth}");
        assert!(!exercise::check_break_even_rule(r, how, |d, at| rule(d, at) * 3.0 + 5.0).passed);
    }
}
