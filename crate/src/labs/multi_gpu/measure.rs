//! Lab 8's measurements on the GPU, each a plan the rig runs verified.
//!
//! A copy's time is taken by difference: the plan with `k` copies minus the
//! same plan with one, over k−1 (CUDA events bracket each run). The upload
//! before and the download after — what makes the run verifiable — cancel
//! out, and no per-op timeline is needed (under Nsight, which holds CUPTI,
//! a pipeline over two GPUs has none).

use super::peer;
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

/// How a copy is timed.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Copies in the long run (the short run has one).
    pub copies: usize,
    /// Runs of each (after one of each untimed), whose differences are summarised.
    pub runs: usize,
}

/// One copy's time, ms, by difference ([`Timing`]): `make(k)` is the plan
/// with `k` copies.
pub fn per_copy_ms(rig: &mut PlanRig, make: impl Fn(usize) -> Plan, t: Timing) -> Result<Summary> {
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
        one_way: to_gbps(per_copy_ms(rig, |k| peer::one_way(elements, from, to, k), t)?, b)?,
        both_ways: to_gbps(per_copy_ms(rig, |k| peer::both_ways(elements, from, to, k), t)?, b)?,
        staged: to_gbps(per_copy_ms(rig, |k| peer::staged(elements, from, to, chunks, k), t)?, b)?,
    })
}
