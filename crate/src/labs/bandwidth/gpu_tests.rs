//! Lab 1's tests on a GPU. Each says SKIPPED with no GPU (`testing::gpu_or_skip`)
//! and fails instead where `OVERLAP_LAB_REQUIRE_GPU` asks for one; the GPU
//! tests of no one lab are in `crate/tests/gpu.rs`.

use crate::gpu::{alloc_host, HostMemoryKind};
use crate::labs::bandwidth::{measure, BandwidthConfig, Direction};
use crate::present::progress::ProgressMode;
use crate::testing::gpu_or_skip;
use crate::{Bytes, LabError};

#[test]
fn small_sweep_verifies_every_point() {
    let Some(gpu) = gpu_or_skip("small_sweep_verifies_every_point") else {
        return;
    };
    let cfg = BandwidthConfig { min_bytes: Bytes(4096), max_bytes: Bytes(8 << 20), warmup: 1, repeats: 3, pin_cost_repeats: 2, ..BandwidthConfig::default() };
    let r = measure::run(&gpu, &cfg, ProgressMode::Quiet).unwrap();
    assert_eq!(r.transfers.len(), 4 * 3 * cfg.sizes().len());
    for p in &r.transfers {
        assert_eq!(p.verified_samples, 4, "{p:?}");
        assert!(p.gbps.median > 0.0 && p.gbps.min <= p.gbps.median && p.gbps.median <= p.gbps.max);
        assert_eq!(p.device_ms.n, 3);
        // At 1 MiB and the largest size, the same copies by plain driver calls too.
        assert_eq!(p.plain.is_some(), cfg.plain_sizes().contains(&p.bytes), "{p:?}");
        // How the lab's copies compare with plain driver calls is the
        // sweep's to print (lab 1's plain table), not a test's to assert.
        if let Some(q) = &p.plain {
            assert_eq!(q.device_ms.n, 3);
            println!("{} {} {}: lab / plain driver calls {:.2}", p.kind, p.direction, p.bytes, p.device_ms.median / q.device_ms.median);
        }
    }
    let bidir = r.point(HostMemoryKind::Pinned, Direction::Bidirectional, Bytes(8 << 20)).unwrap();
    let h2d = r.point(HostMemoryKind::Pinned, Direction::H2d, Bytes(8 << 20)).unwrap();
    println!("8 MiB pinned: both ways {:.1} GB/s, H2D {:.1} GB/s", bidir.gbps.median, h2d.gbps.median);
    assert_eq!(r.pin_cost.len(), cfg.pin_cost_sizes().len());
}

#[test]
fn absurd_sizes_are_clear_errors() {
    let Some(gpu) = gpu_or_skip("absurd_sizes_are_clear_errors") else {
        return;
    };
    let e = gpu.alloc(1 << 50).err().expect("1 PiB cannot be allocated");
    assert!(matches!(e, LabError::OutOfMemory { .. }), "{e}");
    let e = gpu.ensure_free(1 << 50, "a test").unwrap_err();
    assert!(e.to_string().contains("only"), "{e}");
    let big = BandwidthConfig { max_bytes: Bytes(60 << 30), kinds: vec![HostMemoryKind::Pinned], ..BandwidthConfig::default() };
    let (free, _) = gpu.memory_info().unwrap();
    if 2 * (60u64 << 30) > free {
        let e = measure::run(&gpu, &big, ProgressMode::Quiet).unwrap_err();
        assert!(e.to_string().contains("device memory"), "{e}");
    }
    assert!(matches!(alloc_host(&gpu, HostMemoryKind::Pinned, 0), Err(LabError::Config(_))));
}
