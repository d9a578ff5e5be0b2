//! What the results were measured on. Recorded with every result so a number
//! never travels without its machine. The GPU's part is read from the
//! driver by `gpu` (`Gpu::fingerprint`); the host's and the PCIe link's
//! from the OS, here.

use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fingerprint {
    pub gpu_name: String,
    pub gpu_uuid: String,
    pub ordinal: usize,
    pub compute_capability: String,
    pub sm_count: u32,
    pub memory_bytes: u64,
    /// CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: copy engines usable at once.
    pub async_engine_count: u32,
    pub concurrent_kernels: bool,
    /// The kernel driver's version (e.g. "580.95.05"), when the OS exposes it.
    pub driver_version: Option<String>,
    /// Highest CUDA version the driver supports (cuDriverGetVersion).
    pub driver_cuda_version: String,
    /// CUDA API version this crate was built against (cargo feature).
    pub build_cuda_version: String,
    pub pci_bus_id: String,
    pub pcie: Option<PcieLink>,
    pub host_cpu: String,
    pub host_cpus: usize,
}

/// The PCIe link between host and GPU, read from sysfs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PcieLink {
    pub max_generation: u32,
    pub max_width: u32,
    /// At the moment of reading; an idle GPU may train its link down.
    pub current_generation: Option<u32>,
    pub current_width: Option<u32>,
    /// Theoretical bytes per second per direction at max generation and width,
    /// after line encoding (GB/s, 1e9 bytes).
    pub theoretical_gbps: f64,
}

impl PcieLink {
    /// GB/s per lane per direction after encoding (8b/10b up to Gen2,
    /// 128b/130b for Gen3-5, 242B/256B FLITs for Gen6).
    pub fn lane_gbps(generation: u32) -> Option<f64> {
        Some(match generation {
            1 => 2.5 * 8.0 / 10.0 / 8.0,
            2 => 5.0 * 8.0 / 10.0 / 8.0,
            3 => 8.0 * 128.0 / 130.0 / 8.0,
            4 => 16.0 * 128.0 / 130.0 / 8.0,
            5 => 32.0 * 128.0 / 130.0 / 8.0,
            6 => 64.0 * 242.0 / 256.0 / 8.0,
            _ => return None,
        })
    }

    /// "32.0 GT/s PCIe" -> 5.
    pub fn generation_from_speed(speed: &str) -> Option<u32> {
        let gts: f64 = speed.split_whitespace().next()?.parse().ok()?;
        [(2.5, 1), (5.0, 2), (8.0, 3), (16.0, 4), (32.0, 5), (64.0, 6)].iter().find(|(g, _)| (gts - g).abs() < 0.01).map(|&(_, n)| n)
    }

    /// Reads `max_link_*` and `current_link_*` from a PCI device's sysfs dir.
    pub fn from_sysfs(dir: &Path) -> Option<PcieLink> {
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok().map(|s| s.trim().to_string());
        let max_generation = Self::generation_from_speed(&read("max_link_speed")?)?;
        let max_width: u32 = read("max_link_width")?.parse().ok()?;
        let theoretical_gbps = Self::lane_gbps(max_generation)? * max_width as f64;
        Some(PcieLink {
            max_generation,
            max_width,
            current_generation: read("current_link_speed").and_then(|s| Self::generation_from_speed(&s)),
            current_width: read("current_link_width").and_then(|s| s.parse().ok()),
            theoretical_gbps,
        })
    }
}

/// "0000:3B:00.0" or "00000000:3B:00.0" -> "0000:3b:00.0" (sysfs spelling).
pub fn sysfs_bus_id(bus_id: &str) -> String {
    let lower = bus_id.to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => format!("{}:{rest}", &domain[domain.len() - 4..]),
        _ => lower,
    }
}

pub(crate) fn cuda_version_string(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

pub fn build_cuda_version() -> &'static str {
    if cfg!(feature = "cuda-12") {
        "12.8"
    } else {
        "13.0"
    }
}

pub(crate) fn host_cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).map(|m| m.trim().to_string()))
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

pub(crate) fn kernel_driver_version() -> Option<String> {
    if let Ok(v) = std::fs::read_to_string("/sys/module/nvidia/version") {
        return Some(v.trim().to_string());
    }
    // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  ..."
    let s = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    let line = s.lines().next()?;
    let after = line.split("Kernel Module").nth(1)?;
    after.split_whitespace().next().map(str::to_string)
}

impl Fingerprint {
    /// A GPU that does not exist ("Test GPU", an H100-like card): what
    /// results made up for tests, with no GPU, are said to come from.
    pub fn made_up() -> Fingerprint {
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
                theoretical_gbps: PcieLink::lane_gbps(5).unwrap_or(0.0) * 16.0,
            }),
            host_cpu: "Test CPU".into(),
            host_cpus: 16,
        }
    }

    /// A directory-safe name for the device, e.g. "nvidia-h100-80gb-hbm3".
    pub fn slug(&self) -> String {
        crate::units::slug(&self.gpu_name)
    }

    /// A short table for humans (CLI `device`, notebook banners).
    pub fn describe(&self) -> String {
        let link = match &self.pcie {
            Some(l) => format!(
                "PCIe Gen{} x{} (now Gen{} x{}), {:.1} GB/s per direction in theory",
                l.max_generation,
                l.max_width,
                l.current_generation.map_or("?".into(), |g| g.to_string()),
                l.current_width.map_or("?".into(), |w| w.to_string()),
                l.theoretical_gbps
            ),
            None => "PCIe link unknown (no sysfs entry)".into(),
        };
        format!(
            "GPU {}: {} (sm_{}; {} SMs; {})\n  uuid {}, PCI {}\n  copy engines (async engine count): {}; concurrent kernels: {}\n  driver {} (CUDA {}), built for CUDA {}\n  {}\n  host: {} ({} CPUs)",
            self.ordinal,
            self.gpu_name,
            self.compute_capability.replace('.', ""),
            self.sm_count,
            Bytes(self.memory_bytes),
            self.gpu_uuid,
            self.pci_bus_id,
            self.async_engine_count,
            if self.concurrent_kernels { "yes" } else { "no" },
            self.driver_version.as_deref().unwrap_or("?"),
            self.driver_cuda_version,
            self.build_cuda_version,
            link,
            self.host_cpu,
            self.host_cpus
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcie_generations_and_rates() {
        assert_eq!(PcieLink::generation_from_speed("32.0 GT/s PCIe"), Some(5));
        assert_eq!(PcieLink::generation_from_speed("2.5 GT/s PCIe"), Some(1));
        assert_eq!(PcieLink::generation_from_speed("Unknown"), None);
        let gen5x16 = PcieLink::lane_gbps(5).unwrap() * 16.0;
        assert!((gen5x16 - 63.015).abs() < 0.01, "{gen5x16}");
        let gen4x16 = PcieLink::lane_gbps(4).unwrap() * 16.0;
        assert!((gen4x16 - 31.51).abs() < 0.01, "{gen4x16}");
    }

    #[test]
    fn reads_link_from_a_sysfs_like_dir() {
        let dir = std::env::temp_dir().join(format!("ol-sysfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (f, v) in
            [("max_link_speed", "32.0 GT/s PCIe\n"), ("max_link_width", "16\n"), ("current_link_speed", "2.5 GT/s PCIe\n"), ("current_link_width", "16\n")]
        {
            std::fs::write(dir.join(f), v).unwrap();
        }
        let link = PcieLink::from_sysfs(&dir).unwrap();
        assert_eq!((link.max_generation, link.max_width, link.current_generation), (5, 16, Some(1)));
        assert!((link.theoretical_gbps - 63.015).abs() < 0.01);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(PcieLink::from_sysfs(&dir).is_none());
    }

    #[test]
    fn bus_ids_and_slugs() {
        assert_eq!(sysfs_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
        assert_eq!(sysfs_bus_id("0000:3B:00.0"), "0000:3b:00.0");
        let mut f = crate::testing::fingerprint();
        f.gpu_name = "NVIDIA H100 80GB HBM3".into();
        assert_eq!(f.slug(), "nvidia-h100-80gb-hbm3");
        assert!(f.describe().contains("PCIe Gen5 x16"));
    }
}
