//! How a run's operations are timed for its timeline: by CUDA events
//! around each op, by CUPTI's activity records, or not at all; and how
//! those times become the run's [`Timeline`]. An untimed run records no
//! event per op: only the base event and each stream's end.

use super::super::{driver, Event, Gpu};
use crate::error::{LabError, Result};
use crate::pipeline::op::{Lane, OpKind};
use crate::pipeline::schedule::Schedule;
use crate::pipeline::timeline::{Span, Timeline};
use std::sync::Arc;

/// What times a run's operations for its timeline.
///
/// A kernel costs nothing to trace with CUPTI (its timestamps come from
/// the hardware's launch and completion); a copy costs a timestamp either
/// way, CUPTI's about half a CUDA event's (the copy engine drains before
/// writing an event; `crate/examples/timeline_cost.rs` measures both). So
/// CUPTI is the default: exact spans, at the lower cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimelineSource {
    /// No per-op timing (only the total).
    Off,
    /// CUDA events around each op: works everywhere; a span includes time
    /// queued at the head of its stream.
    Events,
    /// CUPTI activity records: the hardware's own timestamps, nothing added
    /// to the streams. Needs libcupti.
    Cupti,
}

impl TimelineSource {
    /// For pure-GPU pipelines: CUPTI when the library loads, else events.
    pub fn best() -> TimelineSource {
        Self::preferring(TimelineSource::Cupti)
    }
    /// For pipelines the CPU takes part in (host work, host waits): events.
    /// CUPTI instruments every API call on the CPU, and there that cost
    /// lands inside the timed span.
    pub fn for_host_pipeline() -> TimelineSource {
        Self::preferring(TimelineSource::Events)
    }
    /// `default`, unless OVERLAP_LAB_TIMELINE=events|cupti says otherwise;
    /// events wherever CUPTI cannot record (no libcupti, or another tool
    /// already subscribed to it), with one line on stderr saying why.
    fn preferring(default: TimelineSource) -> TimelineSource {
        let wanted = match std::env::var("OVERLAP_LAB_TIMELINE").as_deref() {
            Ok("events") => TimelineSource::Events,
            Ok("cupti") => TimelineSource::Cupti,
            _ => default,
        };
        if wanted != TimelineSource::Cupti {
            return wanted;
        }
        match crate::gpu::cupti_free() {
            Ok(()) => TimelineSource::Cupti,
            Err(why) => {
                Self::fall_back_to_events(why);
                TimelineSource::Events
            }
        }
    }

    /// Says once per process why the timeline is timed by CUDA events
    /// instead of CUPTI.
    pub(super) fn fall_back_to_events(why: &str) {
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
            eprintln!("{}", Self::fallback_line(why));
        }
    }

    /// The line `fall_back_to_events` prints once per process.
    pub fn fallback_line(why: &str) -> String {
        let who = if why.contains("MULTIPLE_SUBSCRIBERS") { " (another tool holds CUPTI: compute-sanitizer, Nsight Systems or Nsight Compute)" } else { "" };
        format!("overlap-lab: CUPTI cannot record here{who}: {why}; timelines are timed with CUDA events instead, and records say \"cuda events\"")
    }
    pub fn label(self) -> &'static str {
        match self {
            TimelineSource::Off => "off",
            TimelineSource::Events => "cuda events",
            TimelineSource::Cupti => "cupti",
        }
    }
}

/// How one op of the run is timed.
pub(super) enum Mark {
    /// Pool events bracketing the op.
    Gpu(usize, usize),
    /// Timed by CUPTI: the op's place among the run's GPU ops.
    Activity(usize),
    /// Timed on the host clock: its slot in the runner's host times.
    Host(usize),
    None,
    /// Timed by the thread that runs it (a host function, a worker): not
    /// on this run's timeline.
    Elsewhere,
}

/// Timing events, made while the loop is recorded (or before it), so that
/// creating one never lands among the timed calls.
#[derive(Default)]
pub(super) struct EventPool {
    events: Vec<Arc<Event>>,
}

impl EventPool {
    /// `n` events made in advance on `gpu`.
    pub fn made(gpu: &Gpu, n: usize) -> Result<EventPool> {
        Ok(EventPool { events: (0..n).map(|_| gpu.timing_event().map(Arc::new)).collect::<Result<_>>()? })
    }
    /// The next unused event (made now if the pool ran out), by index.
    pub fn take(&mut self, gpu: &Gpu, used: &mut usize) -> Result<usize> {
        if *used == self.events.len() {
            self.events.push(Arc::new(gpu.timing_event()?));
        }
        *used += 1;
        Ok(*used - 1)
    }
    pub fn get(&self, i: usize) -> &Arc<Event> {
        &self.events[i]
    }
}

/// (start, end) µs of every GPU op from CUPTI's records: those of the run's
/// streams (`streams`, CUPTI's ids), in correlation order (the order the
/// API calls were made), are its GPU ops in issue order. `t0` is CUPTI's
/// clock when the run's base completed.
pub(super) fn activity_times(schedule: &Schedule, streams: &[u32], t0: u64) -> Result<Vec<(f64, f64)>> {
    let mut recs: Vec<_> = driver::activity::finish()?.into_iter().filter(|r| streams.contains(&r.stream_id)).collect();
    recs.sort_by_key(|r| r.correlation);
    // Only copies and kernels leave activity records (memory calls are timed on the host).
    let kinds: Vec<OpKind> = schedule.ops.iter().filter(|o| o.kind.is_device_work()).map(|o| o.kind).collect();
    if recs.len() != kinds.len() {
        return Err(LabError::Driver { call: "CUPTI", message: format!("{} activity records for {} operations", recs.len(), kinds.len()) });
    }
    // The host reads CUPTI's clock just after the base completes, which
    // may be a few µs after the first op started: start at that op then.
    let t0 = recs.iter().map(|r| r.start_ns).min().map_or(t0, |first| first.min(t0)) as f64;
    recs.iter()
        .zip(kinds)
        .enumerate()
        .map(|(i, (r, k))| {
            // CUPTI_ACTIVITY_MEMCPY_KIND_*: HTOD 1, DTOH 2, DTOD 8, PTOP 10.
            let want = match k {
                OpKind::H2d => 1,
                OpKind::D2h => 2,
                OpKind::D2d(link) if link.is_peer() => 10,
                OpKind::D2d(_) => 8,
                _ => 0,
            };
            if r.copy_kind != want {
                return Err(LabError::Driver { call: "CUPTI", message: format!("operation {i} is {k:?} but its record has copy kind {}", r.copy_kind) });
            }
            Ok(((r.start_ns as f64 - t0) / 1e3, (r.end_ns as f64 - t0) / 1e3))
        })
        .collect()
}

/// Each op's (start, end) µs from its mark: pool events against the base
/// event, CUPTI's times, the host clock's; NaN for ops timed elsewhere.
pub(super) fn op_times(marks: &[Mark], base: &Event, pool: &EventPool, activity: Option<&[(f64, f64)]>, host: &[(f64, f64)]) -> Result<Vec<(f64, f64)>> {
    let mut times = Vec::with_capacity(marks.len());
    for m in marks {
        times.push(match *m {
            Mark::Gpu(a, b) => (base.elapsed_ms(pool.get(a))? * 1e3, base.elapsed_ms(pool.get(b))? * 1e3),
            Mark::Activity(i) => activity.map_or((0.0, 0.0), |a| a[i]),
            Mark::Host(i) => host.get(i).copied().unwrap_or((f64::NAN, f64::NAN)),
            Mark::None => (0.0, 0.0),
            Mark::Elsewhere => (f64::NAN, f64::NAN),
        });
    }
    Ok(times)
}

/// The measured timeline of a run from its ops' times (spans timed
/// elsewhere left out).
pub(super) fn measured_timeline(device: &str, schedule: &Schedule, times: &[(f64, f64)], lanes: &[String], source: TimelineSource) -> Timeline {
    let mut t = Timeline::from_schedule("measured", device, schedule, times, lanes);
    t.spans.retain(|s| s.start_us.is_finite());
    t.source = source.label().into();
    t
}

/// The issuing thread's calls as timeline spans on its lane (the loop's
/// own CPU thread's, host clock, moved back by `shift_us` as the ops'
/// times were): what the CPU was doing while the GPU ran what it had issued.
pub(super) fn issue_spans<'c>(calls: &'c [(f64, f64, &'static str)], shift_us: f64) -> impl Iterator<Item = Span> + 'c {
    let lane = Lane::HostThread(0).to_string();
    calls.iter().map(move |&(start, end, name)| Span {
        lane: lane.clone(),
        kind: OpKind::Host,
        label: name.into(),
        start_us: start - shift_us,
        end_us: end - shift_us,
        class: None,
        index: None,
    })
}

#[cfg(test)]
mod tests {
    use super::TimelineSource;

    #[test]
    fn the_fallback_line_says_why_and_names_the_tools_that_hold_cupti() {
        let held = TimelineSource::fallback_line("cuptiActivityRegisterCallbacks: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED");
        assert!(held.contains("compute-sanitizer") && held.contains("MULTIPLE_SUBSCRIBERS") && held.contains("\"cuda events\""), "{held}");
        let missing = TimelineSource::fallback_line("libcupti could not be loaded");
        assert!(missing.contains("libcupti could not be loaded") && !missing.contains("another tool"), "{missing}");
        // One line, and nothing a notebook runner takes for an error.
        assert!(!held.contains('\n') && !held.contains("Error:") && !held.contains("panicked"));
    }
}
