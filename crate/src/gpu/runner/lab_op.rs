//! The GPU half of a lab's own operations (`crate::pipeline::lab_op`): a
//! lab says once, in its [`LabOnGpu`], how each of its operations runs on a
//! GPU (the calls that enqueue it on a stream, the host task a host
//! function of it runs, the CPU work it hands its own threads), and
//! [`LabRunner`], the runner with that GPU side, takes the loop's calls
//! through [`LabIssue`], as the dry run does with no GPU: each operation
//! is recorded as it describes itself ([`LabOp`]) and then run.
//!
//! What makes enqueueing a lab's calls sound is said once, as the safety
//! contract of [`LabOnGpu`]: the lab promises it where it implements the
//! trait, and [`LabRunner::lab_op`] relies on it.

use super::Runner;
use crate::error::{LabError, Result};
use crate::gpu::host_fn::sealed;
use crate::gpu::{HostTask, Stream};
use crate::pipeline::issue::{DevRef, EventRef, HostRef, Issue, SignalRef, StreamRef};
use crate::pipeline::lab_op::{LabIssue, LabOp};
use crate::pipeline::op::OpId;

/// The calls that put one of a lab's operations on a stream, made when the
/// runner issues it (at once, or at `finish` in a deferring runner).
pub type Enqueue<'a> = Box<dyn FnOnce(&Stream) -> Result<()> + Send + 'a>;

/// A lab with no host functions of its own ([`LabOnGpu::Task`]). No value
/// of it exists.
pub enum NoHostTask {}

impl sealed::Sealed for NoHostTask {}

impl HostTask for NoHostTask {
    fn run(self: Box<Self>) {
        match *self {}
    }
}

/// A lab's GPU side: what its own operations ([`LabOnGpu::Op`]) and calls
/// do on a GPU. It holds what they need there (the lab's rig: its buffers,
/// kernels, CPU threads), borrowed for the runner's life `'a`.
///
/// # Safety
/// Implementing it promises, for every operation: the calls that
/// [`Self::enqueue`] returns touch only memory that stays allocated until
/// the runner has synchronized (memory borrowed for `'a`, which outlives
/// the runner, or memory those calls allocate and free on their own
/// stream), and the operation's [`LabOp::accesses`] name everything they
/// write and everything they read that the loop writes: the race check,
/// which is all that keeps the loop's other work off that memory while
/// the GPU uses it, sees nothing else.
pub unsafe trait LabOnGpu<'a> {
    /// The lab's operations.
    type Op: LabOp;
    /// The lab's calls of its own ([`LabIssue::lab_call`]);
    /// [`crate::pipeline::lab_op::NoCall`] for none.
    type Call;
    /// What its host functions run; [`NoHostTask`] for none.
    type Task: HostTask;
    /// The calls that enqueue `op` on a stream ([`LabIssue::lab_op`]).
    fn enqueue(&mut self, op: &Self::Op) -> Result<Enqueue<'a>>;
    /// What a host function doing `op` runs on the driver's callback thread
    /// ([`LabIssue::host_fn`]).
    fn host_task(&mut self, op: &Self::Op) -> Result<Self::Task> {
        Err(LabError::config(format!("{}: this lab has no host functions of its own", op.label())))
    }
    /// Hands `op`'s CPU work to the lab's thread `thread` ([`LabIssue::on_thread`]).
    fn on_thread(&mut self, thread: usize, op: &Self::Op) -> Result<()> {
        Err(LabError::config(format!("{} on CPU thread {thread}: this lab has no CPU threads of its own", op.label())))
    }
    /// Makes `call` on the loop's thread; its answer ([`LabIssue::lab_call`]).
    fn call(&mut self, call: Self::Call) -> Result<usize> {
        let _ = call;
        Err(LabError::config("this lab has no calls of its own"))
    }
}

/// The runner with a lab's GPU side: executes the vocabulary ([`Issue`],
/// sizes in f32 elements as everywhere in it) and the lab's own
/// operations ([`LabIssue`]) on real streams. Its fields drop in order:
/// the runner first (it synchronizes every GPU, so every host function
/// has run), then the lab's side (its threads end once their work is
/// done).
pub struct LabRunner<'a, L> {
    pub runner: Runner<'a>,
    pub lab: L,
}

impl<'a, L: LabOnGpu<'a>> LabRunner<'a, L> {
    pub fn new(runner: Runner<'a>, lab: L) -> LabRunner<'a, L> {
        LabRunner { runner, lab }
    }
}

impl<'a, L: LabOnGpu<'a>> LabIssue<L::Op, L::Call> for LabRunner<'a, L> {
    fn lab_op(&mut self, s: StreamRef, op: L::Op) -> Result<OpId> {
        let enqueue = self.lab.enqueue(&op)?;
        // SAFETY: `L: LabOnGpu<'a>` promises that these calls touch only
        // memory alive until the runner has synchronized, and that `op`'s
        // accesses, which the runner records for the race check, name
        // everything of the loop's they touch.
        unsafe { self.runner.op(s, op.kind(), &op.label(), op.accesses(), enqueue) }
    }
    fn host_fn(&mut self, s: StreamRef, op: L::Op) -> Result<OpId> {
        let task = self.lab.host_task(&op)?;
        self.runner.host_fn(s, &op.label(), op.accesses(), task)
    }
    fn on_thread(&mut self, thread: usize, op: L::Op) -> Result<OpId> {
        self.lab.on_thread(thread, &op)?;
        Ok(self.runner.on_thread(thread, &op.label(), op.accesses()))
    }
    fn learns(&mut self, thread: usize, op: OpId) {
        self.runner.learns(thread, op);
    }
    fn hands_to(&mut self, thread: usize) {
        self.runner.hands_to(thread);
    }
    fn thread_waits(&mut self, thread: usize, e: EventRef) {
        self.runner.thread_waits(thread, e);
    }
    fn lab_call(&mut self, call: L::Call, _offline: usize) -> Result<usize> {
        self.lab.call(call)
    }
}

/// The vocabulary on the runner, for a lab whose kernels are its own
/// operations: the pipelines' compute kernel and a producer's dataset are
/// not loaded (`super::GpuIssuer` runs loops that use them).
impl<'a, L: LabOnGpu<'a>> Issue for LabRunner<'a, L> {
    super::issuer::issue_on_the_runner!();
    fn compute(&mut self, _s: StreamRef, _input: DevRef, _in_at: usize, _output: DevRef, _out_at: usize, _n: usize, label: &str) -> Result<()> {
        Err(LabError::config(format!("{label}: this lab's kernels are its own operations (lab_op); the pipelines' compute kernel is not loaded for it")))
    }
    fn produce(&mut self, _h: HostRef, _at: usize, _n: usize, _batch: usize, label: &str) -> Result<()> {
        Err(LabError::config(format!("{label}: this lab has no producer")))
    }
}
