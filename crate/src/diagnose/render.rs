//! The diagnosis as text: the window, each GPU's busy and idle time, its
//! streams and copies, its idle time by cause (the unattributed share
//! always shown), the synchronizing calls, then the findings, largest
//! first, each with the call behind it, then the what-if table where one
//! was predicted (which `prediction` prints).
//!
//! May use: `units` (the crate's, for bytes), `diagnosis`, `text`, `link`
//! (the command that measures a link), `fixes` (a fix in the words of the program's API).

use super::diagnosis::{Cause, Diagnosis, Finding, GpuSummary, IdleCause, KERNEL_WAIT_MAX_US};
use super::fixes::{Change, ProgramApi};
use super::link::MEASURE_LINK;
use super::text::{gbps, us};
use crate::units::Bytes;
use std::fmt;

impl Cause {
    /// What a finding is about, as a heading says it.
    pub fn label(self) -> &'static str {
        match self {
            Cause::PageableCopies => "pageable copies",
            Cause::CopiesShareStreamWithKernels => "copies on the kernels' stream",
            Cause::ExposedCopies => "exposed copies",
            Cause::Sync => "synchronizing call",
            Cause::IssueBound => "issue-bound stretch",
            Cause::HostWork => "the host's own work",
        }
    }

    /// The fix a finding of this cause points to, in the words of the
    /// program's API: a what-if change's own ([`Change::as_written`])
    /// where one prices it.
    pub fn fix_as_written(self, api: ProgramApi) -> &'static str {
        let change =
            match self {
                Cause::PageableCopies => Change::Pinned,
                Cause::CopiesShareStreamWithKernels => Change::CopyStream,
                Cause::Sync => Change::SyncRemoved,
                Cause::IssueBound => Change::CudaGraph,
                Cause::ExposedCopies => return match api {
                    ProgramApi::PyTorch => {
                        "the next batch's copy issued earlier, on its side `torch.cuda.Stream`, while this batch's kernels run (prefetch one step ahead)"
                    }
                    ProgramApi::Cuda => {
                        "the next batch's `cudaMemcpyAsync` issued earlier, on a stream of its own, while this batch's kernels run (prefetch one step ahead)"
                    }
                },
                Cause::HostWork => return match api {
                    ProgramApi::PyTorch => {
                        "the next batch prepared ahead: a `torch.utils.data.DataLoader` with `num_workers` > 0 and `pin_memory=True`, or a thread of your own"
                    }
                    ProgramApi::Cuda => "the next batch prepared ahead, on a CPU thread of its own, into page-locked memory",
                },
            };
        change.as_written(api)
    }
}

impl IdleCause {
    /// Why the GPU idled, as the idle table says it.
    pub fn label(self) -> &'static str {
        match self {
            IdleCause::WaitingForLaunches => "waiting for launches",
            IdleCause::Sync => "synchronizing call",
            IdleCause::Copy => "copy call",
            IdleCause::OtherStream => "another stream's work",
            IdleCause::KernelGaps => "gaps between ops",
            IdleCause::HostWork => "the host's own work",
            IdleCause::Unattributed => "unattributed",
        }
    }
}

/// GPU `g`'s idle time by cause: one line each, its share of the idle
/// time and the calls or CPU ops behind it.
fn idle_table(f: &mut fmt::Formatter<'_>, g: &GpuSummary) -> fmt::Result {
    writeln!(f, "  idle, each stretch put down to one cause:")?;
    writeln!(f, "  {:<22} {:>11} {:>6}  behind it", "cause", "time", "share")?;
    for s in &g.idle_causes {
        let share = if g.idle_us > 0.0 { 100.0 * s.idle_us / g.idle_us } else { 0.0 };
        let behind: Vec<String> = s.behind.iter().map(|b| format!("{} ({})", b.name, us(b.idle_us))).collect();
        let behind = if behind.is_empty() { "-".to_string() } else { behind.join("; ") };
        writeln!(f, "  {:<22} {:>11} {:>5.1}%  {behind}", s.cause.label(), us(s.idle_us), share)?;
    }
    Ok(())
}

impl Finding {
    /// The finding as the diagnosis prints it, its fix in `api`'s words.
    fn shown(&self, api: ProgramApi) -> Result<String, fmt::Error> {
        use std::fmt::Write;
        let mut f = String::new();
        let c = &self.call;
        writeln!(f, "{} (GPU {}): {}", self.cause.label(), self.gpu, self.text)?;
        writeln!(f, "fix in {}: {}", api.label(), self.cause.fix_as_written(api))?;
        write!(f, "call: {} at ts {:.3} µs", c.name, c.ts_us)?;
        if let Some(k) = c.correlation {
            write!(f, ", correlation {k}")?;
        }
        if !c.thread.is_empty() {
            write!(f, " ({})", c.thread)?;
        }
        Ok(f)
    }
}

impl fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = self.window;
        writeln!(f, "{}: {}", self.file, self.format.label())?;
        writeln!(f, "traced window: {}, from the first GPU op (ts {:.3} µs) to the last one's end (ts {:.3} µs)", us(w.duration_us()), w.start_us, w.end_us)?;
        for g in &self.gpus {
            let share = if w.duration_us() > 0.0 { 100.0 * g.busy_us / w.duration_us() } else { 100.0 };
            writeln!(f)?;
            writeln!(
                f,
                "GPU {}{}: busy {} ({share:.1}% of the window), idle {}",
                g.gpu,
                g.name.as_ref().map_or(String::new(), |n| format!(" ({n})")),
                us(g.busy_us),
                us(g.idle_us)
            )?;
            // The last three: the stream's idle between its ops, split as HTA splits it.
            writeln!(
                f,
                "  {:<22} {:>8} {:>7} {:>8} {:>11} {:>11} {:>11} {:>11} {:>11}",
                "stream", "kernels", "copies", "memsets", "busy", "idle", "host wait", "kernel wait", "other wait"
            )?;
            for s in &g.streams {
                let name = if s.legacy_default { format!("{} (legacy default)", s.stream) } else { s.stream.to_string() };
                let k = s.idle_kinds;
                writeln!(
                    f,
                    "  {:<22} {:>8} {:>7} {:>8} {:>11} {:>11} {:>11} {:>11} {:>11}",
                    name,
                    s.kernels,
                    s.copies,
                    s.memsets,
                    us(s.busy_us),
                    us(s.idle_us),
                    us(k.host_wait_us),
                    us(k.kernel_wait_us),
                    us(k.other_us)
                )?;
            }
            writeln!(
                f,
                "  (host wait, kernel wait, other wait: the idle between a stream's ops as HTA splits it; kernel wait is a gap under {})",
                us(KERNEL_WAIT_MAX_US)
            )?;
            if !g.copies.is_empty() {
                writeln!(
                    f,
                    "  {:<14} {:>6} {:>11} {:>11} {:>7} {:>24} {:>11} {:>11}",
                    "copies", "count", "bytes", "time", "GB/s", "recorded here, GB/s", "hidden", "exposed"
                )?;
                for c in &g.copies {
                    let recorded = match (c.recorded, c.recorded_pinned) {
                        (Some(r), Some(p)) => format!("{:.1} ({:.1} pinned)", r.gbps, p.gbps),
                        (Some(r), None) => format!("{:.1}", r.gbps),
                        (None, Some(p)) => format!("({:.1} pinned)", p.gbps),
                        (None, None) => "-".into(),
                    };
                    writeln!(
                        f,
                        "  {:<14} {:>6} {:>11} {:>11} {:>7} {:>24} {:>11} {:>11}",
                        c.label(),
                        c.count,
                        c.bytes.map_or("-".into(), |b| Bytes(b).to_string()),
                        us(c.time_us),
                        c.gbps.map_or("-".into(), gbps),
                        recorded,
                        us(c.hidden_us),
                        us(c.exposed_us)
                    )?;
                }
                match &g.link_source {
                    Some(s) => writeln!(f, "  (recorded rates from {s}, at the recorded size nearest the copies' median)")?,
                    None => writeln!(f, "  (no link rates measured on this GPU here to set the copies beside: `{MEASURE_LINK}` on its machine records them)")?,
                }
            }
            idle_table(f, g)?;
        }
        writeln!(f)?;
        let s = &self.syncs;
        if s.calls == 0 {
            writeln!(f, "synchronizing calls: none in the trace")?;
        } else {
            writeln!(
                f,
                "synchronizing calls: {}; {} left a GPU idle, {} in all; {} cost nothing (the GPU had work queued, or none followed)",
                s.calls,
                s.costly,
                us(s.cost_us),
                s.calls - s.costly
            )?;
        }
        if self.findings.is_empty() {
            write!(f, "findings: none; nothing in this trace lost overlap by more than a µs")?;
        } else {
            writeln!(f, "findings, largest first (costs may overlap: one idle gap can have more than one cause):")?;
            for (i, finding) in self.findings.iter().enumerate() {
                let text = finding.shown(self.api)?.replace('\n', "\n              ");
                write!(f, "{:>3}. {:>9}  {text}", i + 1, us(finding.cost_us))?;
                if i + 1 < self.findings.len() {
                    writeln!(f)?;
                }
            }
        }
        match (&self.what_if, &self.what_if_error) {
            (Some(w), _) => write!(f, "\n\n{w}"),
            (None, Some(why)) => write!(f, "\n\nwhat-if: not predicted: {why}"),
            (None, None) => Ok(()),
        }
    }
}
