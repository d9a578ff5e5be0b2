//! Fixtures for tests (unit, integration, and the GPU-skipping ones).

use crate::gpu::{Fingerprint, PcieLink};
use std::path::PathBuf;

pub fn fingerprint() -> Fingerprint {
    Fingerprint {
        gpu_name: "Test GPU".into(),
        gpu_uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
        ordinal: 0,
        compute_capability: "9.0".into(),
        sm_count: 132,
        memory_bytes: 80 << 30,
        async_engine_count: 3,
        concurrent_kernels: true,
        driver_version: Some("580.0".into()),
        driver_cuda_version: "13.0".into(),
        build_cuda_version: "13.0".into(),
        pci_bus_id: "0000:3B:00.0".into(),
        pcie: Some(PcieLink {
            max_generation: 5,
            max_width: 16,
            current_generation: Some(5),
            current_width: Some(16),
            theoretical_gbps: PcieLink::lane_gbps(5).unwrap() * 16.0,
        }),
        host_cpu: "Test CPU".into(),
        host_cpus: 16,
    }
}

/// A fresh, empty directory under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("overlap-lab-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Set to 1 on a GPU machine: a GPU test that finds no GPU fails instead of
/// skipping, so a run that should have used the GPU cannot pass by skipping.
pub const REQUIRE_GPU_ENV: &str = "OVERLAP_LAB_REQUIRE_GPU";

/// Whether [`REQUIRE_GPU_ENV`] asks for a GPU.
pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// For GPU tests: the opened device, or None after saying why the test
/// skips. Panics (fails the test) instead when [`REQUIRE_GPU_ENV`] is set.
pub fn gpu_or_skip(test: &str) -> Option<crate::gpu::Gpu> {
    let avail = crate::gpu::Availability::probe();
    if !avail.is_ready() {
        skip_unless_required(test, &avail.reason());
        return None;
    }
    Some(crate::gpu::Gpu::open(0).expect("GPU present but could not be opened"))
}

/// Says `SKIPPED test: why`, or fails the test when a GPU is required.
pub fn skip_unless_required(test: &str, why: &str) {
    assert!(!gpu_required(), "{test}: {REQUIRE_GPU_ENV} is set but {why}");
    eprintln!("SKIPPED {test}: {why}");
}
