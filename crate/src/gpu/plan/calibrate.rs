//! What the queue model needs measured on a rig: each op alone (back to
//! back, or by difference where one op spans GPUs), and the machine (copy
//! engines, both directions at once, kernels side by side, the CPU's
//! issuing and wake-up).

use super::PlanRig;
use crate::error::{LabError, Result};
use crate::gpu::TimelineSource;
use crate::measure::stats::Summary;
use crate::pipeline::machine::Machine;
use crate::pipeline::op::{OpKind, StreamKind};
use crate::pipeline::plan::{stage_streams, Costs, Plan, StreamSpec, WaitBy};

/// How many of one op [`PlanRig::alone`] issues back to back to time one.
pub const BACK_TO_BACK: usize = 8;

/// The most repeats [`PlanRig::per_repeat_ms`] doubles its repeats to
/// before it says the repeats cannot be told from the runs' noise.
pub const MAX_REPEATS_BY_DIFFERENCE: usize = 64;

/// Chunks of the loop [`PlanRig::machine`] times the CPU's issuing on (3
/// GPU ops and 4 event calls each; 192 ops stay behind one gate).
pub const ISSUE_CHUNKS: usize = 64;

/// `count` ops of `kind` over `n` elements back to back on one stream (a
/// copy between GPUs: from buffer 0 on its source GPU to buffer 1 on its
/// destination, on a stream of the source). Its buffers are `n` elements
/// long, so that timing one op alone makes none bigger than the rig's
/// plans already placed there (lab 8's rank buffers).
fn alone_plan(kind: OpKind, n: usize, count: usize) -> Plan {
    if let OpKind::AllReduce(ranks) = kind {
        // One stream and one buffer on each of the first `ranks` GPUs.
        let ranks = ranks.max(1) as usize;
        let streams = (0..ranks).map(|g| StreamSpec::new("alone", StreamKind::NonBlocking, 0).on_gpu(g)).collect();
        return Plan::new(&format!("all-reduce of {n} elements over {ranks} GPUs alone"), streams, n.max(2), ranks, move |p, r| {
            let pairs: Vec<_> = r.streams.iter().copied().zip(r.devices.iter().copied()).collect();
            (0..count).try_for_each(|_| p.all_reduce(&pairs, 0, n, "alone"))
        })
        .placed((0..ranks).collect())
        .with_device_buffers_of(n.max(2));
    }
    let (from, to) = match kind {
        OpKind::D2d(link) => (link.from as usize, link.to as usize),
        _ => (0, 0),
    };
    let stream = StreamSpec::new("alone", StreamKind::NonBlocking, 0).on_gpu(from);
    Plan::new(&format!("{} of {n} elements alone", kind.label()), vec![stream], n.max(2), 2, move |p, r| {
        let s = r.streams[0];
        for _ in 0..count {
            match kind {
                OpKind::H2d => p.h2d(s, r.devices[0], 0, r.input, 0, n, "alone"),
                OpKind::Kernel => p.compute(s, r.devices[0], 0, r.devices[1], 0, n, "alone"),
                OpKind::D2h => p.d2h(s, r.output, 0, r.devices[1], 0, n, "alone"),
                OpKind::D2d(_) => p.d2d(s, r.devices[1], 0, r.devices[0], 0, n, "alone"),
                other => Err(LabError::config(format!("{} cannot be timed alone", other.label()))),
            }?;
        }
        Ok(())
    })
    .placed(vec![from, to])
    .with_device_buffers_of(n.max(2))
}

/// Each distinct op of `plans`, once.
fn distinct_ops(plans: &[&Plan]) -> Result<Vec<(OpKind, usize)>> {
    let mut ops: Vec<(OpKind, usize)> = Vec::new();
    for p in plans {
        ops.extend(p.distinct_ops()?);
    }
    ops.sort();
    ops.dedup();
    Ok(ops)
}

/// What the model needs to know of the machine, as measured.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MachineFacts {
    pub copy_engines: u32,
    /// H2D and D2H of the same size, each alone (lower quartiles) and both
    /// at once (the fastest run), ms.
    pub h2d_ms: f64,
    pub d2h_ms: f64,
    pub both_ms: f64,
    /// From GPU work's end to the next op a CPU thread issues after waiting
    /// for it (cuEventSynchronize, then a launch), ms.
    pub wake_ms: f64,
    /// A kernel of a quarter of the machine's size alone, and
    /// [`BACK_TO_BACK`] of them alternating over two streams in all (ms).
    pub kernel_ms: f64,
    pub kernels_alternating_ms: f64,
    /// The host time to issue one GPU op of a loop ordered by events
    /// (its share of the events' record and wait calls included), ms.
    pub issue_ms: f64,
}

impl MachineFacts {
    /// The queue model's machine.
    pub fn machine(&self) -> Machine {
        Machine {
            host_wake: self.wake_ms.max(0.0),
            issue: self.issue_ms.max(0.0),
            ..Machine::copies_measured(self.copy_engines, self.h2d_ms, self.d2h_ms, self.both_ms)
        }
        .with_kernel_overlap(self.kernel_ms, BACK_TO_BACK, self.kernels_alternating_ms)
    }
}

impl PlanRig {
    /// One op of `kind` over `n` elements alone on one stream, ms (median
    /// of `reps` after a warm-up run): [`BACK_TO_BACK`] of them issued back
    /// to back, their span between CUDA events divided by their count. Not
    /// one op's span, nor the pipeline's total: a lone op pays a launch and
    /// a tail that ops back to back hide (measured: 32 chunk copies timed
    /// by their totals summed to 14% more than the pipeline of them took;
    /// timed by their own spans, still 5% more).
    ///
    /// An op over several GPUs (an all-reduce, a copy between GPUs) has no
    /// per-op events to compare across GPUs: it is timed by difference
    /// instead ([`Self::per_repeat_ms`]).
    pub fn alone(&mut self, kind: OpKind, n: usize, reps: usize) -> Result<Summary> {
        let one = alone_plan(kind, n, BACK_TO_BACK);
        if one.gpus().len() > 1 {
            return self.per_repeat_ms(|k| alone_plan(kind, n, k), BACK_TO_BACK, reps);
        }
        self.span_ms(&one, reps).map(|s| s.scaled(1.0 / BACK_TO_BACK as f64))
    }

    /// One repeat's time, ms, by difference: the run of `make(copies)`
    /// minus the run of `make(1)`, over `copies`−1 (each run bracketed by
    /// CUDA events, every output verified), `runs` times after one untimed
    /// run of each. What the plan does besides the repeats (an upload
    /// before, a download after) cancels out, and no per-op timeline is
    /// needed. A pair whose difference is at or below zero measured the
    /// runs' noise, not the repeats (short copies within a GPU can leave
    /// less than the noise between two runs): it is taken again, up to
    /// `runs` more pairs; then the repeats are doubled and the pairs begun
    /// again, up to `MAX_REPEATS_BY_DIFFERENCE`, and only then the
    /// calibration error.
    pub fn per_repeat_ms(&mut self, make: impl Fn(usize) -> Plan, copies: usize, runs: usize) -> Result<Summary> {
        if copies < 2 || runs == 0 {
            return Err(LabError::config(format!("timing a repeat by difference takes at least 2 repeats and 1 run (got {copies} and {runs})")));
        }
        let one = make(1);
        let one_model = one.dry_run()?;
        let mut copies = copies;
        loop {
            let many = make(copies);
            let many_model = many.dry_run()?;
            let mut run = |p: &Plan, m| self.run_modelled(p, m, TimelineSource::Off).map(|r| r.total_ms);
            run(&one, &one_model)?;
            run(&many, &many_model)?;
            let mut per_copy = Vec::with_capacity(runs);
            let mut pairs = 0;
            while per_copy.len() < runs && pairs < 2 * runs {
                pairs += 1;
                let a = run(&one, &one_model)?;
                let b = run(&many, &many_model)?;
                let ms = (b - a) / (copies - 1) as f64;
                if ms > 0.0 {
                    per_copy.push(ms);
                }
            }
            if per_copy.len() == runs {
                return Summary::of(&per_copy);
            }
            if 2 * copies > MAX_REPEATS_BY_DIFFERENCE {
                return Err(LabError::calibration(
                    format!("{}: {copies} repeats did not take measurably longer than one in {pairs} pairs of runs", many.name),
                    "Something else sets the run's time: give a larger size, or more copies",
                ));
            }
            copies *= 2;
        }
    }

    /// From the first op's start to the last op's end between CUDA events,
    /// ms (median of `reps` after a warm-up run).
    fn span_ms(&mut self, plan: &Plan, reps: usize) -> Result<Summary> {
        let model = plan.dry_run()?;
        let ops = model.schedule.ops.len();
        self.run_modelled(plan, &model, TimelineSource::Off)?;
        Summary::of_runs(reps, || {
            // Every op timed (where the gate is off, as under a tool that
            // blocks in calls, the timeline also holds the CPU's calls).
            let run = self.run_modelled(plan, &model, TimelineSource::Events)?;
            if run.full_timeline().is_none() {
                let spans = run.timeline.as_ref().map_or(0, |t| t.spans.len());
                return Err(LabError::config(format!("{}: {ops} ops and {} calls left {spans} spans", plan.name, run.calls_drawn)));
            }
            run.ops_ms()
        })
    }

    /// Every distinct op of `plans`, each alone, ms: the lower quartile of
    /// `reps` runs. This host has slow phases that last seconds (a 2 MiB
    /// H2D read 54 µs instead of 41 through every run of one op), and
    /// interference only ever slows a run: the lower quartile is the op's
    /// typical time, which a slow phase over up to three quarters of the
    /// runs leaves alone.
    pub fn costs(&mut self, plans: &[&Plan], reps: usize) -> Result<Costs> {
        let mut typical = Costs::new();
        for (kind, n) in distinct_ops(plans)? {
            typical.insert((kind, n), self.alone(kind, n, reps)?.middle_range().0);
        }
        Ok(typical)
    }

    /// The machine as the model needs it: copy engines, an H2D and a D2H of
    /// `n` elements alone and at once, and the wake-up of a CPU thread that
    /// waited for a kernel (medians of `reps`).
    pub fn machine(&mut self, n: usize, reps: usize) -> Result<MachineFacts> {
        let copy_engines = self.gpu.copy_engines()?;
        // Lower quartiles, as for every op alone (see `costs`).
        let h2d_ms = self.alone(OpKind::H2d, n, reps)?.middle_range().0;
        let d2h_ms = self.alone(OpKind::D2h, n, reps)?.middle_range().0;
        let two = vec![StreamSpec::new("up", StreamKind::NonBlocking, 0), StreamSpec::new("down", StreamKind::NonBlocking, 0)];
        // Back to back like the ops alone, and timed by the total with no
        // events between copies (an event after a copy costs its engine a
        // flush); the loop's fixed start-up is shared by all of them.
        let both = Plan::new("H2D and D2H at once", two, n.max(2), 2, move |p, r| {
            for _ in 0..BACK_TO_BACK {
                p.h2d(r.streams[0], r.devices[0], 0, r.input, 0, n, "up")?;
                p.d2h(r.streams[1], r.output, 0, r.devices[1], 0, n, "down")?;
            }
            Ok(())
        });
        let model = both.dry_run()?;
        // The fastest run: a host has slow phases of its link, and one
        // would set the ceiling for every run made outside it.
        let both_ms = Summary::of_runs(reps, || Ok(self.run_modelled(&both, &model, TimelineSource::Off)?.total_ms / BACK_TO_BACK as f64))?.min;
        // Kernels of a quarter of `n` alternating over two streams, all
        // issued at once, against the same kernels back to back on one.
        let k = (n / 4).max(1);
        let kernel_ms = self.alone(OpKind::Kernel, k, reps)?.middle_range().0;
        let two = vec![StreamSpec::new("a", StreamKind::NonBlocking, 0), StreamSpec::new("b", StreamKind::NonBlocking, 0)];
        let alternating = Plan::new("kernels alternating over two streams", two, (2 * k).max(2), 2, move |p, r| {
            for i in 0..BACK_TO_BACK {
                p.compute(r.streams[i % 2], r.devices[0], (i % 2) * k, r.devices[1], (i % 2) * k, k, &format!("kernel {i}"))?;
            }
            Ok(())
        });
        let kernels_alternating_ms = self.span_ms(&alternating, reps)?.middle_range().0;
        // Issuing: a loop of uploads, kernels and downloads on three streams
        // ordered by events, issued behind the gate (no waits), per GPU op.
        // Long enough for the steady pace: a short loop pays its start
        // over few ops.
        let issued = stage_streams("issue a three-stream loop", n.max(2 * ISSUE_CHUNKS), ISSUE_CHUNKS, WaitBy::StreamWaitEvent);
        let model = issued.dry_run()?;
        let ops = model.schedule.ops.len() as f64;
        self.run_modelled(&issued, &model, TimelineSource::Off)?;
        let issue_ms = Summary::of_runs(reps, || Ok(self.run_modelled(&issued, &model, TimelineSource::Off)?.issue_ms / ops))?.median;
        // A short kernel, the CPU waits for it, then issues the next: the
        // gap between the two on the timeline.
        let k = 1 << 14;
        let woken = Plan::new("a CPU thread wakes after a kernel", vec![StreamSpec::new("s", StreamKind::NonBlocking, 0)], 2 * k, 2, move |p, r| {
            let s = r.streams[0];
            p.compute(s, r.devices[0], 0, r.devices[1], 0, k, "before")?;
            let e = p.event()?;
            p.record(e, s)?;
            p.host_wait(e)?;
            p.compute(s, r.devices[0], k, r.devices[1], k, k, "after")
        });
        let wake_ms = Summary::of_runs(reps, || {
            let t = self.run(&woken, TimelineSource::Events)?.timeline.ok_or_else(|| LabError::config("no timeline"))?;
            let at = |label: &str| t.spans.iter().find(|s| s.label == label).map(|s| (s.start_us, s.end_us));
            match (at("before"), at("after")) {
                (Some(b), Some(a)) => Ok((a.0 - b.1) / 1e3),
                _ => Err(LabError::config("the wake-up plan lost a kernel")),
            }
        })?
        .median;
        Ok(MachineFacts { copy_engines, h2d_ms, d2h_ms, both_ms, wake_ms, kernel_ms, kernels_alternating_ms, issue_ms })
    }
}
