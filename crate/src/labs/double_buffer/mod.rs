//! Lab 3: double buffering. A stream of batches: the CPU produces each batch
//! into one of two pinned host buffers, a copy stream uploads it into one of
//! two device buffers, a compute stream runs the kernel. Events are the only
//! dependencies: copy(i) overlaps compute(i-1); a buffer is refilled only
//! after whatever read it finished.

pub mod exercise;
#[doc(hidden)]
pub mod fixture;
#[cfg(test)]
mod gpu_tests;
pub mod measure;
#[cfg(test)]
mod recorded_tests;

use crate::error::{LabError, Result};
use crate::measure::stats::{Efficiency, Summary};
use crate::pipeline::issue::Issue;
use crate::pipeline::issue::{DevRef, EventRef, HostRef, StreamRef};
use crate::pipeline::timeline::Timeline;
use crate::present::chart::Chart;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const LAB: &str = "double-buffer";

/// Lab 3's settings; `overlap-lab double-buffer` takes each as an option.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct DoubleBufferConfig {
    /// GPU ordinal (the command line's `--device`).
    #[arg(skip)]
    pub device: usize,
    /// Batches the producer makes.
    #[arg(long, default_value_t = DoubleBufferConfig::default().batches)]
    pub batches: usize,
    /// f32 elements per batch (2Mi = 8 MiB).
    #[arg(long, default_value_t = DoubleBufferConfig::default().batch_elements)]
    pub batch_elements: usize,
    /// Kernel time over copy time per batch (calibrated on the device).
    #[arg(long, default_value_t = DoubleBufferConfig::default().kernel_over_copy)]
    pub kernel_over_copy: f64,
    /// Kernel time at least this many times the CPU producer's per batch
    /// (0: no floor), so the GPU stays the slowest stage: the kernel is
    /// calibrated to the longer of the two targets.
    #[serde(default = "default_kernel_over_produce")]
    #[arg(long, default_value_t = DoubleBufferConfig::default().kernel_over_produce)]
    pub kernel_over_produce: f64,
    /// Untimed runs first.
    #[arg(long, default_value_t = DoubleBufferConfig::default().warmup)]
    pub warmup: usize,
    /// Timed runs of each schedule.
    #[arg(long, default_value_t = DoubleBufferConfig::default().repeats)]
    pub repeats: usize,
}

impl Default for DoubleBufferConfig {
    fn default() -> Self {
        // A kernel 2.5x the copy keeps the GPU, not the CPU producer, the
        // slowest stage: the case the bound n*max(C, K) + min(C, K)
        // describes. A host whose producer is slower than that needs a
        // longer kernel: hence also twice the producer's time alone (in the
        // pipeline the DMA slows it further).
        DoubleBufferConfig {
            device: 0,
            batches: 64,
            batch_elements: 2 << 20,
            kernel_over_copy: 2.5,
            kernel_over_produce: default_kernel_over_produce(),
            warmup: 1,
            repeats: 5,
        }
    }
}

fn default_kernel_over_produce() -> f64 {
    2.0
}

impl DoubleBufferConfig {
    /// Its full run: it is short.
    pub fn headline() -> Self {
        Self::default()
    }
    pub fn quick() -> Self {
        DoubleBufferConfig { batches: 32, repeats: 3, ..Self::default() }
    }
    /// The smallest run that still touches every code path (8 batches of
    /// 1 MiB): for compute-sanitizer and smoke tests, not for numbers.
    pub fn small() -> Self {
        DoubleBufferConfig { batches: 8, batch_elements: 1 << 18, warmup: 0, repeats: 1, ..Self::default() }
    }
    pub fn validate(&self) -> Result<()> {
        if self.batches < 2 || self.batches > 100_000 {
            return Err(LabError::config(format!("--batches must be 2-100000 (got {})", self.batches)));
        }
        if self.batch_elements < 2 || self.batch_elements % 2 != 0 || self.batch_elements > 1 << 28 {
            return Err(LabError::config(format!("--batch-elements must be even, 2-2^28 (got {})", self.batch_elements)));
        }
        if (self.batches as u64) * (self.batch_elements as u64) > 1 << 31 {
            return Err(LabError::config(format!(
                "--batches {} x --batch-elements {} must stay under 2^31 elements (8 GiB)",
                self.batches, self.batch_elements
            )));
        }
        if !(self.kernel_over_copy > 0.0 && self.kernel_over_copy <= 100.0) {
            return Err(LabError::config(format!("--kernel-over-copy must be in (0, 100] (got {})", self.kernel_over_copy)));
        }
        if !(0.0..=100.0).contains(&self.kernel_over_produce) {
            return Err(LabError::config(format!("--kernel-over-produce must be in [0, 100] (got {})", self.kernel_over_produce)));
        }
        if self.repeats == 0 || self.repeats > 1000 || self.warmup > 100 {
            return Err(LabError::config(format!("--repeats must be 1-1000 and --warmup 0-100 (got {} and {})", self.repeats, self.warmup)));
        }
        Ok(())
    }
}

/// What a double-buffer schedule is given.
#[derive(Clone, Debug)]
pub struct BufferTask {
    pub batches: usize,
    pub batch_elements: usize,
    pub copy: StreamRef,
    pub compute: StreamRef,
    /// Two pinned host buffers of one batch each.
    pub host: [HostRef; 2],
    /// Two device buffers of one batch each.
    pub dev: [DevRef; 2],
    /// Device results, `batches` x `batch_elements`: batch i goes to i * batch_elements.
    pub results: DevRef,
}

/// The lab's schedule: two buffers, two streams, events only.
pub fn pipelined(p: &mut dyn Issue, t: &BufferTask) -> Result<()> {
    two_buffers(p, t, true)
}

/// The double-buffered schedule; without `refill_after_copy` the producer
/// refills a host buffer without waiting for the copy still reading it (the
/// exercise's early-reuse mistake).
pub(crate) fn two_buffers(p: &mut dyn Issue, t: &BufferTask, refill_after_copy: bool) -> Result<()> {
    let n = t.batch_elements;
    let copied: [EventRef; 2] = [p.event()?, p.event()?];
    let computed: [EventRef; 2] = [p.event()?, p.event()?];
    for i in 0..t.batches {
        let b = i % 2;
        if i >= 2 && refill_after_copy {
            // Refill host buffer b only once copy(i-2) has read it.
            p.host_wait(copied[b])?;
        }
        p.produce(t.host[b], 0, n, i, &format!("produce batch {i}"))?;
        if i >= 2 {
            // Overwrite device buffer b only once compute(i-2) has read it.
            p.wait(t.copy, computed[b])?;
        }
        p.h2d(t.copy, t.dev[b], 0, t.host[b], 0, n, &format!("H2D batch {i}"))?;
        p.record(copied[b], t.copy)?;
        p.wait(t.compute, copied[b])?;
        p.compute(t.compute, t.dev[b], 0, t.results, i * n, n, &format!("compute batch {i}"))?;
        p.record(computed[b], t.compute)?;
    }
    Ok(())
}

/// The baseline: one host buffer, one device buffer, one stream.
pub fn no_overlap(p: &mut dyn Issue, t: &BufferTask) -> Result<()> {
    let n = t.batch_elements;
    let done = p.event()?;
    for i in 0..t.batches {
        if i >= 1 {
            p.host_wait(done)?;
        }
        p.produce(t.host[0], 0, n, i, &format!("produce batch {i}"))?;
        p.h2d(t.copy, t.dev[0], 0, t.host[0], 0, n, &format!("H2D batch {i}"))?;
        p.compute(t.copy, t.dev[0], 0, t.results, i * n, n, &format!("compute batch {i}"))?;
        p.record(done, t.copy)?;
    }
    Ok(())
}

/// The pipeline's bound: n·max(C, K) + min(C, K).
pub use crate::lab_kit::two_stage_bound_ms as bound_ms;

/// The bound when the CPU producer may be the slowest stage: the GPU's
/// n·max(C, K) + min(C, K), or the producer's pace n·P + C + K (the last
/// batch still has to be copied and computed), whichever is longer.
pub fn bound_with_producer_ms(batches: usize, produce: f64, copy: f64, kernel: f64) -> f64 {
    bound_ms(batches, copy, kernel).max(batches as f64 * produce + copy + kernel)
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DoubleBufferResults {
    pub config: DoubleBufferConfig,
    pub iterations: i32,
    /// One batch's stages alone, ms.
    pub produce_ms: Summary,
    pub copy_ms: Summary,
    pub kernel_ms: Summary,
    pub no_overlap_ms: Summary,
    pub pipelined_ms: Summary,
    pub no_overlap_timeline: Timeline,
    pub pipelined_timeline: Timeline,
    pub verified_runs: usize,
    /// Median pipelined total with the per-op timeline on over off, minus
    /// one (%); None in records made before it was measured.
    #[serde(default)]
    pub timeline_overhead_pct: Option<f64>,
    /// Every on/off pair's overhead (%).
    #[serde(default)]
    pub timeline_overhead_pairs_pct: Option<Summary>,
    /// What timed the timelines: "cupti" or "cuda events".
    #[serde(default)]
    pub timeline_source: String,
}

pub type DoubleBufferRecord = crate::measure::record::Record<DoubleBufferResults>;

impl DoubleBufferResults {
    /// The bound n·max(C, K) + min(C, K), each stage at its fast end.
    pub fn bound_ms(&self) -> f64 {
        crate::lab_kit::two_stage_bound(self.config.batches, &self.copy_ms, &self.kernel_ms)
    }
    /// The double-buffered loop against the bound, with its runs' spread.
    pub fn efficiency(&self) -> Efficiency {
        crate::lab_kit::two_stage_efficiency(self.config.batches, &self.copy_ms, &self.kernel_ms, &self.pipelined_ms)
    }
    pub fn speedup(&self) -> f64 {
        self.no_overlap_ms.median / self.pipelined_ms.median
    }
    /// The measured numbers behind [`Self::headline`]: the speed-up, with
    /// the range the two loops' spreads allow. Not the two times: each
    /// run sizes its kernel from its own producer's time, so the times
    /// move together from run to run while their ratio does not.
    pub fn headline_figures(&self) -> Vec<crate::lab_kit::headline::HeadlineFigure> {
        vec![crate::lab_kit::headline::HeadlineFigure::new("speed-up, no overlap / double-buffered", "x", self.no_overlap_ms.over(&self.pipelined_ms))]
    }
    /// The lab's headline numbers, as (what, value) rows for the report's
    /// table of GPUs side by side.
    pub fn headline(&self) -> Vec<(String, String)> {
        let mut rows = vec![
            (
                "no overlap / double-buffered".into(),
                format!(
                    "{:.2} / {:.2} ms ({} x {})",
                    self.no_overlap_ms.median,
                    self.pipelined_ms.median,
                    self.config.batches,
                    crate::units::Bytes(self.config.batch_elements as u64 * 4)
                ),
            ),
            ("speed-up; against the bound".into(), format!("{:.2}x; {:.1}%", self.speedup(), 100.0 * self.efficiency().ratio)),
        ];
        if let Some(pct) = self.timeline_overhead_pct {
            rows.push(("timeline overhead, median of pairs".into(), format!("{pct:+.2}% ({})", self.timeline_source)));
        }
        rows
    }
    pub fn summary(&self) -> String {
        let eff = self.efficiency();
        format!(
            "{} batches of {} f32 ({:.1} MiB), kernel {} FMAs/element\n\
             per batch alone: produce {:.3} ms, copy {:.3} ms, kernel {:.3} ms\n\
             no overlap (1 buffer, 1 stream): {:.2} ms\n\
             double-buffered (2+2 buffers, copy + compute streams): {:.2} ms\n\
             bound n*max(C,K) + min(C,K), each stage at its fastest quarter: {:.2} ms -> efficiency {} (its runs' middle half), speed-up {:.2}x{}{}\n",
            self.config.batches,
            self.config.batch_elements,
            self.config.batch_elements as f64 * 4.0 / (1 << 20) as f64,
            self.iterations,
            self.produce_ms.median,
            self.copy_ms.median,
            self.kernel_ms.median,
            self.no_overlap_ms.median,
            self.pipelined_ms.median,
            eff.bound_ms,
            eff.cell(),
            self.speedup(),
            Efficiency::note([&eff]).map_or(String::new(), |why| format!("\n{why}")),
            if self.produce_ms.median > self.copy_ms.median.max(self.kernel_ms.median) {
                "\nnote: the CPU producer is the slowest stage, so the pipeline is bound by the CPU, not by this bound"
            } else {
                ""
            }
        ) + &match self.timeline_overhead_pct {
            Some(pct) => crate::pipeline::timeline::overhead_line(pct, self.timeline_overhead_pairs_pct.as_ref(), &self.timeline_source) + "\n",
            None => String::new(),
        }
    }
}

/// The no-overlap and double-buffered timelines, one above the other.
pub fn timeline_chart(rec: &DoubleBufferRecord, origin: &str) -> crate::present::gantt::Gantt {
    crate::present::gantt::Gantt::new(
        "double-buffer-timelines",
        "Double buffering: one buffer and stream vs two of each",
        origin,
        vec![
            rec.results.no_overlap_timeline.clone().illustrating(rec.results.no_overlap_ms),
            rec.results.pipelined_timeline.clone().illustrating(rec.results.pipelined_ms),
        ],
    )
}

/// Notebook entry points for lab 3.
impl crate::lab_kit::LabRun<DoubleBufferResults> {
    pub fn summary(&self) -> String {
        self.record.results.summary()
    }
    pub fn timeline_chart(&self) -> crate::present::gantt::Gantt {
        timeline_chart(&self.record, &self.origin())
    }
    /// Checks a learner's schedule: live on a GPU, else on the queue model.
    pub fn check_schedule(&self, schedule: impl Fn(&mut dyn Issue, &BufferTask) -> Result<()> + Send + Sync + 'static) -> crate::lab_kit::check::CheckReport {
        let r = &self.record.results;
        let schedule: measure::BufferLoop = std::sync::Arc::new(schedule);
        self.check(
            "double-buffer schedule",
            &exercise::EXERCISES[0],
            r.config.device,
            |gpu| exercise::check_on_gpu(gpu, r, schedule.clone()),
            || exercise::check_on_model(r, r.config.batches, &*schedule),
        )
    }
}

/// Lab 3 in the report: the two timelines (+ Chrome traces), summary.
pub fn report(rec: &DoubleBufferRecord, dir: &Path, origin: &str) -> Result<Vec<PathBuf>> {
    let mut files = timeline_chart(rec, origin).save(dir)?;
    for (name, t) in [("no-overlap", &rec.results.no_overlap_timeline), ("double-buffered", &rec.results.pipelined_timeline)] {
        let trace = dir.join(format!("double-buffer-{name}.trace.json"));
        t.save_chrome_trace(&trace)?;
        files.push(trace);
    }
    files.push(crate::present::chart::write_text(dir.join("double-buffer-summary.txt"), format!("{origin}\n\n{}", rec.results.summary()))?);
    Ok(files)
}

/// Lab 3's entry in the lab table.
pub static ENTRY: crate::lab_kit::Entry<DoubleBufferConfig, DoubleBufferResults> = crate::lab_kit::Entry {
    number: 3,
    name: LAB,
    module: module_path!(),
    teaches: "Double buffering: CPU producer, copy and compute streams, events only",
    builds_on: &[(2, "chunks on streams and the overlap bound")],
    kernels: &[],
    exercises: exercise::EXERCISES,
    glossary: &[crate::lab_kit::Word::new("double buffering", "two buffers used in turn: the CPU fills one while the GPU copies or computes the other")],
    about: "Lab 3: double buffering (CPU producer, copy and compute streams) against no overlap",
    measure: |gpu, cfg, cx| measure::run(gpu, cfg, cx.progress),
    tables: |rec| rec.results.summary(),
    figures: report,
    headline: DoubleBufferResults::headline,
    headline_figures: DoubleBufferResults::headline_figures,
    timelines: |rec, o| vec![timeline_chart(rec, o)],
    fixture: fixture::results,
};

crate::lab_config!(DoubleBufferConfig);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_is_n_times_the_slower_stage_plus_the_faster_once() {
        assert_eq!(bound_ms(10, 1.0, 2.0), 21.0);
        assert_eq!(bound_ms(10, 2.0, 1.0), 21.0);
        let mut c = DoubleBufferConfig::default();
        c.validate().unwrap();
        c.batches = 1;
        assert!(c.validate().unwrap_err().to_string().contains("batches"));
        c.batches = 4;
        c.batch_elements = 3;
        assert!(c.validate().unwrap_err().to_string().contains("even"));
    }
}
