//! The CPU's synchronizing calls and the GPU idle each one caused: an idle
//! gap of a GPU is a sync's doing where the CPU was blocked in the sync
//! when the GPU ran dry and issued the op that ended the gap after the
//! sync began ([`Syncs::blame`]); the syncs are then grouped by where they
//! were called (the CPU ops around them), each group a finding, named a
//! read to the host where a copy to the host came before its wait
//! ([`Syncs::findings`]).
//!
//! May use: `events`, `queries` (which calls synchronize), `busy` (the idle
//! gaps), `callers` (the call a finding names), `diagnosis`, `text`.

use super::busy::Gap;
use super::callers::Callers;
use super::diagnosis::{Cause, Finding, SyncSummary, FINDING_MIN_US};
use super::events::{Call, Direction, GpuOpKind, Trace};
use super::queries::synchronizes;
use super::text::{counted, us};
use std::collections::{BTreeMap, HashMap};

/// A trace's synchronizing calls and the GPU idle blamed on each so far.
pub(super) struct Syncs {
    /// The calls (indices into `trace.calls`), in the order they started.
    calls: Vec<usize>,
    /// The GPU idle each caused, µs.
    cost: Vec<f64>,
    /// The GPU each left idle (the last one, where it drained several).
    gpu: Vec<u32>,
    /// The longest of them, µs: how far back a sync can have begun and
    /// still be running.
    longest_us: f64,
}

impl Syncs {
    /// The synchronizing calls of `trace`, none blamed for anything yet.
    pub(super) fn new(trace: &Trace) -> Syncs {
        let calls: Vec<usize> = (0..trace.calls.len()).filter(|&i| synchronizes(&trace.calls[i].name)).collect();
        let longest_us = calls.iter().map(|&s| trace.calls[s].end_us - trace.calls[s].start_us).fold(0.0, f64::max);
        Syncs { cost: vec![0.0; calls.len()], gpu: vec![0u32; calls.len()], calls, longest_us }
    }

    /// Blames GPU `gpu`'s idle `gaps` on the syncs that caused them; says
    /// which sync (an index into `trace.calls`) each gap was blamed on.
    pub(super) fn blame(&mut self, trace: &Trace, callers: &Callers, gpu: u32, gaps: &[Gap]) -> Vec<Option<usize>> {
        let sync_calls = &self.calls;
        let mut blamed = vec![None; gaps.len()];
        for (g, &(a, b, next)) in gaps.iter().enumerate() {
            let Some(li) = callers.launch(next) else { continue };
            let l: &Call = &trace.calls[li];
            // A sync the CPU was blocked in when this GPU ran dry, and after
            // whose start the CPU issued the op that ended the gap.
            let upto = sync_calls.partition_point(|&s| trace.calls[s].start_us <= a);
            let mut best: Option<usize> = None;
            for k in (0..upto).rev() {
                let s = &trace.calls[sync_calls[k]];
                if s.start_us < a - self.longest_us {
                    break;
                }
                if s.end_us >= a && l.start_us >= s.start_us {
                    let better = match best {
                        None => true,
                        Some(b) => s.thread == l.thread && trace.calls[sync_calls[b]].thread != l.thread,
                    };
                    if better {
                        best = Some(k);
                    }
                }
            }
            if let Some(k) = best {
                self.cost[k] += b - a;
                self.gpu[k] = gpu;
                blamed[g] = Some(sync_calls[k]);
            }
        }
        blamed
    }

    /// The findings about the syncs, one for each place they were called
    /// from that cost a GPU at least [`FINDING_MIN_US`].
    pub(super) fn findings(&self, trace: &Trace, callers: &Callers) -> Vec<Finding> {
        let (sync_calls, sync_cost, sync_gpu) = (&self.calls, &self.cost, &self.gpu);
        let reads_to_host: HashMap<usize, u64> = {
            // The outermost CPU op of every call whose copy went to the host.
            let mut m = HashMap::new();
            for (oi, o) in trace.gpu_ops.iter().enumerate() {
                if let (GpuOpKind::Copy { direction: Direction::D2h, .. }, Some(ci)) = (o.kind, callers.launch(oi)) {
                    if let Some(outer) = callers.outermost_op(ci) {
                        *m.entry(outer).or_insert(0) += o.bytes.unwrap_or(0);
                    }
                }
            }
            m
        };
        let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (k, &ci) in sync_calls.iter().enumerate() {
            groups.entry(callers.call_ref(ci).name).or_default().push(k);
        }
        let mut findings = Vec::new();
        for (name, ks) in &groups {
            let cost: f64 = ks.iter().map(|&k| sync_cost[k]).sum();
            if cost < FINDING_MIN_US {
                continue;
            }
            let costly = ks.iter().filter(|&&k| sync_cost[k] > 0.0).count();
            let worst = *ks.iter().max_by(|&&a, &&b| sync_cost[a].total_cmp(&sync_cost[b])).expect("a group has a call");
            let ci = sync_calls[worst];
            let read = callers.outermost_op(ci).and_then(|o| reads_to_host.get(&o).map(|b| (o, b))).map(|(o, b)| {
                format!(
                    "a read to the host ({}-style: {} copied back, then a wait): ",
                    if trace.cpu_ops[o].name.contains("item") { ".item()" } else { ".cpu()" },
                    crate::units::Bytes(*b)
                )
            });
            let gpu = sync_gpu[worst];
            findings.push(Finding {
                cause: Cause::Sync,
                gpu,
                call: callers.call_ref(ci),
                count: ks.len(),
                cost_us: cost,
                text: format!(
                    "{}{costly} of {} of {name} left the GPU idle, {} in all (the costliest {}): the CPU waited for the GPU to drain, and the GPU then waited for the CPU to issue more",
                    read.unwrap_or_default(),
                    counted(ks.len(), "call", "calls"),
                    us(cost),
                    us(sync_cost[worst])
                ),
            });
        }
        findings
    }

    /// How many syncs there were, how many cost a GPU idle time, and what
    /// they cost in all.
    pub(super) fn summary(&self) -> SyncSummary {
        SyncSummary { calls: self.calls.len(), costly: self.cost.iter().filter(|&&c| c > 0.0).count(), cost_us: self.cost.iter().sum() }
    }
}
