//! Lab 1's fixture: a made-up sweep with round numbers (no GPU ran it),
//! for its checker's unit tests and the table's check of every lab's parts.

use super::{BandwidthConfig, BandwidthResults, Direction, TransferPoint};
use crate::gpu::HostMemoryKind;
use crate::lab_kit::host_memory::PinCostPoint;
use crate::testing::flat;

/// A synthetic sweep: pinned = 5 µs + bytes/50 GB/s each way; pageable
/// = 10 µs + bytes/10 GB/s up, /15 GB/s down; pinning priced at 1 GiB.
pub fn results() -> BandwidthResults {
    let cfg = BandwidthConfig::default();
    let mut transfers = Vec::new();
    for bytes in cfg.sizes() {
        for (kind, lat_us, up, down) in
            [(HostMemoryKind::Pinned, 5.0, 50.0, 50.0), (HostMemoryKind::Pageable, 10.0, 10.0, 15.0), (HostMemoryKind::Registered, 5.0, 50.0, 50.0)]
        {
            for (direction, gbps) in [(Direction::H2d, up), (Direction::D2h, down)] {
                let ms = lat_us * 1e-3 + bytes.0 as f64 / (gbps * 1e9) * 1e3;
                transfers.push(TransferPoint {
                    kind,
                    direction,
                    bytes,
                    copies_per_sample: 1,
                    device_ms: flat(ms),
                    host_call_ms: flat(if kind == HostMemoryKind::Pageable { ms } else { 0.005 }),
                    gbps: flat(bytes.0 as f64 / (ms * 1e-3) / 1e9),
                    gated: kind != HostMemoryKind::Pageable,
                    verified_samples: 1,
                    plain: None,
                });
            }
        }
    }
    BandwidthResults { config: cfg, transfers, pin_cost: vec![PinCostPoint::made_up()] }
}
