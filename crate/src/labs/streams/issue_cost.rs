//! Issue cost and CUDA graphs. One pipeline (uploads, kernels and downloads
//! on three streams, ordered by events) over a fixed size, cut into ever
//! more chunks, run two ways:
//!
//! * **issued live**: the GPU starts each op as the CPU issues it (no start
//!   gate), so the CPU's cost of issuing every copy, kernel and event is in
//!   the time;
//! * **graph**: the same loop captured once as a CUDA graph (stream
//!   capture), then replayed with one `cuGraphLaunch`: all of it queued at
//!   once, the GPU's own time plus one launch;
//! * **plain driver loop**: the same calls issued live by a loop of bare
//!   driver calls (`gpu::plan::plain`), in the same run: what issuing costs
//!   in CUDA itself, which the lab's own live runs are held against (they
//!   replay recorded driver calls, with nothing of this crate between them).
//!
//! As chunks shrink, the GPU's work per chunk shrinks and the CPU's cost
//! per chunk does not: below some chunk size issuing is the bottleneck and
//! the graph wins. The model predicts each from the ops measured alone (8
//! back to back on a stream) and the CPU's pace as the host clock measured
//! it (the loop's time per op; the launch call's time per node). The same
//! ops cost less as nodes of a graph on one stream, but the three-stream
//! graph's edges give that back, so ops alone on a stream predict the
//! graph better. (The other
//! experiments hold their loop behind the start gate; a gate holds at most
//! 256 ops before it must open, fewer than this sweep's longest loops, so
//! the GPU-only time here is the model's.)

use super::{effect_line, StreamsConfig};
use crate::error::{LabError, Result};
use crate::gpu::plan::plain::{PlainLoop, PlainRun};
use crate::gpu::{MachineFacts, PlanRig, TimelineSource};
use crate::measure::stats::Summary;
use crate::pipeline::machine::Machine;
use crate::pipeline::plan::{chunk, stage_streams, Plan, WaitBy};
use crate::pipeline::timeline::Timeline;
use crate::present::chart::{Figure, Panel, RGBColor, Series, XAxis};
use crate::present::progress::Progress;
use crate::units::Bytes;
use serde::{Deserialize, Serialize};

/// The sweep's size: a quarter of the lab's, so its many small chunks
/// stay quick to verify.
pub fn elements(cfg: &StreamsConfig) -> usize {
    (cfg.elements / 4) & !1
}

/// The smallest chunk the sweep takes, in elements (4 KiB): below it every
/// op is all fixed cost.
pub const MIN_CHUNK: usize = 1024;

/// The pipeline at `chunks` chunks: as captured into the graph (behind
/// the gate, were it run), and issued live.
pub fn plans(elements: usize, chunks: usize) -> (Plan, Plan) {
    let gated = stage_streams(&format!("{chunks} chunks, as a graph"), elements, chunks, WaitBy::StreamWaitEvent);
    let live = stage_streams(&format!("{chunks} chunks, issued live"), elements, chunks, WaitBy::StreamWaitEvent).issued_live();
    (gated, live)
}

/// A graph gain worth the name: live issuing more than 10% slower. (Even
/// at the largest chunks a graph saves issuing the first ops before the
/// GPU has work: a few percent, beyond the runs' spread.)
pub const CLEAR_GAIN: f64 = 0.10;

/// One chunk count, measured both ways and modelled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IssuePoint {
    pub chunks: usize,
    pub chunk_bytes: u64,
    /// GPU ops of one run (copies and kernels).
    pub ops: usize,
    /// Each run's time, ms: issued live (from the loop's first call), a
    /// graph replay (from the launch call), each to the last op's end.
    pub live: Summary,
    pub graph: Summary,
    /// Per GPU op of a live run, the CPU's time to issue the loop, µs.
    pub issue_us_per_op: Summary,
    /// The plain driver loop's time per run, ms, and its CPU time per GPU
    /// op, µs (None in recordings made before it was measured).
    #[serde(default)]
    pub plain: Option<Summary>,
    #[serde(default)]
    pub plain_issue_us_per_op: Option<Summary>,
    /// Of the live run's issuing, the time inside the driver's calls, µs
    /// (recordings made before live runs replayed recorded calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_us_per_op: Option<Summary>,
    /// How long cuGraphLaunch held the CPU, µs.
    pub launch_us: Summary,
    /// One-time costs of the graph: capturing the loop, instantiating, ms.
    pub capture_ms: f64,
    pub instantiate_ms: f64,
    pub nodes: usize,
    /// The model's times, ms: the GPU's work alone (all ops there at the
    /// start); live (each op reaching the GPU the measured issue time per
    /// op after the one before); graph (each op submitted at the launch
    /// call's pace, its measured time over the ops).
    pub model_gated: f64,
    pub model_live: f64,
    pub model_graph: f64,
}

impl IssuePoint {
    /// Live over graph: how much the graph saves (> 1: it wins).
    pub fn graph_gain(&self) -> f64 {
        self.live.median / self.graph.median
    }
    /// The plain driver loop over the graph: what a graph saves a program
    /// that issues with bare driver calls.
    pub fn plain_graph_gain(&self) -> Option<f64> {
        self.plain.map(|p| p.median / self.graph.median)
    }
    /// The lab's issuing per op over the plain loop's (1: as cheap as bare
    /// driver calls).
    pub fn issue_ratio(&self) -> Option<f64> {
        self.plain_issue_us_per_op.map(|p| self.issue_us_per_op.median / p.median)
    }
    /// Whether the graph is faster than live issuing by more than either
    /// one's spread (Some(true)), slower by more (Some(false)), or neither.
    pub fn winner(&self) -> Option<bool> {
        let diff = self.live.median - self.graph.median;
        (diff.abs() > self.live.middle_spread().max(self.graph.middle_spread())).then_some(diff > 0.0)
    }
    /// How many replays repay capturing and instantiating the graph.
    pub fn replays_to_repay(&self) -> Option<f64> {
        let saved = self.live.median - self.graph.median;
        (saved > 0.0).then(|| (self.capture_ms + self.instantiate_ms) / saved)
    }
}

/// The sweep's results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IssueCost {
    pub elements: usize,
    /// The machine as the model took it (measured just before the sweep).
    pub machine: MachineFacts,
    pub points: Vec<IssuePoint>,
    /// One live run's measured timeline and the model's, at `timeline_chunks`.
    pub timeline_chunks: usize,
    pub timeline: Timeline,
    pub predicted: Timeline,
}

/// Runs the sweep on `rig` (its kernel balanced by the caller), one
/// progress step per chunk count.
pub fn measure(rig: &mut PlanRig, cfg: &StreamsConfig, progress: &mut Progress) -> Result<IssueCost> {
    let (n, reps) = (elements(cfg), cfg.repeats);
    let facts = rig.machine(n, reps)?;
    let machine = facts.machine();
    // The timeline is drawn at a chunk count where issuing is visible but
    // the ops still read as bars.
    let timeline_chunks = cfg.issue_chunks.iter().copied().filter(|&c| c <= 64).max().unwrap_or(cfg.issue_chunks[0]);
    let (mut points, mut drawn) = (Vec::new(), None);
    for &chunks in &cfg.issue_chunks {
        let (gated, live) = plans(n, chunks);
        let (gm, lm) = (gated.dry_run()?, live.dry_run()?);
        let ops = gm.schedule.ops.len();
        let captured = rig.capture(&gated, &gm)?;
        // A warm-up of each, then the three in turn, so drift hits them
        // alike. The plain loop makes the live plan's driver calls.
        let plain = PlainLoop::new(n, chunks)?;
        rig.run_modelled(&live, &lm, TimelineSource::Off)?;
        rig.plain_stage_loop(&plain)?;
        rig.replay(&gated, &captured)?;
        let (mut l, mut p, mut r, mut issue, mut plain_issue, mut launch) = (vec![], vec![], vec![], vec![], vec![], vec![]);
        for _ in 0..reps {
            let run = rig.run_modelled(&live, &lm, TimelineSource::Off)?;
            l.push(run.total_ms);
            issue.push(run.issue_ms * 1e3 / ops as f64);
            let PlainRun { total_ms, issue_ms } = rig.plain_stage_loop(&plain)?;
            p.push(total_ms);
            plain_issue.push(issue_ms * 1e3 / ops as f64);
            let replay = rig.replay(&gated, &captured)?;
            r.push(replay.total_ms);
            launch.push(replay.launch_ms * 1e3);
        }
        let costs = rig.costs(&[&gated], reps)?;
        let model_gated = gated.prediction(&gm, machine, &costs)?.total_ms;
        let (launch, issue) = (Summary::of(&launch)?, Summary::of(&issue)?);
        // The model is told the CPU's pace, as the host clock measured it in
        // these runs, and predicts when the GPU finishes: issued live, each
        // op reaches the GPU an issue time after the one before; a graph's
        // launch call submits its nodes one by one (its time grows with
        // them) and the GPU starts each as it arrives, at that call's pace.
        let issued = Machine { issue: issue.median / 1e3, ..machine };
        let submitted = Machine { issue: launch.median / 1e3 / ops as f64, ..machine };
        let live_model = live.prediction(&lm, issued, &costs)?;
        let point = IssuePoint {
            chunks,
            chunk_bytes: 4 * chunk(n, chunks, 0).1 as u64,
            ops,
            live: Summary::of(&l)?,
            graph: Summary::of(&r)?,
            issue_us_per_op: issue,
            plain: Some(Summary::of(&p)?),
            plain_issue_us_per_op: Some(Summary::of(&plain_issue)?),
            driver_us_per_op: None,
            launch_us: launch,
            capture_ms: captured.capture_ms,
            instantiate_ms: captured.instantiate_ms,
            nodes: captured.nodes,
            model_gated,
            model_live: live_model.total_ms,
            model_graph: live.prediction(&lm, submitted, &costs)?.total_ms,
        };
        if chunks == timeline_chunks {
            let run = rig.run_modelled(&live, &lm, TimelineSource::best())?;
            let t = run.timeline.ok_or_else(|| LabError::config("a traced run left no timeline"))?;
            drawn = Some((t, live_model.timeline));
        }
        progress.step(&format!(
            "issue-cost: {chunks} chunks of {}: issued live {:.3} ms, graph {:.3} ms (model {:.3} / {:.3}; the GPU's work alone {:.3})",
            Bytes(point.chunk_bytes),
            point.live.median,
            point.graph.median,
            point.model_live,
            point.model_graph,
            point.model_gated
        ));
        points.push(point);
    }
    let (timeline, predicted) = drawn.ok_or_else(|| LabError::config("the issue-cost sweep drew no timeline"))?;
    Ok(IssueCost { elements: n, machine: facts, points, timeline_chunks, timeline, predicted })
}

impl IssueCost {
    /// Where the graph starts to pay: the largest chunk at which it is
    /// more than [`CLEAR_GAIN`] faster than live issuing, and by more than
    /// the runs' spread.
    pub fn crossover(&self) -> Option<&IssuePoint> {
        self.points.iter().filter(|p| p.winner() == Some(true) && p.graph_gain() > 1.0 + CLEAR_GAIN).max_by_key(|p| p.chunk_bytes)
    }

    /// The worst model error of the sweep (model / measured - 1) and where.
    pub fn worst_model_error(&self) -> Option<(String, f64)> {
        self.points
            .iter()
            .flat_map(|p| {
                [("issued live", p.model_live, p.live.median), ("graph", p.model_graph, p.graph.median)]
                    .map(|(how, m, t)| (format!("{} chunks, {how}", p.chunks), m / t - 1.0))
            })
            .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
    }

    /// The sweep's table: each chunk count three ways (the lab's live
    /// runs, the plain driver loop, the graph), the CPU's cost per op each
    /// way, the model, and where the graph wins.
    pub fn table(&self) -> String {
        let mut out = format!(
            "\nissue-cost: the same three-stream pipeline over {} in ever smaller chunks, issued live (the CPU's issuing in the time), issued by a plain loop of driver calls, and captured once as a CUDA graph, replayed with one launch\n",
            Bytes(4 * self.elements as u64)
        );
        out += &format!(
            "  {:>6} {:>9} {:>18} {:>18} {:>18} {:>14} {:>23} {:>9} {:>28}\n",
            "chunks", "chunk", "issued live ms", "plain loop ms", "graph ms", "graph gain", "issue µs/op: lab/plain", "launch µs", "model ms: live/graph (GPU)"
        );
        let opt = |v: Option<f64>, width: usize, digits: usize| v.map_or(format!("{:>width$}", "-"), |v| format!("{v:>width$.digits$}"));
        for p in &self.points {
            out += &format!(
                "  {:>6} {:>9} {:>8.3} ({:>7.3}) {} ({}) {:>8.3} ({:>7.3}) {:>6.2}x/{}x {:>7.2}/{} ({}x) {:>9.1} {:>11.3}/{:.3} ({:.3})\n",
                p.chunks,
                Bytes(p.chunk_bytes).to_string(),
                p.live.median,
                p.live.middle_spread(),
                opt(p.plain.map(|s| s.median), 8, 3),
                opt(p.plain.map(|s| s.middle_spread()), 7, 3),
                p.graph.median,
                p.graph.middle_spread(),
                p.graph_gain(),
                opt(p.plain_graph_gain(), 5, 2),
                p.issue_us_per_op.median,
                opt(p.plain_issue_us_per_op.map(|s| s.median), 5, 2),
                opt(p.issue_ratio(), 4, 2),
                p.launch_us.median,
                p.model_live,
                p.model_graph,
                p.model_gated
            );
        }
        out += "  (spreads in brackets: the middle half of the runs; graph gain: issued live / graph, then plain loop / graph; issue µs/op: the CPU's time per GPU op issuing the loop, the lab's live run against the plain loop of driver calls; GPU: the model's time for the GPU's work alone)\n";
        if let Some(worst) = self.points.iter().filter_map(|p| p.issue_ratio().map(|r| (p, r))).max_by(|a, b| a.1.total_cmp(&b.1)) {
            out += &format!(
                "  the lab issues within {:.2}x of the plain driver loop at every chunk count (worst at {} chunks: {:.2} against {:.2} µs per op): what the graph gains here, it gains over CUDA's own issuing\n",
                worst.1,
                worst.0.chunks,
                worst.0.issue_us_per_op.median,
                worst.0.plain_issue_us_per_op.map_or(f64::NAN, |s| s.median)
            );
        }
        if let (Some(small), Some(big)) = (self.points.iter().max_by_key(|p| p.chunks), self.points.iter().min_by_key(|p| p.chunks)) {
            out += &effect_line(
                &format!("a graph instead of issuing live, {} chunks of {}", small.chunks, Bytes(small.chunk_bytes)),
                small.graph.median - small.live.median,
                small.live.middle_spread(),
                small.graph.middle_spread(),
                true,
            );
            out += &format!(
                "  at {} chunks of {} the graph saves {:.3} ms ({:.1}%): the first ops' issuing, before the GPU has work; the GPU's work dominates there\n",
                big.chunks,
                Bytes(big.chunk_bytes),
                big.live.median - big.graph.median,
                100.0 * (1.0 - big.graph.median / big.live.median)
            );
            let one_time = small.capture_ms + small.instantiate_ms;
            out += &format!(
                "  the graph of {} chunks ({} nodes) took {:.2} ms to capture and {:.2} ms to instantiate{}\n",
                small.chunks,
                small.nodes,
                small.capture_ms,
                small.instantiate_ms,
                small.replays_to_repay().map_or(String::from(": it never repays that here"), |n| format!(": {one_time:.2} ms, repaid after {n:.1} replays"))
            );
        }
        out += &match self.crossover() {
            Some(p) => format!(
                "  the graph gains more than {:.0}% (beyond the runs' spread) from {} per chunk down ({} chunks, {:.2}x); issuing costs the CPU {:.1} µs per op there\n",
                100.0 * CLEAR_GAIN,
                Bytes(p.chunk_bytes),
                p.chunks,
                p.graph_gain(),
                p.issue_us_per_op.median
            ),
            None => format!("  the graph never gained more than {:.0}% over live issuing (beyond the runs' spread) on this GPU\n", 100.0 * CLEAR_GAIN),
        };
        if let Some((at, e)) = self.worst_model_error() {
            out += &format!("  model, worst point: {:+.1}% ({at})\n", 100.0 * e);
        }
        out
    }

    /// Time per run against chunk size (measured solid, model dashed), and
    /// the CPU's cost per op.
    pub fn chart(&self, origin: &str) -> Figure {
        const GATED: RGBColor = RGBColor(120, 120, 120);
        const LIVE: RGBColor = RGBColor(214, 39, 40);
        const GRAPH: RGBColor = RGBColor(31, 119, 180);
        const PLAIN: RGBColor = RGBColor(44, 160, 44);
        let line = |label: &str, color, dashed, f: &dyn Fn(&IssuePoint) -> f64| Series {
            label: label.into(),
            color,
            dashed,
            points: self.points.iter().map(|p| (p.chunk_bytes as f64, f(p))).collect(),
        };
        let times = Panel {
            title: format!("{} in chunks: time per run", Bytes(4 * self.elements as u64)),
            x_axis: XAxis::LogBytes,
            x_label: "chunk size".into(),
            y_label: "ms".into(),
            log_y: true,
            series: vec![
                line("issued live", LIVE, false, &|p| p.live.median),
                line("plain driver loop", PLAIN, false, &|p| p.plain.map_or(f64::NAN, |s| s.median)),
                line("CUDA graph replay", GRAPH, false, &|p| p.graph.median),
                line("model: issued live", LIVE, true, &|p| p.model_live),
                line("model: graph", GRAPH, true, &|p| p.model_graph),
                line("model: the GPU's work alone", GATED, true, &|p| p.model_gated),
            ],
        };
        let cpu = Panel {
            title: "the CPU's cost".into(),
            x_axis: XAxis::LogBytes,
            x_label: "chunk size".into(),
            y_label: "µs".into(),
            log_y: true,
            series: vec![
                line("issuing, per GPU op (the lab's live run)", LIVE, false, &|p| p.issue_us_per_op.median),
                line("issuing, per GPU op (plain driver loop)", PLAIN, true, &|p| p.plain_issue_us_per_op.map_or(f64::NAN, |s| s.median)),
                line("cuGraphLaunch, the whole run", GRAPH, false, &|p| p.launch_us.median),
            ],
        };
        Figure {
            stem: format!("{}-issue-cost", super::LAB),
            title: "Lab 5: issuing op by op against one CUDA graph launch".into(),
            subtitle: origin.into(),
            panels: vec![times, cpu],
            panel_size: (640, 420),
        }
    }
}
