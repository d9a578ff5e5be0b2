//! A lab's own operations: the vocabulary's one hook for work that only
//! one lab has (lab 4's row_dot kernel and the copy of its scores, its
//! argmins on the driver's callback thread or on threads of its own; lab
//! 9's layers of cuBLAS GEMMs).
//!
//! A lab writes each of its operations once, as a value of a type of its
//! own that says what it is to the schedule ([`LabOp`]: its kind, label and
//! the bytes it reads and writes) and, in `gpu::runner::lab_op`, how a GPU
//! runs it. Its loop is written once against [`LabIssue`]: the vocabulary
//! ([`Issue`]) plus the calls that take those operations. Both executors
//! implement it: the dry run ([`super::dry_run::DryRun`]) records each
//! operation's accesses in its schedule (the race check, the queue model)
//! and runs nothing; `gpu::runner::LabRunner` records the same accesses and
//! enqueues the operation on a stream. So a loop never asks which executor
//! it runs on.
//!
//! No CUDA here: how an operation is enqueued is the `gpu` half's.

use super::issue::{EventRef, Issue, StreamRef};
use super::op::{Access, OpId, OpKind};
use crate::error::Result;

/// A lab's own operation, as the schedule sees it: written once by the lab,
/// taken by both executors through [`LabIssue`].
pub trait LabOp {
    /// What the schedule and the queue model take it for on a stream (a
    /// kernel, a copy: [`LabIssue::lab_op`]). A host function is
    /// [`OpKind::Host`], and another thread's CPU work a host op, whatever
    /// this says.
    fn kind(&self) -> OpKind;
    /// Its name on timelines and in the race check's findings.
    fn label(&self) -> String;
    /// What it reads and writes: everything it writes, and everything it
    /// reads that the loop writes anywhere (memory nothing in the loop
    /// writes, like a lab's fixed inputs, may go unnamed).
    fn accesses(&self) -> Vec<Access>;
}

/// A lab with no calls of its own ([`LabIssue::lab_call`]): its vocabulary
/// is operations only. No value of it exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoCall {}

/// The vocabulary with a lab's own operations (of type `O`) and calls (of
/// type `C`): what the loop of a lab with work of its own is written
/// against, once, and what both executors implement (see the module docs).
pub trait LabIssue<O: LabOp, C = NoCall>: Issue {
    /// The lab's operation `op` on stream `s` (a kernel or a copy of its
    /// own buffers): ordered and timed like every other op on `s`.
    fn lab_op(&mut self, s: StreamRef, op: O) -> Result<OpId>;
    /// A host function on `s` (cuLaunchHostFunc) doing `op`'s CPU work on
    /// the driver's callback thread: it reads and writes `op`'s accesses,
    /// and `s` waits for it.
    fn host_fn(&mut self, s: StreamRef, op: O) -> Result<OpId>;
    /// `op`'s CPU work on CPU thread `thread` of the lab (1, 2, ...: a
    /// worker, a thread waiting on an event), after everything that thread
    /// has learned so far ([`Self::learns`], [`Self::thread_waits`]).
    fn on_thread(&mut self, thread: usize, op: O) -> Result<OpId>;
    /// CPU thread `thread` learns that op `op` is done (a job `op` sent
    /// it, a slot `op` gave back): its later work comes after `op`.
    fn learns(&mut self, thread: usize, op: OpId);
    /// CPU thread `thread` receives work from the loop's thread (0):
    /// what thread 0 did so far comes before its later work.
    fn hands_to(&mut self, thread: usize);
    /// CPU thread `thread` waits for event `e` itself (cuEventSynchronize there).
    fn thread_waits(&mut self, thread: usize, e: EventRef);
    /// A call of the lab's own on the loop's thread that the schedule does
    /// not hold, answered by a number (lab 4 takes a free score slot): on
    /// a GPU the lab's side makes it (and may block, as a CPU waiting for
    /// a slot to come back does); with no GPU nothing runs, and the answer
    /// is `offline`, what the lab's own account of the loop expects.
    fn lab_call(&mut self, call: C, offline: usize) -> Result<usize>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::dry_run::DryRun;
    use crate::pipeline::op::{Lane, StreamDecl, StreamKind};

    /// A lab of two operations: a kernel writing a buffer, and CPU work
    /// reading it.
    enum Toy {
        Writes(usize),
        Reads(usize),
    }

    impl LabOp for Toy {
        fn kind(&self) -> OpKind {
            match self {
                Toy::Writes(_) => OpKind::Kernel,
                Toy::Reads(_) => OpKind::Host,
            }
        }
        fn label(&self) -> String {
            match self {
                Toy::Writes(i) => format!("write {i}"),
                Toy::Reads(i) => format!("read {i}"),
            }
        }
        fn accesses(&self) -> Vec<Access> {
            match self {
                Toy::Writes(_) => vec![Access::write("buffer", 0, 8)],
                Toy::Reads(_) => vec![Access::read("buffer", 0, 8)],
            }
        }
    }

    /// A loop written once against the hook: nothing in it names an executor.
    fn toy_loop(x: &mut dyn LabIssue<Toy>, s: StreamRef, reader_waits: bool) -> Result<(OpId, OpId)> {
        let written = x.lab_op(s, Toy::Writes(0))?;
        let e = x.event()?;
        x.record(e, s)?;
        x.hands_to(1);
        if reader_waits {
            x.thread_waits(1, e);
        }
        let read = x.on_thread(1, Toy::Reads(0))?;
        Ok((written, read))
    }

    #[test]
    fn the_dry_run_records_a_lab_op_as_it_describes_itself() {
        let mut dry = DryRun::new();
        let s = dry.stream_named(StreamDecl::new(StreamKind::NonBlocking, 0, 0), "compute");
        let (written, read) = toy_loop(&mut dry, s, true).unwrap();
        let op = &dry.schedule.ops[written];
        assert_eq!((op.kind, op.label.as_str(), op.lane), (OpKind::Kernel, "write 0", Lane::Stream(0)));
        assert_eq!(op.accesses, [Access::write("buffer", 0, 8)]);
        let op = &dry.schedule.ops[read];
        assert_eq!((op.kind, op.label.as_str(), op.lane), (OpKind::Host, "read 0", Lane::HostThread(1)));
        assert!(dry.schedule.happens_before(written, read), "the thread waited for the event behind the kernel");
        assert!(dry.schedule.races().is_empty(), "{:?}", dry.schedule.races());
        // A host function on the stream is ordered after the kernel by the stream.
        let f = LabIssue::<Toy>::host_fn(&mut dry, s, Toy::Reads(1)).unwrap();
        assert_eq!((dry.schedule.ops[f].kind, dry.schedule.ops[f].lane), (OpKind::Host, Lane::Stream(0)));
        assert!(dry.schedule.happens_before(written, f));
        // The dry run makes no call: it answers what the lab expects.
        assert_eq!(LabIssue::<Toy, usize>::lab_call(&mut dry, 7, 3).unwrap(), 3);
    }

    #[test]
    fn a_thread_that_learns_nothing_races_the_kernel() {
        let mut dry = DryRun::new();
        let s = dry.stream_named(StreamDecl::new(StreamKind::NonBlocking, 0, 0), "compute");
        toy_loop(&mut dry, s, false).unwrap();
        let races = dry.schedule.races();
        assert_eq!(races.len(), 1, "{races:?}");
        assert!(races[0].what.contains("'read 0' reads") && races[0].what.contains("'write 0' may still write"), "{}", races[0].what);
        // Learning that the kernel is done orders the thread after it.
        let mut dry = DryRun::new();
        let s = dry.stream_named(StreamDecl::new(StreamKind::NonBlocking, 0, 0), "compute");
        let written = LabIssue::<Toy>::lab_op(&mut dry, s, Toy::Writes(0)).unwrap();
        LabIssue::<Toy>::learns(&mut dry, 2, written);
        LabIssue::<Toy>::on_thread(&mut dry, 2, Toy::Reads(0)).unwrap();
        assert!(dry.schedule.races().is_empty(), "{:?}", dry.schedule.races());
    }

    #[test]
    fn a_host_function_from_another_thread_and_an_unknown_stream_are_refused() {
        let mut dry = DryRun::new();
        let s = dry.stream_named(StreamDecl::new(StreamKind::NonBlocking, 0, 0), "compute");
        let e = LabIssue::<Toy>::lab_op(&mut dry, StreamRef(4), Toy::Writes(0)).unwrap_err().to_string();
        assert!(e.contains("stream 4 was never created"), "{e}");
        dry.issue_from(1).unwrap();
        let e = LabIssue::<Toy>::host_fn(&mut dry, s, Toy::Reads(0)).unwrap_err().to_string();
        assert!(e.contains("a host function from CPU thread 1"), "{e}");
    }
}
