//! Lab 7's fixture: a made-up run (no GPU ran it) for its unit tests
//! and the table's check of every lab's parts: the table, the headline,
//! the charts.

use super::kernel::{KernelResources, TileKind, TileShape, WarpPhase, WarpTrace};
use super::results::{KernelPipelineResults, VariantResult};
use super::settings::{KernelPipelineConfig, Role};
use super::warps::warp_timeline;
use crate::measure::stats::Summary;

/// A run of the small preset with made-up times: the naive kernel 2.0
/// ms (1.2 with as many blocks as fit), the stage sweep 1.0 + 0.1 /
/// stages, no TMA (skipped), the plain CUDA reference's sweep from
/// 1.04 ms (tile 1024, as many blocks as fit: its best) to 1.08, its
/// 4 blocks per SM at tile 2048 skipped as not fitting; the copy of
/// the input 1.0 ms; two warp timelines.
pub fn results() -> KernelPipelineResults {
    let c = KernelPipelineConfig::small();
    let res = KernelResources {
        registers: 32,
        static_smem: 16,
        dynamic_smem: 8192,
        local_bytes: 0,
        max_blocks_per_sm: 8,
        occupancy: 1.0,
        blocks_per_sm: 1,
        grid: 132,
    };
    let s = |ms: f64| Summary::of(&[ms * 0.99, ms, ms * 1.01]).unwrap();
    let variants = c
        .variants()
        .into_iter()
        .map(|v| {
            let ms = match (v.role, v.kind) {
                (Role::Baseline, _) => Some(2.0),
                (Role::Occupancy, _) => Some(1.2),
                (_, TileKind::Tma) => None,
                // The reference: its best at tile 1024 with as many blocks as fit.
                (Role::PlainReference, _) => match (v.shape.tile, v.blocks_per_sm) {
                    (2048, 4) => None,
                    (1024, u32::MAX) => Some(1.04),
                    (tile, blocks) => Some(1.05 + if tile == 2048 { 0.02 } else { 0.0 } + if blocks == 1 { 0.01 } else { 0.0 }),
                },
                _ => Some(1.0 + 0.1 / v.shape.stages as f64),
            };
            let why = if v.kind == TileKind::Tma {
                "tile_tma.cu needs compute capability 9.0"
            } else {
                "4 blocks per SM do not fit: 3 do (the launch with as many blocks as fit)"
            };
            VariantResult {
                skipped: ms.is_none().then(|| why.to_string()),
                resources: ms.map(|_| KernelResources { blocks_per_sm: v.blocks_per_sm.min(8), grid: 132 * v.blocks_per_sm.min(8), ..res }),
                ms: ms.map(s),
                variant: v,
            }
        })
        .collect();
    let spans = |warp: u32, phases: &[(WarpPhase, f64)]| {
        let mut at = 0.0;
        let mut v = Vec::new();
        for tile in 0..2 {
            for &(phase, us) in phases {
                v.push(super::kernel::WarpSpan { warp, phase, tile, start_us: at, end_us: at + us });
                at += us;
            }
        }
        v
    };
    let naive: Vec<_> = (0..4).flat_map(|w| spans(w, &[(WarpPhase::Copy, 1.0), (WarpPhase::Wait, 0.5), (WarpPhase::Compute, 0.5)])).collect();
    let ws: Vec<_> = spans(0, &[(WarpPhase::Wait, 0.2), (WarpPhase::Copy, 0.3)])
        .into_iter()
        .chain(spans(1, &[(WarpPhase::Wait, 0.25), (WarpPhase::Compute, 0.75)]))
        .chain(spans(2, &[(WarpPhase::Wait, 0.1), (WarpPhase::Compute, 0.9)]))
        .chain(spans(3, &[(WarpPhase::Wait, 0.5), (WarpPhase::Store, 0.5)]))
        .collect();
    let trace = |spans| WarpTrace { spans, ns_per_cycle: 0.5 };
    let shape = TileShape { tile: 1024, threads: 128, stages: 2 };
    let warps = vec![
        warp_timeline(TileKind::Naive, shape, &trace(naive), "naive", "GPU 0 (test)"),
        warp_timeline(TileKind::WarpSpecialized, shape, &trace(ws), "warp-specialized, 2 stages, 2 compute warps", "GPU 0 (test)"),
    ];
    KernelPipelineResults { config: c, copy_ms: s(1.0), ceiling_sweep: Vec::new(), variants, round: None, warps }
}
