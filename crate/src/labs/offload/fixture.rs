//! Lab 9's fixture: made-up results with round numbers (no GPU ran them),
//! for its unit tests and the table's check of every lab's parts.

use crate::gpu::MachineFacts;
use crate::measure::stats::Summary;
use crate::pipeline::timeline::Timeline;
use crate::testing::flat;

/// Lab 9's results as a recording of the full preset might hold them: a
/// link-bound and a compute-bound batch (GEMMs 0.6 and 1.8 ms); one
/// layer's upload 1.2 ms at its best, though the link-bound batch's
/// uploads ran slow (1.25 to 1.4 ms: a slow phase of the host); the ring
/// passes at 97% of the bound; the host's wake-up and issue costs as lab 5
/// measured them on the H100 (6 and 3 µs). The exercise is judged at the
/// compute-bound batch, nearest the crossover, as on the recorded GPUs.
pub fn results() -> crate::labs::offload::OffloadResults {
    use crate::labs::offload::{BatchPoint, OffloadConfig, OffloadResults, Shape, Variant, VariantPoint};
    let cfg = OffloadConfig::default();
    let shape = Shape { layers: cfg.layers, d: cfg.d_model };
    let uploads = |q25: f64, median: f64, q75: f64| Summary { median, min: 0.99 * q25, max: 1.02 * q75, n: 5, middle: Some((q25, q75)) };
    let point = |batch: usize, h2d_ms: Summary, layer: f64| {
        let bound = crate::lab_kit::two_stage_bound_ms(shape.layers, 1.2, layer);
        BatchPoint {
            batch,
            h2d_ms,
            h2d_pageable_ms: flat(3.0),
            layer_ms: flat(layer),
            variants: Variant::ALL
                .iter()
                .filter(|v| v.kind() == crate::labs::offload::rig::LayerKind::Separate)
                .map(|&variant| {
                    let ms = match variant {
                        Variant::Pageable => shape.layers as f64 * (3.0 + layer),
                        Variant::Pinned => shape.layers as f64 * (1.2 + layer),
                        _ => bound * 1.03,
                    };
                    VariantPoint { variant, ms: flat(ms), predicted_ms: ms * 0.98, plan: None }
                })
                .collect(),
            torch_to_ms: Some(flat(shape.layers as f64 * (3.2 + layer))),
            torch_ring_ms: Some(flat(bound * 1.05)),
            layer_fused_ms: None,
            h2d_fp8_ms: None,
            layer_fp8_ms: None,
            h2d_int4_ms: None,
            layer_int4_ms: None,
            dequant_int4_ms: None,
            torch_beyond: None,
        }
    };
    let host = MachineFacts {
        copy_engines: 3,
        h2d_ms: 1.217,
        d2h_ms: 1.218,
        both_ms: 1.326,
        wake_ms: 0.006,
        kernel_ms: 0.141,
        kernels_alternating_ms: 1.015,
        issue_ms: 0.003,
    };
    OffloadResults {
        config: cfg,
        shape,
        chose: "96 layers as asked".into(),
        gpu_bytes: 800 << 20,
        cublas: "13.0.0".into(),
        copy_engines: 3,
        machine: Some(host),
        points: vec![point(4096, uploads(1.25, 1.3, 1.4), 0.6), point(16384, uploads(1.2, 1.21, 1.22), 1.8)],
        timeline: Timeline::default(),
        timeline_batch: 16384,
        timeline_untraced_ms: 120.0,
        max_error: 1e-3,
        verified_passes: 10,
        torch: Ok("2.9.0".into()),
        fp8: None,
        fp8_missing: None,
        int4: None,
        int4_missing: None,
        sweeps: Vec::new(),
        timelines: Vec::new(),
    }
}

/// Lab 9's recording from the H100 (`data/nvidia-h100-80gb-hbm3/offload.json`,
/// committed): every variant past the streaming bound with its plan, the
/// placement sweep at three batches and budgets, FP8's accuracy and the
/// traced passes, as a real run holds them.
pub fn results_beyond() -> crate::labs::offload::OffloadResults {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/nvidia-h100-80gb-hbm3/offload.json");
    crate::labs::offload::OffloadRecord::load(&path).expect("the committed H100 recording of lab 9").results
}
