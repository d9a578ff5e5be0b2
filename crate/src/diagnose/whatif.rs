//! What-if: the fixes a diagnosis suggests, each predicted by the queue
//! model on the trace's schedule ([`super::replay`]).
//!
//! Each finding suggests a change: pageable copies, pinned memory (and, where
//! the copies share the kernels' stream, pinned memory on a copy stream of
//! their own); page-locked copies on the kernels' stream, a copy stream; a
//! sync that left the GPU idle, the syncs removed; an issue-bound stretch,
//! CUDA graphs. The trace is replayed as traced (the model's own error
//! against the window) and with each fix; the gain is the as-traced replay
//! over the fix's, so the model's error does not count as gain.

use super::analyze::{Cause, Diagnosis};
use super::events::Trace;
use super::replay::{self, predict, Change, Pricing, Replay};
use serde::Serialize;
use std::fmt;

/// One fix, predicted.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Prediction {
    /// "pinned + copy stream".
    pub fix: String,
    pub changes: Vec<Change>,
    /// The traced window's time with the fix, µs, on the queue model.
    pub predicted_us: f64,
    /// The as-traced replay's time over the fix's.
    pub gain: f64,
    /// What the price rests on, where a reader should know it.
    pub priced_by: Option<String>,
}

/// The what-if table of one trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WhatIf {
    /// The traced window, µs.
    pub traced_us: f64,
    /// The queue model's replay of the trace as traced, µs.
    pub replayed_us: f64,
    /// The fixes, fastest first.
    pub predictions: Vec<Prediction>,
    /// Why a fix could not be priced (one line each).
    pub not_priced: Vec<String>,
}

/// The changes the findings of `d` on `trace` suggest, each fix once. A
/// copy stream is suggested where uploads share a stream with kernels.
pub fn suggested(trace: &Trace, d: &Diagnosis) -> Vec<Vec<Change>> {
    let has = |c: Cause| d.findings.iter().any(|f| f.cause == c);
    let uploads_beside_kernels = replay::uploads_on_kernel_streams(trace) > 0;
    let mut fixes = Vec::new();
    if has(Cause::PageableCopies) {
        fixes.push(vec![Change::Pinned]);
        if uploads_beside_kernels {
            fixes.push(vec![Change::Pinned, Change::CopyStream]);
        }
    } else if has(Cause::CopiesShareStreamWithKernels) && uploads_beside_kernels {
        fixes.push(vec![Change::CopyStream]);
    }
    if has(Cause::Sync) {
        fixes.push(vec![Change::SyncRemoved]);
    }
    // Issue-bound between launches that are graphs already: no graph to add.
    if d.findings.iter().any(|f| f.cause == Cause::IssueBound && !f.call.name.ends_with("cudaGraphLaunch")) {
        fixes.push(vec![Change::CudaGraph]);
    }
    fixes
}

/// The fix's name: its changes' labels joined.
pub fn fix_label(changes: &[Change]) -> String {
    changes.iter().map(|c| c.label()).collect::<Vec<_>>().join(" + ")
}

/// Predicts `fixes` on `trace` (the as-traced replay beside them). `Err`
/// where the trace cannot be replayed at all (no launching calls, several
/// issuing threads: the course's own traces).
pub fn predict_fixes(trace: &Trace, fixes: &[Vec<Change>], pricing: &Pricing) -> Result<WhatIf, String> {
    let (start, end) = trace.window_us();
    let replay = Replay::new(trace)?;
    let replayed_us = predict(&replay.schedule(&[], pricing)?);
    let mut w = WhatIf { traced_us: end - start, replayed_us, predictions: Vec::new(), not_priced: Vec::new() };
    for changes in fixes {
        match replay.schedule(changes, pricing) {
            Ok(ts) => {
                let predicted_us = predict(&ts);
                let priced_by = changes.iter().find_map(|c| match c {
                    Change::Pinned => pricing.rates.as_ref().map(|r| format!("pinned rate from {}", r.source)),
                    Change::CudaGraph => Some(match &pricing.graph_gap_us {
                        Some((gap, from)) => format!("{gap:.2} µs between a graph's kernels, from {from}"),
                        None => "no gap between a graph's kernels (none recorded for this GPU): a lower bound".into(),
                    }),
                    _ => None,
                });
                w.predictions.push(Prediction { fix: fix_label(changes), changes: changes.clone(), predicted_us, gain: replayed_us / predicted_us, priced_by });
            }
            Err(e) => w.not_priced.push(format!("{}: {e}", fix_label(changes))),
        }
    }
    w.predictions.sort_by(|a, b| a.predicted_us.total_cmp(&b.predicted_us));
    Ok(w)
}

/// The what-if of the fixes `d`'s findings suggest.
pub fn what_if(trace: &Trace, d: &Diagnosis, pricing: &Pricing) -> Result<WhatIf, String> {
    predict_fixes(trace, &suggested(trace, d), pricing)
}

impl fmt::Display for WhatIf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use super::analyze::us;
        writeln!(
            f,
            "what-if, on the queue model (the trace replayed as traced: {} against the window's {}, {:+.1}%):",
            us(self.replayed_us),
            us(self.traced_us),
            100.0 * (self.replayed_us / self.traced_us - 1.0)
        )?;
        if self.predictions.is_empty() && self.not_priced.is_empty() {
            return write!(f, "  no fix to price: the findings suggest none of pinned memory, a copy stream, removing a sync or a CUDA graph");
        }
        writeln!(f, "  {:<24} {:>14} {:>8}", "fix", "predicted", "gain")?;
        for p in &self.predictions {
            write!(f, "  {:<24} {:>14} {:>7.2}x", p.fix, us(p.predicted_us), p.gain)?;
            if let Some(by) = &p.priced_by {
                write!(f, "  ({by})")?;
            }
            writeln!(f)?;
        }
        for n in &self.not_priced {
            writeln!(f, "  not priced: {n}")?;
        }
        write!(f, "  (gain: the as-traced replay over the fix's, so the model's own error is not counted)")
    }
}
