//! A trace as a schedule of the pipeline vocabulary, with every op's
//! measured duration ([`TracedSchedule`]: what `replay` builds and a
//! batch prepared ahead adds to), and its replay on the queue model
//! ([`predicted_times`], [`predict`]).
//!
//! May use: `pipeline` (the schedule and the queue model), `waits` (what
//! each op waited for).

use super::waits::Waited;
use crate::pipeline::machine::Machine;
use crate::pipeline::schedule::Schedule;

/// A trace as a schedule, with every op's measured duration.
#[derive(Clone, Debug)]
pub struct TracedSchedule {
    pub schedule: Schedule,
    /// Each schedule op's duration as traced (or as a fix makes it), µs.
    pub durations_us: Vec<f64>,
    /// For each schedule op on a stream: the trace's `gpu_ops` index.
    pub traced_op: Vec<Option<usize>>,
    /// Schedule stream index -> (GPU, the trace's stream number).
    pub streams: Vec<(u32, u64)>,
    /// For each of the trace's GPU ops, what it waited for.
    pub waited: Vec<Waited>,
    /// Whether kernels of different streams run side by side (a CUDA
    /// graph's branches), not one at a time.
    pub kernels_side_by_side: bool,
    /// Whether the schedule starts at the run's start before the window
    /// (the host's own work before the first call, which the replay
    /// starts from),
    /// so that its time is counted from 0, not from its first GPU op.
    pub from_run_start: bool,
}

impl TracedSchedule {
    /// Host work of `us` on host lane `lane` (none when it took no time).
    pub(super) fn host(&mut self, lane: usize, label: &str, us: f64) {
        if us > 0.0 {
            self.schedule.host_op(lane, label, vec![]);
            self.durations_us.push(us);
            self.traced_op.push(None);
        }
    }
}

/// The queue model's replay of a traced schedule: each schedule op's
/// (start, end), µs.
pub fn predicted_times(ts: &TracedSchedule) -> Vec<(f64, f64)> {
    // Copy engines each way, kernels one at a time (but for a graph's
    // branches, side by side): what the model assumes of a GPU whose
    // engines the trace does not name. Every CPU cost is in the schedule's
    // host work already.
    let machine = Machine { kernels_side_by_side: ts.kernels_side_by_side, ..Machine::engines(2) };
    crate::pipeline::predict::predict(&ts.schedule, machine, |op| ts.durations_us[op.id])
}

/// The queue model's replay of a traced schedule: the run from its start
/// (where the schedule knows it, [`TracedSchedule::from_run_start`]), else
/// from the first GPU op's start, to the last one's end, µs.
pub fn predict(ts: &TracedSchedule) -> f64 {
    window_us(ts, &predicted_times(ts))
}

/// The time of `ts` replayed at `times` (its ops' start and end, µs): from
/// the run's start (the schedule's 0, where it starts there), else from
/// the first GPU op's start, to the last GPU op's end.
pub fn window_us(ts: &TracedSchedule, times: &[(f64, f64)]) -> f64 {
    let (start, end) = window_span(ts, times);
    end - start
}

/// The (start, end) of the window [`window_us`] measures, µs.
pub fn window_span(ts: &TracedSchedule, times: &[(f64, f64)]) -> (f64, f64) {
    let gpu: Vec<(f64, f64)> = ts.traced_op.iter().zip(times).filter(|(t, _)| t.is_some()).map(|(_, &t)| t).collect();
    let first_gpu = gpu.iter().map(|t| t.0).fold(f64::INFINITY, f64::min);
    let start = if ts.from_run_start { 0.0f64.min(first_gpu) } else { first_gpu };
    let end = gpu.iter().map(|t| t.1).fold(f64::NEG_INFINITY, f64::max);
    (start, end)
}
