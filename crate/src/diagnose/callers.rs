//! Who is behind each GPU op, and how a finding names it: the call that
//! launched the op (by correlation id), the CPU ops around that call, and
//! the [`CallRef`] a finding shows
//! (`aten::item > aten::_local_scalar_dense > cudaStreamSynchronize`).
//! Built once a trace; every kind of finding asks it.
//!
//! May use: `events`, `queries` (launching calls, enclosing CPU ops),
//! `diagnosis` (the [`CallRef`] it makes).

use super::diagnosis::CallRef;
use super::events::Trace;
use super::queries::{enclosing_ops, launch_calls};
use std::collections::HashMap;

/// A trace's launching calls and the CPU ops around each call, to name
/// what a finding blames.
pub(super) struct Callers<'t> {
    trace: &'t Trace,
    /// The launching call of each correlation id ([`launch_calls`]).
    launch_of: HashMap<u64, usize>,
    /// The CPU ops around each call, outermost first ([`enclosing_ops`]).
    enclosing: Vec<Vec<usize>>,
}

impl<'t> Callers<'t> {
    pub(super) fn new(trace: &'t Trace) -> Callers<'t> {
        Callers { trace, launch_of: launch_calls(trace), enclosing: enclosing_ops(trace) }
    }

    /// The call that launched GPU op `oi`, where the trace has it.
    pub(super) fn launch(&self, oi: usize) -> Option<usize> {
        self.trace.gpu_ops[oi].correlation.and_then(|k| self.launch_of.get(&k)).copied()
    }

    /// Call `ci` as a finding names it, with the CPU ops around it (not
    /// the annotations).
    pub(super) fn call_ref(&self, ci: usize) -> CallRef {
        let trace = self.trace;
        let c = &trace.calls[ci];
        let mut name: Vec<&str> = self.enclosing[ci].iter().map(|&o| &trace.cpu_ops[o]).filter(|o| !o.annotation).map(|o| o.name.as_str()).collect();
        name.push(&c.name);
        CallRef {
            name: name.join(" > "),
            ts_us: c.start_us,
            correlation: c.correlation,
            thread: trace.threads.get(c.thread).map_or(String::new(), |t| t.to_string()),
        }
    }

    /// The launching call of GPU op `oi`, or where there is none (the
    /// course's traces) the op itself.
    pub(super) fn op_ref(&self, oi: usize) -> CallRef {
        let o = &self.trace.gpu_ops[oi];
        match self.launch(oi) {
            Some(ci) => self.call_ref(ci),
            None => CallRef { name: o.name.clone(), ts_us: o.start_us, correlation: o.correlation, thread: format!("GPU {} stream {}", o.gpu, o.stream) },
        }
    }

    /// The outermost CPU op (not an annotation) around call `ci`.
    pub(super) fn outermost_op(&self, ci: usize) -> Option<usize> {
        self.enclosing[ci].iter().copied().find(|&x| !self.trace.cpu_ops[x].annotation)
    }
}
