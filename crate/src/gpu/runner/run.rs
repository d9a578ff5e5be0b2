//! What a finished run of the runner leaves behind: its schedule and
//! races, its times (the whole run's, each op's, the issue loop's) and
//! whether it ran behind the start gate.

use crate::error::{LabError, Result};
use crate::pipeline::op::OpId;
use crate::pipeline::schedule::{Race, Schedule};
use crate::pipeline::timeline::Timeline;

/// What a finished run leaves behind.
#[derive(Debug)]
pub struct Run {
    pub schedule: Schedule,
    /// Accesses not ordered after a conflicting earlier access.
    pub races: Vec<Race>,
    /// Per-op device/host times against the base event (when recorded),
    /// in op order, then the issuing thread's calls where it drew them.
    pub timeline: Option<Timeline>,
    /// How many of the timeline's spans are the issuing thread's calls
    /// (drawn after the ops' spans, in a run issued live).
    pub calls_drawn: usize,
    /// Each op's (start, end) against the base event, µs, by op id, where
    /// the run was timed (empty otherwise; NaN for an op timed elsewhere).
    pub op_times_us: Vec<(f64, f64)>,
    /// To the last stream's end from the first stream's start, ms (CUDA
    /// events; always measured): behind a start gate on one GPU, from when
    /// the gate let the first stream go; else from the base event (the
    /// loop's first call, or the clock's restart after its set-up).
    pub total_ms: f64,
    /// What the loop allocated and never released (the runner released
    /// it after the run).
    pub unreleased: Vec<String>,
    /// Names given to the run's streams, by stream index.
    pub stream_names: Vec<String>,
    /// Host time from the loop's first call to its last, waits included,
    /// ms: for a deferred run, the replay of its recorded calls.
    pub issue_ms: f64,
    /// Per CPU thread of the loop (0 first), the host time its own calls
    /// took, ms, where the threads made them at once
    /// ([`super::Runner::threads_at_once`]); else the one entry `issue_ms`.
    pub issue_ms_by_thread: Vec<f64>,
    /// Whether the streams were held behind the start gate until the loop
    /// was issued (false: asked for no gate, the device has none, or a
    /// watchdog had to open it, as under a tool that serializes the GPU).
    pub gated: bool,
}

impl Run {
    /// Op `id`'s (start, end) against the base event, µs, as the run's
    /// timeline timed it (an error where the run was not timed per op, or
    /// timed that op elsewhere, as a host function).
    pub fn op_time_us(&self, id: OpId) -> Result<(f64, f64)> {
        self.op_times_us
            .get(id)
            .copied()
            .filter(|(a, b)| a.is_finite() && b.is_finite())
            .ok_or_else(|| LabError::config(format!("op {id} of this run was not timed on the GPU (give the runner a timeline source)")))
    }
    /// From the first op's start to the last op's end, ms, as the run's
    /// timeline timed them (CUDA events or CUPTI around each op): the
    /// device time of a few ops run alone, without the start of the
    /// run's clock in it.
    pub fn ops_ms(&self) -> Result<f64> {
        let start = self.op_times_us.iter().map(|t| t.0).fold(f64::INFINITY, f64::min);
        let end = self.op_times_us.iter().map(|t| t.1).fold(f64::NEG_INFINITY, f64::max);
        if !start.is_finite() || !end.is_finite() || end < start {
            return Err(LabError::config("ops_ms of a run that was not timed per op (give it a timeline source)"));
        }
        Ok((end - start) / 1e3)
    }
    /// The run's timeline when it has a span for every op: none, or only
    /// some, where another tool held CUPTI or a source missed records.
    pub fn full_timeline(&self) -> Option<&Timeline> {
        self.timeline.as_ref().filter(|t| t.spans.len() == self.schedule.ops.len() + self.calls_drawn)
    }
    /// The queue model's timeline for this run's schedule, each op lasting
    /// `duration_us(op)`.
    pub fn predicted(&self, machine: crate::pipeline::machine::Machine, duration_us: impl Fn(&crate::pipeline::op::Op) -> f64) -> Timeline {
        let times = crate::pipeline::predict::predict(&self.schedule, machine, duration_us);
        let device = self.timeline.as_ref().map(|t| t.device.clone()).unwrap_or_default();
        Timeline::from_schedule("predicted", &device, &self.schedule, &times, &self.stream_names)
    }
}
