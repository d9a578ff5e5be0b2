//! What-if: the fixes a diagnosis suggests, each predicted by the queue
//! model on the trace's schedule ([`super::replay`], priced in
//! [`super::prediction`]).
//!
//! Each finding suggests a change: pageable copies, pinned memory (and, where
//! the copies share the kernels' stream, pinned memory on a copy stream of
//! their own; for results brought back each step, pinned memory with a
//! download stream, with the results read a step late, and both);
//! page-locked copies on the kernels' stream, a copy stream (each way); a
//! sync that left the GPU idle, the syncs removed; an issue-bound stretch,
//! CUDA graphs. [`what_if`] picks them from a [`Diagnosis`] and predicts
//! each; whoever holds the machine's figures attaches the table to the
//! diagnosis.
//!
//! May use: `events`, `diagnosis` (the findings read), `replay` (the
//! changes), `prediction` (the pricing, and the table's types, which are
//! named from here too). The top of the stack: nothing here is used below.

use super::diagnosis::{Cause, Diagnosis};
use super::events::{Direction, GpuOpKind, HostMemory, Trace};
pub use super::prediction::{fix_label, predict_fixes, Prediction, WhatIf};
use super::replay::{self, Change, Pricing};

/// The changes the findings of `d` on `trace` suggest, each fix once. A
/// copy stream is suggested where uploads share a stream with kernels; for
/// results the CPU waits for as they come back (`.cpu()` each step: two or
/// more), a stream of their own and reading them a step late, alone and
/// together.
pub fn suggested(trace: &Trace, d: &Diagnosis) -> Vec<Vec<Change>> {
    let has = |c: Cause| d.findings.iter().any(|f| f.cause == c);
    let uploads_beside_kernels = replay::uploads_on_kernel_streams(trace) > 0;
    let downloads_each_step = replay::results_waited_at_once(trace) >= 2;
    let pageable_downloads = trace.gpu_ops.iter().any(|o| o.kind == GpuOpKind::Copy { direction: Direction::D2h, host: Some(HostMemory::Pageable) });
    let download_fixes = [vec![Change::ReadLate], vec![Change::DownloadStream], vec![Change::DownloadStream, Change::ReadLate]];
    let mut fixes = Vec::new();
    if has(Cause::PageableCopies) {
        fixes.push(vec![Change::Pinned]);
        if uploads_beside_kernels {
            fixes.push(vec![Change::Pinned, Change::CopyStream]);
        }
        if downloads_each_step && pageable_downloads {
            fixes.extend(download_fixes.iter().map(|f| [&[Change::Pinned][..], f].concat()));
            if uploads_beside_kernels {
                fixes.push(vec![Change::Pinned, Change::CopyStream, Change::DownloadStream, Change::ReadLate]);
            }
        }
    } else if has(Cause::CopiesShareStreamWithKernels) {
        if uploads_beside_kernels {
            fixes.push(vec![Change::CopyStream]);
        }
        if downloads_each_step {
            fixes.extend(download_fixes);
        }
    }
    if has(Cause::Sync) {
        fixes.push(vec![Change::SyncRemoved]);
    }
    // Issue-bound between launches that are graphs already: no graph to add.
    if d.findings.iter().any(|f| f.cause == Cause::IssueBound && !f.call.name.ends_with("cudaGraphLaunch")) {
        fixes.push(vec![Change::CudaGraph]);
    }
    fixes
}

/// The what-if of the fixes `d`'s findings suggest.
pub fn what_if(trace: &Trace, d: &Diagnosis, pricing: &Pricing) -> Result<WhatIf, String> {
    predict_fixes(trace, &suggested(trace, d), pricing)
}
