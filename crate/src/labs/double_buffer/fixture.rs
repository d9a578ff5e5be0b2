//! Lab 3's fixture: made-up results with round numbers (no GPU ran them),
//! for its checker's unit tests and the table's check of every lab's parts.

use super::{DoubleBufferConfig, DoubleBufferResults};
use crate::pipeline::timeline::Timeline;
use crate::testing::flat;

pub fn results() -> DoubleBufferResults {
    let empty = Timeline::default();
    DoubleBufferResults {
        config: DoubleBufferConfig::default(),
        iterations: 100,
        produce_ms: flat(0.05),
        copy_ms: flat(0.15),
        kernel_ms: flat(0.15),
        no_overlap_ms: flat(20.0),
        pipelined_ms: flat(10.0),
        no_overlap_timeline: empty.clone(),
        pipelined_timeline: empty,
        verified_runs: 1,
        timeline_overhead_pct: Some(1.0),
        timeline_overhead_pairs_pct: None,
        timeline_source: "cupti".into(),
    }
}
