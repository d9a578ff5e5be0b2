//! Lab 5: which stream, and what it costs. Each experiment is a set of
//! [`Plan`]s (variants of one pipeline) run on the GPU, verified, timed
//! with spread, and predicted by the queue model from each operation
//! measured alone: the legacy NULL stream against blocking and
//! non-blocking streams, the weight of each way to wait, the copy engines
//! (both directions at once, three-way overlap against a bound that knows
//! the bidirectional ceiling), and stream priorities.
//!
//! May use: `pipeline` (plans, the model), `gpu` (to run them), `measure`,
//! `present`.

pub mod experiments;
pub mod measure;

use crate::gpu::MachineFacts;
use crate::measure::stats::Summary;
use crate::pipeline::timeline::Timeline;
use serde::{Deserialize, Serialize};

pub const LAB: &str = "streams";

/// Lab 5's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct StreamsConfig {
    /// f32 elements the pipelines move (64 MiB by default).
    #[arg(long, default_value_t = 16 << 20)]
    pub elements: usize,
    /// Chunks of the chunked pipelines.
    #[arg(long, default_value_t = 8)]
    pub chunks: usize,
    /// Streams of the chunked pipelines.
    #[arg(long, default_value_t = 4)]
    pub streams: usize,
    /// Timed runs per variant (after one warm-up).
    #[arg(long, default_value_t = 7)]
    pub repeats: usize,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
}

impl Default for StreamsConfig {
    fn default() -> Self {
        StreamsConfig { elements: 16 << 20, chunks: 8, streams: 4, repeats: 7, device: 0 }
    }
}

impl StreamsConfig {
    /// The notebook's run.
    pub fn quick() -> Self {
        StreamsConfig { elements: 8 << 20, repeats: 5, ..Self::default() }
    }
    /// Every code path, small.
    pub fn small() -> Self {
        StreamsConfig { elements: 1 << 18, chunks: 4, streams: 2, repeats: 2, device: 0 }
    }
    pub fn validate(&self) -> crate::Result<()> {
        let bad = |why: String| Err(crate::LabError::config(why));
        if self.elements < 1 << 12 || self.elements % 2 != 0 || self.elements > 1 << 30 {
            return bad(format!("--elements {}: give an even number from 4096 to 2^30", self.elements));
        }
        if !(2..=64).contains(&self.chunks) {
            return bad(format!("--chunks {}: give 2 to 64", self.chunks));
        }
        if !(2..=16).contains(&self.streams) || self.streams > self.chunks {
            return bad(format!("--streams {}: give 2 to 16, at most --chunks ({})", self.streams, self.chunks));
        }
        if !(1..=1000).contains(&self.repeats) {
            return bad(format!("--repeats {}: give 1 to 1000", self.repeats));
        }
        Ok(())
    }
}

crate::lab_config!(StreamsConfig);

/// One variant of an experiment, measured and predicted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VariantResult {
    pub name: String,
    /// First op's start to the last op's end on the GPU (events), ms.
    pub total_ms: Summary,
    /// The queue model's total from each op measured alone, ms.
    pub model_ms: f64,
    /// When the experiment names a job to watch (the urgent job of the
    /// priority experiment): its last op's end, measured and predicted, ms.
    pub watched_ms: Option<Summary>,
    pub watched_model_ms: Option<f64>,
    /// The best this pipeline could do on this machine, ms (three-way
    /// overlap: a bound that knows the bidirectional ceiling).
    #[serde(default)]
    pub bound_ms: Option<f64>,
    /// One run's timeline (the last).
    pub timeline: Timeline,
    pub predicted: Timeline,
}

impl VariantResult {
    /// |ln(model / measured)| of the total.
    pub fn model_error(&self) -> f64 {
        (self.model_ms / self.total_ms.median).ln().abs()
    }
}

/// One experiment's variants.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExperimentResult {
    pub name: String,
    pub shows: String,
    pub variants: Vec<VariantResult>,
}

impl ExperimentResult {
    pub fn variant(&self, name: &str) -> Option<&VariantResult> {
        self.variants.iter().find(|v| v.name == name)
    }
}

/// Lab 5's results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StreamsResults {
    pub config: StreamsConfig,
    pub machine: MachineFacts,
    /// The kernel's FMA chain per element, chosen so a chunk's kernel
    /// takes about as long as its H2D.
    pub iterations: i32,
    /// (priority least, greatest) of this GPU.
    pub priority_range: (i32, i32),
    /// Every distinct op alone: (kind, elements, ms).
    pub costs: Vec<(crate::pipeline::schedule::OpKind, usize, f64)>,
    pub experiments: Vec<ExperimentResult>,
}

impl StreamsResults {
    pub fn experiment(&self, name: &str) -> Option<&ExperimentResult> {
        self.experiments.iter().find(|e| e.name == name)
    }

    /// The table the command line prints.
    pub fn table(&self) -> String {
        let m = &self.machine;
        let mut out = format!(
            "machine: {} copy engines; H2D {:.3} ms, D2H {:.3} ms, both at once {:.3} ms (each direction at {:.0}% while both run); a CPU thread resumes {:.1} µs after the GPU work it waited for; kernel: {} FMAs per element\n",
            m.copy_engines,
            m.h2d_ms,
            m.d2h_ms,
            m.both_ms,
            100.0 * m.machine().both_ways,
            m.wake_ms * 1e3,
            self.iterations
        );
        for e in &self.experiments {
            out += &format!("\n{}: {}\n", e.name, e.shows);
            out += &format!("  {:<52} {:>10} {:>16} {:>10} {:>8}\n", "variant", "median ms", "spread ms", "model ms", "error");
            for v in &e.variants {
                out += &format!(
                    "  {:<52} {:>10.3} {:>7.3}..{:<8.3} {:>10.3} {:>7.1}%\n",
                    v.name,
                    v.total_ms.median,
                    v.total_ms.min,
                    v.total_ms.max,
                    v.model_ms,
                    100.0 * (v.model_ms / v.total_ms.median - 1.0)
                );
                if let (Some(w), Some(wm)) = (&v.watched_ms, v.watched_model_ms) {
                    out += &format!("  {:<52} {:>10.3} {:>7.3}..{:<8.3} {:>10.3}\n", "  urgent job done at", w.median, w.min, w.max, wm);
                }
            }
            for v in &e.variants {
                if let Some(b) = v.bound_ms {
                    out += &format!("  {}: {:.1}% of the bound that knows the bidirectional ceiling ({b:.3} ms)\n", v.name, 100.0 * b / v.total_ms.median);
                }
            }
        }
        out
    }
}
