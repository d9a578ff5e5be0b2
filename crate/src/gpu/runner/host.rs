//! Where the CPU takes part in a loop: it waits (for an event, a stream,
//! the device, a host function's signal), it works on host memory, a host
//! function runs on the driver's thread, or another thread of the lab
//! acts. Each opens the start gate first: a GPU held behind it would never
//! get to what the CPU waits for.

use super::command::{Command, What};
use super::timing::Mark;
use super::Runner;
use crate::error::{LabError, Result};
use crate::gpu::host_fn::{Flag, Raise};
use crate::gpu::{driver, trace, Event, HostTask};
use crate::pipeline::issue::{EventRef, HostRef, SignalRef, StreamRef};
use crate::pipeline::op::{Access, OpId, OpKind};
use crate::pipeline::schedule::{Race, Schedule, WaitFor};
use std::sync::Arc;
use std::time::Instant;

/// How long the CPU waits for a host function before calling it lost (a
/// stream that never reaches it would otherwise hang the lab).
const SIGNAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

impl<'a> Runner<'a> {
    /// A call of CPU thread `thread` that waits (the CPU takes part).
    fn host_wait_call(&mut self, call: impl FnOnce() -> Result<()> + Send + 'a) -> Result<()> {
        let thread = self.lanes.thread();
        self.dispatch(Command { thread, what: What::Host { timed: None, call: Box::new(call) } })?;
        self.forget_reusable_ends();
        Ok(())
    }

    /// cuEventSynchronize: the CPU waits for `e`.
    pub fn host_wait(&mut self, e: EventRef) -> Result<()> {
        self.not_captured("a CPU wait (cuEventSynchronize)")?;
        let event = self.user_event(e)?;
        self.host_wait_call(move || {
            let _r = trace::range("host waits on event");
            event.synchronize()
        })?;
        self.schedule.host_wait_event(self.lanes.thread(), e.0);
        self.schedule.note_wait(self.lanes.thread(), WaitFor::Event(e.0));
        Ok(())
    }
    /// cuStreamSynchronize: the CPU waits for everything issued to `s`.
    pub fn host_sync(&mut self, s: StreamRef) -> Result<()> {
        self.not_captured("a CPU wait (cuStreamSynchronize)")?;
        let lane = self.lane(s)?;
        let stream = self.streams[lane];
        self.host_wait_call(move || stream.synchronize())?;
        self.schedule.host_wait_stream(self.lanes.thread(), lane);
        self.schedule.note_wait(self.lanes.thread(), WaitFor::Stream(s.0));
        Ok(())
    }
    /// cuCtxSynchronize: the CPU waits for every stream.
    pub fn sync_device(&mut self) -> Result<()> {
        self.not_captured("a CPU wait (cuCtxSynchronize)")?;
        let gpus = self.gpus.clone();
        self.host_wait_call(move || {
            let _r = trace::range("host waits for the device");
            for g in &gpus {
                g.bind()?;
                driver::context_synchronize()?;
            }
            gpus[0].bind()
        })?;
        self.schedule.host_wait_all(self.lanes.thread());
        self.schedule.note_wait(self.lanes.thread(), WaitFor::Device);
        Ok(())
    }

    /// [`crate::pipeline::issue::Issue::timed_from_here`]: what came before
    /// is set-up; the CPU waits for it, and the run's clock starts again
    /// (behind the gate again, where the run was gated). Set-up ops leave
    /// the timeline: the run's times count from here. Streams join the
    /// runner before its loop (a per-thread stream of another CPU thread
    /// resolved after this point is not held behind the new gate).
    pub fn timed_from_here(&mut self) -> Result<()> {
        self.not_captured("timed_from_here")?;
        self.lanes.on_loop_thread("timed_from_here")?;
        let (gpus, hold) = (self.gpus.clone(), if self.exec.gated { self.streams.clone() } else { Vec::new() });
        self.dispatch(Command { thread: 0, what: What::Restart { gpus, hold } })?;
        self.stream_starts.clear();
        self.marks.iter_mut().for_each(|m| *m = Mark::Elsewhere);
        self.forget_reusable_ends();
        self.schedule.host_wait_all(0);
        self.schedule.note_wait(0, WaitFor::Restart);
        (self.gate_closed, self.behind_gate) = (self.exec.gated, 0);
        Ok(())
    }

    /// A host function on `s` (cuLaunchHostFunc): `task` runs on the
    /// driver's callback thread once `s` reaches it, and `s` waits for it.
    /// Timed by the task itself, not on this run's timeline.
    pub fn host_fn<T: HostTask>(&mut self, s: StreamRef, label: &str, accesses: Vec<Access>, task: T) -> Result<OpId> {
        self.not_captured("a host function")?;
        self.lanes.on_loop_thread("a host function")?;
        let lane = self.lane(s)?;
        let stream = self.streams[lane];
        // The CPU takes part from here: the GPU must be running.
        self.dispatch(Command { thread: 0, what: What::Host { timed: None, call: Box::new(move || stream.launch_host_task(task)) } })?;
        // The stream waits for the CPU: its next op does not start where this one was issued.
        self.reusable_end[lane] = None;
        let id = self.schedule.gpu_op(0, lane, OpKind::Host, label, accesses);
        self.marks.push(Mark::Elsewhere);
        Ok(id)
    }

    /// [`crate::pipeline::issue::Issue::signal`]: a host function on `s` that raises a flag.
    pub fn signal(&mut self, s: StreamRef, label: &str) -> Result<SignalRef> {
        let flag = Arc::new(Flag::default());
        let id = self.host_fn(s, label, Vec::new(), Raise(flag.clone()))?;
        self.signals.push((flag, id));
        Ok(SignalRef(self.signals.len() - 1))
    }
    /// [`crate::pipeline::issue::Issue::host_wait_signal`]: the CPU sleeps until the flag is raised.
    pub fn host_wait_signal(&mut self, g: SignalRef) -> Result<()> {
        self.lanes.on_loop_thread("a wait for a host function")?;
        let (flag, id) =
            self.signals.get(g.0).cloned().ok_or_else(|| LabError::config(format!("signal {} was never made ({} exist)", g.0, self.signals.len())))?;
        self.host_wait_call(move || {
            let _r = trace::range("host waits for a host function");
            if !flag.wait(SIGNAL_TIMEOUT) {
                return Err(LabError::config(format!(
                    "a host function did not run within {} s of the CPU waiting for it: its stream never reached it (is it waiting for an event recorded later?)",
                    SIGNAL_TIMEOUT.as_secs()
                )));
            }
            Ok(())
        })?;
        self.learns(0, id);
        self.schedule.note_wait(0, WaitFor::Signal(g.0));
        Ok(())
    }

    /// CPU work that another thread of the lab runs (thread 1, 2, ...: a
    /// worker, a thread waiting on an event), after all that thread has
    /// learned so far ([`Self::learns`], [`Self::thread_waits`]). Recorded
    /// for the race check and the model; timed by that thread.
    pub fn on_thread(&mut self, thread: usize, label: &str, accesses: Vec<Access>) -> OpId {
        let id = self.schedule.host_op(thread, label, accesses);
        self.marks.push(Mark::Elsewhere);
        id
    }

    /// Host thread `thread` learns that op `op` is done (it was handed the
    /// job `op` sent, or the slot `op` gave back). Thread 0 is the one
    /// issuing: it blocked until then, so its later work comes after `op`.
    pub fn learns(&mut self, thread: usize, op: OpId) {
        if thread == 0 {
            self.forget_reusable_ends();
        }
        self.schedule.host_learns(thread, op);
    }

    /// Host thread `thread` receives work from the issuing thread: what
    /// thread 0 did so far happens before its later work.
    pub fn hands_to(&mut self, thread: usize) {
        self.schedule.host_joins(thread, 0);
    }

    /// Host thread `thread` waits on `e` itself (cuEventSynchronize there,
    /// on [`Self::shared_event`]).
    pub fn thread_waits(&mut self, thread: usize, e: EventRef) {
        self.schedule.host_wait_event(thread, e.0);
    }

    /// Event `e`, for another thread to wait on while the loop runs (a
    /// runner that does not defer: in a deferring one, the event is
    /// recorded only at `finish`).
    pub fn shared_event(&self, e: EventRef) -> Result<Arc<Event>> {
        self.not_deferred("an event another thread waits on")?;
        self.user_event(e)
    }

    /// The host clock this runner's timeline counts from.
    pub fn host_base(&self) -> Instant {
        self.exec.host_base
    }

    /// CPU work that writes `bytes` of host buffer `h` at byte `at`
    /// (`write`), timed on the host clock.
    pub fn host_write(&mut self, label: &str, h: HostRef, at: usize, bytes: usize, write: impl FnOnce(&mut [u64]) + Send + 'a) -> Result<()> {
        self.not_captured("CPU work")?;
        self.lanes.on_loop_thread("CPU work")?;
        let (place, mut access) = self.host_range(h, at, bytes)?;
        access.write = true;
        self.forget_reusable_ends();
        let id = self.schedule.host_op(0, label, vec![access.clone()]);
        // The CPU writes through a `&mut`: nothing else may touch the range
        // meanwhile, a copy that reads it no more than one that writes it.
        if let Some(race) = unordered_access(&self.schedule, id, &access) {
            return Err(LabError::schedule(format!("CPU work refused: {}", race.what)));
        }
        let slot = self.host_slot();
        self.marks.push(Mark::Host(slot));
        let label = label.to_string();
        self.dispatch(Command {
            thread: 0,
            what: What::Host {
                timed: Some(slot),
                call: Box::new(move || {
                    let _r = trace::range(&label);
                    // SAFETY: in bounds (host_range); the runner holds the
                    // buffer's exclusive borrow; every op issued before this
                    // one that reads or writes the range happens before it
                    // (refused above otherwise), and CPU work is issued from
                    // the loop thread alone (`on_loop_thread` above), which
                    // orders what it issues later after it. An op another
                    // issuing thread adds meanwhile that could touch the
                    // range is a race the schedule reports.
                    write(unsafe { std::slice::from_raw_parts_mut(place.addr() as *mut u64, bytes / 8) });
                    Ok(())
                }),
            },
        })
    }

    /// CPU work that reads `bytes` of host buffer `h` at byte `at` and
    /// hands `read`'s result back (a runner that does not defer: the loop
    /// has it at once).
    pub fn host_read<R>(&mut self, label: &str, h: HostRef, at: usize, bytes: usize, read: impl FnOnce(&[u64]) -> R) -> Result<R> {
        self.not_captured("CPU work")?;
        self.not_deferred("reading host memory into the loop")?;
        self.lanes.on_loop_thread("CPU work")?;
        let (place, access) = self.host_range(h, at, bytes)?;
        self.exec.open_gate()?;
        self.gate_closed = false;
        self.forget_reusable_ends();
        let id = self.schedule.host_op(0, label, vec![access.clone()]);
        self.refuse_unordered_writer(id, &access)?;
        let slot = self.host_slot();
        self.marks.push(Mark::Host(slot));
        let _r = trace::range(label);
        let t0 = self.exec.now_us();
        // SAFETY: in bounds (host_range); the runner holds the buffer's
        // exclusive borrow, and every write to the range happens before this
        // read (refused above otherwise): a runner that does not defer has
        // made the waits that order them, so nothing writes it meanwhile.
        let r = read(unsafe { std::slice::from_raw_parts(place.addr() as *const u64, bytes / 8) });
        self.exec.host_times[slot] = (t0, self.exec.now_us());
        Ok(r)
    }

    /// Refuses CPU work `id` on host memory (`access`) while anything may
    /// still write that memory ([`unordered_writer`]).
    fn refuse_unordered_writer(&self, id: OpId, access: &Access) -> Result<()> {
        match unordered_writer(&self.schedule, id, access) {
            Some(race) => Err(LabError::schedule(format!("CPU work refused: {}", race.what))),
            None => Ok(()),
        }
    }

    /// After host work or a host wait, streams may sit idle until the next
    /// op is issued: a shared end event would date its start too early.
    pub(super) fn forget_reusable_ends(&mut self) {
        self.reusable_end.iter_mut().for_each(|e| *e = None);
    }
}

/// The race, if any, that leaves CPU work `id` writing host memory
/// (`access`) unordered after an op that reads or writes that memory: the
/// CPU would write memory a copy may still be reading or changing.
fn unordered_access<'s>(schedule: &'s Schedule, id: OpId, access: &Access) -> Option<&'s Race> {
    let overlaps = |a: &Access| a.buffer == access.buffer && a.start < access.end && access.start < a.end;
    schedule.races().iter().filter(|r| r.later == id).find(|r| schedule.ops[r.earlier].accesses.iter().any(overlaps))
}

/// The race, if any, that leaves CPU work `id` on host memory (`access`)
/// unordered after an op that writes that memory (a copy into it, its
/// release): the CPU would read or write memory a copy may be changing
/// under it, which no Rust reference may see. (Unordered after an op that
/// only reads it, the CPU's writes are a race the schedule reports, not
/// memory changing under the CPU.)
fn unordered_writer<'s>(schedule: &'s Schedule, id: OpId, access: &Access) -> Option<&'s Race> {
    let overlaps = |a: &Access| a.write && a.buffer == access.buffer && a.start < access.end && access.start < a.end;
    schedule.races().iter().filter(|r| r.later == id).find(|r| schedule.ops[r.earlier].accesses.iter().any(overlaps))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::op::OpKind;

    #[test]
    fn cpu_work_is_refused_only_where_a_copy_may_still_write_its_memory() {
        let mut s = Schedule::new();
        // A D2H into "out" on stream 0, then the CPU reads "out" with no wait.
        s.gpu_op(0, 0, OpKind::D2h, "D2H 0", vec![Access::write("out", 0, 64)]);
        let read = Access::read("out", 0, 64);
        let id = s.host_op(0, "CPU reads out", vec![read.clone()]);
        let race = unordered_writer(&s, id, &read).expect("the copy may still be writing");
        assert!(race.what.contains("D2H 0") && race.what.contains("out"), "{}", race.what);
        // Other bytes of the buffer: nothing writes them.
        let elsewhere = Access::read("out", 64, 128);
        let id = s.host_op(0, "CPU reads the rest", vec![elsewhere.clone()]);
        assert!(unordered_writer(&s, id, &elsewhere).is_none());
        // After the CPU waited for the stream, the same read is ordered.
        s.host_wait_stream(0, 0);
        let id = s.host_op(0, "CPU reads out after the wait", vec![read.clone()]);
        assert!(unordered_writer(&s, id, &read).is_none());
        // An H2D that may still read "in" while the CPU writes it: nothing
        // writes under a CPU that reads, but a CPU that writes through a
        // `&mut` is refused (host_write), the copy named.
        s.gpu_op(0, 1, OpKind::H2d, "H2D 1", vec![Access::read("in", 0, 64)]);
        let write = Access::write("in", 0, 64);
        let id = s.host_op(0, "CPU writes in", vec![write.clone()]);
        assert!(unordered_writer(&s, id, &write).is_none());
        let race = unordered_access(&s, id, &write).expect("the copy may still be reading");
        assert!(race.what.contains("H2D 1"), "{}", race.what);
        // After the CPU waited for that stream, the write is ordered.
        s.host_wait_stream(0, 1);
        let id = s.host_op(0, "CPU writes in after the wait", vec![write.clone()]);
        assert!(unordered_access(&s, id, &write).is_none());
    }
}
