//! A batch a DataLoader's workers prepare ahead, as the replay lays it
//! out (`Change::PrepareAhead`): each batch built on a worker's lane,
//! handed over by the loader's own thread (PyTorch's pinning thread), and
//! taken over by the loop's thread at the loss the machine's calibration
//! says ([`BatchHandover`]), less what the loop waited for its other
//! threads where that loss was measured by the loop's own work.
//!
//! May use: `pipeline` (the schedule's lanes), `fixes` (what a handover
//! costs), `traced_schedule` (the schedule it adds to, its replay).

use super::fixes::{BatchHandover, Pricing, PREPARED_AHEAD};
use super::traced_schedule::{predicted_times, TracedSchedule};
use crate::pipeline::op::Lane;

/// The batches laid out so far, for a replay whose host lanes `0..threads`
/// are the trace's issuing threads (0 the loop's): the workers' lanes
/// follow them, then the loader's own thread.
pub(super) struct PreparedAhead {
    handover: BatchHandover,
    workers: usize,
    threads: usize,
    batches: usize,
    /// Each batch's taking over: its op, and what the loop loses there
    /// where it never lets the interpreter go.
    losses: Vec<(usize, f64)>,
    /// The schedule's ops since the last batch was taken over.
    busy_from: usize,
}

impl PreparedAhead {
    pub(super) fn new(pricing: &Pricing, threads: usize) -> PreparedAhead {
        let handover = pricing.batch_handover.clone().unwrap_or_default();
        PreparedAhead { handover, workers: pricing.workers(), threads, batches: 0, losses: Vec::new(), busy_from: 0 }
    }

    /// A batch of `built_us` of the host's work that a worker now builds;
    /// the loop's thread waits for it here.
    pub(super) fn batch(&mut self, ts: &mut TracedSchedule, built_us: f64) {
        let handover = &self.handover;
        // The batch's worker prepares it. The workers start building once
        // the loader has started them (`BatchHandover::workers_start_us`).
        let worker_lane = self.threads + self.batches % self.workers;
        if self.batches < self.workers {
            ts.host(worker_lane, "workers starting", handover.workers_start_us());
        }
        let worker = ts.schedule.host_op(worker_lane, PREPARED_AHEAD, vec![]);
        ts.durations_us.push(built_us + handover.worker_us);
        ts.traced_op.push(None);
        // Then the loader's own thread takes it over (PyTorch's
        // pinning thread), a batch at a time, beside the loop; its
        // first no sooner than the loader's start allows.
        let taker = self.threads + self.workers;
        if self.batches == 0 {
            ts.host(taker, "loader starting", handover.first_batch_us - handover.loop_us);
        }
        ts.schedule.host_learns(taker, worker);
        let taken = ts.schedule.host_op(taker, "batch handed over", vec![]);
        ts.durations_us.push(handover.loop_us);
        ts.traced_op.push(None);
        // The loop waits for it, then takes it over itself: it
        // loses the interpreter the pinning thread holds, by its
        // own work since the batch before (its own thread's host
        // work, `BatchHandover::lost_over`). Where the loop's time a
        // batch was measured by its work, that measure starts at
        // the first batch in hand (whose wait is the first batch's
        // calibration), so the first batch loses nothing more, and
        // what the loop waits for its other threads comes off
        // later (`hide_losses_in_waits`); else, waiting for
        // autograd's thread in `backward()` is not its own work,
        // so it loses nothing then.
        let busy: f64 =
            (self.busy_from..ts.durations_us.len()).filter(|&i| matches!(ts.schedule.ops[i].lane, Lane::HostThread(0))).map(|i| ts.durations_us[i]).sum();
        ts.schedule.host_learns(0, taken);
        let lost = if handover.measured_by_loop_work() && self.batches == 0 { 0.0 } else { handover.lost_over(busy) };
        // Pushed even when it takes no time: its time may change.
        self.losses.push((ts.durations_us.len(), lost));
        ts.schedule.host_op(0, "batch taken over", vec![]);
        ts.durations_us.push(lost);
        ts.traced_op.push(None);
        self.busy_from = ts.durations_us.len();
        self.batches += 1;
    }

    /// Once every call is laid out: the losses less the loop's waits,
    /// where they were measured by its work.
    pub(super) fn finish(self, ts: &mut TracedSchedule) {
        if self.handover.measured_by_loop_work() && self.losses.len() > 1 {
            hide_losses_in_waits(ts, &self.losses);
        }
    }
}

/// What the loop's thread loses to the loader at each batch after the
/// first (`losses`: the op that takes it over and its whole loss), less
/// the time it waited since the batch before for work of its own on other
/// threads or the GPU (in `backward()`, autograd's thread): waiting, it
/// lets the interpreter go, and the pinning thread takes its share then.
/// The wait for the batch itself is not taken off: the calibration's loop
/// waited for its batches too, and where the loader is the slower side the
/// loss falls inside that wait anyway (the batch is taken over no sooner
/// than it is handed over). Replayed again with the new losses, at most
/// three rounds, until they no longer change.
fn hide_losses_in_waits(ts: &mut TracedSchedule, losses: &[(usize, f64)]) {
    let main: Vec<usize> = (0..ts.durations_us.len()).filter(|&i| ts.schedule.ops[i].lane == Lane::HostThread(0)).collect();
    for _ in 0..3 {
        let times = predicted_times(ts);
        let mut changed = false;
        for pair in losses.windows(2) {
            let ((before, _), (at, whole)) = (pair[0], pair[1]);
            let between = &main[main.partition_point(|&i| i <= before)..main.partition_point(|&i| i < at)];
            let (busy, last_end) = between.iter().fold((0.0, times[before].1), |(b, e), &i| (b + times[i].1 - times[i].0, f64::max(e, times[i].1)));
            let waited = (last_end - times[before].1 - busy).max(0.0);
            let lost = (whole - waited).max(0.0);
            changed |= (lost - ts.durations_us[at]).abs() > 1e-3;
            ts.durations_us[at] = lost;
        }
        if !changed {
            break;
        }
    }
}
