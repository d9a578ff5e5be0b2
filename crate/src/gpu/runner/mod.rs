//! The runner: every lab's GPU work goes through it. It executes the
//! pipeline vocabulary (`crate::pipeline`) on real streams and records it
//! as it goes: every operation enters a [`Schedule`] (for the race check
//! and the queue model) and, when asked, is timed against one base event
//! for the measured timeline.
//!
//! **Two ways to run a loop.** A runner that *defers*
//! ([`Runner::deferring`], what [`super::PlanRig`] uses) takes the loop's
//! calls first: it checks each, records it in the schedule, decides which
//! events time it, and keeps the driver calls it will make as a
//! `command::Command`. At [`Runner::finish`] those commands run one after
//! another with nothing of ours between them, so what issuing the loop
//! costs the CPU is what the same driver calls cost in a plain program
//! (`PlanRig::plain_stage_loop` holds it to that); with
//! [`Runner::threads_at_once`], each CPU thread makes its own commands at
//! the same time as the others (lab 1's two directions, each blocking its
//! own thread where the memory is pageable). A runner that does not
//! defer makes each call as the loop makes it: for labs whose other CPU
//! threads act while the loop runs (lab 4's worker waits on the loop's
//! events), and for capturing a CUDA graph.
//!
//! Streams start behind a gate (`gpu::gate`): the GPU starts the loop
//! when it is fully issued, or as soon as the CPU takes part (host work, a
//! host wait), so its time is device time, not the time the CPU took to
//! issue it. A plan issued live ([`Gpu::runner`] with `gated` false) has no
//! gate: its time counts from the loop's first call.
//!
//! The runner borrows every buffer it uses for its whole life and
//! synchronizes before it ends (in `finish`, or on drop), so no buffer can
//! be freed or reused by Rust code while the GPU may still touch it. Inside
//! the loop, the order of GPU and CPU accesses is the learner's business:
//! the schedule reports any access not ordered after a conflicting one.
//!
//! The rooms: [`command`] (what a recorded call holds), `exec` (what makes
//! the calls: clocks, gate, threads, the replay), `run` (what a finished
//! run leaves), [`timing`] (what times the ops, and the timeline), `ops`
//! (copies, kernels, events, waits), `host` (CPU work and waits, host
//! functions), `memory` (memory calls as ops), `threads` (CPU threads past
//! the loop's own), [`issuer`] (the vocabulary's trait on this runner),
//! [`lab_op`] (the GPU half of a lab's own operations: [`LabOnGpu`], whose
//! safety contract is the one a lab's enqueued calls rest on, and
//! [`LabRunner`], the runner with a lab's GPU side, which takes a loop
//! written once for it and the dry run).

pub mod command;
mod exec;
mod host;
pub mod issuer;
pub mod lab_op;
mod memory;
mod ops;
mod run;
mod threads;
pub mod timing;

use super::gate::Gate;
use super::nccl::Communicators;
use super::{driver, Event, Gpu, Graph, Stream};
use crate::error::{LabError, Result};
use crate::pipeline::issue::{Holding, Lanes, StreamRef};
use crate::pipeline::op::{Memory, OpId, StreamDecl, StreamKind};
use crate::pipeline::schedule::Schedule;
use crate::pipeline::timeline::Timeline;
use command::{Base, Command, What};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;
use threads::CpuThreads;
use timing::{EventPool, Mark};

use exec::Exec;
pub use issuer::{Dataset, GpuIssuer};
pub use lab_op::{Enqueue, LabOnGpu, LabRunner, NoHostTask};
pub use run::Run;
pub use timing::TimelineSource;

/// A host buffer of the runner: the lab's (borrowed) or the loop's own
/// (the runner releases it at its end if the loop did not).
struct HostEntry {
    base: Base,
    words: usize,
    hold: Holding,
    /// A copy from pageable memory blocks inside its call until its DMA
    /// ran, so the gate must open before one is issued.
    page_locked: bool,
}

/// A device buffer of the runner: the lab's (borrowed) or the loop's own.
struct DeviceEntry {
    base: Base,
    bytes: usize,
    hold: Holding,
    /// The GPU whose memory it is.
    gpu: Gpu,
}

/// Operations issued behind a closed gate before it opens anyway, so the
/// GPU's queues never fill while the CPU is still issuing (which would
/// block the CPU forever).
const MAX_GATED_OPS: usize = 256;

/// Runs the pipeline vocabulary on real streams (see the module docs).
pub struct Runner<'a> {
    /// Every GPU its streams belong to, its own first ([`Self::stream`]
    /// takes a stream of any GPU).
    gpus: Vec<Gpu>,
    device_label: String,
    schedule: Schedule,
    /// The streams by lane and the CPU thread making the calls
    /// ([`Lanes`]): the loop's own streams, then the per-thread streams of
    /// other CPU threads (the same handle, called from there).
    lanes: Lanes,
    streams: Vec<&'a Stream>,
    /// One per lane, made when the lane is added: recorded last in
    /// `finish`, so creating them never lands after the timed work.
    stream_ends: Vec<Event>,
    /// Behind a closed gate, one per lane: recorded as the lane is held, so
    /// it completes when the lane may start. The run's time counts from
    /// the first of them, not from the base, whose release reaches the
    /// other streams some µs later (cleared by a restart of the clock).
    stream_starts: Vec<Event>,
    devices: Vec<DeviceEntry>,
    hosts: Vec<HostEntry>,
    /// Shared, so a thread of the lab can wait on one ([`Runner::shared_event`]).
    user_events: Vec<Arc<Event>>,
    /// Events a record on another GPU replaced, kept while recorded
    /// commands may still name them.
    replaced_events: Vec<Arc<Event>>,
    /// Each signal's flag and host function op ([`Self::signal`]).
    signals: Vec<(Arc<super::host_fn::Flag>, OpId)>,
    pool: EventPool,
    pool_used: usize,
    /// How each op is timed, in schedule order.
    marks: Vec<Mark>,
    source: TimelineSource,
    /// CUPTI's ids of the lanes' streams.
    cupti_streams: Vec<u32>,
    /// GPU ops issued so far.
    gpu_ops: usize,
    /// GPU ops issued behind the current gate.
    behind_gate: usize,
    /// Whether the gate is still closed at this point of the loop (no
    /// command so far opens it).
    gate_closed: bool,
    /// Per stream: the pool event recorded at the end of its last op, while it
    /// may still serve as the next op's start (nothing has happened between).
    reusable_end: Vec<Option<usize>>,
    /// The recorded calls of a deferring runner, run at `finish`.
    deferred: Option<Vec<Command<'a>>>,
    /// Per lane, the CPU thread that issues to it, where each thread's
    /// calls are made at once ([`Self::threads_at_once`]); None otherwise.
    at_once: Option<Vec<Option<usize>>>,
    exec: Exec,
    /// Capture mode ([`Gpu::capture_runner`]): the event recorded on the
    /// base stream as its capture began, which every stream waits on to
    /// join the capture; None when the runner runs.
    capture: Option<Event>,
    /// Why the capture cannot go on (a stream failed to join it).
    capture_broken: Option<String>,
    finished: bool,
    /// NCCL's communicators, for all-reduces ([`Self::use_communicators`]).
    communicators: Option<&'a Communicators>,
    _borrows: PhantomData<&'a mut ()>,
}

impl Gpu {
    /// A runner whose timeline comes from `source` (each op timed by it)
    /// and that makes each call as the loop makes it; `gated` holds its
    /// streams until the loop is issued (where the device supports it).
    /// `expected_ops` sizes the pool of timing events made in advance.
    pub fn runner<'a>(&self, source: TimelineSource, expected_ops: usize, gated: bool) -> Result<Runner<'a>> {
        // Enabling CUPTI is set-up (it instruments the context): done before
        // the base event, so its cost stays out of the run's time. If
        // another tool took CUPTI since it was probed, events time the run.
        let source = match source {
            TimelineSource::Cupti => match driver::activity::start() {
                Ok(()) => TimelineSource::Cupti,
                Err(e) => {
                    TimelineSource::fall_back_to_events(&e.to_string());
                    TimelineSource::Events
                }
            },
            other => other,
        };
        let pool = if source == TimelineSource::Events { EventPool::made(self, expected_ops * 2)? } else { EventPool::default() };
        let base_stream = self.stream()?;
        if source == TimelineSource::Cupti {
            wake_cupti(self, &base_stream)?;
        }
        let base = self.timing_event()?;
        let mut gate = if gated { Gate::take(self) } else { None };
        if let Some(g) = gate.as_mut() {
            if let Err(e) = g.hold(&base_stream) {
                g.release();
                return Err(e);
            }
        }
        // Built before anything else can fail: from here on, Drop opens the
        // gate, so no error leaves a stream waiting on a freed word.
        let gate_closed = gate.is_some();
        let mut r = Runner {
            gpus: vec![self.clone()],
            device_label: self.label(),
            schedule: Schedule::new(),
            lanes: Lanes::default(),
            streams: Vec::new(),
            stream_ends: Vec::new(),
            stream_starts: Vec::new(),
            devices: Vec::new(),
            hosts: Vec::new(),
            user_events: Vec::new(),
            replaced_events: Vec::new(),
            signals: Vec::new(),
            pool,
            pool_used: 0,
            marks: Vec::new(),
            source,
            cupti_streams: Vec::new(),
            gpu_ops: 0,
            behind_gate: 0,
            gate_closed,
            reusable_end: Vec::new(),
            deferred: None,
            at_once: None,
            exec: Exec {
                gpu: self.clone(),
                gate,
                base,
                base_stream,
                host_base: Instant::now(),
                cupti: source == TimelineSource::Cupti,
                cupti_t0: 0,
                host_times: Vec::new(),
                issue_spans: None,
                cpu: CpuThreads::default(),
                loop_start: None,
                gated: gate_closed,
            },
            capture: None,
            capture_broken: None,
            finished: false,
            communicators: None,
            _borrows: PhantomData,
        };
        // With no gate (asked, or not supported), ops start as issued, and
        // a traced run shows when the CPU issued them.
        r.schedule.issued_live = r.exec.gate.is_none();
        if r.schedule.issued_live && source != TimelineSource::Off {
            r.exec.issue_spans = Some(Vec::with_capacity(expected_ops * 2));
        }
        r.exec.base.record(&r.exec.base_stream)?;
        if r.exec.gate.is_none() {
            r.exec.align_clocks()?;
        }
        Ok(r)
    }

    /// A runner in capture mode: its loop's GPU work, events and waits are
    /// recorded into a CUDA graph (stream capture on the runner's own base
    /// stream, which every stream joins) instead of run; CPU waits, CPU
    /// work, memory calls and the legacy stream are refused, as a graph
    /// cannot hold them. [`Runner::finish_capture`] makes the graph.
    pub fn capture_runner<'a>(&self) -> Result<Runner<'a>> {
        let mut r = self.runner(TimelineSource::Off, 0, false)?;
        let fork = self.sync_event()?;
        // SAFETY: the base stream is the runner's own, created by this context.
        unsafe { driver::stream_begin_capture(r.exec.base_stream.raw()) }?;
        r.schedule.issued_live = false;
        // From here Drop ends the capture, whatever fails.
        r.capture.insert(fork).record(&r.exec.base_stream)?;
        Ok(r)
    }
}

impl<'a> Runner<'a> {
    /// This runner, deferring: the loop's calls are checked and recorded
    /// as they are made, and run at [`Self::finish`] (see the module docs).
    /// Refused once the loop began, and for a capture.
    pub fn deferring(mut self) -> Result<Runner<'a>> {
        if self.capture.is_some() || !self.schedule.ops.is_empty() || self.gpu_ops > 0 {
            return Err(LabError::config("a runner defers from its start, and a capture runs as issued"));
        }
        self.deferred = Some(Vec::new());
        Ok(self)
    }

    /// This deferring runner, its CPU threads making their calls at once
    /// at [`Self::finish`], each on its own OS thread, instead of taking
    /// turns: so a copy that blocks one thread (from pageable memory) does
    /// not hold up another's. What makes that safe is that nothing orders
    /// one thread's calls after another's: each stream takes the calls of
    /// one thread only, and events, waits, CPU work and memory calls are
    /// refused as they are made. [`Run::issue_ms_by_thread`] tells how long
    /// each thread's calls took.
    pub fn threads_at_once(mut self) -> Result<Runner<'a>> {
        if self.deferred.as_ref().is_none_or(|d| !d.is_empty()) {
            return Err(LabError::config("threads make their calls at once only in a deferring runner, from its start"));
        }
        self.at_once = Some(Vec::new());
        Ok(self)
    }

    /// Where threads make their calls at once: refuses a second thread on `lane`.
    fn one_thread_per_lane(&mut self, lane: usize) -> Result<()> {
        let thread = self.lanes.thread();
        let Some(callers) = self.at_once.as_mut() else { return Ok(()) };
        if callers.len() <= lane {
            callers.resize(lane + 1, None);
        }
        match *callers[lane].get_or_insert(thread) {
            t if t == thread => Ok(()),
            t => Err(LabError::config(format!(
                "{}: CPU threads {t} and {thread} both issue to it, but their calls are made at once, so nothing orders them",
                self.lanes.name(lane)
            ))),
        }
    }

    /// Makes `c`'s calls now, or keeps them for `finish` in a deferring runner.
    fn dispatch(&mut self, c: Command<'a>) -> Result<()> {
        if self.at_once.is_some() && !matches!(c.what, What::Copy { .. } | What::Kernel { .. } | What::Issue(_) | What::Blocking(_)) {
            return Err(LabError::config(
                "events, waits, CPU work, memory calls and a restarted clock order one CPU thread's calls after another's, which a runner whose threads make their calls at once cannot keep",
            ));
        }
        if matches!(c.what, What::Host { .. } | What::Blocking(_) | What::OpenGate) {
            self.gate_closed = false;
        }
        match self.deferred.as_mut() {
            Some(list) => {
                list.push(c);
                Ok(())
            }
            None => self.exec.run(c),
        }
    }

    /// A new slot for an op timed on the host clock.
    fn host_slot(&mut self) -> usize {
        self.exec.host_times.push((f64::NAN, f64::NAN));
        self.exec.host_times.len() - 1
    }

    /// Restarts the run's clock now, after its set-up (streams, buffers),
    /// so that with no gate its time counts from the loop's first call:
    /// what the CPU's issuing costs is in it, and nothing else. A deferring
    /// runner restarts it as its replay begins, whatever this says.
    pub fn start_clock(&mut self) -> Result<()> {
        if self.deferred.is_some() || self.capture.is_some() {
            return Ok(());
        }
        if self.gpu_ops > 0 || !self.schedule.ops.is_empty() {
            return Err(LabError::config("start_clock after the loop began"));
        }
        self.exec.restart_clock()
    }

    /// Adds stream `s` under `name`.
    pub fn stream(&mut self, s: &'a Stream, name: &str) -> StreamRef {
        let r = self.lanes.add(&mut self.schedule, StreamDecl::new(s.kind(), s.priority(), s.gpu().ordinal()), name);
        self.add_lane(r.0, s);
        r
    }

    /// The state of lane `lane` on stream `s`, set up from the thread whose
    /// lane it is: held behind the gate, an end event, CUPTI's name for it.
    /// Set-up, made at once even in a deferring runner.
    fn add_lane(&mut self, lane: usize, s: &'a Stream) {
        debug_assert_eq!(lane, self.streams.len());
        let owner = self.lanes.owner(lane);
        let gpu = s.gpu().clone();
        if !self.gpus.iter().any(|g| g.ordinal() == gpu.ordinal()) {
            self.join_gpu(&gpu);
        }
        if let Some(fork) = &self.capture {
            // Joins the capture: its work from here on is the graph's. A
            // stream that could not join would run its work for real: its
            // first op is refused instead.
            if let Err(e) = self.exec.cpu.run(owner, || s.wait_event(fork)) {
                self.capture_broken.get_or_insert(format!("a stream could not join the capture ({e})"));
            }
        }
        if self.exec.gate.is_some() {
            // Held behind the base event (itself behind the gate), so no op
            // can start before the base: every time is >= 0.
            let base = &self.exec.base;
            let start = gpu.timing_event();
            match self.exec.cpu.run(owner, || s.wait_event(base)) {
                Ok(()) => {
                    if let Ok(start) = start {
                        if self.exec.cpu.run(owner, || start.record(s)).is_ok() {
                            self.stream_starts.push(start);
                        }
                    }
                }
                Err(_) => {
                    // A stream that cannot be held would start early: start all.
                    let _ = self.exec.open_gate();
                    self.gate_closed = false;
                }
            }
        }
        // A runner that cannot make an event fails at its first op instead.
        if let Ok(e) = gpu.timing_event() {
            self.stream_ends.push(e);
        }
        if self.source == TimelineSource::Cupti {
            // A stream CUPTI cannot name gets u32::MAX: its ops then fail to
            // match, loudly. Another thread's per-thread stream has no handle
            // of its own to name: plans that use one are timed with events.
            let id = if owner == 0 {
                // SAFETY: the stream was created in this context and is borrowed for the runner's life.
                unsafe { driver::activity::stream_id(gpu.ctx.cu_ctx(), s.raw()) }.unwrap_or(u32::MAX)
            } else {
                u32::MAX
            };
            self.cupti_streams.push(id);
        }
        self.streams.push(s);
        self.reusable_end.push(None);
        // Making the end event made the stream's GPU current.
        let _ = self.exec.gpu.bind();
    }

    /// A stream of another GPU joins the runner: per-op CUDA events of two
    /// GPUs cannot be compared (cuEventElapsedTime takes one context's),
    /// so its timeline needs CUPTI; a graph this crate captures holds one
    /// GPU's streams.
    fn join_gpu(&mut self, gpu: &Gpu) {
        if self.capture.is_some() {
            self.capture_broken.get_or_insert(format!(
                "a stream of GPU {} joined a capture on GPU {}: a captured graph holds one GPU's streams",
                gpu.ordinal(),
                self.exec.gpu.ordinal()
            ));
        }
        if self.source == TimelineSource::Events {
            eprintln!("timeline: off for this run (per-op CUDA events cannot be compared across GPUs; a pipeline over several GPUs is timed by CUPTI, which another tool holds)");
            self.source = TimelineSource::Off;
        }
        self.gpus.push(gpu.clone());
    }

    /// Synchronizes every GPU the runner's streams belong to (cuCtxSynchronize on each).
    fn synchronize_gpus(&self) -> Result<()> {
        for g in &self.gpus {
            g.bind()?;
            driver::context_synchronize()?;
        }
        self.exec.gpu.bind()
    }

    /// The lane `s` means on the current thread, added on first use (a
    /// per-thread stream called from another thread).
    fn lane(&mut self, s: StreamRef) -> Result<usize> {
        if self.source == TimelineSource::Cupti && self.lanes.would_add(s) {
            return Err(LabError::config(
                "CUPTI cannot name another CPU thread's per-thread stream: time a pipeline of several threads with CUDA events (TimelineSource::Events)",
            ));
        }
        let (lane, new) = self.lanes.resolve(&mut self.schedule, s)?;
        if self.capture.is_some() && self.lanes.kind(lane) == StreamKind::Legacy {
            return Err(LabError::config(
                "the legacy NULL stream cannot be captured into a CUDA graph (it would wait on every blocking stream): use the loop's own streams",
            ));
        }
        if new {
            self.add_lane(lane, self.streams[s.0]);
        }
        Ok(lane)
    }

    /// The CPU thread that makes the calls that follow (see
    /// [`crate::pipeline::issue::Issue::issue_from`]); its OS thread is made on first use.
    pub fn issue_from(&mut self, thread: usize) -> Result<()> {
        self.lanes.issue_from(thread)?;
        let gpu = self.exec.gpu.clone();
        self.exec.cpu.ensure(&gpu, thread)
    }

    /// Refuses what a CUDA graph cannot hold, while capturing.
    fn not_captured(&self, what: &str) -> Result<()> {
        if self.capture.is_some() {
            return Err(LabError::config(format!(
                "{what} cannot be captured into a CUDA graph: a graph holds GPU work and the events that order it, and runs with no CPU in the loop"
            )));
        }
        Ok(())
    }

    /// Refuses what only a runner that makes each call at once can do.
    fn not_deferred(&self, what: &str) -> Result<()> {
        if self.deferred.is_some() {
            return Err(LabError::config(format!("{what} needs its result while the loop runs: use a runner that does not defer")));
        }
        Ok(())
    }

    /// Releases what the loop allocated and did not release (the device is
    /// idle: called after a context synchronize). Returns their names.
    fn release_leftovers(&mut self) -> Vec<String> {
        let mut names = Vec::new();
        let base_stream = self.exec.base_stream.raw();
        for e in self.devices.iter_mut().filter(|e| e.hold.leaked()) {
            let (Some(m), ptr) = (e.hold.memory, e.base.get()) else { continue };
            if ptr != 0 {
                let _ = match m {
                    // SAFETY: the loop's own pool allocation, released once,
                    // on the runner's live base stream; the device is idle
                    // (called after a synchronize), so no work still uses it.
                    Memory::Pool => unsafe { driver::mem_free_async(ptr, base_stream) }.and_then(|_| self.exec.base_stream.synchronize()),
                    // SAFETY: the loop's own cuMemAlloc allocation, released
                    // once; the device is idle, so no work still uses it.
                    _ => unsafe { driver::device_free(ptr) },
                };
                names.push(e.hold.name.clone());
            }
            e.hold.released_by(m);
        }
        for e in self.hosts.iter_mut().filter(|e| e.hold.leaked()) {
            let (Some(m), ptr) = (e.hold.memory, e.base.get() as *mut std::ffi::c_void) else { continue };
            if !ptr.is_null() {
                let _ = match m {
                    // SAFETY: the loop's own registration, released once; the
                    // device is idle, so no copy still uses it.
                    Memory::Registered => unsafe { driver::host_unregister(ptr) },
                    // SAFETY: the loop's own cuMemHostAlloc allocation,
                    // released once; the device is idle, so no copy uses it.
                    _ => unsafe { driver::host_free(ptr) },
                };
                names.push(e.hold.name.clone());
            }
            e.hold.released_by(m);
        }
        names
    }

    /// Ends a capture ([`Gpu::capture_runner`]): every stream joins the
    /// base stream again, and the captured graph is made executable. Also
    /// the schedule the loop made (its races, for the checker).
    pub fn finish_capture(mut self) -> Result<(Graph, Run)> {
        if self.capture.is_none() {
            return Err(LabError::config("finish_capture on a runner that was not capturing"));
        }
        if let Some(why) = &self.capture_broken {
            return Err(LabError::config(format!("the CUDA graph capture failed: {why}")));
        }
        // Each stream's last work joins the base stream, so the graph ends
        // when all of it has.
        let mut joins = Vec::with_capacity(self.streams.len());
        for (lane, s) in self.streams.iter().enumerate() {
            let join = self.exec.gpu.sync_event()?;
            self.exec.cpu.run(self.lanes.owner(lane), || join.record(s))?;
            self.exec.base_stream.wait_event(&join)?;
            joins.push(join);
        }
        self.capture = None;
        self.finished = true;
        // SAFETY: the base stream began capturing in `capture_runner`, on this thread.
        let graph = unsafe { driver::stream_end_capture(self.exec.base_stream.raw()) }?;
        // SAFETY: just captured in this context; the Graph owns it from here.
        let graph = unsafe { Graph::instantiate(&self.exec.gpu, graph) }?;
        Ok((graph, self.run(None, 0.0, Vec::new(), 0.0)))
    }

    /// Runs the loop (a deferring runner's recorded calls), waits for all
    /// work, then resolves the timeline and the races.
    pub fn finish(mut self) -> Result<Run> {
        if self.capture.is_some() {
            return Err(LabError::config("a capturing runner ends with finish_capture, which makes its graph"));
        }
        let replayed = self.replay()?;
        let (issue_ms, issue_ms_by_thread) = replayed.unwrap_or_else(|| {
            let ms = self.exec.loop_start.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
            (ms, vec![ms])
        });
        let gated = self.exec.gated && !super::gate::forced_open();
        self.exec.open_gate()?;
        if self.stream_ends.len() != self.streams.len() {
            return Err(LabError::Driver { call: "cuEventCreate", message: "could not make a stream's end event".into() });
        }
        for (lane, (s, e)) in self.streams.iter().zip(&self.stream_ends).enumerate() {
            // From the thread whose stream it is (a per-thread stream's handle means the caller's).
            self.exec.cpu.run(self.lanes.owner(lane), || e.record(s))?;
        }
        // Another GPU's stream ends are timed on this GPU's clock: the base
        // stream waits for them, then records when it got there.
        let own = self.exec.gpu.ordinal();
        let foreign: Vec<&Event> = self.stream_ends.iter().filter(|e| e.gpu.ordinal() != own).collect();
        let joined = if foreign.is_empty() {
            None
        } else {
            for e in &foreign {
                self.exec.base_stream.wait_event(e)?;
            }
            let joined = self.exec.gpu.timing_event()?;
            joined.record(&self.exec.base_stream)?;
            Some(joined)
        };
        self.synchronize_gpus()?;
        // Only now may the borrows end (an error above leaves Drop to wait).
        self.finished = true;
        let unreleased = self.release_leftovers();
        let mut total_ms = 0.0f64;
        for e in self.stream_ends.iter().filter(|e| e.gpu.ordinal() == own).chain(&joined) {
            total_ms = total_ms.max(self.exec.base.elapsed_ms(e)?);
        }
        // An op CUPTI's records do not match leaves the run with no
        // timeline, never a failed lab.
        let activity = if self.source == TimelineSource::Cupti {
            match timing::activity_times(&self.schedule, &self.cupti_streams, self.exec.cupti_t0) {
                Ok(a) => Some(a),
                Err(e) => {
                    eprintln!("timeline: off for this run ({e})");
                    self.source = TimelineSource::Off;
                    None
                }
            }
        } else {
            None
        };
        let mut times = match self.source {
            TimelineSource::Off => Vec::new(),
            _ => timing::op_times(&self.marks, &self.exec.base, &self.pool, activity.as_deref(), &self.exec.host_times)?,
        };
        // Behind a gate on one GPU, the run counts from when the first
        // stream could start, and so do its ops' times (never past the
        // first op's start, which another clock may put a little earlier).
        let mut shift_us = 0.0;
        if self.gpus.len() == 1 && !self.stream_starts.is_empty() && self.stream_starts.len() == self.streams.len() {
            let mut first = f64::INFINITY;
            for e in &self.stream_starts {
                first = first.min(self.exec.base.elapsed_ms(e)? * 1e3);
            }
            let earliest = times.iter().map(|t| t.0).filter(|t| t.is_finite()).fold(first, f64::min);
            shift_us = earliest.clamp(0.0, total_ms * 1e3);
            total_ms -= shift_us / 1e3;
            for t in &mut times {
                *t = (t.0 - shift_us, t.1 - shift_us);
            }
        }
        // Recorded only in a traced run, so every call recorded is drawn.
        let issue_spans = self.exec.issue_spans.take().unwrap_or_default();
        let calls_drawn = issue_spans.len();
        let timeline = (self.source != TimelineSource::Off).then(|| {
            let mut t = timing::measured_timeline(&self.device_label, &self.schedule, &times, &self.lanes.names(), self.source);
            t.spans.extend(timing::issue_spans(&issue_spans, shift_us));
            t
        });
        let mut run = self.run(timeline, total_ms, unreleased, issue_ms);
        (run.issue_ms_by_thread, run.gated, run.op_times_us, run.calls_drawn) = (issue_ms_by_thread, gated, times, calls_drawn);
        Ok(run)
    }

    /// What the runner leaves behind: its schedule (taken), races and
    /// lanes, with what `finish` or `finish_capture` measured.
    fn run(&mut self, timeline: Option<Timeline>, total_ms: f64, unreleased: Vec<String>, issue_ms: f64) -> Run {
        Run {
            races: self.schedule.races().to_vec(),
            schedule: std::mem::take(&mut self.schedule),
            timeline,
            op_times_us: Vec::new(),
            calls_drawn: 0,
            total_ms,
            stream_names: self.lanes.names(),
            unreleased,
            issue_ms,
            issue_ms_by_thread: vec![issue_ms],
            gated: false,
        }
    }
}

impl Drop for Runner<'_> {
    fn drop(&mut self) {
        // Recorded calls that never ran hold nothing the GPU uses.
        self.deferred = None;
        if self.capture.take().is_some() {
            // A capture that failed part way: end it (nothing ran) and
            // discard what it made, so the streams work again.
            let _ = self.exec.gpu.bind();
            // SAFETY: the base stream began capturing in `capture_runner`.
            if let Ok(g) = unsafe { driver::stream_end_capture(self.exec.base_stream.raw()) } {
                // SAFETY: the graph just returned, owned by no one else.
                let _ = unsafe { driver::graph_destroy(g) };
            }
        }
        if !self.finished {
            // Never let the borrows end while the GPU may still use the buffers.
            let _ = self.exec.gpu.bind();
            let _ = self.exec.open_gate();
            let _ = self.synchronize_gpus();
            self.release_leftovers();
            if self.source == TimelineSource::Cupti {
                let _ = driver::activity::finish();
            }
        }
    }
}

/// One tiny copy on `s` (not a stream of the run, so no record of it
/// counts) and a wait for it: CUPTI attaches to the context at the
/// first call it instruments after it was enabled, which takes the
/// issuing thread a millisecond or more; paid here, it stays out of
/// the run and out of the CPU's lane of its timeline.
fn wake_cupti(gpu: &Gpu, s: &Stream) -> Result<()> {
    let (a, b) = (gpu.alloc(4)?, gpu.alloc(4)?);
    // SAFETY: both buffers live until the stream has run the copy (waited for below).
    unsafe { s.enqueue_copy_on_device(b.span(), a.span(), 4) }?;
    s.synchronize()
}
