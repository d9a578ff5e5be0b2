//! Lab 1: pinned vs pageable transfers.
//!
//! Copies from pageable memory are staged by the driver through its own pinned
//! bounce buffers, so they are slower and the "async" call blocks the CPU.
//! Page-locked memory lets the copy engine DMA directly, but pinning costs
//! time up front. This lab sweeps sizes x directions x host memory kinds,
//! shows both clocks (CPU blocked vs device busy) and prices pinning.

pub mod charts;
pub mod exercise;
#[doc(hidden)]
pub mod fixture;
#[cfg(test)]
mod gpu_tests;
pub mod measure;
pub mod model;
#[cfg(test)]
mod recorded_tests;

use crate::error::{LabError, Result};
use crate::gpu::HostMemoryKind;
use crate::lab_kit::host_memory;
pub use crate::lab_kit::host_memory::{AcquireCost, PinCostPoint};
use crate::measure::stats::Summary;
use crate::units::{Bytes, GIB, KIB};
use serde::{Deserialize, Serialize};

pub const LAB: &str = "bandwidth";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Direction {
    /// Host to device.
    H2d,
    /// Device to host.
    D2h,
    /// H2D and D2H at once, on two streams.
    #[value(alias = "bidir")]
    Bidirectional,
}

impl Direction {
    pub const ALL: [Direction; 3] = [Direction::H2d, Direction::D2h, Direction::Bidirectional];
    pub fn label(self) -> &'static str {
        match self {
            Direction::H2d => "H2D",
            Direction::D2h => "D2H",
            Direction::Bidirectional => "bidirectional",
        }
    }
    pub fn uploads(self) -> bool {
        self != Direction::D2h
    }
    pub fn downloads(self) -> bool {
        self != Direction::H2d
    }
    /// Bytes over the link per copy of `bytes` (both ways for bidirectional).
    pub fn bytes_moved(self, bytes: u64) -> u64 {
        if self == Direction::Bidirectional {
            2 * bytes
        } else {
            bytes
        }
    }
}

impl std::fmt::Display for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// Largest buffer the lab accepts: beyond this a typo is more likely than intent.
pub const MAX_BYTES: u64 = 64 * GIB;

/// Lab 1's settings; `overlap-lab bandwidth` takes each as an option.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct BandwidthConfig {
    /// GPU ordinal (the command line's `--device`).
    #[arg(skip)]
    pub device: usize,
    /// Smallest copy (each next one --size-factor times larger): bytes, or
    /// with a unit (4KiB, 1.5MiB; K, M, G are powers of 1024).
    #[arg(long = "min", value_name = "SIZE", value_parser = crate::units::size_option, default_value_t = BandwidthConfig::default().min_bytes)]
    pub min_bytes: Bytes,
    /// Largest copy: bytes, or with a unit (1GiB).
    #[arg(long = "max", value_name = "SIZE", value_parser = crate::units::size_option, default_value_t = BandwidthConfig::default().max_bytes)]
    pub max_bytes: Bytes,
    /// Each size this many times the one before (2: every power of two; 4
    /// keeps 4 KiB, 1 MiB and 1 GiB with half the points).
    #[arg(long, default_value_t = BandwidthConfig::default().size_factor)]
    #[serde(default = "every_power_of_two")]
    pub size_factor: u64,
    /// Host memory kinds, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = BandwidthConfig::default().kinds)]
    pub kinds: Vec<HostMemoryKind>,
    /// Directions, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = BandwidthConfig::default().directions)]
    pub directions: Vec<Direction>,
    /// Untimed samples first.
    #[arg(long, default_value_t = BandwidthConfig::default().warmup)]
    pub warmup: usize,
    /// Timed samples per point.
    #[arg(long, default_value_t = BandwidthConfig::default().repeats)]
    pub repeats: usize,
    /// Small copies are issued back to back until a sample moves at least
    /// this much (at most 64 copies), so event resolution does not dominate.
    #[arg(skip = BandwidthConfig::default().min_sample_bytes)]
    pub min_sample_bytes: Bytes,
    /// Repeats of each allocation when pricing pinning (0 skips it).
    #[arg(long, default_value_t = BandwidthConfig::default().pin_cost_repeats)]
    pub pin_cost_repeats: usize,
    /// The largest size pinning is priced at (default: --max). A pinned
    /// GiB takes about half a second to allocate, each repeat.
    #[arg(long, value_parser = crate::units::size_option)]
    #[serde(default)]
    pub pin_cost_max: Option<Bytes>,
}

impl Default for BandwidthConfig {
    /// The full sweep of the lab: 4 KiB - 1 GiB, every kind and direction.
    fn default() -> Self {
        BandwidthConfig {
            device: 0,
            min_bytes: Bytes(4 * KIB),
            max_bytes: Bytes(GIB),
            size_factor: every_power_of_two(),
            kinds: HostMemoryKind::ALL.to_vec(),
            directions: Direction::ALL.to_vec(),
            warmup: 2,
            repeats: 10,
            min_sample_bytes: Bytes(8 << 20),
            pin_cost_repeats: 5,
            pin_cost_max: None,
        }
    }
}

/// The sweep's step before it was a setting: every power of two.
fn every_power_of_two() -> u64 {
    2
}

impl BandwidthConfig {
    /// The headline's points (the largest copy, 1 MiB's break-even) at
    /// their full sizes, every fourth power of two between, fewer repeats;
    /// pinning priced up to 16 MiB (the headline's break-even is 1 MiB's:
    /// the full sweep prices the larger sizes).
    pub fn headline() -> Self {
        BandwidthConfig { size_factor: 4, repeats: 6, pin_cost_repeats: 3, pin_cost_max: Some(Bytes(16 << 20)), ..Self::default() }
    }
    /// A shorter sweep for notebooks (4 KiB - 256 MiB, fewer repeats).
    pub fn quick() -> Self {
        BandwidthConfig { max_bytes: Bytes(256 << 20), repeats: 5, pin_cost_repeats: 3, ..Self::default() }
    }
    /// The smallest run that still touches every code path (4 KiB - 4 MiB,
    /// one sample each): for compute-sanitizer and smoke tests, not for numbers.
    pub fn small() -> Self {
        BandwidthConfig { max_bytes: Bytes(4 << 20), warmup: 1, repeats: 2, min_sample_bytes: Bytes(1 << 20), pin_cost_repeats: 1, ..Self::default() }
    }

    pub fn validate(&self) -> Result<()> {
        if !(2..=16).contains(&self.size_factor) {
            return Err(LabError::config(format!("--size-factor {} is out of range: the sweep takes 2 to 16", self.size_factor)));
        }
        let (lo, hi) = (self.min_bytes.0, self.max_bytes.0);
        for (option, b) in [("--min", lo), ("--max", hi)] {
            if b < 8 || b % 8 != 0 {
                return Err(LabError::config(format!("{option} {} must be a multiple of 8 bytes and at least 8 B", Bytes(b))));
            }
        }
        if lo > hi {
            return Err(LabError::config(format!("--min {} exceeds --max {}", Bytes(lo), Bytes(hi))));
        }
        if hi > MAX_BYTES {
            return Err(LabError::config(format!("--max {} is over the {} limit", Bytes(hi), Bytes(MAX_BYTES))));
        }
        if self.kinds.is_empty() || self.directions.is_empty() {
            return Err(LabError::config("--kinds and --directions each need at least one value"));
        }
        if self.repeats == 0 || self.repeats > 10_000 {
            return Err(LabError::config(format!("--repeats must be 1-10000 (got {})", self.repeats)));
        }
        if self.warmup > 1_000 {
            return Err(LabError::config(format!("--warmup must be 0-1000 (got {})", self.warmup)));
        }
        if self.pin_cost_repeats > 1_000 {
            return Err(LabError::config(format!("--pin-cost-repeats must be at most 1000 (got {})", self.pin_cost_repeats)));
        }
        Ok(())
    }

    /// min, 2*min, 4*min ... up to max.
    pub fn sizes(&self) -> Vec<Bytes> {
        let mut v = Vec::new();
        let mut s = self.min_bytes.0;
        while s <= self.max_bytes.0 {
            v.push(Bytes(s));
            s = match s.checked_mul(self.size_factor.max(2)) {
                Some(n) => n,
                None => break,
            };
        }
        v
    }

    /// Every other size (x4 steps) plus the largest, up to
    /// `--pin-cost-max`: allocations are slow.
    pub fn pin_cost_sizes(&self) -> Vec<Bytes> {
        let cap = self.pin_cost_max.unwrap_or(self.max_bytes);
        let all: Vec<Bytes> = self.sizes().into_iter().filter(|b| *b <= cap).collect();
        let mut v: Vec<Bytes> = all.iter().step_by(2).copied().collect();
        if let Some(&last) = all.last() {
            if v.last() != Some(&last) {
                v.push(last);
            }
        }
        v
    }

    /// Where the lab also makes its copies with plain driver calls, to
    /// show that the runner adds nothing to them: 1 MiB (where a copy's
    /// fixed costs still show) and the largest size, where swept.
    pub fn plain_sizes(&self) -> Vec<Bytes> {
        let sizes = self.sizes();
        let mut v: Vec<Bytes> = [Bytes(1 << 20), self.max_bytes].into_iter().filter(|b| sizes.contains(b)).collect();
        v.dedup();
        v
    }

    pub fn copies_per_sample(&self, bytes: Bytes) -> usize {
        (self.min_sample_bytes.0 / bytes.0.max(1)).clamp(1, 64) as usize
    }
}

/// One (kind, direction, size) point of the sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TransferPoint {
    pub kind: HostMemoryKind,
    pub direction: Direction,
    pub bytes: Bytes,
    pub copies_per_sample: usize,
    /// Device time per copy (CUDA events), ms.
    pub device_ms: Summary,
    /// Host time inside one copy call (how long the CPU was blocked), ms.
    pub host_call_ms: Summary,
    /// GB/s (1e9 bytes/s) over the link by device time; both ways for bidirectional.
    pub gbps: Summary,
    /// Whether the streams were held behind the start gate.
    pub gated: bool,
    /// Samples whose destination was poisoned before and verified after.
    pub verified_samples: usize,
    /// The same copies made with plain driver calls in the same samples
    /// (at the sizes the lab checks itself at, [`BandwidthConfig::plain_sizes`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plain: Option<PlainCopies>,
}

/// Lab 1's copies made with the driver's calls alone, in the same samples
/// as the runner's: what the lab's figures are held to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlainCopies {
    /// Device time per copy (CUDA events), ms.
    pub device_ms: Summary,
    /// Host time inside one copy call, ms.
    pub host_call_ms: Summary,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BandwidthResults {
    pub config: BandwidthConfig,
    pub transfers: Vec<TransferPoint>,
    pub pin_cost: Vec<PinCostPoint>,
}

pub type BandwidthRecord = crate::measure::record::Record<BandwidthResults>;

impl BandwidthResults {
    pub fn point(&self, kind: HostMemoryKind, direction: Direction, bytes: Bytes) -> Option<&TransferPoint> {
        self.transfers.iter().find(|p| p.kind == kind && p.direction == direction && p.bytes == bytes)
    }
    /// The points of one series, by size.
    pub fn series(&self, kind: HostMemoryKind, direction: Direction) -> Vec<&TransferPoint> {
        let mut v: Vec<_> = self.transfers.iter().filter(|p| p.kind == kind && p.direction == direction).collect();
        v.sort_by_key(|p| p.bytes);
        v
    }
    pub fn kinds(&self) -> Vec<HostMemoryKind> {
        let mut v: Vec<_> = self.transfers.iter().map(|p| p.kind).collect();
        v.sort();
        v.dedup();
        v
    }
    pub fn directions(&self) -> Vec<Direction> {
        let mut v: Vec<_> = self.transfers.iter().map(|p| p.direction).collect();
        v.sort();
        v.dedup();
        v
    }
    pub fn largest_size(&self) -> Option<Bytes> {
        self.transfers.iter().map(|p| p.bytes).max()
    }
}

/// Notebook entry points for lab 1.
impl crate::lab_kit::LabRun<BandwidthResults> {
    pub fn summary(&self) -> String {
        model::summary_table(&self.record)
    }
    pub fn two_clocks_table(&self, bytes: Bytes) -> String {
        model::two_clocks_table(&self.record.results, bytes)
    }
    /// What getting memory a copy can use costs, each way, per size.
    pub fn pin_cost_table(&self) -> String {
        host_memory::cost_table(&self.record.results.pin_cost)
    }
    pub fn break_even_table(&self) -> String {
        model::break_even_table(&self.record.results)
    }
    pub fn bandwidth_chart(&self) -> crate::present::chart::Figure {
        charts::bandwidth_vs_size(&self.record, &self.origin())
    }
    pub fn ratio_chart(&self) -> crate::present::chart::Figure {
        charts::ratio_to_pageable(&self.record, &self.origin())
    }
    pub fn two_clocks_chart(&self) -> crate::present::chart::Figure {
        charts::two_clocks(&self.record, &self.origin())
    }
    pub fn pinning_cost_chart(&self) -> crate::present::chart::Figure {
        charts::pinning_cost(&self.record, &self.origin())
    }
    /// Median device time of one copy, µs (None if that point was not measured).
    pub fn copy_time_us(&self, kind: HostMemoryKind, direction: Direction, bytes: Bytes) -> Option<f64> {
        self.record.results.point(kind, direction, bytes).map(|p| p.device_ms.median * 1e3)
    }
}

/// Lab 1's entry in the lab table.
pub static ENTRY: crate::lab_kit::Entry<BandwidthConfig, BandwidthResults> = crate::lab_kit::Entry {
    number: 1,
    name: LAB,
    module: module_path!(),
    teaches: "Pinned vs pageable transfers: bandwidth, two clocks, the price of pinning",
    builds_on: &[],
    kernels: &[],
    exercises: exercise::EXERCISES,
    glossary: &[
        crate::lab_kit::Word::new(
            "pinned / pageable",
            "page-locked host memory the copy engines read directly / ordinary memory the driver stages through a pinned buffer",
        ),
        crate::lab_kit::Word::new(
            "write-combined, registered",
            "pinned memory the CPU writes fast but reads slowly / ordinary memory pinned where it is (cuMemHostRegister)",
        ),
        crate::lab_kit::Word::new("break-even", "how many copies of a buffer it takes for pinning it to pay for itself"),
    ],
    about: "Lab 1: pinned vs pageable bandwidth sweep, two clocks, pinning cost",
    measure: |gpu, cfg, cx| measure::run(gpu, cfg, cx.progress),
    tables: |rec| format!("{}\n{}\n{}", model::summary_table(rec), host_memory::cost_table(&rec.results.pin_cost), model::break_even_table(&rec.results)),
    figures: charts::report,
    headline: model::headline,
    headline_figures: model::headline_figures,
    // Lab 1 draws no timeline.
    timelines: |_, _| Vec::new(),
    fixture: fixture::results,
};

crate::lab_config!(BandwidthConfig);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_sweep_is_4k_to_1g() {
        let c = BandwidthConfig::default();
        c.validate().unwrap();
        let s = c.sizes();
        assert_eq!((s.len(), s[0], *s.last().unwrap()), (19, Bytes(4096), Bytes(GIB)));
        assert_eq!(c.copies_per_sample(Bytes(4096)), 64);
        assert_eq!(c.copies_per_sample(Bytes(GIB)), 1);
        // Checked against plain driver calls at 1 MiB and the largest size, where swept.
        assert_eq!(c.plain_sizes(), vec![Bytes(1 << 20), Bytes(GIB)]);
        assert_eq!(BandwidthConfig { max_bytes: Bytes(1 << 20), ..c.clone() }.plain_sizes(), vec![Bytes(1 << 20)]);
        assert_eq!(BandwidthConfig { min_bytes: Bytes(4 << 20), ..c.clone() }.plain_sizes(), vec![Bytes(GIB)]);
        let p = c.pin_cost_sizes();
        assert_eq!((p[0], p[1], *p.last().unwrap()), (Bytes(4096), Bytes(16384), Bytes(GIB)));
        // The headline prices pinning up to 16 MiB, 1 MiB's break-even among them.
        let p = BandwidthConfig::headline().pin_cost_sizes();
        assert_eq!(p, [4 << 10, 64 << 10, 1 << 20, 16 << 20].map(Bytes));
    }

    #[test]
    fn bad_configs_are_named() {
        let bad = |f: &dyn Fn(&mut BandwidthConfig)| {
            let mut c = BandwidthConfig::default();
            f(&mut c);
            c.validate().unwrap_err().to_string()
        };
        assert!(bad(&|c| c.min_bytes = Bytes(0)).contains("--min 0 B"));
        assert!(bad(&|c| c.max_bytes = Bytes(1000 * GIB)).contains("over the 64 GiB limit"));
        assert!(bad(&|c| c.min_bytes = Bytes(12)).contains("multiple of 8"));
        assert!(bad(&|c| c.min_bytes = Bytes(2 * GIB)).contains("--min 2 GiB exceeds --max"));
        assert!(bad(&|c| c.kinds.clear()).contains("--kinds"));
        assert!(bad(&|c| c.repeats = 0).contains("--repeats"));
    }
}
