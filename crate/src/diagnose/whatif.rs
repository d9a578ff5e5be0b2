//! What-if: the fixes a diagnosis suggests, each predicted by the queue
//! model on the trace's schedule ([`super::replay`], priced in
//! [`super::prediction`]).
//!
//! Each finding suggests a change: pageable copies, pinned memory (and, where
//! the copies share the kernels' stream, pinned memory on a copy stream of
//! their own); page-locked copies on the kernels' stream, a copy stream; a
//! sync that left the GPU idle, the syncs removed; an issue-bound stretch,
//! CUDA graphs. [`what_if`] picks them from a [`Diagnosis`] and predicts
//! each; whoever holds the machine's figures attaches the table to the
//! diagnosis.
//!
//! May use: `events`, `diagnosis` (the findings read), `replay` (the
//! changes), `prediction` (the pricing, and the table's types, which are
//! named from here too). The top of the stack: nothing here is used below.

use super::diagnosis::{Cause, Diagnosis};
use super::events::Trace;
pub use super::prediction::{fix_label, predict_fixes, Prediction, WhatIf};
use super::replay::{self, Change, Pricing};

/// The changes the findings of `d` on `trace` suggest, each fix once. A
/// copy stream is suggested where uploads share a stream with kernels.
pub fn suggested(trace: &Trace, d: &Diagnosis) -> Vec<Vec<Change>> {
    let has = |c: Cause| d.findings.iter().any(|f| f.cause == c);
    let uploads_beside_kernels = replay::uploads_on_kernel_streams(trace) > 0;
    let mut fixes = Vec::new();
    if has(Cause::PageableCopies) {
        fixes.push(vec![Change::Pinned]);
        if uploads_beside_kernels {
            fixes.push(vec![Change::Pinned, Change::CopyStream]);
        }
    } else if has(Cause::CopiesShareStreamWithKernels) && uploads_beside_kernels {
        fixes.push(vec![Change::CopyStream]);
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
