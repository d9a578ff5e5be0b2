//! Lab 2: asynchronous copies and chunked overlap.
//!
//! One stream runs H2D -> kernel -> D2H in order, so the copy engines and the
//! SMs take turns. Split the data into chunks over several non-blocking
//! streams and chunk i's kernel runs while chunk i+1 is uploaded and chunk
//! i-1 downloaded. How much that buys is set by the slowest stage: the sweep
//! measures it against the closed-form bounds and the queue model.

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
use crate::measure::stats::Summary;
use crate::pipeline::issue::Issue;
use crate::pipeline::issue::{DevRef, HostRef, StreamRef};
use crate::pipeline::op::OpKind;
use crate::pipeline::timeline::Timeline;
use serde::{Deserialize, Serialize};

pub const LAB: &str = "overlap";

/// How much work the kernel does per byte, relative to copying the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Intensity {
    /// Kernel ~1/4 of one copy direction.
    CopyBound,
    /// Kernel ~ one copy direction.
    Balanced,
    /// Kernel ~4x one copy direction.
    ComputeBound,
}

impl Intensity {
    pub const ALL: [Intensity; 3] = [Intensity::CopyBound, Intensity::Balanced, Intensity::ComputeBound];
    /// Target kernel time over H2D time for the whole data.
    pub fn kernel_over_copy(self) -> f64 {
        match self {
            Intensity::CopyBound => 0.25,
            Intensity::Balanced => 1.0,
            Intensity::ComputeBound => 4.0,
        }
    }
    pub fn label(self) -> &'static str {
        match self {
            Intensity::CopyBound => "copy-bound",
            Intensity::Balanced => "balanced",
            Intensity::ComputeBound => "compute-bound",
        }
    }
}

/// The order the host issues a chunked pipeline in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum IssueOrder {
    /// For each chunk: its H2D, kernel, D2H.
    DepthFirst,
    /// All H2Ds, then all kernels, then all D2Hs.
    BreadthFirst,
    /// One stream per stage (uploads, kernels, downloads: three streams),
    /// chunk i's stages linked by events. Each engine's work then sits in one
    /// in-order queue, and no chunk waits behind another chunk's other stage.
    StageStreams,
}

impl IssueOrder {
    pub fn label(self) -> &'static str {
        match self {
            IssueOrder::DepthFirst => "depth-first",
            IssueOrder::BreadthFirst => "breadth-first",
            IssueOrder::StageStreams => "stream per stage",
        }
    }
    /// For file names.
    pub fn slug(self) -> &'static str {
        match self {
            IssueOrder::DepthFirst => "depth-first",
            IssueOrder::BreadthFirst => "breadth-first",
            IssueOrder::StageStreams => "stage-streams",
        }
    }
    /// Two letters for tables.
    pub fn short(self) -> &'static str {
        match self {
            IssueOrder::DepthFirst => "DF",
            IssueOrder::BreadthFirst => "BF",
            IssueOrder::StageStreams => "SS",
        }
    }
    /// Streams this order uses at a point of the grid with `streams` streams.
    pub fn streams_used(self, streams: usize) -> usize {
        match self {
            IssueOrder::StageStreams => STAGE_STREAMS,
            _ => streams,
        }
    }
}

impl IssueOrder {
    /// Issues `stages` of every chunk of `t` in this order: the lab's own
    /// loop, which the GPU rig and the queue model both run. The stream per
    /// stage layout takes `t.streams[0..3]` as uploads, kernels, downloads.
    pub fn issue(self, p: &mut dyn Issue, t: &ChunkTask, stages: &[OpKind]) -> Result<()> {
        let stage = |p: &mut dyn Issue, c: usize, what: OpKind, s: StreamRef| {
            let (at, n) = t.chunk(c);
            match what {
                OpKind::H2d => p.h2d(s, t.dev_in, at, t.host_in, at, n, &format!("H2D chunk {c}")),
                OpKind::Kernel => p.compute(s, t.dev_in, at, t.dev_out, at, n, &format!("compute chunk {c}")),
                _ => p.d2h(s, t.host_out, at, t.dev_out, at, n, &format!("D2H chunk {c}")),
            }
        };
        let round_robin = |c: usize| t.streams[c % t.streams.len()];
        match self {
            IssueOrder::DepthFirst => {
                for c in 0..t.chunks {
                    for &what in stages {
                        stage(p, c, what, round_robin(c))?;
                    }
                }
            }
            IssueOrder::BreadthFirst => {
                for &what in stages {
                    for c in 0..t.chunks {
                        stage(p, c, what, round_robin(c))?;
                    }
                }
            }
            IssueOrder::StageStreams => {
                if t.streams.len() < STAGE_STREAMS {
                    return Err(LabError::config(format!("{} needs {STAGE_STREAMS} streams; got {}", self.label(), t.streams.len())));
                }
                // Chunk c's next stage waits for its previous one, on the
                // next stage's stream, through an event.
                for c in 0..t.chunks {
                    let mut done = None;
                    for (j, &what) in stages.iter().enumerate() {
                        let s = t.streams[what.stage_index()];
                        if let Some(e) = done {
                            p.wait(s, e)?;
                        }
                        stage(p, c, what, s)?;
                        done = if j + 1 < stages.len() {
                            let e = p.event()?;
                            p.record(e, s)?;
                            Some(e)
                        } else {
                            None
                        };
                    }
                }
            }
        }
        Ok(())
    }
}

/// What an issue loop is given: the data's size and chunking, the streams
/// and the four buffers (as handles the GPU and the model both accept).
#[derive(Clone, Debug)]
pub struct ChunkTask {
    pub elements: usize,
    pub chunks: usize,
    pub streams: Vec<StreamRef>,
    pub host_in: HostRef,
    pub host_out: HostRef,
    pub dev_in: DevRef,
    pub dev_out: DevRef,
}

impl ChunkTask {
    /// The task a plan's loop is handed: its streams, `host in` and `host
    /// out`, device buffers 0 (in) and 1 (out), cut in `chunks` chunks.
    pub fn of(r: &crate::pipeline::plan::Refs, chunks: usize) -> ChunkTask {
        ChunkTask {
            elements: r.elements,
            chunks,
            streams: r.streams.clone(),
            host_in: r.input,
            host_out: r.output,
            dev_in: r.devices[0],
            dev_out: r.devices[1],
        }
    }

    /// (first element, element count) of chunk `c`: `chunks` near-equal
    /// chunks, boundaries on even elements (host copies move whole 8-byte
    /// words), the last taking what is left.
    pub fn chunk(&self, c: usize) -> (usize, usize) {
        crate::pipeline::plan::chunk(self.elements, self.chunks, c)
    }
}

/// Streams of the stream-per-stage layout: uploads, kernels, downloads.
pub const STAGE_STREAMS: usize = 3;

pub const MAX_CHUNKS: usize = 1024;

/// Lab 2's settings; `overlap-lab overlap` takes each as an option.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct OverlapConfig {
    /// GPU ordinal (the command line's `--device`).
    #[arg(skip)]
    pub device: usize,
    /// f32 elements in the whole data set (32Mi = 128 MiB each way).
    #[arg(long, default_value_t = OverlapConfig::default().elements)]
    pub elements: usize,
    /// Chunk counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = OverlapConfig::default().chunks)]
    pub chunks: Vec<usize>,
    /// Stream counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = OverlapConfig::default().streams)]
    pub streams: Vec<usize>,
    /// Kernel intensities, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = OverlapConfig::default().intensities)]
    pub intensities: Vec<Intensity>,
    /// Issue orders, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = OverlapConfig::default().orders)]
    pub orders: Vec<IssueOrder>,
    /// Untimed runs of each point first.
    #[arg(long, default_value_t = OverlapConfig::default().warmup)]
    pub warmup: usize,
    /// Timed runs of each point.
    #[arg(long, default_value_t = OverlapConfig::default().repeats)]
    pub repeats: usize,
}

impl Default for OverlapConfig {
    fn default() -> Self {
        OverlapConfig {
            device: 0,
            elements: 32 << 20,
            chunks: vec![1, 2, 4, 8, 16, 32, 64],
            streams: vec![1, 2, 4, 8],
            intensities: Intensity::ALL.to_vec(),
            orders: vec![IssueOrder::DepthFirst, IssueOrder::BreadthFirst, IssueOrder::StageStreams],
            warmup: 1,
            repeats: 5,
        }
    }
}

impl OverlapConfig {
    /// The headline's points (every intensity's one-chunk run and its best
    /// point) with fewer chunk counts around them and fewer repeats.
    pub fn headline() -> Self {
        OverlapConfig { chunks: vec![1, 4, 16, 32, 64], repeats: 3, ..Self::default() }
    }
    /// A short sweep for notebooks.
    pub fn quick() -> Self {
        OverlapConfig { elements: 16 << 20, chunks: vec![1, 2, 4, 8, 16, 32], streams: vec![1, 2, 4], repeats: 3, ..Self::default() }
    }
    /// The smallest run that still touches every code path (4 MiB each way,
    /// 1 and 4 chunks, every order, one intensity): for compute-sanitizer
    /// and smoke tests, not for numbers.
    pub fn small() -> Self {
        OverlapConfig {
            elements: 1 << 20,
            chunks: vec![1, 4],
            streams: vec![1, 2],
            intensities: vec![Intensity::Balanced],
            warmup: 0,
            repeats: 1,
            ..Self::default()
        }
    }

    pub fn validate(&self) -> Result<()> {
        let max_chunks = self.chunks.iter().copied().max().unwrap_or(0);
        if self.chunks.is_empty() || self.chunks.contains(&0) || max_chunks > MAX_CHUNKS {
            return Err(LabError::config(format!("--chunks must be 1-{MAX_CHUNKS} (got {:?})", self.chunks)));
        }
        if self.streams.is_empty() || self.streams.contains(&0) || self.streams.iter().any(|&s| s > 64) {
            return Err(LabError::config(format!("--streams must be 1-64 (got {:?})", self.streams)));
        }
        if self.elements < 2 * max_chunks || self.elements > (1 << 32) {
            return Err(LabError::config(format!(
                "--elements {} cannot be split into {max_chunks} chunks of at least 2 (and at most 2^32 elements)",
                self.elements
            )));
        }
        if self.intensities.is_empty() || self.orders.is_empty() {
            return Err(LabError::config("--intensities and --orders each need at least one value"));
        }
        if self.repeats == 0 || self.repeats > 1000 || self.warmup > 100 {
            return Err(LabError::config(format!("--repeats must be 1-1000 and --warmup 0-100 (got {} and {})", self.repeats, self.warmup)));
        }
        Ok(())
    }

    /// Every point to run, as (chunks, streams, order): the grid for the
    /// round-robin orders, and each chunk count on its three streams for
    /// the stream-per-stage layout.
    pub fn points(&self) -> Vec<(usize, usize, IssueOrder)> {
        let mut v = Vec::new();
        for &order in &self.orders {
            if order == IssueOrder::StageStreams {
                v.extend(self.chunks.iter().map(|&c| (c, STAGE_STREAMS, order)));
            } else {
                v.extend(self.grid().into_iter().map(|(c, s)| (c, s, order)));
            }
        }
        v
    }

    /// Streams the sweep needs at most.
    pub fn max_streams(&self) -> usize {
        self.points().iter().map(|p| p.1).max().unwrap_or(1)
    }

    /// Every (chunks, streams) pair worth running: more streams than chunks
    /// would leave streams idle.
    pub fn grid(&self) -> Vec<(usize, usize)> {
        let mut v = Vec::new();
        for &c in &self.chunks {
            for &s in &self.streams {
                if s <= c {
                    v.push((c, s));
                }
            }
        }
        v
    }
}

/// The parts of the pipeline, each stage run alone over the whole data (ms):
/// in one launch/copy for the intensity's overview, and with a point's own
/// chunks and streams for that point's bound.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Parts {
    pub h2d_ms: Summary,
    pub kernel_ms: Summary,
    pub d2h_ms: Summary,
    /// H2D and D2H of the whole data at once (uploads on one stream,
    /// downloads on another, no kernel): the link is not full-duplex at full
    /// rate, so this is more than max(H, D). For a point: in its own chunks,
    /// since many small copies both ways move slower than two big ones.
    pub both_copies_ms: Summary,
}

impl Parts {
    /// Parts from samples of [H2D, kernel, D2H, both copies] (ms).
    pub fn of_samples(samples: &[[f64; 4]]) -> Result<Parts> {
        let col = |i: usize| Summary::of(&samples.iter().map(|s| s[i]).collect::<Vec<_>>());
        Ok(Parts { h2d_ms: col(0)?, kernel_ms: col(1)?, d2h_ms: col(2)?, both_copies_ms: col(3)? })
    }
    /// The queue model's machine: `copy_engines` engines, each direction
    /// slowed while both run by what the parts measured (max(H, D) over H|D).
    pub fn machine(&self, copy_engines: u32) -> crate::pipeline::machine::Machine {
        crate::pipeline::machine::Machine::copies_measured(copy_engines, self.h2d_ms.median, self.d2h_ms.median, self.both_copies_ms.median)
    }
    /// How long `op` takes in the queue model: its byte share of the whole
    /// data times its stage measured alone (ms). Host work and memory calls
    /// cost nothing here (this lab measures neither).
    pub fn op_ms(&self, op: &crate::pipeline::op::Op, elements: usize) -> f64 {
        let share = op.accesses.first().map_or(0.0, |a| (a.end - a.start) as f64 / (elements * 4) as f64);
        share
            * match op.kind {
                crate::pipeline::op::OpKind::H2d => self.h2d_ms.median,
                crate::pipeline::op::OpKind::Kernel => self.kernel_ms.median,
                crate::pipeline::op::OpKind::D2h => self.d2h_ms.median,
                _ => 0.0,
            }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OverlapPoint {
    pub chunks: usize,
    pub streams: usize,
    pub order: IssueOrder,
    /// Each stage alone with this point's chunks and streams (its bound).
    pub parts: Parts,
    /// First op start to last op end on the device (events), ms.
    pub total_ms: Summary,
    pub verified_runs: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IntensityResults {
    pub intensity: Intensity,
    /// FMAs per element chosen by calibration.
    pub iterations: i32,
    pub parts: Parts,
    /// H2D, host sync, kernel, host sync, D2H, host sync (wall clock, ms).
    pub synchronous_ms: Summary,
    pub points: Vec<OverlapPoint>,
    /// One chunk on one stream, then the fastest point, measured and predicted.
    pub serial_timeline: Timeline,
    pub best_timeline: Timeline,
    pub best_predicted: Timeline,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OverlapResults {
    pub config: OverlapConfig,
    pub copy_engines: u32,
    pub intensities: Vec<IntensityResults>,
    /// How much slower the run with the drawn timeline was (%, the median of
    /// alternating pairs: [`crate::pipeline::timeline::overhead_pct`]).
    pub timeline_overhead_pct: f64,
    /// Every pair's overhead (%).
    #[serde(default)]
    pub timeline_overhead_pairs_pct: Option<Summary>,
    /// What timed the timelines: "cupti" or "cuda events".
    #[serde(default)]
    pub timeline_source: String,
}

pub type OverlapRecord = crate::measure::record::Record<OverlapResults>;

impl IntensityResults {
    pub fn point(&self, chunks: usize, streams: usize, order: IssueOrder) -> Option<&OverlapPoint> {
        self.points.iter().find(|p| p.chunks == chunks && p.streams == streams && p.order == order)
    }
    /// One chunk, one stream: the async-but-serial baseline.
    pub fn serial(&self) -> Option<&OverlapPoint> {
        self.points.iter().find(|p| p.chunks == 1 && p.streams == 1)
    }
    pub fn best(&self) -> Option<&OverlapPoint> {
        self.points.iter().min_by(|a, b| a.total_ms.median.total_cmp(&b.total_ms.median))
    }
}

impl OverlapResults {
    pub fn intensity(&self, i: Intensity) -> Option<&IntensityResults> {
        self.intensities.iter().find(|r| r.intensity == i)
    }
    /// The headline table and what the drawn timeline cost: what the CLI,
    /// the report and notebook 02 print.
    pub fn summary(&self) -> String {
        format!("{}{}\n", model::summary_table(&self.intensities, self.copy_engines), self.overhead_line())
    }
    /// See [`crate::pipeline::timeline::overhead_line`].
    pub fn overhead_line(&self) -> String {
        crate::pipeline::timeline::overhead_line(self.timeline_overhead_pct, self.timeline_overhead_pairs_pct.as_ref(), &self.timeline_source)
    }
}

/// Notebook entry points for lab 2.
impl crate::lab_kit::LabRun<OverlapResults> {
    pub fn summary(&self) -> String {
        self.record.results.summary()
    }
    /// The classic ceilings next to the measured speed-ups.
    pub fn speedup_limits(&self) -> String {
        model::speedup_limits(&self.record.results.intensities, self.record.results.copy_engines)
    }
    /// Every point of one intensity against its own bound, fastest first.
    pub fn efficiency_table(&self, intensity: Intensity) -> String {
        self.record
            .results
            .intensity(intensity)
            .map_or_else(|| format!("no {} runs recorded\n", intensity.label()), |ir| model::efficiency_table(ir, self.record.results.copy_engines))
    }
    pub fn speedup_heatmap(&self, order: IssueOrder) -> crate::present::chart::Heatmap {
        charts::speedup_heatmap(&self.record, order, &self.origin())
    }
    pub fn measured_vs_bound_chart(&self) -> crate::present::chart::Figure {
        charts::measured_vs_bound(&self.record, &self.origin())
    }
    /// Serial vs best pipeline, measured and predicted, for one intensity.
    pub fn timeline_chart(&self, intensity: Intensity) -> Option<crate::present::gantt::Gantt> {
        let i = self.record.results.intensities.iter().position(|r| r.intensity == intensity)?;
        charts::timelines(&self.record, i, &self.origin())
    }
    /// Checks a learner's issue loop: on the GPU when one is here (at the
    /// recorded data size), else on the queue model with the recorded parts.
    pub fn check_issue_loop(
        &self,
        intensity: Intensity,
        chunks: usize,
        streams: usize,
        issue: impl Fn(&mut dyn crate::pipeline::issue::Issue, &exercise::ChunkTask) -> Result<()> + Send + Sync + 'static,
    ) -> crate::lab_kit::check::CheckReport {
        let r = &self.record.results;
        let issue: measure::ChunkLoop = std::sync::Arc::new(issue);
        self.check(
            "chunked issue loop",
            &exercise::EXERCISES[0],
            r.config.device,
            |gpu| exercise::check_on_gpu(gpu, intensity, r.config.elements, chunks, streams, issue.clone()),
            || exercise::check_on_model(r, intensity, chunks, streams, &*issue),
        )
    }
}

/// Lab 2's entry in the lab table.
pub static ENTRY: crate::lab_kit::Entry<OverlapConfig, OverlapResults> = crate::lab_kit::Entry {
    number: 2,
    name: LAB,
    module: module_path!(),
    teaches: "Chunked copy/compute overlap over N streams, against its bound and a queue model",
    builds_on: &[(1, "pinned memory: only page-locked copies run asynchronously")],
    kernels: &[],
    exercises: exercise::EXERCISES,
    glossary: &[
        crate::lab_kit::Word::new("H, K, D, H|D", "the whole data's H2D, kernel, D2H alone, and both copies at once"),
        crate::lab_kit::Word::new(
            "chunks/streams DF, BF, SS",
            "issue orders: depth-first (a chunk's three ops, then the next), breadth-first (every H2D, then every kernel...), a stream per stage",
        ),
        crate::lab_kit::Word::new("serial", "one chunk on one stream: nothing overlaps"),
    ],
    about: "Lab 2: chunked copy/compute overlap over N streams, against the bounds and the queue model",
    measure: |gpu, cfg, cx| measure::run(gpu, cfg, cx.progress),
    tables: |rec| rec.results.summary(),
    figures: charts::report,
    headline: model::headline,
    headline_figures: model::headline_figures,
    timelines: |rec, o| (0..rec.results.intensities.len()).filter_map(|i| charts::timelines(rec, i, o)).collect(),
    fixture: fixture::results,
};

crate::lab_config!(OverlapConfig);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_data_on_even_boundaries() {
        for (n, c) in [(1000usize, 7usize), (32 << 20, 64), (128, 64), (10, 1)] {
            let mut dry = crate::pipeline::dry_run::DryRun::new();
            let t = ChunkTask {
                elements: n,
                chunks: c,
                streams: vec![dry.stream()],
                host_in: dry.host("in", 1, true),
                host_out: dry.host("out", 1, false),
                dev_in: dry.device("in", 1),
                dev_out: dry.device("out", 1),
            };
            // (first element, count), each chunk starting where the one before ends, on an even element.
            let r: Vec<(usize, usize)> = (0..c).map(|k| t.chunk(k)).collect();
            assert_eq!(r[0].0, 0);
            assert_eq!(r[c - 1].0 + r[c - 1].1, n);
            for w in r.windows(2) {
                assert_eq!(w[0].0 + w[0].1, w[1].0);
                assert_eq!(w[1].0 % 2, 0);
            }
            assert!(r.iter().all(|&(_, len)| len > 0), "{r:?}");
        }
    }

    #[test]
    fn bad_configs_are_named() {
        let bad = |f: &dyn Fn(&mut OverlapConfig)| {
            let mut c = OverlapConfig::default();
            f(&mut c);
            c.validate().unwrap_err().to_string()
        };
        OverlapConfig::default().validate().unwrap();
        assert!(bad(&|c| c.chunks = vec![0]).contains("--chunks"));
        assert!(bad(&|c| c.chunks = vec![5000]).contains("--chunks"));
        assert!(bad(&|c| c.streams = vec![]).contains("--streams"));
        assert!(bad(&|c| c.elements = 10).contains("--elements 10 cannot be split"));
        assert!(bad(&|c| c.repeats = 0).contains("--repeats"));
        let g = OverlapConfig::default().grid();
        assert!(g.contains(&(1, 1)) && g.contains(&(64, 8)) && !g.contains(&(2, 4)));
    }

    #[test]
    fn stage_streams_points_use_three_streams_once_per_chunk_count() {
        let cfg = OverlapConfig::default();
        let pts = cfg.points();
        let ss: Vec<_> = pts.iter().filter(|p| p.2 == IssueOrder::StageStreams).collect();
        assert_eq!(ss.len(), cfg.chunks.len());
        assert!(ss.iter().all(|p| p.1 == STAGE_STREAMS));
        assert_eq!(pts.iter().filter(|p| p.2 == IssueOrder::DepthFirst).count(), cfg.grid().len());
        assert_eq!(cfg.max_streams(), 8);
        let only_ss = OverlapConfig { orders: vec![IssueOrder::StageStreams], streams: vec![1], ..cfg };
        assert_eq!(only_ss.max_streams(), 3);
    }
}
