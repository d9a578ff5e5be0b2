//! Lab 2's tests on the committed recordings in `data/`; the tests that walk every
//! lab of the table are in `crate/tests/recorded.rs`.

use crate::measure::record::{default_data_dir, find_recordings};
use crate::testing::busy;

#[test]
fn lab2_recordings_are_complete_and_verified() {
    use crate::labs::overlap::{self, OverlapResults};
    let found = find_recordings::<OverlapResults>(&default_data_dir(), overlap::LAB).expect("data/ holds a lab 2 recording");
    for (path, rec) in found {
        let r = &rec.results;
        assert_eq!(r.intensities.len(), r.config.intensities.len(), "{}", path.display());
        for ir in &r.intensities {
            assert_eq!(ir.points.len(), r.config.points().len(), "{}", path.display());
            assert!(ir.points.iter().all(|p| p.verified_runs == r.config.warmup + r.config.repeats));
            assert!(ir.serial().is_some() && ir.best().is_some());
            assert_eq!(ir.best_timeline.spans.len(), 3 * ir.best().unwrap().chunks);
            assert_eq!(ir.best_predicted.spans.len(), ir.best_timeline.spans.len());
        }
        assert!(r.timeline_overhead_pct.is_finite());
        assert_eq!(r.timeline_overhead_pairs_pct.expect("every pair's overhead").n, 2 * r.config.repeats + 1);
        // The exercise on the recorded parts: the solution passes, one stream does not.
        use crate::labs::overlap::{exercise, Intensity};
        let rep = exercise::check_on_model(r, Intensity::Balanced, 16, 4, exercise::solution);
        assert!(rep.passed, "{}: {rep}", path.display());
        let one_stream = exercise::check_on_model(r, Intensity::Balanced, 16, 4, |p, t| {
            for c in 0..t.chunks {
                let (at, n) = t.chunk(c);
                let s = t.streams[0];
                p.h2d(s, t.dev_in, at, t.host_in, at, n, "H2D")?;
                p.compute(s, t.dev_in, at, t.dev_out, at, n, "compute")?;
                p.d2h(s, t.host_out, at, t.dev_out, at, n, "D2H")?;
            }
            Ok(())
        });
        assert!(!one_stream.passed && one_stream.to_string().contains("no overlap"), "{one_stream}");
    }
}

/// The queue model runs each point's own issue loop with its parts: it
/// must agree with what the GPU measured, order by order (breadth-first
/// included: before the model let an engine keep serving one stream, it
/// predicted 1.3-1.9x the measured time there).
#[test]
fn lab2_queue_model_agrees_with_recordings() {
    let _busy = busy();
    use crate::labs::overlap::{self, model, IssueOrder, OverlapResults};
    for (path, rec) in find_recordings::<OverlapResults>(&default_data_dir(), overlap::LAB).unwrap() {
        let r = &rec.results;
        for order in [IssueOrder::DepthFirst, IssueOrder::BreadthFirst, IssueOrder::StageStreams] {
            let mut errs: Vec<(f64, String)> = Vec::new();
            for ir in &r.intensities {
                for p in ir.points.iter().filter(|p| p.order == order) {
                    let pred = model::predicted_ms(p, r.copy_engines).unwrap();
                    let what = format!("{} {}/{}: measured {:.3} ms, model {pred:.3} ms", ir.intensity.label(), p.chunks, p.streams, p.total_ms.median);
                    errs.push(((pred / p.total_ms.median).ln().abs(), what));
                }
            }
            errs.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (median, p90) = (&errs[errs.len() / 2], &errs[errs.len() * 9 / 10]);
            eprintln!(
                "{} {}: |ln(model/measured)| median {:.3}, 90th percentile {:.3} ({}), worst {}",
                path.display(),
                order.label(),
                median.0,
                p90.0,
                p90.1,
                errs.last().unwrap().1
            );
            assert!(median.0 < 0.05, "{} {}: half the points are off by more than 5%: {}", path.display(), order.label(), median.1);
            assert!(p90.0 < 0.12, "{} {}: a tenth of the points are off by more than 13%: {}", path.display(), order.label(), p90.1);
        }
    }
}
