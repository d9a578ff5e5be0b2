//! When each GPU was busy and when it sat idle: one GPU's ops, the union
//! of their times ([`GpuWork`]), each stream's busy and idle time in the
//! window and its idle split HTA's way ([`stream_summaries`],
//! [`stream_idle_kinds`]), and the idle gaps between one busy stretch and
//! the next op ([`idle_gaps`]), which the syncs, the issue-bound
//! stretches and the idle attribution (`idle`) share out.
//!
//! May use: `events`, `intervals`, `callers` (the call that launched an
//! op), `diagnosis` (the summaries it fills).

use super::callers::Callers;
use super::diagnosis::{StreamIdleKinds, StreamSummary, Window, KERNEL_WAIT_MAX_US};
use super::events::{GpuOpKind, Trace};
use super::intervals::{total, union};
use std::collections::BTreeMap;

/// An idle gap of one GPU: (the busy stretch's end, the next op's start,
/// that next op's index into `trace.gpu_ops`), µs.
pub(super) type Gap = (f64, f64, usize);

/// One GPU's ops and when they kept it busy.
pub(super) struct GpuWork {
    /// Its ops (indices into `trace.gpu_ops`), in the order they started.
    pub(super) ops: Vec<usize>,
    /// The union of all its ops (kernels, copies, memsets).
    pub(super) busy: Vec<(f64, f64)>,
    /// The union of its kernels.
    pub(super) kernels: Vec<(f64, f64)>,
    /// Its ops by stream.
    pub(super) by_stream: BTreeMap<u64, Vec<usize>>,
}

/// GPU op `i`'s (start, end), µs.
pub(super) fn span(trace: &Trace, i: usize) -> (f64, f64) {
    (trace.gpu_ops[i].start_us, trace.gpu_ops[i].end_us)
}

impl GpuWork {
    /// GPU `gpu`'s work in `trace`.
    pub(super) fn of(trace: &Trace, gpu: u32) -> GpuWork {
        let ops: Vec<usize> = (0..trace.gpu_ops.len()).filter(|&i| trace.gpu_ops[i].gpu == gpu).collect();
        let busy = union(ops.iter().map(|&i| span(trace, i)).collect());
        let kernels = union(ops.iter().filter(|&&i| trace.gpu_ops[i].kind == GpuOpKind::Kernel).map(|&i| span(trace, i)).collect());
        let mut by_stream: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for &i in &ops {
            by_stream.entry(trace.gpu_ops[i].stream).or_default().push(i);
        }
        GpuWork { ops, busy, kernels, by_stream }
    }
}

/// The idle time between the ops of one stream (`ops`, in the order they
/// started), split as HTA splits it ([`StreamIdleKinds`]): each gap from
/// one op's end to the next op's start is host wait where the next op's
/// launching call started after that end, else kernel wait where it is
/// under [`KERNEL_WAIT_MAX_US`], else other. As in HTA, a gap is measured
/// from the op just before (not the latest end so far), and an op with no
/// launching call in the trace is never host wait.
pub(super) fn stream_idle_kinds(trace: &Trace, callers: &Callers, ops: &[usize]) -> StreamIdleKinds {
    let mut kinds = StreamIdleKinds::default();
    for pair in ops.windows(2) {
        let (prev_end, next) = (trace.gpu_ops[pair[0]].end_us, pair[1]);
        let gap = trace.gpu_ops[next].start_us - prev_end;
        let launched_late = callers.launch(next).is_some_and(|ci| trace.calls[ci].start_us > prev_end);
        if launched_late {
            kinds.host_wait_us += gap;
        } else if gap < KERNEL_WAIT_MAX_US {
            kinds.kernel_wait_us += gap;
        } else {
            kinds.other_us += gap;
        }
    }
    kinds
}

/// Each stream's ops and busy and idle time in `window`; `legacy` is the
/// legacy default stream, where the trace has one.
pub(super) fn stream_summaries(trace: &Trace, callers: &Callers, work: &GpuWork, legacy: Option<u64>, window: Window) -> Vec<StreamSummary> {
    work.by_stream
        .iter()
        .map(|(&stream, v)| {
            let busy_us = total(&union(v.iter().map(|&i| span(trace, i)).collect()));
            let count = |f: fn(GpuOpKind) -> bool| v.iter().filter(|&&i| f(trace.gpu_ops[i].kind)).count();
            StreamSummary {
                stream,
                legacy_default: legacy == Some(stream),
                kernels: count(|k| k == GpuOpKind::Kernel),
                copies: count(GpuOpKind::is_copy),
                memsets: count(|k| k == GpuOpKind::Memset),
                busy_us,
                idle_us: window.duration_us() - busy_us,
                idle_kinds: stream_idle_kinds(trace, callers, v),
            }
        })
        .collect()
}

/// The idle gaps of a GPU whose ops are `ops`: each between one busy
/// stretch's end and the next op.
pub(super) fn idle_gaps(trace: &Trace, ops: &[usize]) -> Vec<Gap> {
    let mut gaps: Vec<Gap> = Vec::new();
    let mut busy_end = f64::NEG_INFINITY;
    for &i in ops {
        let o = &trace.gpu_ops[i];
        if busy_end.is_finite() && o.start_us > busy_end {
            gaps.push((busy_end, o.start_us, i));
        }
        busy_end = busy_end.max(o.end_us);
    }
    gaps
}
