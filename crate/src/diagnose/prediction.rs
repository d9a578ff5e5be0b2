//! Fixes priced: each set of [`Change`]s predicted by the queue model on
//! the trace's schedule ([`super::replay`]), and the what-if table they
//! make ([`WhatIf`]), as `--json` writes it and as text.
//!
//! The trace is replayed as traced (the model's own error against the
//! window) and with each fix; the gain is the as-traced replay over the
//! fix's, so the model's error does not count as gain. Which fixes a
//! diagnosis suggests is `whatif`'s to say; this prices any list of them.
//!
//! May use: `events`, `fixes` (the program's API), `event_joins` (how the joins a graph keeps were
//! known: read from the trace's CUDA sync events, or inferred), `replay`
//! (the schedule and the queue model's replay), `busy_clock` (each
//! fix's kernels at its GPU's clock), `text` (how a time is written).

use super::busy_clock::{recovering_idle_share, replay_at_its_busy_clock};
use super::event_joins::JoinsKnown;
use super::events::Trace;
use super::fixes::ProgramApi;
use super::replay::{predicted_times, window_us, Change, Pricing, Replay, TracedSchedule};
use super::text::us;
use serde::Serialize;
use std::fmt;
use std::sync::Arc;

/// A fix's replay on the queue model: the trace's schedule with the fix's
/// changes, and each op's start and end, µs. Kept with its prediction, so
/// a chart draws the replay that priced the fix rather than replaying it
/// again.
#[derive(Clone, Debug)]
pub struct Replayed {
    pub schedule: Arc<TracedSchedule>,
    pub times: Arc<Vec<(f64, f64)>>,
}

/// A replay follows from its fix and its trace: two predictions are equal
/// by what they predict.
impl PartialEq for Replayed {
    fn eq(&self, _: &Replayed) -> bool {
        true
    }
}

/// One fix, predicted.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Prediction {
    /// "pinned + copy stream".
    pub fix: String,
    pub changes: Vec<Change>,
    /// The fix as the program makes it, in the words of the API it is
    /// written against ([`WhatIf::api`]; each change's
    /// [`Change::as_written`], joined by "; ").
    pub as_written: String,
    /// The traced run's time with the fix ([`WhatIf::traced_us`]), µs, on the queue model.
    pub predicted_us: f64,
    /// The as-traced replay's time over the fix's.
    pub gain: f64,
    /// What the price rests on, where a reader should know it.
    pub priced_by: Option<String>,
    /// What its kernels' traced times were multiplied by: the clock of a
    /// GPU as busy as the fix keeps it over the trace's
    /// ([`WhatIf::busy_clock`]); 1 where none is calibrated.
    pub kernel_clock_factor: f64,
    /// The replay that priced it (not in `--json`).
    #[serde(skip)]
    pub replayed: Replayed,
}

/// The what-if table of one trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WhatIf {
    /// The traced run, µs: from its start ([`WhatIf::run_from`]) to the
    /// last GPU op's end.
    pub traced_us: f64,
    /// The annotation (`record_function`, `ProfilerStep#N`: the outermost
    /// that holds the first issuing thread's first call) inside which the
    /// run starts with the host's own work before its first GPU op (a
    /// first batch built), which counts as the program's own clock counts
    /// it; none where there is no such work: the run is the window.
    pub run_from: Option<String>,
    /// The queue model's replay of the trace as traced, µs.
    pub replayed_us: f64,
    /// The same replay with the profiler's cost per recorded CPU op taken
    /// out ([`Pricing::profiler_us_per_cpu_op`]), as every fix is priced:
    /// the program untraced, as the model sees it, and what each gain is
    /// over (the replay as traced where that cost is not known), µs.
    pub replayed_untraced_us: f64,
    /// The API the program is written against: the words each fix is said in.
    pub api: ProgramApi,
    /// The fixes, fastest first.
    pub predictions: Vec<Prediction>,
    /// Why a fix could not be priced (one line each).
    pub not_priced: Vec<String>,
    /// How the joins of the program's events between its streams (the
    /// `cudaStreamWaitEvent`s a CUDA graph keeps) were known; none where
    /// the trace has no such wait.
    pub event_joins: Option<JoinsKnown>,
    /// How a fix's kernels were priced at the clock its GPU runs at as
    /// busy as the fix keeps it ([`super::busy_clock`]); none where this
    /// GPU has no calibration: each kernel at its traced time.
    pub busy_clock: Option<String>,
}

/// The fix's name: its changes' labels joined.
pub fn fix_label(changes: &[Change]) -> String {
    changes.iter().map(|c| c.label()).collect::<Vec<_>>().join(" + ")
}

/// Predicts `fixes` on `trace` (the as-traced replay beside them). `Err`
/// where the trace cannot be replayed at all (no launching calls, several
/// issuing threads: the course's own traces).
pub fn predict_fixes(trace: &Trace, fixes: &[Vec<Change>], pricing: &Pricing) -> Result<WhatIf, String> {
    let pricing = &pricing.for_trace(trace);
    let replay = Replay::new(trace)?;
    let (window_start, end) = trace.window_us();
    let start = replay.run_start.as_ref().map_or(window_start, |r| r.0.min(window_start));
    let as_traced = Pricing { profiler_us_per_cpu_op: None, ..pricing.clone() };
    let as_traced_schedule = replay.schedule(&[], &as_traced)?;
    let as_traced_times = predicted_times(&as_traced_schedule);
    let replayed_us = window_us(&as_traced_schedule, &as_traced_times);
    // How long the traced program left its GPU idle, as the model replays
    // it: what the traced kernels' clock followed.
    let clock = pricing.busy_clock.as_ref();
    let traced_idle_share = clock.map_or(0.0, |c| recovering_idle_share(&as_traced_schedule, &as_traced_times, c));
    let replayed_untraced_us = if pricing.profiler_us_per_cpu_op.is_some() {
        let (ts, times, _) = replay_at_its_busy_clock(replay.schedule(&[], pricing)?, traced_idle_share, clock);
        window_us(&ts, &times)
    } else {
        replayed_us
    };
    let event_joins = JoinsKnown::of(trace);
    let run_from = replay.run_start.as_ref().map(|r| r.1.clone());
    let api = ProgramApi::of(trace);
    let mut w = WhatIf {
        traced_us: end - start,
        run_from,
        replayed_us,
        replayed_untraced_us,
        api,
        predictions: Vec::new(),
        not_priced: Vec::new(),
        event_joins,
        busy_clock: clock.map(|c| c.says()),
    };
    for changes in fixes {
        match replay.schedule(changes, pricing) {
            Ok(ts) => {
                let (ts, times, kernel_clock_factor) = replay_at_its_busy_clock(ts, traced_idle_share, clock);
                let predicted_us = window_us(&ts, &times);
                let priced_by = changes.iter().find_map(|c| match c {
                    Change::Pinned => pricing.rates.as_ref().map(|r| format!("pinned rate from {}", r.source)),
                    Change::CudaGraph => Some(format!(
                        "{}{}",
                        match &pricing.graph {
                            Some(g) => g.says(),
                            None => "no gap between a graph's kernels (none recorded for this GPU): a lower bound".into(),
                        },
                        match ts.streams.len() {
                            0 | 1 => String::new(),
                            k => format!(
                                "; its {k} captured streams run side by side, joined where their events joined them{}",
                                event_joins.map_or(String::new(), |known| format!(" ({})", known.says()))
                            ),
                        }
                    )),
                    _ => None,
                });
                let replayed = Replayed { schedule: Arc::new(ts), times: Arc::new(times) };
                w.predictions.push(Prediction {
                    fix: fix_label(changes),
                    changes: changes.clone(),
                    as_written: changes.iter().map(|c| c.as_written(w.api)).collect::<Vec<_>>().join("; "),
                    predicted_us,
                    gain: replayed_untraced_us / predicted_us,
                    priced_by,
                    kernel_clock_factor,
                    replayed,
                });
            }
            Err(e) => w.not_priced.push(format!("{}: {e}", fix_label(changes))),
        }
    }
    w.predictions.sort_by(|a, b| a.predicted_us.total_cmp(&b.predicted_us));
    Ok(w)
}

impl fmt::Display for WhatIf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "what-if: the trace's GPU ops and CPU calls replayed in their order and with their measured times, each fix applied (lab 10's queue model; as traced it replays in {} against {} {}, {:+.1}%{}):",
            us(self.replayed_us),
            match &self.run_from {
                Some(name) => format!("the run's (from the start of its annotation '{name}')"),
                None => "the window's".into(),
            },
            us(self.traced_us),
            100.0 * (self.replayed_us / self.traced_us - 1.0),
            if self.replayed_untraced_us == self.replayed_us {
                String::new()
            } else {
                format!("; without the profiler's cost per recorded CPU op, as every fix is priced, {}", us(self.replayed_untraced_us))
            }
        )?;
        if self.predictions.is_empty() && self.not_priced.is_empty() {
            return write!(
                f,
                "  no fix to price: the findings suggest none of pinned memory, a copy stream, results read a step late, removing a sync or a CUDA graph"
            );
        }
        let width = self.predictions.iter().map(|p| p.fix.chars().count()).fold(24, usize::max);
        writeln!(f, "  {:<width$} {:>14} {:>8}", "fix", "predicted", "gain")?;
        for p in &self.predictions {
            write!(f, "  {:<width$} {:>14} {:>7.2}x", p.fix, us(p.predicted_us), p.gain)?;
            if let Some(by) = &p.priced_by {
                write!(f, "  ({by})")?;
            }
            if (p.kernel_clock_factor - 1.0).abs() >= 0.001 {
                write!(f, "  (kernels {:.3}x at the clock of a GPU this busy)", p.kernel_clock_factor)?;
            }
            writeln!(f)?;
            writeln!(f, "    in {}: {}", self.api.label(), p.as_written)?;
        }
        for n in &self.not_priced {
            writeln!(f, "  not priced: {n}")?;
        }
        if let Some(clock) = &self.busy_clock {
            writeln!(f, "  (each fix's kernels at the clock its GPU keeps as busy as the fix keeps it: {clock})")?;
        }
        write!(f, "  (gain: the replay of the program as it is over the fix's, both without the profiler's cost where it is known, so the model's own error is not counted)")
    }
}
