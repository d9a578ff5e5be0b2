//! Lab 7's fixture: made-up results (no GPU ran them), for the table's
//! check of every lab's parts: every variant of the default settings
//! timed, the pipelined ones faster the more stages they keep, the
//! ceiling a copy of 4 GiB at 4000 GB/s.

use super::kernel::KernelResources;
use super::{CopyPoint, KernelPipelineConfig, KernelPipelineResults, VariantResult};
use crate::testing::flat;

pub fn results() -> KernelPipelineResults {
    let config = KernelPipelineConfig::default();
    // A copy of `mib` MiB reading and writing it at `gbps`, ms.
    let copy_ms = |mib: usize, gbps: f64| 2.0 * (mib << 20) as f64 / (gbps * 1e6);
    let variants = config
        .variants()
        .into_iter()
        .map(|variant| {
            // 70% of the ceiling for one stage, up to 90% with more.
            let share = 0.7 + 0.05 * (variant.shape.stages.min(4) as f64);
            let ms = copy_ms(config.mib, 4000.0 * share);
            // 32 registers, 8 blocks fit; as many as fit where asked.
            let blocks_per_sm = variant.blocks_per_sm.min(8);
            let resources = KernelResources {
                registers: 32,
                static_smem: 64,
                dynamic_smem: 4 * variant.shape.tile * variant.shape.stages,
                local_bytes: 0,
                max_blocks_per_sm: 8,
                occupancy: 0.5,
                blocks_per_sm,
                grid: 132 * blocks_per_sm,
            };
            VariantResult { variant, skipped: None, resources: Some(resources), ms: Some(flat(ms)) }
        })
        .collect();
    KernelPipelineResults {
        copy_ms: flat(copy_ms(config.mib, 3900.0)),
        ceiling_sweep: vec![CopyPoint { mib: 4096, ms: flat(copy_ms(4096, 4000.0)) }],
        variants,
        round: None,
        warps: Vec::new(),
        config,
    }
}
