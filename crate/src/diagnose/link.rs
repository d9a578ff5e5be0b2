//! The host link's measured rates, from this machine's lab 1 recording
//! (`data/<gpu>/bandwidth.json`): what a traced copy's achieved rate is set
//! beside. The recording itself is the bandwidth lab's; whoever has it (the
//! command line, a notebook) hands its points over as [`LinkRates`], so
//! that reading a trace needs nothing of the labs.
//!
//! A trace from a GPU with no recording here (a stranger's A100) is still
//! priced ([`assumed_rates`]): by its own pinned copies where it has some,
//! else by the typical pinned rate of the PCIe link its GPU sits on
//! ([`TypicalLink`]), always said to be an assumption, with the command
//! that measures the real one ([`MEASURE_LINK`]).
//!
//! May use: `events` only (and `units`, to write a size and find the
//! nearest recorded one).

use super::events::{Direction, GpuOpKind, HostMemory, Trace};
use crate::units::Bytes;
use serde::Serialize;

/// The one line that measures a machine's link and records it where
/// `overlap-lab diagnose` reads it (lab 1's full sweep, into `data/`).
pub const MEASURE_LINK: &str = "overlap-lab all --preset full --labs bandwidth";

/// A pinned copy's rate one way on a PCIe x16 link of each generation,
/// large copies, GB/s: typical figures, not measured on the trace's GPU.
/// Gen5 is this repository's own: lab 1 on an H200 and an H100 (both
/// Gen5 x16) recorded 53-55 GB/s from 4 MiB up, 55.4 and 55.0 GB/s H2D at
/// 1 GiB (`data/nvidia-h200/bandwidth.json`,
/// `data/nvidia-h100-80gb-hbm3/bandwidth.json`). Gen4 and Gen3 are the
/// commonly published figures (CUDA's `bandwidthTest` on A100 and V100
/// PCIe hosts reports about 24-26 and 11-13 GB/s pinned): ~25 and ~12.
const TYPICAL_X16_GBPS: [(u8, f64); 3] = [(3, 12.0), (4, 25.0), (5, 55.0)];

/// The generation assumed where neither the trace nor [`GPU_LINKS`] names
/// one: Gen4, the link of most GPUs in use today (A100, L4, L40, RTX 30
/// and 40 series).
const DEFAULT_GENERATION: u8 = 4;

/// GPU families and the PCIe generation of their host link, by a piece of
/// the name a trace gives (lower case; the first that matches answers).
/// Coarse on purpose: a family's parts share a generation.
const GPU_LINKS: [(&str, u8); 21] = [
    // Before "rtx 50": the RTX 5000 Ada is a Gen4 card.
    ("ada generation", 4),
    ("h100", 5),
    ("h200", 5),
    ("b200", 5),
    ("b100", 5),
    ("rtx 50", 5),
    ("blackwell", 5),
    ("a100", 4),
    ("a10", 4),
    ("a30", 4),
    ("a40", 4),
    ("l40", 4),
    ("l4", 4),
    ("rtx 30", 4),
    ("rtx 40", 4),
    ("rtx a", 4),
    ("v100", 3),
    ("t4", 3),
    ("p100", 3),
    ("rtx 20", 3),
    ("titan v", 3),
];

/// A copy's fixed cost besides its bytes, µs, each way: what lab 1's 4 KiB
/// pinned copies on an H200 took beyond 4 KiB at the link's full rate
/// (2.5 µs H2D, 1.55 µs D2H). Small copies run well under the link's rate.
fn fixed_cost_us(direction: Direction) -> f64 {
    match direction {
        Direction::H2d => 2.5,
        _ => 1.55,
    }
}

/// The host link a GPU is assumed to sit on, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct TypicalLink {
    pub generation: u8,
    /// Large pinned copies' rate one way, GB/s.
    pub gbps: f64,
    /// Whether the GPU's name placed it (the table of GPU families), not the default.
    pub from_name: bool,
}

impl TypicalLink {
    /// The link of the GPU named `gpu_name` (none: the default).
    pub fn of(gpu_name: Option<&str>) -> TypicalLink {
        let named = gpu_name.and_then(|n| {
            let n = n.to_ascii_lowercase();
            GPU_LINKS.iter().find(|(piece, _)| n.contains(piece)).map(|&(_, g)| g)
        });
        let generation = named.unwrap_or(DEFAULT_GENERATION);
        let gbps = TYPICAL_X16_GBPS.iter().find(|(g, _)| *g == generation).map_or(25.0, |&(_, r)| r);
        TypicalLink { generation, gbps, from_name: named.is_some() }
    }

    /// The rate of a pinned copy of `bytes` one way: its fixed cost, then
    /// its bytes at the link's rate, GB/s.
    pub fn rate(&self, direction: Direction, bytes: u64) -> f64 {
        let b = bytes.max(1) as f64;
        b / (fixed_cost_us(direction) + b / (self.gbps * 1e3)) / 1e3
    }
}

/// Sizes the typical rate is written at: 4 KiB to 1 GiB, by doubling.
fn typical_sizes() -> impl Iterator<Item = u64> {
    (12..=30).map(|p| 1u64 << p)
}

/// Each (direction, size) of the trace's own pinned copies across the host
/// link, at the rate they ran (bytes over time, added up), GB/s.
fn traced_pinned_points(trace: &Trace) -> Vec<LinkPoint> {
    let mut points: Vec<(Direction, u64, u64, f64)> = Vec::new();
    for o in &trace.gpu_ops {
        let GpuOpKind::Copy { direction, host: Some(HostMemory::Pinned) } = o.kind else { continue };
        let (Some(bytes), t) = (o.bytes, o.duration_us()) else { continue };
        if !direction.crosses_host_link() || bytes == 0 || t <= 0.0 {
            continue;
        }
        match points.iter_mut().find(|p| p.0 == direction && p.1 == bytes) {
            Some(p) => (p.2, p.3) = (p.2 + bytes, p.3 + t),
            None => points.push((direction, bytes, bytes, t)),
        }
    }
    points.into_iter().map(|(direction, bytes, total, t)| LinkPoint { host: HostMemory::Pinned, direction, bytes, gbps: total as f64 / t / 1e3 }).collect()
}

/// The pinned rates to price `trace`'s fixes by where no recording of its
/// GPU is here: its own pinned copies at the sizes they ran (and within a
/// factor of two of them), else the typical rate of its GPU's link
/// ([`TypicalLink`]). The source says which, that it is an assumption,
/// and how to measure the real rate.
pub fn assumed_rates(trace: &Trace) -> LinkRates {
    let gpu_name = trace.first_gpu_name();
    let link = TypicalLink::of(gpu_name);
    let traced = traced_pinned_points(trace);
    // A typical point only where no traced one of that direction is within 4x.
    let near_traced = |direction: Direction, bytes: u64| traced.iter().any(|p| p.direction == direction && (p.bytes as f64 / bytes as f64).log2().abs() < 2.0);
    let typical = [Direction::H2d, Direction::D2h].into_iter().flat_map(|direction| {
        let link = &link;
        typical_sizes().filter(move |&b| !near_traced(direction, b)).map(move |bytes| LinkPoint {
            host: HostMemory::Pinned,
            direction,
            bytes,
            gbps: link.rate(direction, bytes),
        })
    });
    let points: Vec<LinkPoint> = traced.iter().copied().chain(typical).collect();
    let why = match (link.from_name, gpu_name) {
        (true, Some(n)) => format!("which an {n} sits on"),
        (_, Some(n)) => format!("assumed for an {n}, a GPU this program does not place"),
        _ => "assumed: the trace names no GPU".into(),
    };
    let typical = format!(
        "a typical PCIe Gen{} x16 link, ~{:.0} GB/s pinned each way for large copies ({why}; an assumption: no rates of this GPU are measured here, measure them on its machine with `{MEASURE_LINK}`)",
        link.generation, link.gbps
    );
    let source = if traced.is_empty() {
        typical
    } else {
        let own: Vec<String> = traced.iter().map(|p| format!("{} {} at {:.1} GB/s", p.direction, Bytes(p.bytes), p.gbps)).collect();
        format!("this trace's own pinned copies ({}); other sizes and directions from {typical}", own.join(", "))
    };
    LinkRates { gpu_name: gpu_name.unwrap_or("").to_string(), source, points }
}

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
        same_gpu(&self.gpu_name, gpu_name)
    }

    /// The recorded rate of copies from `host` memory in `direction` at the
    /// recorded size nearest `bytes` (nearest by ratio: 3 MiB is nearer 4
    /// MiB than 1 MiB).
    pub fn rate(&self, host: HostMemory, direction: Direction, bytes: u64) -> Option<RecordedRate> {
        let points = self.points.iter().filter(|p| p.host == host && p.direction == direction && p.gbps > 0.0);
        crate::units::nearest_by_ratio(points, |p| p.bytes, bytes).map(|p| RecordedRate { host, gbps: p.gbps, at_bytes: p.bytes })
    }
}

/// Whether a recording's GPU (as its fingerprint names it) is the one a
/// trace names: the same name, ignoring case and spaces around it.
pub fn same_gpu(recorded: &str, traced: &str) -> bool {
    recorded.trim().eq_ignore_ascii_case(traced.trim())
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
