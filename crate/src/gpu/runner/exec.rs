//! What runs the runner's commands (`super::command`): the clocks, the
//! start gate, the CPU threads; and the replay of a deferring runner's
//! recorded calls, one after another or each CPU thread's at once.

use super::command::{Command, What};
use super::threads::CpuThreads;
use super::Runner;
use crate::error::{LabError, Result};
use crate::gpu::gate::Gate;
use crate::gpu::{driver, trace, Event, Gpu, Stream};
use std::time::Instant;

/// What runs the commands: the clocks, the gate, the CPU threads.
pub(super) struct Exec {
    /// The runner's own GPU (its base event, its gate).
    pub(super) gpu: Gpu,
    /// Closed while Some; opened once, then given back to the device.
    pub(super) gate: Option<Gate>,
    pub(super) base: Event,
    /// The stream the base event is recorded on (held behind the gate too).
    pub(super) base_stream: Stream,
    pub(super) host_base: Instant,
    /// CUPTI's clock when the base completed (ns), for CUPTI-timed runs.
    pub(super) cupti: bool,
    pub(super) cupti_t0: u64,
    /// Host-clock spans of the ops timed there, µs, by slot.
    pub(super) host_times: Vec<(f64, f64)>,
    /// In a traced run issued live: when the issuing thread made each
    /// call that hands work to the GPU (host clock, µs) and what it was,
    /// so a timeline shows what the CPU was doing beside the GPU. Two
    /// clock reads a call, and only in a traced run.
    pub(super) issue_spans: Option<Vec<(f64, f64, &'static str)>>,
    pub(super) cpu: CpuThreads,
    /// When the loop's first call was made.
    pub(super) loop_start: Option<Instant>,
    /// Whether the run started behind a gate (and starts behind one again
    /// after its set-up, [`Runner::timed_from_here`]).
    pub(super) gated: bool,
}

impl Exec {
    /// Waits for the base event, then reads the host clock (and CUPTI's):
    /// the base completes as soon as its stream runs, so the clocks align
    /// within a few µs.
    pub(super) fn align_clocks(&mut self) -> Result<()> {
        self.base.synchronize()?;
        self.host_base = Instant::now();
        if self.cupti {
            self.cupti_t0 = driver::activity::now()?;
        }
        Ok(())
    }
    /// Lets the GPU start everything issued so far (once).
    pub(super) fn open_gate(&mut self) -> Result<()> {
        if let Some(mut g) = self.gate.take() {
            g.release();
            g.put_back(&self.gpu);
            self.align_clocks()?;
        }
        Ok(())
    }
    /// With no gate, restarts the clock now, so the run's time counts from
    /// the loop's first call.
    pub(super) fn restart_clock(&mut self) -> Result<()> {
        if self.gate.is_none() {
            self.base.record(&self.base_stream)?;
            self.align_clocks()?;
        }
        self.loop_start = Some(Instant::now());
        Ok(())
    }
    /// What came before was set-up: it runs to its end, then the clock
    /// starts again: behind the gate again where the run was gated, every
    /// stream in `hold` waiting for the new base.
    pub(super) fn restart_after_setup(&mut self, gpus: &[Gpu], hold: &[&Stream]) -> Result<()> {
        self.open_gate()?;
        for g in gpus {
            g.bind()?;
            driver::context_synchronize()?;
        }
        self.gpu.bind()?;
        if self.gated {
            if let Some(g) = Gate::take(&self.gpu) {
                let held = g.hold(&self.base_stream);
                self.gate = Some(g);
                held?;
            }
        }
        self.base.record(&self.base_stream)?;
        if self.gate.is_some() {
            for s in hold {
                s.wait_event(&self.base)?;
            }
            self.gpu.bind()?;
        } else {
            self.align_clocks()?;
        }
        Ok(())
    }
    pub(super) fn now_us(&self) -> f64 {
        self.host_base.elapsed().as_secs_f64() * 1e6
    }
    /// Makes one command's calls.
    pub(super) fn run(&mut self, c: Command<'_>) -> Result<()> {
        match c.what {
            What::OpenGate => self.open_gate(),
            What::Restart { gpus, hold } => self.restart_after_setup(&gpus, &hold),
            What::Blocking(call) => {
                self.open_gate()?;
                self.cpu.run(c.thread, call)
            }
            What::Host { timed, call } => {
                self.open_gate()?;
                let t0 = self.now_us();
                self.cpu.run(c.thread, call)?;
                if let Some(slot) = timed {
                    self.host_times[slot] = (t0, self.now_us());
                }
                Ok(())
            }
            what if c.thread == 0 => {
                let traced = self.issue_spans.is_some().then(|| (self.now_us(), what.call_name()));
                // SAFETY: the runner holds every buffer and handle its commands
                // name until it has synchronized (it borrows the lab's for its
                // life, keeps its events, and frees the loop's own only after).
                unsafe { what.issue() }?;
                if let Some((t0, name)) = traced {
                    let t1 = self.now_us();
                    if let Some(spans) = self.issue_spans.as_mut() {
                        spans.push((t0, t1, name));
                    }
                }
                Ok(())
            }
            // SAFETY: as above (the runner holds what the command names until
            // it has synchronized), made from the thread whose stream it is.
            what => self.cpu.run(c.thread, move || unsafe { what.issue() }),
        }
    }
}

impl<'a> Runner<'a> {
    /// Runs what a deferring runner recorded, from the loop's first call to
    /// its last with nothing between them: the time it took, ms, in all and
    /// per CPU thread where they made their calls at once.
    pub(super) fn replay(&mut self) -> Result<Option<(f64, Vec<f64>)>> {
        let Some(commands) = self.deferred.take() else { return Ok(None) };
        let _r = trace::range("issue loop");
        self.exec.restart_clock()?;
        let started = Instant::now();
        if self.at_once.is_some() {
            let by_thread = self.replay_at_once(commands)?;
            return Ok(Some((started.elapsed().as_secs_f64() * 1e3, by_thread)));
        }
        for c in commands {
            self.exec.run(c)?;
        }
        let ms = started.elapsed().as_secs_f64() * 1e3;
        Ok(Some((ms, vec![ms])))
    }

    /// [`Self::threads_at_once`]: each CPU thread's commands on its own OS
    /// thread, all at once (thread 0's on this one); per thread, the time
    /// its calls took, ms.
    pub(super) fn replay_at_once(&mut self, commands: Vec<Command<'a>>) -> Result<Vec<f64>> {
        // A call that blocks the CPU needs the GPU running.
        if commands.iter().any(|c| matches!(c.what, What::Blocking(_))) {
            self.exec.open_gate()?;
        }
        let threads = commands.iter().map(|c| c.thread + 1).max().unwrap_or(1);
        let mut by_thread: Vec<Vec<What<'a>>> = (0..threads).map(|_| Vec::new()).collect();
        for c in commands {
            by_thread[c.thread].push(c.what);
        }
        let issue_all = |whats: Vec<What<'a>>| -> Result<f64> {
            let t = Instant::now();
            for w in whats {
                // SAFETY: as for every command (see `Exec::run`); the gate is
                // open wherever a call blocks, and the dispatch refused
                // anything that orders one thread after another.
                unsafe { w.issue() }?;
            }
            Ok(t.elapsed().as_secs_f64() * 1e3)
        };
        let cpu = &self.exec.cpu;
        let mut lists = by_thread.into_iter();
        let own = lists.next().unwrap_or_default();
        let times: Vec<Result<f64>> = std::thread::scope(|scope| {
            let others: Vec<_> = lists.enumerate().map(|(i, whats)| scope.spawn(move || cpu.run(i + 1, move || issue_all(whats)))).collect();
            let mut times = vec![issue_all(own)];
            times.extend(others.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(LabError::Thread("a CPU thread of the loop panicked".into())))));
            times
        });
        times.into_iter().collect()
    }
}
