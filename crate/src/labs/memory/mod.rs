//! Lab 6: memory that does not stall the pipeline. Which memory calls wait
//! for the GPU, probed beside busy kernels, uploads and downloads
//! ([`probes`]); a two-stream pipeline that allocates scratch memory per
//! batch with cuMemAlloc/cuMemFree and with the stream-ordered pair,
//! measured beside the queue model ([`experiments`]); the pool's release
//! threshold (an allocate + free pair by size, and batches of varying size
//! with what the pool holds, [`pool`]); pinned host memory priced by size,
//! and pinned staging for a CPU producer, per batch or in a ring of slots
//! handed back by host functions ([`ring`]); zero-copy against
//! copy-then-compute for data read once and several times ([`zero_copy`]);
//! and the exercise, a scratch loop without stalls ([`exercise`]).
//!
//! May use: `pipeline` (plans, the model), `gpu` (to run them, the pool,
//! mapped memory), `labs::{experiment, host_memory, check, loop_check}`,
//! `measure`, `present`.

pub mod exercise;
pub mod experiments;
#[doc(hidden)]
pub mod fixture;
#[cfg(test)]
mod gpu_tests;
pub mod kernel;
pub mod measure;
pub mod pool;
pub mod probes;
pub mod ring;
pub mod zero_copy;

use crate::error::Result;
use crate::lab_kit::experiment::ExperimentResult;
use crate::lab_kit::host_memory::PinCostPoint;
use crate::measure::record::Record;
use crate::pipeline::machine::DeviceWaits;
use crate::present::chart::{Chart, Figure, Panel, Series, XAxis};
use crate::present::gantt::Gantt;
use crate::Bytes;
use plotters::style::RGBColor;
use pool::{Allocator, BatchTrace, PairPoint};
use probes::CallProbe;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use zero_copy::ZeroCopy;

pub const LAB: &str = "memory";

/// Lab 6's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct MemoryConfig {
    /// f32 elements the two-stream pipeline moves (128 MiB by default, in
    /// batches of 32 MiB: a batch's download outlasts a cuMemAlloc call).
    #[arg(long, default_value_t = MemoryConfig::default().elements)]
    pub elements: usize,
    /// Batches of the two-stream pipeline (each allocates its scratch memory).
    #[arg(long, default_value_t = MemoryConfig::default().batches)]
    pub batches: usize,
    /// Sizes of the allocate + free sweep, comma-separated, MiB if no unit
    /// is given (1,16,1GiB).
    #[arg(long, value_name = "MIB", value_parser = crate::units::mib_option, value_delimiter = ',', default_values_t = MemoryConfig::default().sizes_mib)]
    pub sizes_mib: Vec<usize>,
    /// Sizes pinned host memory is priced at (cuMemHostAlloc the first
    /// time and again, cuMemHostRegister), MiB if no unit is given; a
    /// pinned GiB takes about half a second each repeat.
    #[arg(long, value_name = "MIB", value_parser = crate::units::mib_option, value_delimiter = ',', default_values_t = MemoryConfig::default().pinned_sizes_mib)]
    #[serde(default = "pinned_sizes_of_recordings")]
    pub pinned_sizes_mib: Vec<usize>,
    /// Batches of the varying-size run.
    #[arg(long, default_value_t = MemoryConfig::default().trace_batches)]
    pub trace_batches: usize,
    /// The varying-size run's first scratch size, MiB if no unit is given
    /// (it grows to about 16x).
    #[arg(long, value_name = "MIB", value_parser = crate::units::mib_option, default_value_t = MemoryConfig::default().trace_base_mib)]
    pub trace_base_mib: usize,
    /// How many times the zero-copy kernel reads its input.
    #[arg(long, value_delimiter = ',', default_values_t = MemoryConfig::default().passes)]
    pub passes: Vec<i32>,
    /// f32 elements of the zero-copy input (larger than the GPU's L2, so
    /// every read goes to where the data lives).
    #[arg(long, default_value_t = MemoryConfig::default().zero_copy_elements)]
    pub zero_copy_elements: usize,
    /// Kernel time per read as a share of the upload's: 1 read then runs
    /// max(link, kernel) in place (the link: one read in place with no
    /// compute, measured) against upload + kernel copied first.
    #[arg(long, default_value_t = MemoryConfig::default().zero_copy_compute)]
    pub zero_copy_compute: f64,
    /// Batches of the pinned-staging run (the producer writes each into
    /// pinned memory; `--elements` in all).
    #[arg(long, default_value_t = MemoryConfig::default().ring_batches)]
    pub ring_batches: usize,
    /// Slot counts of the ring of pinned slots.
    #[arg(long, value_delimiter = ',', default_values_t = MemoryConfig::default().ring_slots)]
    pub ring_slots: Vec<usize>,
    /// Timed runs of each variant (after warm-ups).
    #[arg(long, default_value_t = MemoryConfig::default().repeats)]
    pub repeats: usize,
    /// GPU ordinal (the command line's `--device`).
    #[arg(skip)]
    pub device: usize,
}

/// The sizes pinned memory was priced at in recordings made before
/// `--pinned-sizes-mib` (the default sweep's).
fn pinned_sizes_of_recordings() -> Vec<usize> {
    vec![1, 4, 16, 64, 256, 1024]
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            elements: 32 << 20,
            batches: 4,
            sizes_mib: vec![1, 4, 16, 64, 256, 1024],
            pinned_sizes_mib: vec![1, 4, 16, 64, 256, 1024],
            trace_batches: 48,
            trace_base_mib: 16,
            passes: vec![1, 2, 4, 8],
            zero_copy_elements: 64 << 20,
            zero_copy_compute: 0.5,
            ring_batches: 16,
            ring_slots: vec![1, 2, 3, 4, 6],
            repeats: 15,
            device: 0,
        }
    }
}

impl MemoryConfig {
    /// The headline's sizes (the largest pair) with fewer between, fewer repeats.
    pub fn headline() -> Self {
        // Pinned memory priced at small sizes only: no headline row is
        // made of it (the full sweep, and lab 1, price the GiB).
        MemoryConfig { sizes_mib: vec![1, 16, 1024], pinned_sizes_mib: vec![1, 16], repeats: 9, ..Self::default() }
    }
    /// The notebook's run.
    pub fn quick() -> Self {
        MemoryConfig {
            elements: 16 << 20,
            sizes_mib: vec![1, 16, 256],
            pinned_sizes_mib: vec![1, 16, 256],
            trace_batches: 24,
            zero_copy_elements: 32 << 20,
            zero_copy_compute: 0.5,
            repeats: 7,
            ..Self::default()
        }
    }
    /// Every code path, small.
    pub fn small() -> Self {
        MemoryConfig {
            elements: 1 << 18,
            batches: 4,
            sizes_mib: vec![1, 4],
            pinned_sizes_mib: vec![1, 4],
            trace_batches: 6,
            trace_base_mib: 1,
            passes: vec![1, 2],
            zero_copy_elements: 1 << 18,
            zero_copy_compute: 0.5,
            ring_batches: 4,
            ring_slots: vec![1, 2],
            repeats: 2,
            device: 0,
        }
    }
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(crate::LabError::config(why));
        if self.elements < 1 << 12 || self.elements % 2 != 0 || self.elements > 1 << 30 {
            return bad(format!("--elements {}: give an even number from 4096 to 2^30", self.elements));
        }
        if !(2..=64).contains(&self.batches) {
            return bad(format!("--batches {}: give 2 to 64", self.batches));
        }
        if self.sizes_mib.is_empty() || self.sizes_mib.iter().any(|&m| !(1..=16384).contains(&m)) {
            return bad(format!("--sizes-mib {:?}: give one or more sizes from 1 to 16384 MiB", self.sizes_mib));
        }
        if self.pinned_sizes_mib.iter().any(|&m| !(1..=16384).contains(&m)) {
            return bad(format!("--pinned-sizes-mib {:?}: give sizes from 1 to 16384 MiB", self.pinned_sizes_mib));
        }
        if !(2..=10_000).contains(&self.trace_batches) {
            return bad(format!("--trace-batches {}: give 2 to 10000", self.trace_batches));
        }
        if !(1..=1024).contains(&self.trace_base_mib) {
            return bad(format!("--trace-base-mib {}: give 1 to 1024 (the run grows to about 16x that)", self.trace_base_mib));
        }
        if self.passes.is_empty() || self.passes.iter().any(|&p| !(1..=64).contains(&p)) {
            return bad(format!("--passes {:?}: give one or more read counts from 1 to 64", self.passes));
        }
        if self.zero_copy_elements < 1 << 12 || self.zero_copy_elements % 2 != 0 || self.zero_copy_elements > 1 << 30 {
            return bad(format!("--zero-copy-elements {}: give an even number from 4096 to 2^30", self.zero_copy_elements));
        }
        if !(0.0..=8.0).contains(&self.zero_copy_compute) {
            return bad(format!("--zero-copy-compute {}: give the kernel's time per read as a share of the upload's, from 0 to 8", self.zero_copy_compute));
        }
        if !(2..=256).contains(&self.ring_batches) || self.elements % (2 * self.ring_batches) != 0 {
            return bad(format!("--ring-batches {}: give 2 to 256 that divide --elements {} into batches of an even size", self.ring_batches, self.elements));
        }
        if self.ring_slots.is_empty() || self.ring_slots.iter().any(|&k| k == 0 || k > self.ring_batches) {
            return bad(format!("--ring-slots {:?}: give one or more slot counts from 1 to --ring-batches ({})", self.ring_slots, self.ring_batches));
        }
        if !(1..=1000).contains(&self.repeats) {
            return bad(format!("--repeats {}: give 1 to 1000", self.repeats));
        }
        Ok(())
    }
}

crate::lab_config!(MemoryConfig);

/// Lab 6's results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemoryResults {
    pub config: MemoryConfig,
    /// The kernel's FMAs per element (a batch's kernel about as long as its H2D).
    pub iterations: i32,
    pub probes: Vec<CallProbe>,
    /// What the probes found, as the model was told.
    pub device_waits: DeviceWaits,
    /// The two-stream pipeline with each kind of scratch memory.
    pub stall: ExperimentResult,
    pub pairs: Vec<PairPoint>,
    pub traces: Vec<BatchTrace>,
    pub zero_copy: ZeroCopy,
    /// Pinned staging for a producer: per batch, or a ring by slot count.
    pub ring: ring::RingResults,
    /// cuMemHostAlloc, cuMemFreeHost and cuMemHostRegister by size (the
    /// sweep's sizes), the first of each size in this run apart (earlier
    /// parts of the lab may have pinned some sizes already).
    pub pin_cost: Vec<PinCostPoint>,
}

/// "64 MiB: cuMemHostAlloc 21.100 ms the first time, 20.300 again;
/// cuMemFreeHost 6.200; ..." (medians).
pub fn pin_line(c: &PinCostPoint) -> String {
    format!(
        "{}: cuMemHostAlloc {:.3} ms the first time, {:.3} again; cuMemFreeHost {:.3}; cuMemHostRegister {:.3}, cuMemHostUnregister {:.3}",
        c.bytes,
        c.pinned_first.acquire_ms.median,
        c.pinned_reused.acquire_ms.median,
        c.pinned_reused.release_ms.median,
        c.registered.acquire_ms.median,
        c.registered.release_ms.median
    )
}

const COLORS: [RGBColor; 3] = [RGBColor(214, 39, 40), RGBColor(255, 127, 14), RGBColor(31, 119, 180)];

fn color(a: Allocator) -> RGBColor {
    COLORS[Allocator::ALL.iter().position(|&x| x == a).unwrap_or(0)]
}

impl MemoryResults {
    pub fn pair(&self, a: Allocator, bytes: u64) -> Option<&PairPoint> {
        self.pairs.iter().find(|p| p.allocator == a && p.bytes == bytes)
    }
    pub fn trace(&self, a: Allocator) -> Option<&BatchTrace> {
        self.traces.iter().find(|t| t.allocator == a)
    }

    /// The measured numbers behind [`Self::headline`]: the stall pipeline's
    /// variants, each allocator's pair at the largest size and its
    /// varying-size batches.
    pub fn headline_figures(&self) -> Vec<crate::lab_kit::headline::HeadlineFigure> {
        let mut v = self.stall.headline_figures();
        let big = self.config.sizes_mib.iter().max().map(|&m| (m as u64) << 20);
        for a in [Allocator::CuMemAlloc, Allocator::PoolThresholdZero, Allocator::PoolThresholdMax] {
            if let Some(p) = big.and_then(|b| self.pair(a, b)) {
                v.push(crate::lab_kit::headline::HeadlineFigure::new(format!("allocate + free {}: {a:?}", Bytes(p.bytes)), "ms", p.ms));
            }
            if let Some(s) = self.trace(a).and_then(|t| t.steady_ms().ok()) {
                v.push(crate::lab_kit::headline::HeadlineFigure::new(format!("varying-size batches: {a:?}"), "ms", s));
            }
        }
        v
    }
    /// The headline table's rows.
    pub fn headline(&self) -> Vec<(String, String)> {
        let mut rows = Vec::new();
        let waiting: Vec<String> = self
            .probes
            .iter()
            .flat_map(|p| [true, false].into_iter().filter(|&a| p.waits(a).any()).map(|a| format!("{} (for {})", p.call(a), p.waits(a).describe())))
            .collect();
        rows.push(("memory calls that wait for the GPU".into(), if waiting.is_empty() { "none".into() } else { waiting.join(", ") }));
        let v = |i: usize| self.stall.variants.get(i).map(|v| v.total_ms.median);
        if let (Some(a), Some(f)) = (v(0), v(3)) {
            rows.push((
                "two-stream pipeline: stream-ordered pair / cuMemAlloc + cuMemFree per batch".into(),
                format!("{a:.3} / {f:.3} ms ({:+.0}%)", 100.0 * (f / a - 1.0)),
            ));
        }
        if let Some(big) = self.config.sizes_mib.iter().max().map(|&m| (m as u64) << 20) {
            let ms = |a| self.pair(a, big).map_or(f64::NAN, |p| p.ms.median);
            rows.push((
                format!("allocate + free {}: cuMemAlloc / threshold 0 / threshold max", Bytes(big)),
                format!("{:.3} / {:.3} / {:.3} ms", ms(Allocator::CuMemAlloc), ms(Allocator::PoolThresholdZero), ms(Allocator::PoolThresholdMax)),
            ));
        }
        let steady = |a| self.trace(a).and_then(|t| t.steady_ms().ok()).map_or(f64::NAN, |s| s.median);
        rows.push((
            "varying-size batches, median: cuMemAlloc / threshold 0 / threshold max".into(),
            format!("{:.3} / {:.3} / {:.3} ms", steady(Allocator::CuMemAlloc), steady(Allocator::PoolThresholdZero), steady(Allocator::PoolThresholdMax)),
        ));
        if let Some(t) = self.trace(Allocator::PoolThresholdMax) {
            rows.push(("the pool at threshold max holds at most".into(), format!("{}", Bytes(t.most_reserved()))));
        }
        let z = &self.zero_copy;
        rows.push((
            "zero-copy kernel: compute per read / the upload (asked, measured)".into(),
            format!("{:.2} / {:.2} ({} FMAs per element per read)", z.compute_share, z.measured_share(), z.iterations),
        ));
        for p in &z.points {
            let (mz, mc) = z.model(p);
            rows.push((format!("zero-copy / copy-then-compute, data read {}x", p.passes), format!("{:.2}x (model {:.2}x)", p.ratio(), mz / mc)));
        }
        if let (Some((k, ring)), Some(per)) = (self.ring.fewest(), self.ring.per_batch()) {
            let ring = ring.total_ms.median;
            rows.push((
                format!("pinned staging, {} batches: per-batch cuMemHostAlloc / the fewest ring slots that keep up", self.ring.batches),
                format!(
                    "{:.3} / {:.3} ms per batch ({k} slots; {:.1}x)",
                    per.total_ms.median / self.ring.batches as f64,
                    ring / self.ring.batches as f64,
                    per.total_ms.median / ring
                ),
            ));
        }
        let variants = self.stall.variants.iter().chain(&self.ring.staging.variants);
        if let Some((worst, name)) = variants.map(|v| (v.model_ms / v.total_ms.median - 1.0, &v.name)).max_by(|a, b| a.0.abs().total_cmp(&b.0.abs())) {
            rows.push(("model, worst variant".into(), format!("{:+.1}% ({name})", 100.0 * worst)));
        }
        rows
    }

    /// The table the command line prints.
    pub fn table(&self) -> String {
        let mut out = format!(
            "which memory calls wait for the GPU (busy work on another stream: at least {} ops of a batch's size, and {:.0}x the calls' idle time), median ms:\n",
            probes::BUSY_OPS,
            probes::BUSY_OVER_CALLS
        );
        for line in self.probes.iter().flat_map(|p| p.lines()) {
            out += &format!("  {line}\n");
        }
        let e = &self.stall;
        out += &format!("\n{}: {}\n", e.name, e.shows);
        if let Some(f) = &e.machine {
            out += &format!("  measured just before: {}\n", crate::lab_kit::experiment::machine_line(f));
        }
        out += &format!("  {:<58} {:>10} {:>16} {:>10} {:>8}\n", "variant", "median ms", "25%..75% ms", "model ms", "error");
        for v in &e.variants {
            let (lo, hi) = v.total_ms.middle_range();
            out += &format!(
                "  {:<58} {:>10.3} {:>7.3}..{:<8.3} {:>10.3} {:>7.1}%\n",
                v.name,
                v.total_ms.median,
                lo,
                hi,
                v.model_ms,
                100.0 * (v.model_ms / v.total_ms.median - 1.0)
            );
        }
        out += &e.effect_lines();
        out += "\nallocate + free (and the stream synchronize a batch ends with), host time, median (25%..75%) ms:\n";
        out += &format!("  {:>10}", "size");
        for a in Allocator::ALL {
            out += &format!(" {:>38}", a.label());
        }
        out += "\n";
        for &mib in &self.config.sizes_mib {
            let bytes = (mib as u64) << 20;
            out += &format!("  {:>10}", Bytes(bytes).to_string());
            for a in Allocator::ALL {
                let cell = self.pair(a, bytes).map_or("-".into(), |p| {
                    let (lo, hi) = p.ms.middle_range();
                    format!("{:.3} ({lo:.3}..{hi:.3})", p.ms.median)
                });
                out += &format!(" {cell:>38}");
            }
            out += "\n";
        }
        out += &format!(
            "\n{} batches of varying size (a scratch buffer growing from {} MiB to about 16x):\n",
            self.config.trace_batches, self.config.trace_base_mib
        );
        for t in &self.traces {
            let s = t.steady_ms().ok();
            out += &format!(
                "  {:<40} median {:.3} ms a batch (25%..75% {:.3}..{:.3}), first {:.3} ms, pool holds at most {}\n",
                t.allocator.label(),
                s.map_or(f64::NAN, |s| s.median),
                s.map_or(f64::NAN, |s| s.middle_range().0),
                s.map_or(f64::NAN, |s| s.middle_range().1),
                t.batches.first().map_or(f64::NAN, |b| b.ms),
                Bytes(t.most_reserved())
            );
        }
        out += "\npinned host memory by size, host time, median (the first allocation of a size is one sample):\n";
        for c in &self.pin_cost {
            out += &format!("  {}\n", pin_line(c));
        }
        let r = &self.ring.staging;
        out += &format!("\n{}: {}\n", r.name, r.shows);
        for line in self.ring.lines() {
            out += &format!("  {line}\n");
        }
        out += &r.effect_lines();
        let z = &self.zero_copy;
        out += &format!(
            "\nzero-copy over {} (device times; the upload {:.3} ms: copy-then-compute less the kernel; alone before the sweep {:.3} ms):\n",
            Bytes(4 * z.elements as u64),
            z.upload_ms.median,
            z.upload_alone_ms.median
        );
        out += &format!(
            "  the kernel: {} FMAs per element per read, balanced to {:.2}x the upload per read (measured {:.2}x)\n",
            z.iterations,
            z.compute_share,
            z.measured_share()
        );
        out += &format!(
            "  model: zero-copy reads x max(one read in place with no compute: {:.3} ms, kernel per read), copy-then-compute upload + kernel\n",
            z.link_in_place_ms.median
        );
        out += &format!("  {:>6} {:>22} {:>22} {:>12} {:>8} {:>22}\n", "reads", "zero-copy ms", "copy+compute ms", "kernel ms", "ratio", "model zc / c+c ms");
        for p in &z.points {
            let (mz, mc) = z.model(p);
            out += &format!(
                "  {:>6} {:>10.3} (±{:>7.3}) {:>10.3} (±{:>7.3}) {:>12.3} {:>7.2}x {:>10.3} / {:<10.3}\n",
                p.passes,
                p.zero_copy_ms.median,
                p.zero_copy_ms.middle_spread() / 2.0,
                p.copy_then_compute_ms.median,
                p.copy_then_compute_ms.middle_spread() / 2.0,
                p.kernel_ms.median,
                p.ratio(),
                mz,
                mc
            );
        }
        out += &match z.wins_up_to() {
            Some(k) => format!("  zero-copy wins for data read up to {k}x; copy-then-compute wins beyond\n"),
            None => "  zero-copy never wins on this GPU at these read counts\n".into(),
        };
        out += &match z.model_wins_up_to() {
            Some(k) => format!("  (the model: zero-copy wins up to {k}x)\n"),
            None => "  (the model: zero-copy never wins at these read counts)\n".into(),
        };
        out
    }

    /// The stall experiment's timelines (with the model's beside them).
    pub fn timelines(&self, with_model: bool, origin: &str) -> Gantt {
        self.stall.gantt("Lab 6", &format!("{LAB}-{}", self.stall.name), with_model, origin)
    }

    /// The pinned-staging run's timelines (with the model's beside them).
    pub fn ring_timelines(&self, with_model: bool, origin: &str) -> Gantt {
        // Not "memory-pinned-staging": that is the ring chart's name.
        self.ring.staging.gantt("Lab 6", &format!("{LAB}-{}-timelines", self.ring.staging.name), with_model, origin)
    }

    /// Pinned staging: time per batch by ring slots, per-batch allocation
    /// beside it, measured and modelled.
    pub fn ring_chart(&self, origin: &str) -> Figure {
        let r = &self.ring;
        let per = |ms: f64| ms / r.batches as f64;
        let slots: Vec<usize> = r.rings().iter().map(|&(k, _)| k).collect();
        let (ring_color, alloc_color) = (RGBColor(31, 119, 180), RGBColor(214, 39, 40));
        let mut series = vec![
            Series {
                label: "a ring of pinned slots".into(),
                color: ring_color,
                dashed: false,
                points: r.rings().iter().map(|&(k, v)| (k as f64, per(v.total_ms.median))).collect(),
            },
            Series {
                label: "model: the ring".into(),
                color: ring_color,
                dashed: true,
                points: r.rings().iter().map(|&(k, v)| (k as f64, per(v.model_ms))).collect(),
            },
        ];
        if let (Some(p), Some(lo), Some(hi)) = (r.per_batch(), slots.iter().min(), slots.iter().max()) {
            series.push(Series {
                label: "cuMemHostAlloc + cuMemFreeHost per batch".into(),
                color: alloc_color,
                dashed: false,
                points: vec![(*lo as f64, per(p.total_ms.median)), (*hi as f64, per(p.total_ms.median))],
            });
            series.push(Series {
                label: "model: per batch".into(),
                color: alloc_color,
                dashed: true,
                points: vec![(*lo as f64, per(p.model_ms)), (*hi as f64, per(p.model_ms))],
            });
        }
        let panel = Panel {
            title: format!("{} batches of {}, produced by the CPU into pinned memory", r.batches, Bytes(4 * r.batch_elements as u64)),
            x_axis: XAxis::Linear,
            x_label: "ring slots".into(),
            y_label: "ms per batch".into(),
            log_y: true,
            series,
        };
        Figure {
            stem: format!("{LAB}-pinned-staging"),
            title: "Lab 6: pinned staging, per batch or a ring of slots".into(),
            subtitle: origin.into(),
            panels: vec![panel],
            panel_size: (640, 420),
        }
    }

    /// The release threshold: a pair's cost by size, and the varying-size
    /// run's batch times and pool memory.
    pub fn pool_chart(&self, origin: &str) -> Figure {
        let by_size = Panel {
            title: "allocate + free, by size".into(),
            x_axis: XAxis::LogBytes,
            x_label: "allocation".into(),
            y_label: "ms (host)".into(),
            log_y: true,
            series: Allocator::ALL
                .iter()
                .map(|&a| Series {
                    label: a.label().into(),
                    color: color(a),
                    dashed: false,
                    points: self.pairs.iter().filter(|p| p.allocator == a).map(|p| (p.bytes as f64, p.ms.median)).collect(),
                })
                .collect(),
        };
        let batch_ms = Panel {
            title: "batches of varying size: time per batch".into(),
            x_axis: XAxis::Linear,
            x_label: "batch".into(),
            y_label: "ms (host)".into(),
            log_y: true,
            series: self
                .traces
                .iter()
                .map(|t| Series {
                    label: t.allocator.label().into(),
                    color: color(t.allocator),
                    dashed: false,
                    points: t.batches.iter().enumerate().map(|(i, b)| (i as f64, b.ms)).collect(),
                })
                .collect(),
        };
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let mut memory: Vec<Series> = self
            .traces
            .iter()
            .filter(|t| t.allocator != Allocator::CuMemAlloc)
            .map(|t| Series {
                label: format!("pool reserved, {}", t.allocator.label()),
                color: color(t.allocator),
                dashed: false,
                points: t.batches.iter().enumerate().map(|(i, b)| (i as f64, mib(b.after.reserved))).collect(),
            })
            .collect();
        if let Some(t) = self.traces.first() {
            memory.push(Series {
                label: "the batch's scratch".into(),
                color: RGBColor(120, 120, 120),
                dashed: true,
                points: t.batches.iter().enumerate().map(|(i, b)| (i as f64, mib(b.bytes))).collect(),
            });
        }
        let memory = Panel {
            title: "what the pool holds after each batch".into(),
            x_axis: XAxis::Linear,
            x_label: "batch".into(),
            y_label: "MiB".into(),
            log_y: false,
            series: memory,
        };
        Figure {
            stem: format!("{LAB}-release-threshold"),
            title: "Lab 6: the stream-ordered pool's release threshold".into(),
            subtitle: origin.into(),
            panels: vec![by_size, batch_ms, memory],
            panel_size: (520, 380),
        }
    }

    /// Zero-copy against copy-then-compute by read count.
    pub fn zero_copy_chart(&self, origin: &str) -> Figure {
        let z = &self.zero_copy;
        let line = |label: &str, color, dashed, f: &dyn Fn(&zero_copy::ZeroCopyPoint) -> f64| Series {
            label: label.into(),
            color,
            dashed,
            points: z.points.iter().map(|p| (p.passes as f64, f(p))).collect(),
        };
        let (zc, cc) = (RGBColor(214, 39, 40), RGBColor(31, 119, 180));
        let panel = Panel {
            title: format!("{}, compute per read {:.2}x the upload ({} FMAs per element)", Bytes(4 * z.elements as u64), z.measured_share(), z.iterations),
            x_axis: XAxis::LogCount,
            x_label: "times the kernel reads its input".into(),
            y_label: "ms (device)".into(),
            log_y: true,
            series: vec![
                line("zero-copy (mapped pinned memory)", zc, false, &|p| p.zero_copy_ms.median),
                line("copy, then compute", cc, false, &|p| p.copy_then_compute_ms.median),
                line("model: zero-copy", zc, true, &|p| z.model(p).0),
                line("model: copy, then compute", cc, true, &|p| z.model(p).1),
            ],
        };
        Figure {
            stem: format!("{LAB}-zero-copy"),
            title: "Lab 6: zero-copy against copy-then-compute".into(),
            subtitle: origin.into(),
            panels: vec![panel],
            panel_size: (640, 420),
        }
    }
}

/// A lab-6 recording.
pub type MemoryRecord = Record<MemoryResults>;

/// Notebook entry points for lab 6.
impl crate::lab_kit::LabRun<MemoryResults> {
    /// Every part's table: measured, spread, model.
    pub fn table(&self) -> String {
        self.record.results.table()
    }
    /// The two-stream pipeline's timelines (with `with_model`, the model's beside each).
    pub fn timelines(&self, with_model: bool) -> Gantt {
        self.record.results.timelines(with_model, &self.origin())
    }
    /// The release threshold's figure.
    pub fn pool_chart(&self) -> Figure {
        self.record.results.pool_chart(&self.origin())
    }
    /// Zero-copy's figure.
    pub fn zero_copy_chart(&self) -> Figure {
        self.record.results.zero_copy_chart(&self.origin())
    }
    /// Pinned staging's figure: time per batch by ring slots.
    pub fn ring_chart(&self) -> Figure {
        self.record.results.ring_chart(&self.origin())
    }
    /// Pinned staging's timelines (with `with_model`, the model's beside each).
    pub fn ring_timelines(&self, with_model: bool) -> Gantt {
        self.record.results.ring_timelines(with_model, &self.origin())
    }
    /// Checks a learner's scratch loop (the exercise): live on a GPU, else
    /// on the queue model with the recorded costs and what the probes found.
    pub fn check_scratch(
        &self,
        learner: impl Fn(&mut dyn crate::pipeline::issue::Issue, &exercise::ScratchTask) -> Result<()> + Send + Sync + 'static,
    ) -> crate::lab_kit::check::CheckReport {
        let r = &self.record.results;
        let learner: exercise::Loop = std::sync::Arc::new(learner);
        self.check(
            "memory that does not stall the pipeline",
            &exercise::EXERCISES[0],
            r.config.device,
            |gpu| exercise::check_on_gpu(gpu, r, learner.clone()),
            || exercise::check_on_model(r, learner.clone()),
        )
    }
}

/// Lab 6 in the report.
pub fn report(rec: &MemoryRecord, dir: &Path, origin: &str) -> Result<Vec<PathBuf>> {
    let r = &rec.results;
    let mut files = r.timelines(true, origin).save(dir)?;
    files.extend(r.pool_chart(origin).save(dir)?);
    files.extend(r.zero_copy_chart(origin).save(dir)?);
    files.extend(r.ring_chart(origin).save(dir)?);
    files.extend(r.ring_timelines(true, origin).save(dir)?);
    files.push(crate::present::chart::write_text(dir.join(format!("{LAB}-summary.txt")), format!("{origin}\n\n{}", r.table()))?);
    Ok(files)
}

/// Lab 6's entry in the lab table.
pub static ENTRY: crate::lab_kit::Entry<MemoryConfig, MemoryResults> = crate::lab_kit::Entry {
    number: 6,
    name: LAB,
    module: module_path!(),
    teaches: "Memory that does not stall the pipeline: which calls wait, cuMemFree against the stream-ordered pair, the pool's release threshold, pinned staging slots, zero-copy",
    builds_on: &[(1, "pinned memory"), (3, "a ring of slots reused behind events")],
    kernels: &[&kernel::REREAD],
    exercises: exercise::EXERCISES,
    glossary: &[
        crate::lab_kit::Word::new("stream-ordered pair", "cuMemAllocAsync / cuMemFreeAsync: memory from the pool, allocated and freed in stream order, so neither waits for the GPU"),
        crate::lab_kit::Word::new("release threshold", "how much memory the pool keeps at a synchronization instead of giving it back to the driver"),
        crate::lab_kit::Word::new("staging slots, zero-copy", "a ring of pinned buffers reused as each batch's copy ends / a kernel reading mapped pinned host memory in place"),
    ],
    about: "Lab 6: memory calls and the pipeline, each measured beside the model",
    measure: |gpu, cfg, cx| measure::run(gpu, cfg, cx.progress),
    tables: |rec| rec.results.table(),
    figures: report,
    headline: MemoryResults::headline,
    headline_figures: MemoryResults::headline_figures,
    timelines: |rec, o| vec![rec.results.timelines(true, o), rec.results.ring_timelines(true, o)],
    fixture: fixture::results,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_headline_and_report_show_every_part() {
        let r = crate::labs::memory::fixture::results();
        let t = r.table();
        for part in [
            "WAITS for all GPU work",
            "alloc-stall",
            "allocate + free",
            "batches of varying size",
            "pinned host memory by size",
            "zero-copy over",
            "pinned-staging",
            "fewest slots that keep the pipeline full: 2 (the model says 2)",
        ] {
            assert!(t.contains(part), "{part}: {t}");
        }
        println!("{t}");
        let most = r.trace(Allocator::PoolThresholdMax).unwrap().most_reserved();
        assert!(((16 << 20)..=(256 << 20)).contains(&most), "the varying sizes grow from 16 MiB to about 16x: {most}");
        let h = r.headline();
        assert!(h.iter().any(|(k, v)| k.starts_with("memory calls that wait") && v.contains("cuMemFree (for all GPU work)")), "{h:?}");
        let dir = crate::testing::temp_dir("memory-report");
        let rec = crate::measure::record::Record::new(LAB, crate::testing::fingerprint(), r);
        let files = report(&rec, &dir, "recorded on a test fixture").unwrap();
        for stem in ["memory-release-threshold.png", "memory-pinned-staging.png", "memory-pinned-staging.svg", "memory-pinned-staging-timelines.svg"] {
            assert!(files.iter().any(|f| f.to_string_lossy().ends_with(stem)), "{stem}: {files:?}");
        }
        assert!(h.iter().any(|(k, v)| k.starts_with("pinned staging, 16 batches") && v.ends_with("x)")), "{h:?}");
        assert!(files.iter().all(|f| f.exists()), "{files:?}");
    }

    #[test]
    fn the_presets_are_valid_and_bad_settings_are_named() {
        for c in [MemoryConfig::default(), MemoryConfig::quick(), MemoryConfig::small()] {
            c.validate().unwrap();
        }
        let bad = |c: MemoryConfig, want: &str| {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        };
        bad(MemoryConfig { batches: 1, ..MemoryConfig::default() }, "--batches 1: give 2 to 64");
        bad(MemoryConfig { sizes_mib: vec![], ..MemoryConfig::default() }, "--sizes-mib");
        bad(MemoryConfig { sizes_mib: vec![0], ..MemoryConfig::default() }, "from 1 to 16384 MiB");
        bad(MemoryConfig { passes: vec![0], ..MemoryConfig::default() }, "--passes");
        bad(MemoryConfig { ring_batches: 1, ..MemoryConfig::default() }, "--ring-batches 1: give 2 to 256");
        bad(MemoryConfig { ring_batches: 48, ..MemoryConfig::default() }, "divide --elements");
        bad(MemoryConfig { ring_slots: vec![0], ..MemoryConfig::default() }, "--ring-slots [0]");
        bad(MemoryConfig { ring_slots: vec![17], ..MemoryConfig::default() }, "from 1 to --ring-batches (16)");
        bad(MemoryConfig { elements: 3, ..MemoryConfig::default() }, "--elements 3");
        bad(MemoryConfig { zero_copy_elements: 1 << 31, ..MemoryConfig::default() }, "--zero-copy-elements");
        bad(MemoryConfig { repeats: 0, ..MemoryConfig::default() }, "--repeats 0");
        bad(MemoryConfig { zero_copy_compute: -0.5, ..MemoryConfig::default() }, "--zero-copy-compute -0.5: give");
        bad(MemoryConfig { zero_copy_compute: 8.5, ..MemoryConfig::default() }, "from 0 to 8");
        bad(MemoryConfig { zero_copy_compute: f64::NAN, ..MemoryConfig::default() }, "--zero-copy-compute NaN");
        MemoryConfig { zero_copy_compute: 0.0, ..MemoryConfig::default() }.validate().unwrap();
        MemoryConfig { zero_copy_compute: 8.0, ..MemoryConfig::default() }.validate().unwrap();
    }
}
