//! Lab 4's fixture: made-up results with round numbers (no GPU ran them),
//! for its checker's unit tests and the table's check of every lab's parts.

use super::{CallbackConfig, CallbackResults, CostPoint, Variant, VariantResult};
use crate::pipeline::timeline::Timeline;
use crate::testing::flat;

pub fn results() -> CallbackResults {
    let cfg = CallbackConfig { iterations: 128, ..CallbackConfig::default() };
    let variants = Variant::ALL.iter().map(|&variant| VariantResult { variant, total_ms: flat(40.0), cpu_ms: flat(0.27) }).collect();
    CallbackResults {
        config: cfg,
        gpu_ms: flat(0.27),
        kernel_ms: flat(0.26),
        d2h_ms: flat(0.01),
        host_fn_round_trip_ms: flat(0.07),
        points: vec![CostPoint { cpu_over_gpu: 1.0, passes: 6, cpu_alone_ms: flat(0.25), variants }],
        timelines: Vec::<Timeline>::new(),
        timeline_overhead_pct: 0.0,
        timeline_overhead_pairs_pct: None,
        timeline_overhead_cpu_over_gpu: 0.5,
        timeline_source: "cuda events".into(),
        verified_runs: 1,
    }
}
