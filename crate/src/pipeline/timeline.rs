//! Timelines without Nsight: spans on lanes (streams, CPU threads, or the
//! warps inside one block of a kernel) in µs, drawn as a Gantt chart and
//! exported as Chrome-trace JSON that Perfetto and chrome://tracing open.
//! Measured timelines come from CUDA events against one base event (or,
//! inside a kernel, from the SM's cycle counter); predicted ones from the
//! schedule model.

use crate::error::Result;
use crate::measure::stats::Summary;
use crate::pipeline::op::{Lane, OpKind};
use crate::pipeline::schedule::Schedule;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Span {
    pub lane: String,
    pub kind: OpKind,
    /// Human label ("H2D chunk 3").
    pub label: String,
    pub start_us: f64,
    pub end_us: f64,
    /// A class of the lab's own where the op kind does not say enough
    /// (inside a kernel: what a warp is doing): a chart draws it in the
    /// colour its palette gives the class
    /// (`present::gantt::Gantt::with_classes`).
    #[serde(default, alias = "phase", skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// An index of the lab's own (inside a kernel: the block's own tile
    /// the phase worked on).
    #[serde(default, alias = "tile", skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    pub title: String,
    /// The process name in traces, e.g. "GPU 0 (NVIDIA H200)".
    pub device: String,
    pub spans: Vec<Span>,
    /// What timed the spans: "cupti", "cuda events" or "model".
    #[serde(default)]
    pub source: String,
    /// For a measured timeline: the untraced runs it illustrates, ms (the
    /// figure its table prints, and where the chart was given the runs,
    /// their spread). A traced run pays for its timestamps, so its
    /// makespan can be longer; a chart says by how much wherever the two
    /// differ by more than [`AGREES_WITHIN`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub untraced_ms: Option<Untraced>,
}

/// The untraced runs a drawn timeline stands for, ms: the figure its table
/// prints beside it and, where the chart has the runs themselves, the
/// middle half of them, which ranks the panels of one chart (see
/// [`order_faults`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Untraced {
    /// The figure the table prints (the runs' median), ms.
    pub ms: f64,
    /// The 25th and 75th percentiles of the runs, ms; `None` where the
    /// figure is not a set of runs (a sum of parts timed alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub middle_ms: Option<(f64, f64)>,
}

impl From<f64> for Untraced {
    /// A figure with no runs behind it to rank by.
    fn from(ms: f64) -> Untraced {
        Untraced { ms, middle_ms: None }
    }
}

impl From<Summary> for Untraced {
    /// The runs: their median, and the middle half (min to max in records
    /// made before the middle half was kept).
    fn from(runs: Summary) -> Untraced {
        Untraced { ms: runs.median, middle_ms: Some(runs.middle_range()) }
    }
}

/// A drawn panel as one chart ranks it: its title, its drawn makespan and
/// the middle half of its untraced runs, ms.
#[derive(Clone, Debug, PartialEq)]
pub struct Ranked {
    pub title: String,
    pub drawn_ms: f64,
    pub runs_ms: (f64, f64),
}

impl Ranked {
    /// The middle half's width: how far the runs spread, ms.
    pub fn spread_ms(&self) -> f64 {
        self.runs_ms.1 - self.runs_ms.0
    }
}

/// Two panels of one chart drawn in another order than their untraced
/// runs rank them: `faster`'s runs are faster than `slower`'s beyond both
/// spreads, yet `faster` is drawn slower, beyond both spreads too. A
/// learner remembers the picture, so the picture then teaches the wrong
/// order.
#[derive(Clone, Debug, PartialEq)]
pub struct OrderFault {
    pub faster: Ranked,
    pub slower: Ranked,
}

impl std::fmt::Display for OrderFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (a, b) = (&self.faster, &self.slower);
        write!(
            f,
            "\"{}\" is drawn slower than \"{}\" ({:.3} against {:.3} ms), though its untraced runs are faster beyond both spreads (middle half {:.3}-{:.3} against {:.3}-{:.3} ms)",
            a.title, b.title, a.drawn_ms, b.drawn_ms, a.runs_ms.0, a.runs_ms.1, b.runs_ms.0, b.runs_ms.1
        )
    }
}

/// Every pair of `panels` (one chart's) drawn against the order their
/// untraced runs rank them. Only panels drawn beside their runs take part
/// (a model's panel, or a figure with no runs behind it, ranks nothing).
/// Panel A's runs rank it faster than B's when their middle halves stand
/// apart (A's 75th percentile below B's 25th; A's slowest run below B's
/// fastest implies it); A is drawn out of order when its drawn makespan
/// exceeds B's by more than either one's spread of runs.
pub fn order_faults(panels: &[Timeline]) -> Vec<OrderFault> {
    let ranked: Vec<Ranked> = panels
        .iter()
        .filter(|t| !t.spans.is_empty())
        .filter_map(|t| Some(Ranked { title: t.title.clone(), drawn_ms: t.makespan_us() / 1e3, runs_ms: t.untraced_ms?.middle_ms? }))
        .collect();
    let mut faults = Vec::new();
    for a in &ranked {
        for b in &ranked {
            let ranked_faster = a.runs_ms.1 < b.runs_ms.0;
            let drawn_slower = a.drawn_ms - b.drawn_ms > a.spread_ms().max(b.spread_ms());
            if ranked_faster && drawn_slower {
                faults.push(OrderFault { faster: a.clone(), slower: b.clone() });
            }
        }
    }
    faults
}

/// The clocks that timed `panels` (one chart's) where they are drawn
/// beside untraced runs: "cupti", "cuda events", each once, in order. One
/// chart's variants compare only when this holds one: CUPTI's cost lands
/// on a run differently from an event's.
pub fn clocks(panels: &[Timeline]) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for t in panels.iter().filter(|t| t.untraced_ms.is_some() && !t.source.is_empty()) {
        if !v.contains(&t.source) {
            v.push(t.source.clone());
        }
    }
    v
}

/// How far a drawn run's makespan may be from the untraced runs' time
/// before its chart says so (a fraction of the untraced time).
pub const AGREES_WITHIN: f64 = 0.10;

/// What drawing a timeline costs a run, in %: after `warmup` pairs,
/// `pairs` untraced and traced runs alternate (`run(traced)` returns a
/// run's total ms), and each pair gives traced / untraced - 1. A ratio per
/// pair cancels what drifts between pairs (the host's speed moves whole
/// runs by tens of percent), which a difference of two medians would not. Timed results never come from traced runs: this is
/// only how far the drawn timeline is from them.
pub fn overhead_pct(warmup: usize, pairs: usize, mut run: impl FnMut(bool) -> Result<f64>) -> Result<Summary> {
    let mut v = Vec::with_capacity(pairs);
    for i in 0..warmup + pairs {
        let untraced = run(false)?;
        let traced = run(true)?;
        if i >= warmup {
            v.push(100.0 * (traced / untraced - 1.0));
        }
    }
    Summary::of(&v)
}

/// One line for a lab's summary: "timeline overhead: +1.20% median, pairs
/// -0.80% to +3.10% over 15 (cupti)".
pub fn overhead_line(median_pct: f64, pairs: Option<&Summary>, source: &str) -> String {
    let spread = pairs.map_or(String::new(), |p| format!(", pairs {:+.2}% to {:+.2}% over {}", p.min, p.max, p.n));
    format!("timeline overhead (drawn run vs untraced): {median_pct:+.2}% median{spread} ({source})")
}

/// A lane name as runs of text and numbers, so that sorting by it
/// compares each number as a number.
fn natural_key(l: &str) -> Vec<(String, u64)> {
    let mut key = Vec::new();
    let mut rest = l;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let end = rest[digits..].find(|c: char| !c.is_ascii_digit()).map_or(rest.len(), |e| digits + e);
        key.push((rest[..digits].to_string(), rest[digits..end].parse::<u64>().unwrap_or(0)));
        rest = &rest[end..];
    }
    key
}

/// The kineto-style name of an operation kind (what PyTorch traces show).
pub fn trace_name(kind: OpKind, label: &str) -> String {
    match kind {
        OpKind::H2d => "Memcpy HtoD (Pinned -> Device)".into(),
        OpKind::D2h => "Memcpy DtoH (Device -> Pinned)".into(),
        OpKind::D2d(l) if l.is_peer() => "Memcpy PtoP (Device -> Device)".into(),
        OpKind::D2d(_) => "Memcpy DtoD (Device -> Device)".into(),
        OpKind::AllReduce(_) => format!("ncclAllReduce: {label}"),
        OpKind::Kernel | OpKind::Host | OpKind::Alloc(_) | OpKind::Free(_) => label.into(),
    }
}

impl Timeline {
    /// Spans for every op of `s` at the given (start, end) µs. Stream i's
    /// lane reads "stream i: `<stream_names[i]>`" when it has a name, after
    /// "GPU g · " when the schedule spans several GPUs (a lane per GPU's
    /// stream, sorted by GPU).
    pub fn from_schedule(title: &str, device: &str, s: &Schedule, times_us: &[(f64, f64)], stream_names: &[String]) -> Timeline {
        let several = s.gpus().len() > 1;
        let lane = |op: &crate::pipeline::op::Op| {
            let name = match op.lane {
                Lane::Stream(i) if i < stream_names.len() => format!("stream {i}: {}", stream_names[i]),
                other => other.to_string(),
            };
            match op.lane {
                Lane::Stream(_) if several => format!("GPU {} · {name}", op.gpu),
                _ => name,
            }
        };
        let spans = s
            .ops
            .iter()
            .zip(times_us)
            .map(|(op, &(start_us, end_us))| Span { lane: lane(op), kind: op.kind, label: op.label.clone(), start_us, end_us, class: None, index: None })
            .collect();
        Timeline { title: title.into(), device: device.into(), spans, source: String::new(), untraced_ms: None }
    }

    /// Each span's (start, end) µs, in the order of the spans (a run's
    /// ops, for a timeline made from its schedule).
    pub fn span_times(&self) -> Vec<(f64, f64)> {
        self.spans.iter().map(|s| (s.start_us, s.end_us)).collect()
    }

    /// Every lane once, in order: streams (or warps) by number, then CPU threads.
    pub fn lanes(&self) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        for s in &self.spans {
            if !v.contains(&s.lane) {
                v.push(s.lane.clone());
            }
        }
        // Numbers compare as numbers: "warp 2" before "warp 10", "GPU 0 ·
        // stream 2" before "GPU 0 · stream 10" before "GPU 1 · stream 0".
        v.sort_by_key(|l| (l.starts_with("CPU"), natural_key(l)));
        v
    }

    pub fn start_us(&self) -> f64 {
        self.spans.iter().map(|s| s.start_us).fold(f64::INFINITY, f64::min)
    }
    pub fn end_us(&self) -> f64 {
        self.spans.iter().map(|s| s.end_us).fold(f64::NEG_INFINITY, f64::max)
    }
    /// The spans `keep` says belong to what is drawn (the rest, set-up
    /// outside the timed region, left out).
    pub fn keeping(&self, keep: impl Fn(&Span) -> bool) -> Timeline {
        Timeline { spans: self.spans.iter().filter(|s| keep(s)).cloned().collect(), ..self.clone() }
    }

    /// This timeline drawn for the untraced runs it stands for (see
    /// [`Timeline::untraced_ms`]): their [`Summary`] where the chart has
    /// them (its panels are then ranked by them, [`order_faults`]), else
    /// the figure its table prints, ms.
    pub fn illustrating(self, untraced: impl Into<Untraced>) -> Timeline {
        Timeline { untraced_ms: Some(untraced.into()), ..self }
    }

    /// How the drawn run compares with the untraced runs it illustrates,
    /// when it is off by more than [`AGREES_WITHIN`]: "tracing slowed this
    /// run by 12%". `None` when they agree or there is nothing to compare
    /// with.
    pub fn disagreement(&self) -> Option<String> {
        let untraced = self.untraced_ms.map(|u| u.ms).filter(|&u| u > 0.0)?;
        let drawn = self.makespan_us() / 1e3;
        let off = drawn / untraced - 1.0;
        if off.abs() <= AGREES_WITHIN {
            return None;
        }
        Some(if off > 0.0 {
            let how = if off >= 0.95 { format!("{:.1}x", drawn / untraced) } else { format!("by {:.0}%", 100.0 * off) };
            // What the stamps cost: CUPTI records every op as it runs;
            // events are two more commands around every op.
            let stamps = match self.source.as_str() {
                "cupti" => " (CUPTI records every op)",
                "cuda events" => " (two events around every op)",
                _ => "",
            };
            format!("tracing{stamps} slowed this run {how}")
        } else {
            format!("this run was {:.0}% faster (runs vary)", -100.0 * off)
        })
    }

    /// First start to last end.
    pub fn makespan_us(&self) -> f64 {
        if self.spans.is_empty() {
            0.0
        } else {
            self.end_us() - self.start_us()
        }
    }
    /// Total busy time of one kind (sum of span lengths).
    pub fn busy_us(&self, kind: OpKind) -> f64 {
        self.spans.iter().filter(|s| s.kind == kind).map(|s| s.end_us - s.start_us).sum()
    }

    /// Chrome trace event format: pid = device, tid = lane, µs timestamps,
    /// with process and thread name metadata so Perfetto labels them.
    pub fn chrome_trace(&self) -> serde_json::Value {
        let lanes = self.lanes();
        let mut events = vec![serde_json::json!({"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": self.device}})];
        for (tid, lane) in lanes.iter().enumerate() {
            events.push(serde_json::json!({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": lane}}));
            events.push(serde_json::json!({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": tid, "args": {"sort_index": tid}}));
        }
        for s in &self.spans {
            let tid = lanes.iter().position(|l| l == &s.lane).unwrap_or(0);
            let (name, cat) = match &s.class {
                Some(class) => (s.label.clone(), class.as_str()),
                None => (trace_name(s.kind, &s.label), s.kind.label()),
            };
            events.push(serde_json::json!({
                "name": name,
                "cat": cat,
                "ph": "X",
                "pid": 0,
                "tid": tid,
                "ts": s.start_us,
                "dur": (s.end_us - s.start_us).max(0.0),
                "args": {"label": s.label},
            }));
        }
        serde_json::json!({"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"title": self.title}})
    }

    pub fn save_chrome_trace(&self, path: &Path) -> Result<()> {
        crate::measure::record::write_atomic(path, &serde_json::to_string(&self.chrome_trace()).expect("trace serializes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::machine::Machine;
    use crate::pipeline::predict::predict;

    #[test]
    fn chrome_trace_has_names_lanes_and_microseconds() {
        let tl = crate::testing::sample_timeline();
        let v = tl.chrome_trace();
        let ev = v["traceEvents"].as_array().unwrap();
        let x: Vec<_> = ev.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(x.len(), 10);
        assert!(x.iter().any(|e| e["name"] == "Memcpy HtoD (Pinned -> Device)" && e["dur"] == 100.0));
        let threads: Vec<_> = ev.iter().filter(|e| e["name"] == "thread_name").map(|e| e["args"]["name"].as_str().unwrap().to_string()).collect();
        assert_eq!(threads, ["stream 0", "stream 1", "CPU main"]);
        assert_eq!(ev[0]["args"]["name"], "GPU 0 (Test GPU)");
        let dir = crate::testing::temp_dir("trace");
        tl.save_chrome_trace(&dir.join("t.json")).unwrap();
        let back: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("t.json")).unwrap()).unwrap();
        assert_eq!(back, v);
    }

    /// A measured panel drawn `drawn_ms` long beside untraced runs `runs`, timed by `clock`.
    fn panel(title: &str, drawn_ms: f64, runs: &[f64], clock: &str) -> Timeline {
        let span =
            Span { lane: "stream 0".into(), kind: OpKind::Kernel, label: "k".into(), start_us: 50.0, end_us: 50.0 + 1e3 * drawn_ms, class: None, index: None };
        Timeline { title: title.into(), device: "GPU 0 (Test GPU)".into(), spans: vec![span], source: clock.into(), untraced_ms: None }
            .illustrating(Summary::of(runs).unwrap())
    }

    /// Fifteen runs around `median`: the middle half `median ± half`
    /// (nearest rank: the 4th and the 12th).
    fn runs(median: f64, half: f64) -> Vec<f64> {
        (0..15).map(|i| median + half * (i as f64 - 7.0) / 4.0).collect()
    }

    #[test]
    fn a_chart_drawn_in_its_tables_order_passes() {
        // Lab 6's alloc-stall as it should be drawn: each panel close to its runs.
        let panels = [
            panel("stream-ordered", 4.80, &runs(4.75, 0.12), "cuda events"),
            panel("cuMemAlloc, free after the loop", 5.20, &runs(5.53, 0.2), "cuda events"),
            panel("the CPU waits", 6.95, &runs(7.10, 0.15), "cuda events"),
        ];
        assert_eq!(order_faults(&panels), vec![]);
        assert_eq!(clocks(&panels), ["cuda events"]);
        // Drawn slower than a slower variant, but by less than the spreads: runs vary.
        let close = [panel("a", 5.60, &runs(4.75, 0.3), "cupti"), panel("b", 5.30, &runs(5.53, 0.3), "cupti")];
        assert!(close[0].untraced_ms.unwrap().middle_ms.unwrap().1 < close[1].untraced_ms.unwrap().middle_ms.unwrap().0, "ranked apart");
        assert_eq!(order_faults(&close), vec![], "drawn 0.3 ms apart, within a spread of 0.6");
        // Runs that do not stand apart rank nothing, however they are drawn.
        let tied = [panel("a", 9.0, &runs(5.0, 0.4), "cupti"), panel("b", 5.0, &runs(5.2, 0.4), "cupti")];
        assert_eq!(order_faults(&tied), vec![]);
        // A model's panel, or a figure with no runs behind it, ranks nothing.
        let mut model = panel("model", 9.0, &runs(4.0, 0.1), "model");
        model.untraced_ms = None;
        let figure = Timeline { untraced_ms: Some(Untraced::from(4.0)), ..panel("a sum of parts", 9.0, &runs(4.0, 0.1), "cupti") };
        let slower = panel("slower", 5.0, &runs(5.5, 0.1), "cupti");
        assert_eq!(order_faults(&[model.clone(), figure.clone(), slower]), vec![]);
        assert_eq!(clocks(&[model, figure]), ["cupti"], "a model's panel has no clock");
    }

    #[test]
    fn a_chart_that_draws_the_faster_variant_slower_fails_naming_both() {
        // Lab 6's alloc-stall as recorded on the H100 at c7db9c4: the
        // stream-ordered pair (runs 4.66-4.90 ms) drawn at 7.25 ms by CUPTI,
        // slower than the next two, drawn by events.
        let panels = [
            panel("stream-ordered", 7.251, &runs(4.753, 0.124), "cupti"),
            panel("cuMemAlloc, free after the loop", 5.126, &runs(5.531, 0.2), "cuda events"),
            panel("the CPU waits", 6.925, &runs(7.103, 0.152), "cuda events"),
            panel("cuMemAlloc + cuMemFree", 7.321, &runs(7.72, 0.29), "cuda events"),
        ];
        let faults = order_faults(&panels);
        let pairs: Vec<(&str, &str)> = faults.iter().map(|f| (f.faster.title.as_str(), f.slower.title.as_str())).collect();
        assert_eq!(pairs, [("stream-ordered", "cuMemAlloc, free after the loop"), ("stream-ordered", "the CPU waits")]);
        let line = faults[0].to_string();
        assert!(
            line.starts_with("\"stream-ordered\" is drawn slower than \"cuMemAlloc, free after the loop\" (7.251 against 5.126 ms)")
                && line.contains("faster beyond both spreads (middle half 4.629-4.877 against 5.331-5.731 ms)"),
            "{line}"
        );
        assert_eq!(clocks(&panels), ["cupti", "cuda events"], "two clocks on one chart");
        // The order holds either way round: the slower variant drawn faster
        // than the faster one beyond the spreads is the same fault.
        let swapped = [panel("slow", 4.0, &runs(8.0, 0.1), "cupti"), panel("fast", 6.0, &runs(5.0, 0.1), "cupti")];
        assert_eq!(order_faults(&swapped).len(), 1);
        assert_eq!(order_faults(&swapped)[0].faster.title, "fast");
    }

    #[test]
    fn a_schedule_over_two_gpus_has_a_lane_per_gpus_stream_in_order() {
        let mut s = Schedule::new();
        let names: Vec<String> = (0..12).map(|i| format!("s{i}")).collect();
        for st in [10usize, 2, 11] {
            s.declare_stream(st, crate::pipeline::op::StreamDecl::new(Default::default(), 0, usize::from(st == 11)));
            s.gpu_op(0, st, OpKind::Kernel, "k", vec![]);
        }
        s.host_op(0, "check", vec![]);
        let t = predict(&s, Machine::engines(2), |_| 1.0);
        let tl = Timeline::from_schedule("predicted", "two GPUs", &s, &t, &names);
        assert_eq!(tl.lanes(), ["GPU 0 · stream 2: s2", "GPU 0 · stream 10: s10", "GPU 1 · stream 11: s11", "CPU main"]);
        // One GPU: the lanes say nothing of GPUs.
        assert_eq!(crate::testing::sample_timeline().lanes(), ["stream 0", "stream 1", "CPU main"]);
    }
}
