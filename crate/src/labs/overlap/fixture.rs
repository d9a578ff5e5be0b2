//! Lab 2's fixture: made-up results with round numbers (no GPU ran them),
//! for its checker's unit tests and the table's check of every lab's parts.

use super::{Intensity, IntensityResults, IssueOrder, OverlapConfig, OverlapPoint, OverlapResults, Parts};
use crate::pipeline::timeline::Timeline;
use crate::testing::flat;

pub fn results() -> OverlapResults {
    let parts = Parts { h2d_ms: flat(2.4), kernel_ms: flat(2.4), d2h_ms: flat(2.4), both_copies_ms: flat(2.7) };
    let empty = Timeline::default();
    let point = OverlapPoint { chunks: 1, streams: 1, order: IssueOrder::DepthFirst, parts: parts.clone(), total_ms: flat(7.2), verified_runs: 1 };
    OverlapResults {
        config: OverlapConfig::default(),
        copy_engines: 3,
        intensities: vec![IntensityResults {
            intensity: Intensity::Balanced,
            iterations: 1800,
            parts,
            synchronous_ms: flat(7.3),
            points: vec![point],
            serial_timeline: empty.clone(),
            best_timeline: empty.clone(),
            best_predicted: empty,
        }],
        timeline_overhead_pct: 1.0,
        timeline_overhead_pairs_pct: None,
        timeline_source: String::new(),
    }
}
