//! Lab 5: which stream, and what it costs. Each experiment is a set of
//! [`Plan`](crate::pipeline::plan::Plan)s (variants of one pipeline) run on the GPU, verified, timed
//! with spread, and predicted by the queue model from each operation
//! measured alone: the legacy NULL stream against blocking and
//! non-blocking streams, the weight of each way to wait, the copy engines
//! (both directions at once, three-way overlap against a bound that knows
//! the bidirectional ceiling), and stream priorities.
//!
//! May use: `pipeline` (plans, the model), `gpu` (to run them), `measure`,
//! `present`.

pub mod exercise;
pub mod experiments;
#[doc(hidden)]
pub mod fixture;
#[cfg(test)]
mod gpu_tests;
pub mod issue_cost;
pub mod measure;
#[cfg(test)]
mod recorded_tests;

use crate::error::{LabError, Result};
use crate::gpu::MachineFacts;
use crate::lab_kit::check::CheckReport;
pub use crate::lab_kit::experiment::{effect_line, EffectSize, ExperimentResult, VariantResult};
use crate::measure::record::Record;
use crate::measure::stats::Efficiency;
use crate::pipeline::issue::Issue;
use crate::pipeline::plan::Costs;
use crate::pipeline::timeline::Timeline;
use crate::present::chart::{Chart, Figure};
use crate::present::gantt::Gantt;
use exercise::StreamsTask;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const LAB: &str = "streams";

/// The issue-cost sweep's name (for [`StreamsResults::timelines`]).
pub const ISSUE_COST: &str = "issue-cost";

/// Lab 5's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct StreamsConfig {
    /// f32 elements the pipelines move (64 MiB by default).
    #[arg(long, default_value_t = StreamsConfig::default().elements)]
    pub elements: usize,
    /// Chunks of the chunked pipelines.
    #[arg(long, default_value_t = StreamsConfig::default().chunks)]
    pub chunks: usize,
    /// Streams of the chunked pipelines.
    #[arg(long, default_value_t = StreamsConfig::default().streams)]
    pub streams: usize,
    /// Timed runs per variant (after two warm-ups). Both directions at
    /// once vary more from run to run than one way, so medians need more
    /// runs than one-way copies.
    #[arg(long, default_value_t = StreamsConfig::default().repeats)]
    pub repeats: usize,
    /// Chunk counts of the issue-cost sweep (over a quarter of
    /// --elements; each chunk at least 4 KiB).
    #[arg(long, value_delimiter = ',', default_values_t = StreamsConfig::default().issue_chunks)]
    #[serde(default = "default_issue_chunks")]
    pub issue_chunks: Vec<usize>,
    /// GPU ordinal (the command line's `--device`).
    #[arg(skip)]
    pub device: usize,
}

impl Default for StreamsConfig {
    fn default() -> Self {
        StreamsConfig { elements: 16 << 20, chunks: 8, streams: 4, repeats: 15, issue_chunks: default_issue_chunks(), device: 0 }
    }
}

fn default_issue_chunks() -> Vec<usize> {
    vec![4, 16, 64, 256, 1024, 4096]
}

impl StreamsConfig {
    /// Its full run: it is short.
    pub fn headline() -> Self {
        Self::default()
    }
    /// The notebook's run.
    pub fn quick() -> Self {
        StreamsConfig { elements: 8 << 20, repeats: 7, issue_chunks: vec![4, 16, 64, 256, 1024], ..Self::default() }
    }
    /// Every code path, small.
    pub fn small() -> Self {
        StreamsConfig { elements: 1 << 18, chunks: 4, streams: 2, repeats: 2, issue_chunks: vec![4, 16, 64], device: 0 }
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
        let sweep = issue_cost::elements(self);
        if self.issue_chunks.is_empty() {
            return bad("--issue-chunks: give at least one chunk count".into());
        }
        if let Some(&n) = self.issue_chunks.iter().find(|&&n| n < 2 || sweep / n < issue_cost::MIN_CHUNK) {
            return bad(format!(
                "--issue-chunks {n}: give counts from 2 to {} (the sweep moves {sweep} elements, a quarter of --elements, in chunks of at least {} elements)",
                sweep / issue_cost::MIN_CHUNK,
                issue_cost::MIN_CHUNK
            ));
        }
        Ok(())
    }
}

crate::lab_config!(StreamsConfig);

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
    pub costs: Vec<(crate::pipeline::op::OpKind, usize, f64)>,
    pub experiments: Vec<ExperimentResult>,
    /// Issue cost and CUDA graphs, swept over chunk sizes.
    #[serde(default)]
    pub issue_cost: Option<issue_cost::IssueCost>,
}

impl StreamsResults {
    pub fn experiment(&self, name: &str) -> Option<&ExperimentResult> {
        self.experiments.iter().find(|e| e.name == name)
    }

    /// Variant `i` of experiment `name`.
    fn nth(&self, name: &str, i: usize) -> Option<&VariantResult> {
        self.experiment(name).and_then(|e| e.variants.get(i))
    }

    /// Every op measured alone, as the model takes them.
    pub fn costs_map(&self) -> Costs {
        self.costs.iter().map(|&(k, n, ms)| ((k, n), ms)).collect()
    }

    /// A variant against its bound, where it has one (three-way overlap's,
    /// which knows the bidirectional ceiling): the bound from the
    /// experiment's ops alone and the ceiling its both-ways variant read,
    /// each at its fast end as measured (the rule of every bound: see
    /// [`Efficiency`]); in a recording that kept neither, the bound it
    /// recorded.
    pub fn efficiency(&self, e: &ExperimentResult, v: &VariantResult) -> Option<Efficiency> {
        let recorded = v.bound_ms?;
        let bound = match e.ceiling {
            Some(share) if v.name == experiments::THREE_WAY && !e.costs.is_empty() => {
                measure::three_way_bound(&e.costs_map(), share, self.config.elements, experiments::three_way_chunks(&self.config))
            }
            _ => recorded,
        };
        Some(Efficiency::new(bound, &[], &v.total_ms))
    }

    /// Three-way overlap against its bound.
    pub fn three_way(&self) -> Option<(&VariantResult, Efficiency)> {
        let e = self.experiment("copy-engines")?;
        let v = e.variant(experiments::THREE_WAY)?;
        Some((v, self.efficiency(e, v)?))
    }

    /// The variant the model missed most, and by how much (model / measured - 1).
    pub fn worst_model_error(&self) -> Option<(&VariantResult, f64)> {
        self.experiments
            .iter()
            .flat_map(|e| e.variants.iter())
            .map(|v| (v, v.model_ms / v.total_ms.median - 1.0))
            .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
    }

    /// The measured numbers behind [`Self::headline`]: every variant of
    /// every experiment.
    pub fn headline_figures(&self) -> Vec<crate::lab_kit::headline::HeadlineFigure> {
        self.experiments.iter().flat_map(|e| e.headline_figures()).collect()
    }
    /// The headline table's rows.
    pub fn headline(&self) -> Vec<(String, String)> {
        let mut rows = Vec::new();
        let pct = |a: f64, b: f64| 100.0 * (b / a - 1.0);
        if let (Some(base), Some(null), Some(nb)) = (self.nth("legacy-stream", 0), self.nth("legacy-stream", 1), self.nth("legacy-stream", 2)) {
            let (b, n, k) = (base.total_ms.median, null.total_ms.median, nb.total_ms.median);
            rows.push((
                "one tiny copy on the NULL stream: blocking / non-blocking streams".into(),
                format!("{:+.0}% / {:+.0}% ({b:.3} ms without)", pct(b, n), pct(b, k)),
            ));
        }
        if let (Some(legacy), Some(own)) = (self.nth("threads", 0), self.nth("threads", 1)) {
            rows.push((
                "threads on the default stream: legacy / per-thread".into(),
                format!("{:.3} / {:.3} ms ({:.2}x)", legacy.total_ms.median, own.total_ms.median, legacy.total_ms.median / own.total_ms.median),
            ));
        }
        if let (Some(gpu), Some(ctx)) = (self.nth("sync-weight", 0), self.nth("sync-weight", 3)) {
            rows.push(("cuStreamWaitEvent / cuCtxSynchronize per chunk".into(), format!("{:.3} / {:.3} ms", gpu.total_ms.median, ctx.total_ms.median)));
        }
        if let (Some(apart), Some(both)) = (self.nth("copy-engines", 0), self.nth("copy-engines", 1)) {
            rows.push(("H2D then D2H / both at once".into(), format!("{:.3} / {:.3} ms", apart.total_ms.median, both.total_ms.median)));
        }
        if let Some((_, e)) = self.three_way() {
            rows.push(("three-way overlap, of its bidirectional-aware bound".into(), format!("{:.1}%", 100.0 * e.ratio)));
        }
        if let (Some(low), Some(high)) = (self.nth("priorities", 0).and_then(|v| v.watched_ms), self.nth("priorities", 1).and_then(|v| v.watched_ms)) {
            rows.push(("urgent job done, default / highest priority".into(), format!("{:.3} / {:.3} ms", low.median, high.median)));
        }
        if let Some(ic) = &self.issue_cost {
            if let Some(small) = ic.points.iter().max_by_key(|p| p.chunks) {
                // A recording from before the lab issued as a plain driver
                // loop does holds the lab's own bookkeeping in its live time.
                let old = if small.plain.is_none() { " (recorded with the lab's per-op bookkeeping in the live time: re-record)" } else { "" };
                rows.push((
                    format!("{} chunks of {}: issued live / CUDA graph", small.chunks, crate::Bytes(small.chunk_bytes)),
                    format!("{:.3} / {:.3} ms ({:.2}x){old}", small.live.median, small.graph.median, small.graph_gain()),
                ));
                rows.push((
                    format!("issuing per GPU op at {} chunks: the lab / a plain driver loop", small.chunks),
                    match (small.plain_issue_us_per_op, small.issue_ratio()) {
                        (Some(plain), Some(ratio)) => format!("{:.2} / {:.2} µs ({ratio:.2}x)", small.issue_us_per_op.median, plain.median),
                        _ => "not in this recording".into(),
                    },
                ));
            }
            rows.push((
                format!("a CUDA graph gains more than {:.0}% from (per chunk)", 100.0 * issue_cost::CLEAR_GAIN),
                ic.crossover().map_or("nowhere on this GPU".into(), |p| format!("{} down", crate::Bytes(p.chunk_bytes))),
            ));
        }
        if let Some((v, e)) = self.worst_model_error() {
            rows.push(("model, worst variant".into(), format!("{:+.1}% ({})", 100.0 * e, v.name)));
        }
        if let Some((at, e)) = self.issue_cost.as_ref().and_then(|ic| ic.worst_model_error()) {
            rows.push(("model, worst issue-cost point".into(), format!("{:+.1}% ({at})", 100.0 * e)));
        }
        rows
    }

    /// Experiment `name`'s measured timelines, one per variant, or each
    /// beside the model's with `with_model`.
    pub fn timelines(&self, name: &str, with_model: bool, origin: &str) -> Result<Gantt> {
        if let (ISSUE_COST, Some(ic)) = (name, &self.issue_cost) {
            let what = format!("{} chunks, issued live", ic.timeline_chunks);
            let mut measured = ic.timeline.clone();
            if let Some(p) = ic.points.iter().find(|p| p.chunks == ic.timeline_chunks) {
                measured = measured.illustrating(p.live.median);
            }
            let mut panels = vec![Timeline { title: format!("{what}: measured"), ..measured }];
            if with_model {
                panels.push(Timeline { title: format!("{what}: model"), ..ic.predicted.clone() });
            }
            return Ok(Gantt::new(&format!("{LAB}-{name}-timeline"), &format!("Lab 5, {name}: the CPU issuing op by op"), origin, panels));
        }
        let e = self.experiment(name).ok_or_else(|| {
            let mut names: Vec<&str> = self.experiments.iter().map(|e| e.name.as_str()).collect();
            if self.issue_cost.is_some() {
                names.push(ISSUE_COST);
            }
            LabError::config(format!("no experiment '{name}': the lab has {}", names.join(", ")))
        })?;
        Ok(e.gantt("Lab 5", &format!("{LAB}-{name}"), with_model, origin))
    }

    /// The table the command line prints.
    pub fn table(&self) -> String {
        let m = &self.machine;
        let mut out = format!(
            "machine: {} copy engines; H2D {:.3} ms, D2H {:.3} ms, both at once {:.3} ms (each direction at {:.0}% while both run); a CPU thread resumes {:.1} µs after the GPU work it waited for; a kernel that waited behind another stream's starts {:.1} µs into its drain; issuing one op takes the CPU {:.1} µs; kernel: {} FMAs per element\n",
            m.copy_engines,
            m.h2d_ms,
            m.d2h_ms,
            m.both_ms,
            100.0 * m.machine().both_ways,
            m.wake_ms * 1e3,
            m.machine().kernel_overlap * 1e3,
            m.issue_ms * 1e3,
            self.iterations
        );
        for e in &self.experiments {
            out += &format!("\n{}: {}\n", e.name, e.shows);
            if let Some(f) = &e.machine {
                out += &format!("  measured just before: {}\n", crate::lab_kit::experiment::machine_line(f));
            }
            out += &format!("  {:<52} {:>10} {:>16} {:>10} {:>8}\n", "variant", "median ms", "25%..75% ms", "model ms", "error");
            for v in &e.variants {
                out += &format!(
                    "  {:<52} {:>10.3} {:>7.3}..{:<8.3} {:>10.3} {:>7.1}%\n",
                    v.name,
                    v.total_ms.median,
                    v.total_ms.middle_range().0,
                    v.total_ms.middle_range().1,
                    v.model_ms,
                    100.0 * (v.model_ms / v.total_ms.median - 1.0)
                );
                if let (Some(w), Some(wm)) = (&v.watched_ms, v.watched_model_ms) {
                    let (lo, hi) = w.middle_range();
                    out += &format!("  {:<52} {:>10.3} {:>7.3}..{:<8.3} {:>10.3}\n", "  urgent job done at", w.median, lo, hi, wm);
                }
            }
            if let Some(c) = e.ceiling {
                out += &format!(
                    "  both directions at once ran at {:.0}% of their speed alone in this experiment (the faster quarter of its runs, as each op alone is costed): the later variants' model and bound use that\n",
                    100.0 * c
                );
            }
            out += &e.effect_lines();
            let effs: Vec<(&VariantResult, Efficiency)> = e.variants.iter().filter_map(|v| Some((v, self.efficiency(e, v)?))).collect();
            for (v, eff) in &effs {
                out += &format!(
                    "  {}: {} of the bound that knows the bidirectional ceiling ({:.3} ms, each part at its fastest quarter; beside it, the shares its runs' middle half read)\n",
                    v.name,
                    eff.cell(),
                    eff.bound_ms
                );
            }
            if let Some(why) = Efficiency::note(effs.iter().map(|(_, eff)| eff)) {
                out += &format!("  {why}\n");
            }
        }
        if let Some(ic) = &self.issue_cost {
            out += &ic.table();
        }
        out
    }

    /// The issue-cost sweep's figure (time per run and the CPU's cost, by
    /// chunk size).
    pub fn issue_cost_chart(&self, origin: &str) -> Result<Figure> {
        let ic = self
            .issue_cost
            .as_ref()
            .ok_or_else(|| LabError::config("this recording has no issue-cost sweep (made before it existed): run `overlap-lab streams` again"))?;
        Ok(ic.chart(origin))
    }
}

/// A lab-5 recording.
pub type StreamsRecord = Record<StreamsResults>;

/// Notebook entry points for lab 5.
impl crate::lab_kit::LabRun<StreamsResults> {
    /// The table of every experiment: measured, spread, model.
    pub fn table(&self) -> String {
        self.record.results.table()
    }
    /// Experiment `name`'s timelines (each variant's measured run; with
    /// `with_model`, the model's beside it).
    pub fn timelines(&self, name: &str, with_model: bool) -> Result<Gantt> {
        self.record.results.timelines(name, with_model, &self.origin())
    }
    /// The issue-cost sweep: each run's time and the CPU's cost by chunk size.
    pub fn issue_cost_chart(&self) -> Result<Figure> {
        self.record.results.issue_cost_chart(&self.origin())
    }
    /// Checks a learner's fix of the hidden legacy-stream operation: live
    /// on a GPU, else on the queue model with the recorded costs.
    pub fn check_hidden_legacy(&self, learner: impl Fn(&mut dyn Issue, &StreamsTask) -> Result<()> + Send + Sync + 'static) -> CheckReport {
        let r = &self.record.results;
        let learner: exercise::Loop = std::sync::Arc::new(learner);
        self.check(
            "the hidden legacy-stream operation",
            &exercise::EXERCISES[0],
            r.config.device,
            |gpu| exercise::check_on_gpu(gpu, r, learner.clone()),
            || exercise::check_on_model(r, learner.clone()),
        )
    }
}

/// Lab 5 in the report: each experiment's timelines and the table.
pub fn report(rec: &StreamsRecord, dir: &Path, origin: &str) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for e in &rec.results.experiments {
        files.extend(rec.results.timelines(&e.name, false, origin)?.save(dir)?);
    }
    if let Some(three) = rec.results.experiment("copy-engines").and_then(|e| e.variant(experiments::THREE_WAY)) {
        let trace = dir.join(format!("{LAB}-three-way.trace.json"));
        three.timeline.save_chrome_trace(&trace)?;
        files.push(trace);
    }
    if rec.results.issue_cost.is_some() {
        files.extend(rec.results.issue_cost_chart(origin)?.save(dir)?);
        files.extend(rec.results.timelines(ISSUE_COST, true, origin)?.save(dir)?);
    }
    files.push(crate::present::chart::write_text(dir.join(format!("{LAB}-summary.txt")), format!("{origin}\n\n{}", rec.results.table()))?);
    Ok(files)
}

/// Lab 5's entry in the lab table.
pub static ENTRY: crate::lab_kit::Entry<StreamsConfig, StreamsResults> = crate::lab_kit::Entry {
    number: 5,
    name: LAB,
    module: module_path!(),
    teaches: "Which stream: the legacy NULL stream, per-thread streams, the weight of each wait, copy engines, priorities, issue cost and CUDA graphs",
    builds_on: &[(2, "a pipeline over several streams"), (3, "events between streams")],
    kernels: &[],
    exercises: exercise::EXERCISES,
    glossary: &[
        crate::lab_kit::Word::new(
            "legacy / per-thread default stream",
            "the NULL stream every blocking stream synchronizes with / a default stream of each CPU thread's own",
        ),
        crate::lab_kit::Word::new("graph", "a CUDA graph: a captured loop replayed with one launch"),
    ],
    about: "Lab 5: stream semantics and costs, each pipeline measured beside the queue model",
    measure: |gpu, cfg, cx| measure::run(gpu, cfg, cx.progress),
    tables: |rec| rec.results.table(),
    figures: report,
    headline: StreamsResults::headline,
    headline_figures: StreamsResults::headline_figures,
    timelines: |rec, o| {
        let r = &rec.results;
        let issue_cost = r.issue_cost.as_ref().map(|_| ISSUE_COST);
        r.experiments
            .iter()
            .map(|e| (e.name.as_str(), false))
            .chain(issue_cost.map(|n| (n, true)))
            .filter_map(|(name, issue)| r.timelines(name, issue, o).ok())
            .collect()
    },
    fixture: fixture::results,
};

#[cfg(test)]
mod tests {
    use super::fixture::results as streams_results;
    use super::*;

    #[test]
    fn the_table_prints_each_effect_against_both_spreads() {
        let mut r = streams_results();
        let t = r.table();
        assert!(t.contains("effect: a tiny copy on the NULL stream beside blocking streams: +"), "{t}");
        assert!(t.contains("shown: larger than either one's spread"), "{t}");
        assert!(t.contains("none beyond the spreads, as the lab expects"), "{t}");
        // A stray slow run each does not hide the effect: the middle half judges.
        for v in &mut r.experiments[0].variants {
            v.total_ms.max += 10.0;
        }
        assert!(r.experiments[0]
            .effect_lines()
            .starts_with("  effect: a tiny copy on the NULL stream beside blocking streams: +2.250 ms, spreads 0.000 / 0.000 ms"));
        // A noisy run: the same medians, the middle of the runs wider than the difference.
        for v in &mut r.experiments[0].variants {
            let m = v.total_ms.median;
            v.total_ms.middle = Some((m - 5.0, m + 5.0));
        }
        assert!(r.experiments[0].effect_lines().contains("NOT shown: within the spread on this run"));
        assert!(!r.experiments[0].effects_as_claimed());
    }

    #[test]
    fn three_way_is_judged_against_its_bound_from_the_parts_fast_ends() {
        let mut r = streams_results();
        // The fixture keeps no costs: the bound it recorded.
        let (v, e) = r.three_way().unwrap();
        assert_eq!((e.bound_ms, e.ratio), (v.bound_ms.unwrap(), v.bound_ms.unwrap() / v.total_ms.median));
        let t = r.table();
        assert!(t.contains(&format!("{}: {} of the bound that knows the bidirectional ceiling", experiments::THREE_WAY, e.cell())), "{t}");
        // With the experiment's ops alone (their fast ends, as measured) and
        // its both-ways ceiling kept, the bound is built from them.
        let costs: Vec<_> = r.costs.clone();
        let e3 = r.experiments.iter_mut().find(|e| e.name == "copy-engines").unwrap();
        e3.costs = costs;
        e3.ceiling = Some(0.5);
        let want = measure::three_way_bound(&e3.costs_map(), 0.5, r.config.elements, experiments::three_way_chunks(&r.config));
        let (v, e) = r.three_way().unwrap();
        assert_eq!(e.bound_ms, want);
        assert!(want > v.bound_ms.unwrap(), "a slower both-ways ceiling lifts the bound above the recorded one");
    }

    #[test]
    fn headline_and_figures_come_from_the_results() {
        let r = streams_results();
        let rows = r.headline();
        let names: Vec<&str> = rows.iter().map(|(w, _)| w.as_str()).collect();
        assert!(names.contains(&"three-way overlap, of its bidirectional-aware bound"), "{names:?}");
        assert!(names.contains(&"urgent job done, default / highest priority"), "{names:?}");
        assert!(names.contains(&"threads on the default stream: legacy / per-thread"), "{names:?}");
        assert!(names.contains(&"a CUDA graph gains more than 10% from (per chunk)"), "{names:?}");
        let ic = r.timelines(ISSUE_COST, true, "test").unwrap();
        assert_eq!(ic.timelines.len(), 2, "the live run measured and modelled");
        let chart = r.issue_cost_chart("test").unwrap();
        assert_eq!(chart.panels[0].series.len(), 6, "live, plain loop, graph, and the model of each and of the GPU alone");
        assert!(chart.panels[0].series.iter().all(|s| s.points.len() == r.config.issue_chunks.len()));
        let old = StreamsResults { issue_cost: None, ..r.clone() };
        assert!(old.issue_cost_chart("test").unwrap_err().to_string().contains("run `overlap-lab streams` again"));
        let g = r.timelines("copy-engines", true, "test").unwrap();
        assert_eq!(g.timelines.len(), 6, "measured and model for each of 3 variants");
        let e = r.timelines("copy engines", false, "test").unwrap_err().to_string();
        assert!(e.contains("no experiment 'copy engines'") && e.contains("legacy-stream") && e.contains("issue-cost"), "{e}");
        let dir = crate::testing::temp_dir("streams-report");
        let rec = Record::new(LAB, crate::testing::fingerprint(), r);
        let files = report(&rec, &dir, "test").unwrap();
        for stem in [
            "streams-legacy-stream",
            "streams-threads",
            "streams-sync-weight",
            "streams-copy-engines",
            "streams-priorities",
            "streams-issue-cost",
            "streams-issue-cost-timeline",
        ] {
            assert!(files.iter().any(|f| f.file_name().unwrap().to_string_lossy() == format!("{stem}.png")), "{stem}: {files:?}");
        }
        assert!(files.iter().all(|f| f.file_name().unwrap().to_string_lossy().starts_with("streams-")));
    }
}

#[cfg(test)]
mod config_tests {
    use super::*;

    #[test]
    fn the_presets_are_valid_and_bad_sweeps_are_named() {
        for c in [StreamsConfig::default(), StreamsConfig::quick(), StreamsConfig::small()] {
            c.validate().unwrap();
        }
        let tiny = StreamsConfig { issue_chunks: vec![4, 8192], ..StreamsConfig::default() };
        let e = tiny.validate().unwrap_err().to_string();
        assert!(e.contains("--issue-chunks 8192: give counts from 2 to 4096") && e.contains("a quarter of --elements"), "{e}");
        let none = StreamsConfig { issue_chunks: vec![], ..StreamsConfig::default() };
        assert!(none.validate().unwrap_err().to_string().contains("at least one chunk count"));
        let one = StreamsConfig { issue_chunks: vec![1], ..StreamsConfig::default() };
        assert!(one.validate().is_err());
    }

    #[test]
    fn the_command_line_takes_a_list_of_chunk_counts() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            c: StreamsConfig,
        }
        let cli = Cli::try_parse_from(["streams", "--issue-chunks", "4,64", "--repeats", "3"]).unwrap();
        assert_eq!((cli.c.issue_chunks, cli.c.repeats), (vec![4, 64], 3));
        assert_eq!(Cli::try_parse_from(["streams"]).unwrap().c, StreamsConfig::default());
    }
}
