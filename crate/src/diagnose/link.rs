//! The host link's measured rates, from this machine's lab 1 recording
//! (`data/<gpu>/bandwidth.json`): what a traced copy's achieved rate is set
//! beside. The recording itself is the bandwidth lab's; whoever has it (the
//! command line, a notebook) hands its points over as [`LinkRates`], so
//! that reading a trace needs nothing of the labs.
//!
//! May use: `events` only.

use super::events::{Direction, HostMemory};
use serde::Serialize;

/// One measured point: copies of `bytes` from `host` memory, one way, ran
/// at `gbps` (GB/s, 1e9 bytes per second; the recording's median).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LinkPoint {
    pub host: HostMemory,
    pub direction: Direction,
    pub bytes: u64,
    pub gbps: f64,
}

/// A GPU's measured link rates, and where they were read from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LinkRates {
    /// The GPU they were measured on, as its fingerprint names it.
    pub gpu_name: String,
    /// The recording, as outputs name files (`data/nvidia-h100-80gb-hbm3/bandwidth.json`).
    pub source: String,
    pub points: Vec<LinkPoint>,
}

/// The rate a recording gives for copies like one of a trace's.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RecordedRate {
    pub host: HostMemory,
    pub gbps: f64,
    /// The recorded size it was measured at (the nearest to the copies').
    pub at_bytes: u64,
}

impl LinkRates {
    /// Whether these were measured on the GPU a trace names (the same name,
    /// ignoring case and spaces around it).
    pub fn matches(&self, gpu_name: &str) -> bool {
        self.gpu_name.trim().eq_ignore_ascii_case(gpu_name.trim())
    }

    /// The recorded rate of copies from `host` memory in `direction` at the
    /// recorded size nearest `bytes` (nearest by ratio: 3 MiB is nearer 4
    /// MiB than 1 MiB).
    pub fn rate(&self, host: HostMemory, direction: Direction, bytes: u64) -> Option<RecordedRate> {
        let ln = |b: u64| (b.max(1) as f64).ln();
        self.points
            .iter()
            .filter(|p| p.host == host && p.direction == direction && p.gbps > 0.0)
            .min_by(|a, b| (ln(a.bytes) - ln(bytes)).abs().total_cmp(&(ln(b.bytes) - ln(bytes)).abs()))
            .map(|p| RecordedRate { host, gbps: p.gbps, at_bytes: p.bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nearest_recorded_size_of_the_same_kind_answers() {
        let p = |host, direction, bytes, gbps| LinkPoint { host, direction, bytes, gbps };
        let rates = LinkRates {
            gpu_name: "NVIDIA H100 80GB HBM3".into(),
            source: "data/x/bandwidth.json".into(),
            points: vec![
                p(HostMemory::Pinned, Direction::H2d, 1 << 20, 40.0),
                p(HostMemory::Pinned, Direction::H2d, 4 << 20, 50.0),
                p(HostMemory::Pageable, Direction::H2d, 4 << 20, 20.0),
                p(HostMemory::Pinned, Direction::D2h, 4 << 20, 52.0),
            ],
        };
        assert!(rates.matches(" nvidia h100 80GB HBM3"));
        assert!(!rates.matches("NVIDIA H200"));
        assert_eq!(rates.rate(HostMemory::Pinned, Direction::H2d, 3 << 20).unwrap().gbps, 50.0);
        assert_eq!(rates.rate(HostMemory::Pinned, Direction::H2d, 1 << 19).unwrap().at_bytes, 1 << 20);
        assert_eq!(rates.rate(HostMemory::Pageable, Direction::H2d, 64 << 20).unwrap().gbps, 20.0);
        assert_eq!(rates.rate(HostMemory::Pageable, Direction::D2h, 1 << 20), None);
    }
}
