//! Lab 4's own operations (`ScoreOp`: row_dot into a slot, the D2H of
//! its scores, an argmin and where it runs ([`ArgminOn`]), a hand-off),
//! each written once as what it is to the schedule: its kind, its label,
//! what it reads and writes ([`LabOp`]). No CUDA: the rig (`rig.rs`) puts
//! the GPU's ops on a stream, the loop (`score_loop.rs`) issues them to
//! either executor, and both depend on this, it on neither.
//!
//! May use: the lab's CUDA-free types in `mod.rs` (`On`, `Slot`) and
//! `pipeline`.

use super::{On, Slot};
use crate::pipeline::lab_op::LabOp;
use crate::pipeline::op::{Access, OpKind};

/// Where an argmin ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgminOn {
    /// Inside a host function, on the driver's callback thread, enqueued on a stream.
    HostFn(On),
    Worker,
    WaitingThread,
}

/// Lab 4's own operations, each written once: what it is to the schedule
/// here ([`LabOp`]); what it does on a GPU is the rig's
/// (`CallbackRig::enqueue`, for the loop's GPU side and for the rig's own
/// runs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum ScoreOp {
    /// Query `t`'s row_dot into the slot's device scores (a kernel).
    RowDot { t: usize, slot: Slot },
    /// The copy of the slot's scores (iteration `t`'s) into its pinned twin.
    D2h { t: usize, slot: Slot },
    /// Iteration `t`'s argmin over the slot's pinned scores, where `on`
    /// says. `unordered`: why the reader is not ordered after its D2H, if
    /// it is not (the dry run's race check finds that race; a GPU refuses
    /// to start a reader whose race would be real).
    Argmin { t: usize, slot: Slot, on: ArgminOn, unordered: Option<String> },
    /// A host function that hands iteration `t`'s argmin to the worker.
    HandOff { t: usize, slot: Slot, unordered: Option<String> },
}

impl LabOp for ScoreOp {
    fn kind(&self) -> OpKind {
        match self {
            ScoreOp::RowDot { .. } => OpKind::Kernel,
            ScoreOp::D2h { .. } => OpKind::D2h,
            ScoreOp::Argmin { .. } | ScoreOp::HandOff { .. } => OpKind::Host,
        }
    }
    fn label(&self) -> String {
        match self {
            ScoreOp::RowDot { t, .. } => format!("row_dot {t}"),
            ScoreOp::D2h { t, .. } => format!("D2H scores {t}"),
            ScoreOp::Argmin { t, .. } => format!("argmin {t}"),
            ScoreOp::HandOff { t, .. } => format!("hand-off {t}"),
        }
    }
    /// A slot's scores as one byte each side: what the race check needs
    /// (the keys and queries row_dot reads are never written).
    fn accesses(&self) -> Vec<Access> {
        match self {
            ScoreOp::RowDot { slot, .. } => vec![Access::write(&slot.scores(false), 0, 1)],
            ScoreOp::D2h { slot, .. } => vec![Access::read(&slot.scores(false), 0, 1), Access::write(&slot.scores(true), 0, 1)],
            ScoreOp::Argmin { slot, .. } => vec![Access::read(&slot.scores(true), 0, 1)],
            ScoreOp::HandOff { .. } => vec![],
        }
    }
}
