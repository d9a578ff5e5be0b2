//! What each GPU op of a trace waited for before it started, read from
//! the trace's times alone: the op before it on its stream, its launching
//! call, or an op of another stream (an event wait the trace does not tie
//! to its event); and the GPU's gap between ops of a stream queued back to
//! back. What the replay ([`super::replay`]) schedules each op behind.
//!
//! May use: `measure` (a median), `events`.

use super::events::Trace;
use crate::measure::stats::upper_median;
use serde::Serialize;
use std::collections::HashMap;

/// How close (µs) an op's start must follow what it waited for to be taken
/// as waiting for it: timestamps are ns, and a GPU starts an op whose wait
/// is over within a few µs.
pub const WAIT_SLACK_US: f64 = 5.0;

/// What a traced GPU op waited for before it started.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "for")]
pub enum Waited {
    /// Nothing: it started as soon as it was issued on an idle stream.
    Nothing,
    /// The op before it on its stream (the trace's `gpu_ops` index).
    StreamOrder { op: usize },
    /// Its launching call: the CPU issued it after the GPU could have run it.
    Launch { call: usize },
    /// An op of another stream (an event wait, inferred from the times).
    OtherStream { op: usize },
}

/// The op each GPU op waited for, from the trace's times alone.
pub fn waits(trace: &Trace, launch_of: &HashMap<u64, usize>) -> Vec<Waited> {
    let mut last_on_stream: HashMap<(u32, u64), usize> = HashMap::new();
    let mut waited = vec![Waited::Nothing; trace.gpu_ops.len()];
    let longest = trace.gpu_ops.iter().map(|o| o.duration_us()).fold(0.0, f64::max);
    // Ops in the order they started (`gpu_ops` is sorted so).
    for (i, o) in trace.gpu_ops.iter().enumerate() {
        let call = o.correlation.and_then(|k| launch_of.get(&k)).copied();
        let pred = last_on_stream.insert((o.gpu, o.stream), i);
        let pred_end = pred.map_or(f64::NEG_INFINITY, |p| trace.gpu_ops[p].end_us);
        let issued = call.map_or(f64::NEG_INFINITY, |c| trace.calls[c].start_us);
        // The later of the two it must wait for explains its start...
        let by_order = match (pred, call) {
            (Some(p), _) if pred_end >= issued => Waited::StreamOrder { op: p },
            (_, Some(c)) => Waited::Launch { call: c },
            _ => Waited::Nothing,
        };
        let own = pred_end.max(issued);
        // ...unless it started later still, just after an op of another
        // stream of its GPU, issued before it, that ended after both.
        let other = (o.start_us > own + WAIT_SLACK_US)
            .then(|| {
                // Only ops that started late enough to end in the slack before
                // it can be what it waited for (`gpu_ops` is sorted by start).
                let from = trace.gpu_ops[..i].partition_point(|y| y.start_us < o.start_us - WAIT_SLACK_US - longest);
                trace.gpu_ops[from..i]
                    .iter()
                    .enumerate()
                    .map(|(j, y)| (from + j, y))
                    .filter(|(_, y)| {
                        y.gpu == o.gpu && y.stream != o.stream && y.end_us > own && y.end_us <= o.start_us + 1e-9 && o.start_us - y.end_us <= WAIT_SLACK_US
                    })
                    .filter(|(_, y)| match (y.correlation.and_then(|k| launch_of.get(&k)), call) {
                        (Some(&yc), Some(c)) => trace.calls[yc].start_us <= trace.calls[c].start_us,
                        _ => true,
                    })
                    .max_by(|a, b| a.1.end_us.total_cmp(&b.1.end_us))
                    .map(|(y, _)| y)
            })
            .flatten();
        waited[i] = other.map_or(by_order, |op| Waited::OtherStream { op });
    }
    waited
}

/// The GPU's gap between two ops of one stream where the second was
/// queued already (its launch began before the first ended, and it waited
/// for nothing else), µs: the median over the trace's such pairs (what
/// HTA counts as kernel wait), none where there are none. Eager kernels
/// queued back to back still start a few µs apart; a fix that queues them
/// so (a copy stream, a sync removed) keeps that gap.
pub fn queued_gap_us(trace: &Trace, waited: &[Waited]) -> f64 {
    let gaps: Vec<f64> = waited
        .iter()
        .enumerate()
        .filter_map(|(i, w)| match *w {
            Waited::StreamOrder { op } => Some((trace.gpu_ops[i].start_us - trace.gpu_ops[op].end_us).max(0.0)),
            _ => None,
        })
        .collect();
    upper_median(&gaps).unwrap_or(0.0)
}
