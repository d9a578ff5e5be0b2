//! Timelines without Nsight: spans on lanes (streams, CPU threads, or the
//! warps inside one block of a kernel) in µs, drawn as a Gantt chart and
//! exported as Chrome-trace JSON that Perfetto and chrome://tracing open.
//! Measured timelines come from CUDA events against one base event (or,
//! inside a kernel, from the SM's cycle counter); predicted ones from the
//! schedule model.

use crate::error::Result;
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
    /// For a measured timeline: the time, ms, of the untraced runs it
    /// illustrates (the figure its table prints). A traced run pays for
    /// its timestamps, so its makespan can be longer; a chart says by how
    /// much wherever the two differ by more than [`AGREES_WITHIN`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub untraced_ms: Option<f64>,
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
pub fn overhead_pct(warmup: usize, pairs: usize, mut run: impl FnMut(bool) -> Result<f64>) -> Result<crate::measure::stats::Summary> {
    let mut v = Vec::with_capacity(pairs);
    for i in 0..warmup + pairs {
        let untraced = run(false)?;
        let traced = run(true)?;
        if i >= warmup {
            v.push(100.0 * (traced / untraced - 1.0));
        }
    }
    crate::measure::stats::Summary::of(&v)
}

/// One line for a lab's summary: "timeline overhead: +1.20% median, pairs
/// -0.80% to +3.10% over 15 (cupti)".
pub fn overhead_line(median_pct: f64, pairs: Option<&crate::measure::stats::Summary>, source: &str) -> String {
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

    /// This timeline drawn for untraced runs that took `ms` (see
    /// [`Timeline::untraced_ms`]).
    pub fn illustrating(self, ms: f64) -> Timeline {
        Timeline { untraced_ms: Some(ms), ..self }
    }

    /// How the drawn run compares with the untraced runs it illustrates,
    /// when it is off by more than [`AGREES_WITHIN`]: "tracing slowed this
    /// run by 12%". `None` when they agree or there is nothing to compare
    /// with.
    pub fn disagreement(&self) -> Option<String> {
        let untraced = self.untraced_ms.filter(|&u| u > 0.0)?;
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
