//! Lab 3's test on the committed recordings in `data/`; the tests that walk every
//! lab of the table are in `crate/tests/recorded.rs`.

use crate::measure::record::{default_data_dir, find_recordings};

#[test]
fn lab3_recordings_are_complete_and_verified() {
    use crate::labs::double_buffer::{self, DoubleBufferResults};
    let found = find_recordings::<DoubleBufferResults>(&default_data_dir(), double_buffer::LAB).expect("data/ holds a lab 3 recording");
    for (path, rec) in found {
        let r = &rec.results;
        // Timed runs of both schedules, the overhead pairs (pipelined, off and on), two timelines.
        let (w, n) = (r.config.warmup, r.config.repeats);
        assert_eq!(r.verified_runs, 2 * (w + n) + 2 * (w + 2 * n + 1) + 2, "{}", path.display());
        assert_eq!(r.timeline_overhead_pairs_pct.expect("every pair's overhead").n, 2 * n + 1);
        let overhead = r.timeline_overhead_pct.expect("the timeline's cost is recorded");
        assert!(overhead.is_finite() && !r.timeline_source.is_empty(), "{}", path.display());
        assert_eq!(r.pipelined_timeline.spans.iter().filter(|s| s.label.starts_with("compute")).count(), r.config.batches);
        assert!(r.bound_ms() > 0.0 && r.pipelined_ms.median > 0.0);
        // The exercise on the recorded costs: the solution passes, the early refill races.
        let rep = double_buffer::exercise::check_on_model(r, r.config.batches, double_buffer::pipelined);
        assert!(rep.passed, "{}: {rep}", path.display());
        let early = double_buffer::exercise::check_on_model(r, r.config.batches, double_buffer::exercise::refills_host_buffer_too_early);
        assert!(!early.passed && early.to_string().contains("race"), "{early}");
    }
}
