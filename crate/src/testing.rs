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

/// For GPU tests: the opened device, or None after saying why the test skips.
pub fn gpu_or_skip(test: &str) -> Option<crate::gpu::Gpu> {
    let avail = crate::gpu::Availability::probe();
    if !avail.is_ready() {
        eprintln!("SKIPPED {test}: {}", avail.reason());
        return None;
    }
    Some(crate::gpu::Gpu::open(0).expect("GPU present but could not be opened"))
}
