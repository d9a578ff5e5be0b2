//! Lab 8's measurements on the GPU, each a plan the rig runs verified.
//!
//! An op's time is taken by difference: the plan with `k` repeats of it
//! minus the same plan with one, over k−1 (CUDA events bracket each run).
//! The upload before and the download after — what makes the run
//! verifiable — cancel out, and no per-op timeline is needed (under
//! Nsight, which holds CUPTI, a pipeline over two GPUs has none).

use super::pipeline_parallel::{self as pp, bubble, bubble_model};
use super::{four_way, peer};
use crate::error::{LabError, Result};
use crate::gpu::{PlanRig, TimelineSource};
use crate::measure::stats::Summary;
use crate::pipeline::plan::Plan;
use serde::{Deserialize, Serialize};

/// GPU-to-GPU bandwidth at one size, GB/s (10^9 bytes a second).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerPoint {
    pub bytes: u64,
    /// One way, from the pair's first GPU to its second.
    pub one_way: Summary,
    /// Both ways at once: the bytes that crossed in both directions per second.
    pub both_ways: Summary,
    /// One way, staged through pinned host memory.
    pub staged: Summary,
}

/// How a repeated op is timed.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Repeats in the long run (the short run has one).
    pub copies: usize,
    /// Runs of each (after one of each untimed), whose differences are summarised.
    pub runs: usize,
}

/// One repeat's time, ms, by difference ([`Timing`]): `make(k)` is the
/// plan with `k` repeats.
pub fn per_repeat_ms(rig: &mut PlanRig, make: impl Fn(usize) -> Plan, t: Timing) -> Result<Summary> {
    if t.copies < 2 || t.runs == 0 {
        return Err(LabError::config(format!("timing a copy by difference takes at least 2 copies and 1 run (got {} and {})", t.copies, t.runs)));
    }
    let (one, many) = (make(1), make(t.copies));
    let (one_model, many_model) = (one.model()?, many.model()?);
    let mut run = |p: &Plan, m| rig.run_modelled(p, m, TimelineSource::Off).map(|r| r.total_ms);
    run(&one, &one_model)?;
    run(&many, &many_model)?;
    let mut per_copy = Vec::with_capacity(t.runs);
    for _ in 0..t.runs {
        let a = run(&one, &one_model)?;
        let b = run(&many, &many_model)?;
        per_copy.push((b - a) / (t.copies - 1) as f64);
    }
    Summary::of(&per_copy)
}

/// GB/s from bytes and ms (a time at or below zero is none: the runs were
/// too noisy to tell the copies apart).
fn gbps(bytes: f64, ms: f64) -> f64 {
    if ms > 0.0 {
        bytes / ms / 1e6
    } else {
        f64::NAN
    }
}

/// The three ways at `bytes` between the rig's GPUs `from` and `to` (the
/// same GPU on a machine with one: copies within it). Staging uses
/// `chunks` chunks.
pub fn peer_point(rig: &mut PlanRig, bytes: usize, (from, to): (usize, usize), chunks: usize, t: Timing) -> Result<PeerPoint> {
    let elements = (bytes / 4) & !1;
    if elements < 2 * chunks.max(1) {
        return Err(LabError::config(format!("{bytes} bytes in {chunks} chunks: give at least 8 bytes a chunk")));
    }
    let b = (elements * 4) as f64;
    let to_gbps = |s: Summary, moved: f64| {
        let v = s.map_decreasing(|ms| gbps(moved, ms));
        if v.median.is_finite() {
            Ok(v)
        } else {
            Err(LabError::calibration(
                format!("copies of {} did not take measurably longer than one", crate::Bytes(bytes as u64)),
                "Something else sets the run's time: give a larger size, or more copies",
            ))
        }
    };
    Ok(PeerPoint {
        bytes: elements as u64 * 4,
        one_way: to_gbps(per_repeat_ms(rig, |k| peer::one_way(elements, from, to, k), t)?, b)?,
        both_ways: to_gbps(per_repeat_ms(rig, |k| peer::both_ways(elements, from, to, k), t)?, b)?,
        staged: to_gbps(per_repeat_ms(rig, |k| peer::staged(elements, from, to, chunks, k), t)?, b)?,
    })
}

/// The four-way experiment's times, ms: each op alone and the four at once
/// (a round of each), by difference; and the bound and the serial sum of
/// the alone times.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FourWay {
    pub bytes: u64,
    /// The GPU the copy goes to (0: within GPU 0).
    pub peer: usize,
    /// H2D, D2H, the copy to `peer`, the kernel ([`four_way::kinds`]).
    pub alone_ms: Vec<Summary>,
    pub together_ms: Summary,
}

impl FourWay {
    /// The longest alone (medians): the four at once cannot beat it.
    pub fn bound_ms(&self) -> f64 {
        self.alone_ms.iter().map(|s| s.median).fold(0.0, f64::max)
    }
    /// The alone medians summed: no overlap at all.
    pub fn serial_ms(&self) -> f64 {
        self.alone_ms.iter().map(|s| s.median).sum()
    }
}

/// Measures the four-way overlap at `bytes` on the rig's GPU 0, the copy
/// going to its GPU `peer`.
pub fn four_way(rig: &mut PlanRig, bytes: usize, peer: usize, t: Timing) -> Result<FourWay> {
    let elements = (bytes / 4) & !1;
    if elements < 2 {
        return Err(LabError::config(format!("{bytes} bytes: give at least 8")));
    }
    let mut alone_ms = Vec::with_capacity(4);
    for kind in four_way::kinds(peer) {
        alone_ms.push(per_repeat_ms(rig, |k| four_way::plan(elements, peer, k, Some(kind)), t)?);
    }
    let together_ms = per_repeat_ms(rig, |k| four_way::plan(elements, peer, k, None), t)?;
    Ok(FourWay { bytes: elements as u64 * 4, peer, alone_ms, together_ms })
}

/// The two-stage pipeline at one micro-batch count: its bubble measured
/// (from each run's timeline) beside the model's (S−1)/(M+S−1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BubblePoint {
    pub micro_batches: usize,
    /// (S−1)/(M+S−1).
    pub model: f64,
    /// The runs' bubble fractions (`None`: no run had a timeline, as under
    /// Nsight, which holds CUPTI).
    pub measured: Option<Summary>,
    /// The runs' totals, ms (CUDA events).
    pub total_ms: Summary,
}

/// Runs the events-only loop over `micro_batches` micro-batches of
/// `elements` with stage 2 on the rig's GPU `second`, `runs` times after
/// one untimed run, each verified.
pub fn bubble_point(rig: &mut PlanRig, elements: usize, micro_batches: usize, second: usize, runs: usize) -> Result<BubblePoint> {
    if micro_batches == 0 || elements < 2 * micro_batches || runs == 0 {
        return Err(LabError::config(format!(
            "{micro_batches} micro-batches of {elements} elements, {runs} runs: give at least 1 of each and 2 elements a micro-batch"
        )));
    }
    let plan = pp::plan_on("events only", micro_batches, elements, std::sync::Arc::new(pp::events_only), second);
    let model = plan.model()?;
    rig.run_modelled(&plan, &model, TimelineSource::Off)?;
    let (mut fractions, mut totals) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let run = rig.run_modelled(&plan, &model, TimelineSource::best())?;
        totals.push(run.total_ms);
        // A span per op, in order, when the timeline has them all.
        let spans: Option<Vec<(f64, f64)>> =
            run.timeline.as_ref().filter(|t| t.spans.len() == run.schedule.ops.len()).map(|t| t.spans.iter().map(|s| (s.start_us, s.end_us)).collect());
        if let Some(b) = spans.and_then(|s| bubble(&run.schedule, &s)) {
            fractions.push(b.fraction());
        }
    }
    Ok(BubblePoint {
        micro_batches,
        model: bubble_model(pp::STAGES, micro_batches),
        measured: if fractions.is_empty() { None } else { Some(Summary::of(&fractions)?) },
        total_ms: Summary::of(&totals)?,
    })
}
