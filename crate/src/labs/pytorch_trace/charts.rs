//! Lab 10's timelines: a traced program's GPU work as torch.profiler saw it
//! (CUPTI's clock), each idle stretch of its GPU on a lane of its own,
//! coloured by the cause the diagnosis put it down to, beside the queue
//! model's replay of it with a fix, and, where the course has it, the
//! traced run of the program that applies the fix. Each panel starts at
//! its window's first GPU op.

use crate::diagnose::diagnosis::IdleCause;
use crate::diagnose::prediction::{Prediction, Replayed};
use crate::diagnose::replay;
use crate::diagnose::{Diagnosis, Trace};
use plotters::style::RGBColor;
use crate::error::Result;
use crate::measure::stats::Summary;
use crate::pipeline::op::Lane;
use crate::pipeline::timeline::{Span, Timeline};
use crate::present::gantt::Gantt;

/// The lane of a stream: "stream 7", after "GPU g · " where the trace has several GPUs.
fn lane(several_gpus: bool, gpu: u32, stream: String) -> String {
    if several_gpus {
        format!("GPU {gpu} · {stream}")
    } else {
        stream
    }
}

/// Spans shifted so the first starts at 0.
fn from_zero(mut spans: Vec<Span>) -> Vec<Span> {
    let t0 = spans.iter().map(|s| s.start_us).fold(f64::INFINITY, f64::min);
    for s in &mut spans {
        s.start_us -= t0;
        s.end_us -= t0;
    }
    spans
}

/// The trace's GPU work, one lane per stream, timed by CUPTI, drawn for
/// the untraced runs it stands for (`untraced`: the chart then says by
/// how much tracing slowed it, where it did).
pub fn traced_timeline(trace: &Trace, title: &str, untraced: Option<&Summary>) -> Timeline {
    let several = trace.gpus().len() > 1;
    let spans = trace
        .gpu_ops
        .iter()
        .map(|o| Span {
            lane: lane(several, o.gpu, format!("stream {}", o.stream)),
            kind: replay::op_kind(o.kind, o.gpu),
            label: o.name.clone(),
            start_us: o.start_us,
            end_us: o.end_us,
            class: None,
            index: None,
        })
        .collect();
    let device = trace.first_gpu_name().unwrap_or("GPU").to_string();
    let t = Timeline { title: title.into(), device, spans: from_zero(spans), source: "cupti".into(), untraced_ms: None };
    match untraced {
        Some(runs) => t.illustrating(*runs),
        None => t,
    }
}

/// Each idle stretch of each GPU `d` diagnosed on `trace`, on a lane of
/// its own under that GPU's streams ("GPU idle: why"), its class the
/// cause it was put down to (coloured by [`idle_palette`]), shifted as
/// [`traced_timeline`] shifts the trace's ops.
pub fn idle_spans(trace: &Trace, d: &Diagnosis) -> Vec<Span> {
    let several = trace.gpus().len() > 1;
    let t0 = trace.window_us().0;
    let mut spans = Vec::new();
    for g in &d.gpus {
        for share in &g.idle_causes {
            for &(a, b) in &share.spans_us {
                spans.push(Span {
                    lane: lane(several, g.gpu, "GPU idle: why".into()),
                    kind: crate::pipeline::op::OpKind::Host,
                    label: share.cause.label().into(),
                    start_us: a - t0,
                    end_us: b - t0,
                    class: Some(share.cause.label().into()),
                    index: None,
                });
            }
        }
    }
    spans
}

/// The colours of the idle lane's causes, with the legend's words.
pub fn idle_palette() -> Vec<(String, String, RGBColor)> {
    [
        (IdleCause::HostWork, RGBColor(188, 189, 34)),
        (IdleCause::WaitingForLaunches, RGBColor(148, 103, 189)),
        (IdleCause::Sync, RGBColor(214, 39, 40)),
        (IdleCause::Copy, RGBColor(255, 152, 150)),
        (IdleCause::OtherStream, RGBColor(23, 190, 207)),
        (IdleCause::KernelGaps, RGBColor(199, 199, 199)),
        (IdleCause::Unattributed, RGBColor(0, 0, 0)),
    ]
    .into_iter()
    .map(|(c, rgb)| (c.label().to_string(), format!("idle: {}", c.label()), rgb))
    .collect()
}

/// The queue model's replay of `trace` with a fix (the replay that priced
/// it): the GPU's ops on their streams (a copy stream the fix makes is a
/// lane of its own).
pub fn predicted_timeline(trace: &Trace, replayed: &Replayed, title: &str) -> Timeline {
    let (ts, times) = (&*replayed.schedule, &*replayed.times);
    let several = trace.gpus().len() > 1;
    let spans = ts
        .schedule
        .ops
        .iter()
        .zip(times.iter())
        .filter_map(|(op, &(start_us, end_us))| {
            let Lane::Stream(i) = op.lane else { return None };
            let (gpu, stream) = ts.streams[i];
            Some(Span {
                lane: lane(several, gpu, replay::stream_label(stream)),
                kind: op.kind,
                label: op.label.clone(),
                start_us,
                end_us,
                class: None,
                index: None,
            })
        })
        .collect();
    let device = trace.first_gpu_name().unwrap_or("GPU").to_string();
    Timeline { title: title.into(), device, spans: from_zero(spans), source: "model".into(), untraced_ms: None }
}

/// What one chart of the lab shows: a traced program and a fix.
pub struct FixChart<'a> {
    /// The chart's file name, without extension.
    pub stem: String,
    pub title: String,
    pub origin: String,
    /// The traced program, its name and its untraced runs.
    pub before: (&'a Trace, &'a str, Option<&'a Summary>),
    /// Its diagnosis, whose idle stretches the traced panel draws.
    pub diagnosis: &'a Diagnosis,
    /// The fix, as the what-if predicted it.
    pub fix: &'a Prediction,
    /// The traced program that applies the fix, its name and its untraced
    /// runs, where there is one.
    pub after: Option<(&'a Trace, &'a str, &'a Summary)>,
}

/// The traced program above, its predicted fix below it, and the fixed
/// program's own trace at the bottom, on one time axis.
pub fn fix_chart(c: FixChart) -> Result<Gantt> {
    let (trace, name, runs) = c.before;
    let mut traced = traced_timeline(trace, &format!("{name}, traced (each idle stretch coloured by its cause)"), runs);
    traced.spans.extend(idle_spans(trace, c.diagnosis));
    let mut panels = vec![traced];
    panels.push(predicted_timeline(trace, &c.fix.replayed, &format!("{name} with {}, predicted by the queue model", c.fix.fix)));
    if let Some((t, after, runs)) = c.after {
        panels.push(traced_timeline(t, &format!("{after} (the program that applies it), traced"), Some(runs)));
    }
    Ok(Gantt::new(&c.stem, &c.title, &c.origin, panels).with_classes(idle_palette()))
}
