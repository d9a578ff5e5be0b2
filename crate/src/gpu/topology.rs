//! What GPUs this machine has and how each pair reaches the other: can
//! one map the other's memory (peer access), the driver's performance rank
//! of the path, whether atomics work across it, and the link itself —
//! NVLink (with how many links) or PCIe — read from NVML where the driver
//! ships it. Lab 8 starts here; with one GPU or none it says so and
//! carries on with recorded data.

use super::driver::{self, P2pAttr};
use crate::error::Result;
use serde::{Deserialize, Serialize};

/// One GPU as discovered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuSummary {
    pub ordinal: usize,
    pub name: String,
    pub pci_bus_id: String,
}

/// How data moves between two GPUs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkKind {
    /// `links` NVLink links join the two (NV18 in `nvidia-smi topo -m`):
    /// straight from one GPU to the other, or, with `switched`, from each
    /// GPU to the NVSwitches that join every GPU of the board (an HGX
    /// board's GPUs reach each other that way).
    NvLink {
        links: u32,
        #[serde(default)]
        switched: bool,
    },
    /// Through PCIe (and the host bridges between).
    Pcie,
    /// NVML could not tell (`why`).
    Unknown { why: String },
}

impl std::fmt::Display for LinkKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkKind::NvLink { links, switched: false } => write!(f, "NVLink x{links}"),
            LinkKind::NvLink { links, switched: true } => write!(f, "NVLink x{links} via NVSwitch"),
            LinkKind::Pcie => write!(f, "PCIe"),
            LinkKind::Unknown { why } => write!(f, "unknown ({why})"),
        }
    }
}

/// The path from one GPU to another.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerPath {
    pub from: usize,
    pub to: usize,
    /// cuDeviceCanAccessPeer: `from` can map `to`'s memory once peer
    /// access is enabled (without it, a copy between them is staged
    /// through host memory).
    pub can_access: bool,
    /// CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: lower is faster.
    pub performance_rank: i32,
    /// CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED.
    pub native_atomics: bool,
    pub link: LinkKind,
}

/// Every GPU and every ordered pair of them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    pub gpus: Vec<GpuSummary>,
    pub paths: Vec<PeerPath>,
}

impl Topology {
    /// Reads it from the driver (and NVML, for the links). With no driver:
    /// the crate's no-driver error.
    pub fn discover() -> Result<Topology> {
        if !driver::driver_present() {
            return Err(crate::LabError::NoDriver);
        }
        let n = driver::device_count()?;
        let devs: Vec<driver::CUdevice> = (0..n).map(driver::device).collect::<Result<_>>()?;
        let gpus: Vec<GpuSummary> = devs
            .iter()
            .enumerate()
            .map(|(ordinal, &d)| Ok(GpuSummary { ordinal, name: driver::device_name(d)?, pci_bus_id: driver::pci_bus_id(d)? }))
            .collect::<Result<_>>()?;
        let links = links::Reader::open();
        let mut paths = Vec::new();
        for (i, &a) in devs.iter().enumerate() {
            for (j, &b) in devs.iter().enumerate().filter(|&(j, _)| j != i) {
                paths.push(PeerPath {
                    from: i,
                    to: j,
                    can_access: driver::can_access_peer(a, b)?,
                    performance_rank: driver::p2p_attribute(a, b, P2pAttr::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)?,
                    native_atomics: driver::p2p_attribute(a, b, P2pAttr::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)? != 0,
                    link: links.between(&gpus[i].pci_bus_id, &gpus[j].pci_bus_id, &gpus),
                });
            }
        }
        Ok(Topology { gpus, paths })
    }

    /// The path from GPU `from` to GPU `to`.
    pub fn path(&self, from: usize, to: usize) -> Option<&PeerPath> {
        self.paths.iter().find(|p| p.from == from && p.to == to)
    }

    /// The GPUs and the peer-access matrix as text: a row per GPU, a
    /// column per peer ("NVLink x18, peer" / "PCIe, no peer" / "-").
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for g in &self.gpus {
            out.push_str(&format!("GPU {}: {} ({})\n", g.ordinal, g.name, g.pci_bus_id));
        }
        match self.gpus.len() {
            0 => out.push_str("no GPU\n"),
            1 => out.push_str("one GPU: no peer to copy to (lab 8's peer copies, pipeline and all-reduce need two)\n"),
            _ => {
                let cell = |i: usize, j: usize| match self.path(i, j) {
                    None => "-".to_string(),
                    Some(p) => format!("{}, {}", p.link, if p.can_access { "peer" } else { "no peer" }),
                };
                let width = self.paths.iter().map(|p| cell(p.from, p.to).len()).max().unwrap_or(1).max(6);
                out.push_str(&format!("{:>8}", "from\\to"));
                for j in 0..self.gpus.len() {
                    out.push_str(&format!("  {:<width$}", format!("GPU {j}")));
                }
                out.push('\n');
                for i in 0..self.gpus.len() {
                    out.push_str(&format!("{:>8}", format!("GPU {i}")));
                    for j in 0..self.gpus.len() {
                        out.push_str(&format!("  {:<width$}", cell(i, j)));
                    }
                    out.push('\n');
                }
            }
        }
        out
    }
}

/// The links between GPUs, from NVML (libnvidia-ml, shipped with the driver).
mod links {
    use super::LinkKind;
    use nvml_wrapper::Nvml;

    /// NVML_NVLINK_MAX_LINKS of nvml.h (18 on Hopper).
    const NVLINK_MAX_LINKS: u32 = 18;

    pub struct Reader(std::result::Result<Nvml, String>);

    impl Reader {
        pub fn open() -> Reader {
            Reader(Nvml::init().map_err(|e| format!("NVML: {e}")))
        }

        /// The link from the GPU at PCI bus id `a` to the one at `b`, among
        /// this machine's `gpus`.
        pub fn between(&self, a: &str, b: &str, gpus: &[super::GpuSummary]) -> LinkKind {
            let nvml = match &self.0 {
                Ok(n) => n,
                Err(why) => return LinkKind::Unknown { why: why.clone() },
            };
            let unknown = |e: nvml_wrapper::error::NvmlError| LinkKind::Unknown { why: format!("NVML: {e}") };
            let dev = match nvml.device_by_pci_bus_id(a) {
                Ok(d) => d,
                Err(e) => return unknown(e),
            };
            // Sort the active links by their far end: `b`, another GPU, or
            // neither (an NVSwitch: its PCI id is no GPU's, or NVML does
            // not give one).
            let (mut direct, mut to_switch) = (0, 0);
            for l in 0..NVLINK_MAX_LINKS {
                let link = dev.link_wrapper_for(l);
                if !link.is_active().unwrap_or(false) {
                    continue;
                }
                match link.remote_pci_info() {
                    Ok(p) if same_bus(&p.bus_id, b) => direct += 1,
                    Ok(p) if gpus.iter().any(|g| same_bus(&p.bus_id, &g.pci_bus_id)) => {}
                    _ => to_switch += 1,
                }
            }
            // Whether the driver says the pair talks over NVLink (through
            // the switches, for a board that has them).
            let nvlink_pair = to_switch > 0
                && nvml.device_by_pci_bus_id(b).is_ok_and(|other| {
                    dev.p2p_status(&other, nvml_wrapper::enum_wrappers::device::P2pCapabilitiesIndex::NvLink)
                        .is_ok_and(|s| s == nvml_wrapper::enum_wrappers::device::P2pStatus::Ok)
                });
            classify(direct, to_switch, nvlink_pair)
        }
    }

    /// The link, from what NVML says of the first GPU's active links:
    /// `direct` of them end at the other GPU, `to_switch` at an NVSwitch,
    /// and `nvlink_pair` says whether the driver calls the pair
    /// NVLink-capable. Links to a switch count only for a pair the switches
    /// join (a GPU may hang off switches its peer does not).
    pub fn classify(direct: u32, to_switch: u32, nvlink_pair: bool) -> LinkKind {
        if direct > 0 {
            LinkKind::NvLink { links: direct, switched: false }
        } else if to_switch > 0 && nvlink_pair {
            LinkKind::NvLink { links: to_switch, switched: true }
        } else {
            LinkKind::Pcie
        }
    }

    /// Whether two PCI bus ids name one device (NVML writes 8 hex digits
    /// of domain, the CUDA driver 4, and their cases may differ).
    pub fn same_bus(a: &str, b: &str) -> bool {
        let norm = |s: &str| {
            let s = s.trim().to_ascii_lowercase();
            match s.split_once(':') {
                Some((domain, rest)) => format!("{:0>8}:{rest}", domain.trim_start_matches('0')),
                None => s,
            }
        };
        norm(a) == norm(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two() -> Topology {
        let gpu = |ordinal: usize| GpuSummary { ordinal, name: "NVIDIA H200".into(), pci_bus_id: format!("0000:{:02X}:00.0", 0x18 + ordinal) };
        let path = |from, to| PeerPath {
            from,
            to,
            can_access: true,
            performance_rank: 0,
            native_atomics: true,
            link: LinkKind::NvLink { links: 18, switched: false },
        };
        Topology { gpus: vec![gpu(0), gpu(1)], paths: vec![path(0, 1), path(1, 0)] }
    }

    #[test]
    fn the_matrix_names_each_link_and_one_gpu_says_what_it_cannot_show() {
        let t = two();
        let text = t.describe();
        assert!(text.contains("GPU 0: NVIDIA H200 (0000:18:00.0)"), "{text}");
        assert!(text.contains("NVLink x18, peer"), "{text}");
        assert_eq!(t.path(1, 0).map(|p| p.from), Some(1));
        assert!(t.path(0, 0).is_none());
        let one = Topology { gpus: vec![t.gpus[0].clone()], paths: vec![] };
        assert!(one.describe().contains("one GPU: no peer"), "{}", one.describe());
        let back: Topology = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back, t);
        assert_eq!(LinkKind::Unknown { why: "NVML: not found".into() }.to_string(), "unknown (NVML: not found)");
    }

    #[test]
    fn links_to_nvswitches_join_a_pair_the_driver_calls_nvlink() {
        // Two GPUs wired to each other (NVLink bridge) or to NVSwitches (an HGX board).
        assert_eq!(links::classify(4, 0, false), LinkKind::NvLink { links: 4, switched: false });
        assert_eq!(links::classify(0, 18, true), LinkKind::NvLink { links: 18, switched: true });
        assert_eq!(LinkKind::NvLink { links: 18, switched: true }.to_string(), "NVLink x18 via NVSwitch");
        // Switches the peer is not on, or no NVLink at all: PCIe.
        assert_eq!(links::classify(0, 18, false), LinkKind::Pcie);
        assert_eq!(links::classify(0, 0, true), LinkKind::Pcie);
        // Recordings made before `switched` read as a direct link.
        let old: LinkKind = serde_json::from_str(r#"{"nv-link":{"links":18}}"#).unwrap();
        assert_eq!(old, LinkKind::NvLink { links: 18, switched: false });
    }

    #[test]
    fn pci_bus_ids_compare_across_nvml_and_cuda_spellings() {
        assert!(links::same_bus("00000000:18:00.0", "0000:18:00.0"));
        assert!(links::same_bus("0000:AB:00.0", "00000000:ab:00.0"));
        assert!(!links::same_bus("0000:18:00.0", "0000:19:00.0"));
    }

    #[test]
    fn with_no_driver_discovery_is_the_no_driver_error() {
        if driver::driver_present() {
            let t = Topology::discover().unwrap();
            assert_eq!(t.paths.len(), t.gpus.len() * t.gpus.len().saturating_sub(1));
        } else {
            assert!(matches!(Topology::discover(), Err(crate::LabError::NoDriver)));
        }
    }
}
