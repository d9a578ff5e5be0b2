//! A GPU kept busy runs the same kernels slower than one that idles
//! between them: under sustained work its clock comes down, and a long
//! enough idle stretch lets it come back up. A trace's kernels took what
//! they took at the clock its program left the GPU at; a fix that keeps
//! the GPU busier runs them at a lower one. [`BusyClock`] is one GPU's
//! calibration of that (one step timed kept busy and with idle gaps of
//! several lengths, `crate/reference/busy_clock_probe.py`), and
//! [`replay_at_its_busy_clock`] replays a fix's schedule with its kernels
//! slowed (or sped up) from the trace's idle pattern to the fix's own.
//!
//! The model, all of it read off the calibration:
//! - **How much a gap lets the clock recover** (its weight, 0 to 1): the
//!   step's speed-up after gaps of that length over its full speed-up,
//!   on the line between the measured gap lengths. A gap of a few tens of
//!   µs (a sync's round trip, back-to-back launches) buys nothing; the
//!   longest gaps measured buy all of it.
//! - **The recovering idle share** of a window: its idle stretches (no
//!   kernel running) weighted so, over the window.
//! - **The slowdown** at a recovering idle share: each phase of the
//!   calibration is a point, its own recovering idle share (its gap's
//!   weight times its idle share) against the share of the full slowdown
//!   `S` it won back (its gap's weight); a window's share won back is
//!   read on the line through those points, from none with no idle to
//!   all of it at the first phase that won all of it, and all of it past
//!   that; its kernels are `S` over the speed-up so won back slower than
//!   at full speed. So the model gives back its calibration: a window idle
//!   as one of its phases was runs the step as that phase ran it.
//!
//! A fix's kernels take their traced time times its slowdown over the
//! trace's. One figure a GPU, from one step's kernels: a kernel the
//! memory bounds slows less than the clock, one the SMs bound nearly as
//! much; the calibration's step (GEMMs) is the second kind, so this
//! prices the slowdown of compute-heavy programs best.
//!
//! May use: `intervals` (the kernels' busy time), `traced_schedule` (the
//! schedule and its replay), `pipeline` (what a schedule op is),
//! `measure` (a measured curve read).

use super::intervals::union;
use super::traced_schedule::{predicted_times, window_span, TracedSchedule};
use crate::measure::stats::{never_falling, on_the_line};
use crate::pipeline::op::OpKind;
use serde::Serialize;

/// One phase of a calibration: the step run again and again, each time
/// after the GPU idled `idle_us` (none: kept busy).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BusyPhase {
    /// The GPU's idle time before each step, µs (the phase's median).
    pub idle_us: f64,
    /// The step's median time, µs.
    pub step_us: f64,
}

/// One GPU's kernels kept busy against with idle gaps, as a calibration
/// measured them ([`BusyClock::from_phases`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BusyClock {
    /// The step's time kept busy over its median time after the three
    /// longest gaps: how much slower a GPU that never idles runs it.
    pub slowdown: f64,
    /// How much of that each idle gap length lets the GPU win back, by
    /// gap (µs, a weight 0 to 1), shortest first.
    pub recovery_by_gap: Vec<(f64, f64)>,
    /// How much of it a window wins back, by its recovering idle share:
    /// each phase's (share, weight), up to the first that won all of it.
    pub recovery_by_idle_share: Vec<(f64, f64)>,
    /// Where it comes from.
    pub from: String,
}

impl BusyClock {
    /// The calibration of a step kept busy (`busy_step_us`) and run after
    /// each gap of `gapped` (at least two): its full speed the median of
    /// the steps after the longest three gaps (all of them where fewer),
    /// so one phase's noise does not set it. None where the step ran no
    /// faster after gaps than kept busy (nothing to price).
    pub fn from_phases(busy_step_us: f64, gapped: &[BusyPhase], from: String) -> Option<BusyClock> {
        let mut phases: Vec<BusyPhase> = gapped.iter().copied().filter(|p| p.idle_us > 0.0 && p.step_us > 0.0).collect();
        if phases.len() < 2 || busy_step_us.is_nan() || busy_step_us <= 0.0 {
            return None;
        }
        phases.sort_by(|a, b| a.idle_us.total_cmp(&b.idle_us));
        let longest = &phases[phases.len().saturating_sub(3)..];
        let mut steps: Vec<f64> = longest.iter().map(|p| p.step_us).collect();
        steps.sort_by(f64::total_cmp);
        let full_speed_us = steps[steps.len() / 2];
        let slowdown = busy_step_us / full_speed_us;
        if slowdown <= 1.0 {
            return None;
        }
        let weight = |p: &BusyPhase| ((busy_step_us / p.step_us - 1.0) / (slowdown - 1.0)).clamp(0.0, 1.0);
        let mut recovery_by_gap: Vec<(f64, f64)> = phases.iter().map(|p| (p.idle_us, weight(p))).collect();
        // The longest gaps set the full speed: they buy all of it.
        for point in recovery_by_gap.iter_mut().skip(phases.len() - longest.len()) {
            point.1 = 1.0;
        }
        // A longer gap never buys less than a shorter one.
        never_falling(&mut recovery_by_gap);
        // Each phase's own recovering idle share: its gaps' weight times its
        // idle share (rising with the gap, as both factors do).
        let mut recovery_by_idle_share = Vec::new();
        for (p, &(_, won)) in phases.iter().zip(&recovery_by_gap) {
            recovery_by_idle_share.push((won * p.idle_us / (p.idle_us + p.step_us), won));
            if won >= 1.0 {
                break;
            }
        }
        Some(BusyClock { slowdown, recovery_by_gap, recovery_by_idle_share, from })
    }

    /// How much of the full speed-up an idle gap of `gap_us` wins back:
    /// 0 for none, on the line between the measured gaps (and from no gap,
    /// which wins nothing), the last one's beyond them.
    pub fn recovery(&self, gap_us: f64) -> f64 {
        on_the_line_from_none(&self.recovery_by_gap, gap_us)
    }

    /// The recovering idle share from which the kernels run at full speed:
    /// the first phase's that won all of the slowdown back.
    pub fn full_speed_idle_share(&self) -> f64 {
        self.recovery_by_idle_share.last().map_or(0.0, |p| p.0)
    }

    /// How much longer a kernel takes on a GPU whose window has the
    /// recovering idle share `idle_share` than at full speed: the full
    /// slowdown over the speed-up won back (the share of it read on the
    /// line through the calibration's phases,
    /// [`BusyClock::recovery_by_idle_share`]), as a phase's step was the
    /// busy one over its speed-up.
    pub fn slowdown_at(&self, idle_share: f64) -> f64 {
        self.slowdown / (1.0 + (self.slowdown - 1.0) * on_the_line_from_none(&self.recovery_by_idle_share, idle_share))
    }

    /// The share of `(start, end)` that its idle stretches between `busy`
    /// (sorted, disjoint) win back: each stretch weighted by
    /// [`BusyClock::recovery`] of its length, over the window.
    pub fn recovering_idle_share(&self, busy: &[(f64, f64)], (start, end): (f64, f64)) -> f64 {
        let window = end - start;
        if window.is_nan() || window <= 0.0 {
            return 0.0;
        }
        let mut from = start;
        let mut won = 0.0;
        for &(s, e) in busy.iter().chain(std::iter::once(&(end, end))) {
            let gap = s.min(end) - from;
            if gap > 0.0 {
                won += gap * self.recovery(gap);
            }
            from = from.max(e);
        }
        won / window
    }

    /// What the what-if says the fixes' kernels were priced by.
    pub fn says(&self) -> String {
        format!(
            "kernels {:.3}x slower on a GPU kept busy than one idle {:.0}% of the time in gaps of {} µs or more, from {}",
            self.slowdown,
            100.0 * self.full_speed_idle_share(),
            self.recovery_by_gap.iter().find(|p| p.1 >= 1.0).map_or(0.0, |p| p.0).round(),
            self.from
        )
    }
}

/// `points` (x, y), x rising, read at `x` on the line through them: from
/// (0, 0) to the first, the last one's y past them.
fn on_the_line_from_none(points: &[(f64, f64)], x: f64) -> f64 {
    match (points.first(), points.last()) {
        (Some(&(x0, y0)), _) if x < x0 => y0 * x / x0,
        (_, Some(&(xn, yn))) if x > xn => yn,
        _ => on_the_line(points, x).unwrap_or(0.0),
    }
}

/// The recovering idle share ([`BusyClock::recovering_idle_share`]) of the
/// replay `times` of `ts` over its window.
pub fn recovering_idle_share(ts: &TracedSchedule, times: &[(f64, f64)], clock: &BusyClock) -> f64 {
    let kernels: Vec<(f64, f64)> = ts
        .schedule
        .ops
        .iter()
        .zip(&ts.traced_op)
        .zip(times)
        .filter(|((op, traced), _)| traced.is_some() && op.kind == OpKind::Kernel)
        .map(|(_, &t)| t)
        .collect();
    clock.recovering_idle_share(&union(kernels), window_span(ts, times))
}

/// The replay of `ts` with its kernels taking what they take at the clock
/// the replay itself leaves the GPU at, from what they took at the
/// trace's (`traced_idle_share`, its recovering idle share): the schedule
/// so priced, its ops' (start, end), µs, and the factor its kernels' times
/// were multiplied by. The share follows from the kernels' times and the
/// times from the share: a few rounds settle it (each moves the kernels
/// by a fraction of the calibration's few percent). Without a
/// calibration, `ts` replayed as it is (a factor of 1).
pub fn replay_at_its_busy_clock(ts: TracedSchedule, traced_idle_share: f64, clock: Option<&BusyClock>) -> (TracedSchedule, Vec<(f64, f64)>, f64) {
    /// Rounds of share, then times: the factor moves by under 0.1% after
    /// the third on the course's traces.
    const ROUNDS: usize = 4;
    let times = predicted_times(&ts);
    let Some(clock) = clock else { return (ts, times, 1.0) };
    let at_trace = clock.slowdown_at(traced_idle_share);
    let traced_durations = ts.durations_us.clone();
    let kernels: Vec<usize> = (0..ts.schedule.ops.len()).filter(|&i| ts.traced_op[i].is_some() && ts.schedule.ops[i].kind == OpKind::Kernel).collect();
    let (mut ts, mut times, mut factor) = (ts, times, 1.0);
    for _ in 0..ROUNDS {
        factor = clock.slowdown_at(recovering_idle_share(&ts, &times, clock)) / at_trace;
        for &i in &kernels {
            ts.durations_us[i] = traced_durations[i] * factor;
        }
        times = predicted_times(&ts);
    }
    (ts, times, factor)
}

#[cfg(test)]
mod tests {
    use super::{BusyClock, BusyPhase};

    /// A step of 1000 µs kept busy, 960 after long gaps, 1000 after 20 µs
    /// and 980 after 200: half the speed-up.
    fn clock() -> BusyClock {
        let phase = |idle_us, step_us| BusyPhase { idle_us, step_us };
        let phases = [phase(20.0, 1000.0), phase(200.0, 980.0), phase(500.0, 960.0), phase(1000.0, 950.0), phase(2000.0, 970.0)];
        BusyClock::from_phases(1000.0, &phases, "a test".into()).unwrap()
    }

    #[test]
    fn the_full_slowdown_is_kept_busy_over_the_longest_gaps_median_step() {
        let c = clock();
        assert!((c.slowdown - 1000.0 / 960.0).abs() < 1e-12, "{}", c.slowdown);
        assert!((c.full_speed_idle_share() - 500.0 / 1460.0).abs() < 1e-12, "the first phase that won all of it back");
        assert_eq!(c.recovery(20.0), 0.0, "a short gap wins nothing back");
        // After 200 µs the step ran 1000/980 - 1 faster, of 1000/960 - 1 in all.
        let at_200 = (1000.0 / 980.0 - 1.0) / (1000.0 / 960.0 - 1.0);
        assert!((c.recovery(200.0) - at_200).abs() < 1e-12, "{}", c.recovery(200.0));
        assert!((c.recovery(110.0) - at_200 / 2.0).abs() < 1e-12, "on the line between the gaps measured");
        assert_eq!(c.recovery(5000.0), 1.0);
        assert_eq!(c.recovery(0.0), 0.0);
    }

    #[test]
    fn short_gaps_leave_the_gpu_as_slow_as_kept_busy_and_long_ones_at_full_speed() {
        let c = clock();
        // 1000 µs of kernels then 20 µs idle, ten times: busy to the clock.
        let short: Vec<(f64, f64)> = (0..10).map(|i| (i as f64 * 1020.0, i as f64 * 1020.0 + 1000.0)).collect();
        let share = c.recovering_idle_share(&short, (0.0, 10200.0));
        assert_eq!(share, 0.0);
        assert!((c.slowdown_at(share) - c.slowdown).abs() < 1e-12);
        // The same kernels with 1000 µs gaps: idle half the time, all of it winning back.
        let long: Vec<(f64, f64)> = (0..10).map(|i| (i as f64 * 2000.0, i as f64 * 2000.0 + 1000.0)).collect();
        let share = c.recovering_idle_share(&long, (0.0, 20000.0));
        assert!((share - 0.5).abs() < 1e-12, "{share}");
        assert_eq!(c.slowdown_at(share), 1.0);
    }

    #[test]
    fn a_window_idle_as_a_phase_of_the_calibration_runs_the_step_as_that_phase_ran_it() {
        let phase = |idle_us, step_us| BusyPhase { idle_us, step_us };
        let phases = [
            phase(100.0, 1584.0),
            phase(130.0, 1560.0),
            phase(180.0, 1552.0),
            phase(280.0, 1532.0),
            phase(380.0, 1518.0),
            phase(580.0, 1521.0),
            phase(1080.0, 1501.0),
            phase(2090.0, 1531.0),
        ];
        let c = BusyClock::from_phases(1584.0, &phases, "the H200's sweep, rounded".into()).unwrap();
        assert_eq!(c.recovery_by_idle_share.len(), 5, "up to the 380 µs phase, the first to win it all back");
        for p in &phases[..5] {
            // Ten steps, each after its gap: the phase's pattern.
            let period = p.idle_us + p.step_us;
            let busy: Vec<(f64, f64)> = (0..10).map(|i| (i as f64 * period + p.idle_us, (i + 1) as f64 * period)).collect();
            let share = c.recovering_idle_share(&busy, (0.0, 10.0 * period));
            // Its step over the full speed's (the busy step over the slowdown).
            let measured = (c.slowdown * p.step_us / 1584.0).max(1.0);
            assert!((c.slowdown_at(share) - measured).abs() < 1e-9, "{} µs gaps: {} against {measured}", p.idle_us, c.slowdown_at(share));
        }
        // Past the first phase that won it all back, all of it; with none, none.
        assert_eq!(c.slowdown_at(0.9), 1.0);
        assert_eq!(c.slowdown_at(0.0), c.slowdown);
    }

    #[test]
    fn a_step_no_faster_after_gaps_gives_no_calibration() {
        let phases = [BusyPhase { idle_us: 100.0, step_us: 1000.0 }, BusyPhase { idle_us: 1000.0, step_us: 1010.0 }];
        assert_eq!(BusyClock::from_phases(1000.0, &phases, "flat".into()), None);
        assert_eq!(BusyClock::from_phases(1000.0, &phases[..1], "one".into()), None, "one phase is no curve");
    }
}
