//! Issue-bound stretches: runs of short idle gaps of one GPU, each ended
//! by an op the CPU had not finished launching when the GPU ran dry, the
//! GPU waiting op after op for the CPU. Every stretch of one GPU makes one
//! finding ([`issue_bound`]), named by the longest stretch's first launch.
//!
//! May use: `events`, `busy` (the idle gaps), `callers` (the call a
//! finding names), `diagnosis`, `text`.

use super::busy::Gap;
use super::callers::Callers;
use super::diagnosis::{Cause, Finding};
use super::events::Trace;
use super::text::us;

/// Idle gaps no longer than this between GPU ops the CPU issued late are
/// what launching costs (an eager PyTorch op takes some 5-30 µs of Python,
/// dispatch and `cudaLaunchKernel`); longer ones are the CPU doing other work.
pub const ISSUE_GAP_MAX_US: f64 = 50.0;

/// A run of at least this many such gaps in a row is an issue-bound stretch.
pub const ISSUE_BOUND_MIN_GAPS: usize = 16;

/// The issue-bound finding of GPU `gpu`, whose idle gaps are `gaps`
/// (`blamed`: the sync each gap was caused by, where one was); `None`
/// where it has no stretch.
pub(super) fn issue_bound(trace: &Trace, callers: &Callers, gpu: u32, gaps: &[Gap], blamed: &[Option<usize>]) -> Option<Finding> {
    // Issue-bound stretches: runs of short gaps, each ended by an op
    // the CPU had not finished launching when the GPU ran dry.
    let starved = |g: usize| {
        let (a, b, next) = gaps[g];
        blamed[g].is_none() && b - a <= ISSUE_GAP_MAX_US && callers.launch(next).is_some_and(|li| trace.calls[li].end_us >= a)
    };
    // Every stretch of one GPU becomes one finding: a loop of tiny ops
    // is one cause, however often a longer op breaks its run.
    // (idle µs, ops, their GPU time, launches and their first and last times, the first op)
    let mut stretches: Vec<(f64, usize, f64, usize, f64, f64, usize)> = Vec::new();
    let mut g = 0;
    while g < gaps.len() {
        if !starved(g) {
            g += 1;
            continue;
        }
        let first = g;
        while g < gaps.len() && starved(g) {
            g += 1;
        }
        let run = &gaps[first..g];
        if run.len() >= ISSUE_BOUND_MIN_GAPS {
            let idle: f64 = run.iter().map(|(a, b, _)| b - a).sum();
            let launches: Vec<f64> = run.iter().filter_map(|&(_, _, n)| callers.launch(n)).map(|li| trace.calls[li].start_us).collect();
            let ran: f64 = run.iter().map(|&(_, _, n)| trace.gpu_ops[n].duration_us()).sum();
            let (l0, l1) = (launches.first().copied().unwrap_or(0.0), launches.last().copied().unwrap_or(0.0));
            stretches.push((idle, run.len(), ran, launches.len(), l0, l1, run[0].2));
        }
    }
    // The finding names the longest stretch's first launch, one of eager
    // launches where there are such (a graph's own stretches are no
    // case for a graph, `whatif` reads from the call).
    let by_graph = |s: &(f64, usize, f64, usize, f64, f64, usize)| callers.op_ref(s.6).name.ends_with("cudaGraphLaunch");
    let eager = stretches.iter().filter(|s| !by_graph(s)).max_by(|a, b| a.0.total_cmp(&b.0)).copied();
    let longest = eager.or_else(|| stretches.iter().max_by(|a, b| a.0.total_cmp(&b.0)).copied())?;
    let idle: f64 = stretches.iter().map(|s| s.0).sum();
    let ops: usize = stretches.iter().map(|s| s.1).sum();
    let mean_op = stretches.iter().map(|s| s.2).sum::<f64>() / ops as f64;
    // The launch interval within stretches (the time between them is not the CPU's launching).
    let (spans, steps) = stretches.iter().filter(|s| s.3 > 1).fold((0.0, 0usize), |(t, n), s| (t + s.5 - s.4, n + s.3 - 1));
    let every = (steps > 0).then(|| spans / steps as f64);
    let stretched = if stretches.len() == 1 {
        String::new()
    } else {
        format!(" in {} stretches (the one named: {} ops, {} idle)", stretches.len(), longest.1 + 1, us(longest.0))
    };
    Some(Finding {
        cause: Cause::IssueBound,
        gpu,
        call: callers.op_ref(longest.6),
        count: ops + stretches.len(),
        cost_us: idle,
        text: format!(
            "{} ops of {mean_op:.1} µs on average{stretched}{}: the GPU waited {} in all for the CPU to launch the next (fewer, larger ops or a CUDA graph would cut it)",
            ops + stretches.len(),
            every.map_or(String::new(), |e| format!(", launched every {e:.1} µs")),
            us(idle)
        ),
    })
}
