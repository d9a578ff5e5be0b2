//! One GPU's copies: grouped by kind (direction and host memory), each
//! group's bytes, time and rate set beside this machine's lab 1 rates,
//! and how much of it ran while a kernel ran ([`Copies::of`]); then the
//! findings about them ([`Copies::findings`]): copies from pageable
//! memory, page-locked copies sharing a stream with kernels, and
//! page-locked copies on a stream of their own that still ran with no
//! kernel beside them.
//!
//! May use: `events`, `intervals`, `link` (the recorded rates), `busy`
//! (the GPU's work), `callers` (the call a finding names), `diagnosis`,
//! `text`.

use super::busy::{span, GpuWork};
use super::callers::Callers;
use super::diagnosis::{Cause, CopyGroup, Finding};
use super::events::{Direction, GpuOpKind, HostMemory, Trace};
use super::intervals::covered;
use super::link::LinkRates;
use super::text::{counted, gbps, us};
use std::collections::BTreeMap;

/// One GPU's copies, by kind.
pub(super) struct Copies {
    /// The copies of each kind (indices into `trace.gpu_ops`).
    by_kind: BTreeMap<(Direction, Option<HostMemory>), Vec<usize>>,
    /// Each kind's figures, in the order of `by_kind`.
    pub(super) groups: Vec<CopyGroup>,
}

/// How long GPU op `i` ran while a kernel ran on its GPU (`kernels`: the
/// union of the GPU's kernels), µs.
fn hidden(trace: &Trace, kernels: &[(f64, f64)], i: usize) -> f64 {
    covered(kernels, span(trace, i))
}

impl Copies {
    /// The copies of a GPU's `work`, set beside `link`'s recorded rates
    /// where the GPU has a recording.
    pub(super) fn of(trace: &Trace, work: &GpuWork, link: Option<&LinkRates>) -> Copies {
        let mut by_kind: BTreeMap<(Direction, Option<HostMemory>), Vec<usize>> = BTreeMap::new();
        for &i in &work.ops {
            if let GpuOpKind::Copy { direction, host } = trace.gpu_ops[i].kind {
                by_kind.entry((direction, host)).or_default().push(i);
            }
        }
        let mut groups = Vec::new();
        for ((direction, host), v) in &by_kind {
            let time_us: f64 = v.iter().map(|&i| trace.gpu_ops[i].duration_us()).sum();
            let bytes: Option<u64> = v.iter().map(|&i| trace.gpu_ops[i].bytes).sum();
            let hidden_us: f64 = v.iter().map(|&i| hidden(trace, &work.kernels, i)).sum();
            let mut sizes: Vec<u64> = v.iter().filter_map(|&i| trace.gpu_ops[i].bytes).collect();
            sizes.sort_unstable();
            let median = sizes.get(sizes.len() / 2).copied();
            // The recording's rate of copies from `h` memory the same way, at their median size.
            let rate_of = |h: HostMemory| match (link, median) {
                (Some(l), Some(m)) if direction.crosses_host_link() => l.rate(h, *direction, m),
                _ => None,
            };
            let recorded = host.and_then(rate_of);
            let recorded_pinned = if *host == Some(HostMemory::Pageable) { rate_of(HostMemory::Pinned) } else { None };
            groups.push(CopyGroup {
                direction: *direction,
                host: *host,
                count: v.len(),
                bytes,
                time_us,
                gbps: bytes.filter(|_| time_us > 0.0).map(|b| b as f64 / time_us / 1e3),
                recorded,
                recorded_pinned,
                hidden_us,
                exposed_us: time_us - hidden_us,
            });
        }
        Copies { by_kind, groups }
    }

    /// The findings about GPU `gpu`'s copies: pageable ones first, then the
    /// page-locked ones of each stream that ran with no kernel beside them.
    /// `legacy` is the legacy default stream, where the trace has one.
    pub(super) fn findings(&self, trace: &Trace, gpu: u32, work: &GpuWork, legacy: Option<u64>, callers: &Callers) -> Vec<Finding> {
        let mut findings = Vec::new();
        for g in self.groups.iter().filter(|g| g.host == Some(HostMemory::Pageable)) {
            let v = &self.by_kind[&(g.direction, g.host)];
            let rates: Vec<String> = [(g.recorded, "pageable"), (g.recorded_pinned, "pinned")]
                .iter()
                .filter_map(|(r, what)| r.map(|r| format!("{what} {:.1} GB/s at {}", r.gbps, crate::units::Bytes(r.at_bytes))))
                .collect();
            let recorded = if rates.is_empty() {
                String::new()
            } else {
                format!(" (as measured on this machine by `overlap-lab bandwidth`, lab 1: {})", rates.join(", "))
            };
            findings.push(Finding {
                cause: Cause::PageableCopies,
                gpu,
                call: callers.op_ref(v[0]),
                count: g.count,
                cost_us: g.exposed_us,
                text: format!(
                    "{} from pageable memory{}{}{}: the driver stages pageable memory through a pinned buffer while the CPU waits, and the copy cannot start early; {} of their {} ran with no kernel beside them",
                    counted(g.count, &format!("{} copy", g.direction), &format!("{} copies", g.direction)),
                    g.bytes.map_or(String::new(), |b| format!(", {}", crate::units::Bytes(b))),
                    g.gbps.map_or(String::new(), |r| format!(", at {} GB/s", gbps(r))),
                    recorded,
                    us(g.exposed_us),
                    us(g.time_us),
                ),
            });
        }
        for (&stream, v) in &work.by_stream {
            let page_locked: Vec<usize> =
                v.iter().copied().filter(|&i| matches!(trace.gpu_ops[i].kind, GpuOpKind::Copy { host, direction } if host != Some(HostMemory::Pageable) && direction.crosses_host_link())).collect();
            if page_locked.is_empty() {
                continue;
            }
            // Each copy's time with no kernel beside it; a copy counts as
            // exposed from half a µs on (timestamps are whole ns, and a copy
            // issued with its kernel starts a little before it).
            let exposed_each: Vec<(usize, f64)> =
                page_locked.iter().map(|&i| (i, trace.gpu_ops[i].duration_us() - hidden(trace, &work.kernels, i))).filter(|&(_, e)| e >= 0.5).collect();
            let Some(&(first, _)) = exposed_each.first() else { continue };
            let exposed: f64 = exposed_each.iter().map(|(_, e)| e).sum();
            let has_kernels = v.iter().any(|&i| trace.gpu_ops[i].kind == GpuOpKind::Kernel);
            let legacy_note = if legacy == Some(stream) { " (the legacy default stream)" } else { "" };
            let before_any_kernel = work.kernels.first().is_none_or(|k| trace.gpu_ops[first].end_us <= k.0);
            let (cause, why) = if has_kernels {
                (Cause::CopiesShareStreamWithKernels, "they share the stream with kernels, so each copy waits for the kernel before it and holds back the one after: put them on a stream of their own")
            } else if exposed_each.len() == 1 && before_any_kernel {
                (Cause::ExposedCopies, "it is the first, before any kernel had work: the pipeline's fill, which no schedule hides")
            } else {
                (
                    Cause::ExposedCopies,
                    "their stream runs only copies, yet no kernel ran beside them then: the compute stream waited for them, or had nothing queued",
                )
            };
            findings.push(Finding {
                cause,
                gpu,
                call: callers.op_ref(first),
                count: exposed_each.len(),
                cost_us: exposed,
                text: format!(
                    "{} of {} on stream {stream}{legacy_note} ran {} with no kernel beside {}: {why}",
                    exposed_each.len(),
                    counted(page_locked.len(), "copy", "copies"),
                    us(exposed),
                    if exposed_each.len() == 1 { "it" } else { "them" }
                ),
            });
        }
        findings
    }
}
