//! Building and running a copy/compute pipeline on real streams while
//! recording it: every operation goes into a [`Schedule`] (for race checking
//! and the queue model) and, when asked, is bracketed by CUDA events against
//! one base event (for the measured timeline).
//!
//! Streams start behind a gate ([`super::gate`]): the GPU starts the
//! pipeline when it is fully issued, or as soon as the CPU takes part (host
//! work, a host wait), so its time is device time, not the time the CPU took
//! to issue it.
//!
//! The pipeline borrows every buffer it uses for its whole life and
//! synchronizes before it ends (in `finish`, or on drop), so no buffer can be
//! freed or reused by Rust code while the GPU may still touch it. Inside the
//! pipeline, the order of GPU and CPU accesses is the learner's business: the
//! schedule reports any access not ordered after a conflicting one.

use super::copy::RawCopy;
use super::gate::Gate;
use super::nccl::Communicators;
use super::{driver, ComputeKernel, DeviceBuffer, DeviceSpan, Event, Gpu, Graph, HostBuffer, HostTask, Stream};
use crate::error::{LabError, Result};
use crate::gpu::trace;
use crate::pipeline::issue::{
    check_alloc, check_ranks, d2d_link, same_gpu, unique_name, DevRef, EventRef, Holding, HostRef, Issue, Lanes, SignalRef, StreamRef,
};
use crate::pipeline::schedule::{Access, Memory, OpId, OpKind, Race, Schedule, StreamDecl, StreamKind};
use crate::pipeline::timeline::Timeline;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;

/// A host buffer of the pipeline: the lab's (borrowed) or the loop's own
/// (the pipeline releases it at its end if the loop did not).
struct HostEntry {
    ptr: *mut u64,
    words: usize,
    hold: Holding,
    /// A copy from pageable memory blocks inside its call until its DMA
    /// ran, so the gate must open before one is issued.
    page_locked: bool,
}

/// A device buffer of the pipeline: the lab's (borrowed) or the loop's own.
struct DeviceEntry {
    span: DeviceSpan,
    hold: Holding,
    /// The GPU whose memory it is.
    gpu: Gpu,
}

/// Operations issued behind a closed gate before it opens anyway, so the
/// GPU's queues never fill while the CPU is still issuing (which would
/// block the CPU forever).
const MAX_GATED_OPS: usize = 256;

/// Where timing events came from: pre-created so creating them never lands
/// inside the issue loop.
struct EventPool {
    events: Vec<Event>,
    next: usize,
}

impl EventPool {
    fn take(&mut self, gpu: &Gpu) -> Result<usize> {
        if self.next == self.events.len() {
            self.events.push(gpu.timing_event()?);
        }
        self.next += 1;
        Ok(self.next - 1)
    }
}

/// What a finished pipeline leaves behind.
#[derive(Debug)]
pub struct PipelineRun {
    pub schedule: Schedule,
    /// Accesses not ordered after a conflicting earlier access.
    pub races: Vec<Race>,
    /// Per-op device/host times against the base event (when recorded).
    pub timeline: Option<Timeline>,
    /// Base event to the last stream's end, ms (events; always measured).
    pub total_ms: f64,
    /// What the loop allocated and never released (the pipeline released
    /// it after the run).
    pub unreleased: Vec<String>,
    /// Names given to the pipeline's streams, by stream index.
    pub stream_names: Vec<String>,
    /// Host time the loop took to issue, waits included, ms (set by the
    /// caller that ran the loop; 0 when none did).
    pub issue_ms: f64,
    /// Of that, the time inside the driver's calls that issue GPU work
    /// (copies, kernels, creating and recording events, stream waits), ms:
    /// the rest is the loop's own and this crate's bookkeeping (the schedule).
    pub driver_ms: f64,
}

impl PipelineRun {
    /// The run's timeline when it has a span for every op: none, or only
    /// some, where another tool held CUPTI or a source missed records.
    pub fn full_timeline(&self) -> Option<&Timeline> {
        self.timeline.as_ref().filter(|t| t.spans.len() == self.schedule.ops.len())
    }
    /// The queue model's timeline for this run's schedule, each op lasting
    /// `duration_us(op)`.
    pub fn predicted(&self, machine: crate::pipeline::schedule::Machine, duration_us: impl Fn(&crate::pipeline::schedule::Op) -> f64) -> Timeline {
        let times = crate::pipeline::schedule::predict(&self.schedule, machine, duration_us);
        let device = self.timeline.as_ref().map(|t| t.device.clone()).unwrap_or_default();
        Timeline::from_schedule("predicted", &device, &self.schedule, &times, &self.stream_names)
    }
}

pub struct Pipeline<'a> {
    /// Its own GPU: the base event, the gate, the memory calls.
    gpu: Gpu,
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
    /// The OS threads that make the calls of threads 1, 2, ..., and the
    /// time spent in the driver's issuing calls.
    cpu: CpuThreads,
    /// One per lane, made when the lane is added: recorded last in
    /// `finish`, so creating them never lands after the timed work.
    stream_ends: Vec<Event>,
    devices: Vec<DeviceEntry>,
    hosts: Vec<HostEntry>,
    /// Shared, so a thread of the lab can wait on one ([`Pipeline::shared_event`]).
    user_events: Vec<Arc<Event>>,
    /// Each signal's flag and host function op ([`Self::signal`]).
    signals: Vec<(Arc<super::host_fn::Flag>, OpId)>,
    pool: EventPool,
    /// (start event, end event) per GPU op, or host (start, end) µs per host op.
    marks: Vec<Mark>,
    source: TimelineSource,
    /// CUPTI: clock at the start (ns), stream ids, GPU ops issued so far.
    cupti_t0: u64,
    cupti_streams: Vec<u32>,
    gpu_ops: usize,
    /// Per stream: the pool event recorded at the end of its last op, while it
    /// may still serve as the next op's start (nothing has happened between).
    reusable_end: Vec<Option<usize>>,
    base: Event,
    /// The stream the base event is recorded on (held behind the gate too).
    base_stream: Stream,
    /// Closed while Some; opened once, then given back to the device.
    gate: Option<Gate>,
    host_base: Instant,
    /// Capture mode ([`Gpu::capture_pipeline`]): the event recorded on the
    /// base stream as its capture began, which every stream waits on to
    /// join the capture; None when the pipeline runs.
    capture: Option<Event>,
    /// Why the capture cannot go on (a stream failed to join it).
    capture_broken: Option<String>,
    finished: bool,
    /// NCCL's communicators, for all-reduces ([`Self::use_communicators`]).
    communicators: Option<&'a Communicators>,
    _borrows: PhantomData<&'a mut ()>,
}

enum Mark {
    /// Pool events bracketing the op.
    Gpu(usize, usize),
    /// Timed by CUPTI: the op's place among the pipeline's GPU ops.
    Activity(usize),
    Host(f64, f64),
    None,
    /// Timed by the thread that runs it (a host function, a worker): not
    /// on this pipeline's timeline.
    Elsewhere,
}

/// What times a pipeline's operations for its timeline.
///
/// Measured on the lent H200 (`crate/examples/timeline_cost.rs`, balanced
/// 32-chunk pipeline, 64 copies and 32 kernels in ~3 ms): a kernel costs
/// nothing to trace with CUPTI (its timestamps come from the hardware's
/// launch and completion); a copy costs ~0.7 µs per timestamp with CUPTI and
/// ~1.3 µs per CUDA event (the copy engine drains before writing it). So
/// CUPTI is the default: exact spans, about half the cost of events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimelineSource {
    /// No per-op timing (only the total).
    Off,
    /// CUDA events around each op: works everywhere; a span includes time
    /// queued at the head of its stream.
    Events,
    /// CUPTI activity records: the hardware's own timestamps, nothing added
    /// to the streams. Needs libcupti.
    Cupti,
}

impl TimelineSource {
    /// For pure-GPU pipelines: CUPTI when the library loads, else events.
    pub fn best() -> TimelineSource {
        Self::preferring(TimelineSource::Cupti)
    }
    /// For pipelines the CPU takes part in (host work, host waits): events.
    /// CUPTI instruments every API call on the CPU, and there that cost
    /// lands inside the timed span: +16.6% on lab 3's double buffer on the
    /// lent H200.
    pub fn for_host_pipeline() -> TimelineSource {
        Self::preferring(TimelineSource::Events)
    }
    /// `default`, unless OVERLAP_LAB_TIMELINE=events|cupti says otherwise;
    /// events wherever CUPTI cannot record (no libcupti, or another tool
    /// already subscribed to it), with one line on stderr saying why.
    fn preferring(default: TimelineSource) -> TimelineSource {
        let wanted = match std::env::var("OVERLAP_LAB_TIMELINE").as_deref() {
            Ok("events") => TimelineSource::Events,
            Ok("cupti") => TimelineSource::Cupti,
            _ => default,
        };
        if wanted != TimelineSource::Cupti {
            return wanted;
        }
        // Probed once per process: attaching costs a few ms.
        static CUPTI: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
        match CUPTI.get_or_init(|| if driver::activity::available() { driver::activity::probe() } else { Err("libcupti could not be loaded".into()) }) {
            Ok(()) => TimelineSource::Cupti,
            Err(why) => {
                Self::fall_back_to_events(why);
                TimelineSource::Events
            }
        }
    }

    /// Says once per process why the timeline is timed by CUDA events
    /// instead of CUPTI.
    fn fall_back_to_events(why: &str) {
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
            eprintln!("{}", Self::fallback_line(why));
        }
    }

    /// The line [`Self::fall_back_to_events`] prints.
    pub fn fallback_line(why: &str) -> String {
        let who = if why.contains("MULTIPLE_SUBSCRIBERS") { " (another tool holds CUPTI: compute-sanitizer, Nsight Systems or Nsight Compute)" } else { "" };
        format!("overlap-lab: CUPTI cannot record here{who}: {why}; timelines are timed with CUDA events instead, and records say \"cuda events\"")
    }
    pub fn label(self) -> &'static str {
        match self {
            TimelineSource::Off => "off",
            TimelineSource::Events => "cuda events",
            TimelineSource::Cupti => "cupti",
        }
    }
}

impl Gpu {
    /// Starts a pipeline; with `timeline`, every GPU op is timed by the
    /// best available source ([`TimelineSource::best`]).
    pub fn pipeline<'a>(&self, timeline: bool, expected_ops: usize) -> Result<Pipeline<'a>> {
        self.pipeline_timed(if timeline { TimelineSource::best() } else { TimelineSource::Off }, expected_ops, true)
    }

    /// A pipeline whose timeline comes from `source`; `gated` holds its
    /// streams until it is issued (where the device supports it).
    pub fn pipeline_timed<'a>(&self, source: TimelineSource, expected_ops: usize, gated: bool) -> Result<Pipeline<'a>> {
        // Enabling CUPTI is set-up (it instruments the context): done before
        // the base event, so its cost stays out of the pipeline's time. If
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
        let mut events = Vec::new();
        if source == TimelineSource::Events {
            for _ in 0..expected_ops * 2 {
                events.push(self.timing_event()?);
            }
        }
        let base_stream = self.stream()?;
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
        let mut p = Pipeline {
            gpu: self.clone(),
            gpus: vec![self.clone()],
            device_label: self.label(),
            schedule: Schedule::new(),
            lanes: Lanes::default(),
            streams: Vec::new(),
            cpu: CpuThreads::default(),
            stream_ends: Vec::new(),
            devices: Vec::new(),
            hosts: Vec::new(),
            user_events: Vec::new(),
            signals: Vec::new(),
            pool: EventPool { events, next: 0 },
            marks: Vec::new(),
            source,
            cupti_t0: 0,
            cupti_streams: Vec::new(),
            gpu_ops: 0,
            reusable_end: Vec::new(),
            base,
            base_stream,
            gate,
            host_base: Instant::now(),
            capture: None,
            capture_broken: None,
            finished: false,
            communicators: None,
            _borrows: PhantomData,
        };
        // With no gate (asked, or not supported), ops start as issued.
        p.schedule.issued_live = p.gate.is_none();
        p.base.record(&p.base_stream)?;
        if p.gate.is_none() {
            p.align_clocks()?;
        }
        Ok(p)
    }
}

impl Gpu {
    /// A pipeline in capture mode: its loop's GPU work, events and waits
    /// are recorded into a CUDA graph (stream capture on the pipeline's own
    /// base stream, which every stream joins) instead of run; CPU waits,
    /// CPU work, memory calls and the legacy stream are refused, as a graph
    /// cannot hold them. [`Pipeline::finish_capture`] makes the graph.
    pub fn capture_pipeline<'a>(&self) -> Result<Pipeline<'a>> {
        let mut p = self.pipeline_timed(TimelineSource::Off, 0, false)?;
        let fork = self.sync_event()?;
        // SAFETY: the base stream is the pipeline's own, created by this context.
        unsafe { driver::stream_begin_capture(p.base_stream.raw()) }?;
        p.schedule.issued_live = false;
        // From here Drop ends the capture, whatever fails.
        p.capture.insert(fork).record(&p.base_stream)?;
        Ok(p)
    }
}

impl<'a> Pipeline<'a> {
    /// Waits for the base event, then reads the host clock (and CUPTI's):
    /// the base completes as soon as its stream runs, so the clocks align
    /// within a few µs.
    fn align_clocks(&mut self) -> Result<()> {
        self.base.synchronize()?;
        self.host_base = Instant::now();
        if self.source == TimelineSource::Cupti {
            self.cupti_t0 = driver::activity::now()?;
        }
        Ok(())
    }

    /// With no gate, restarts the pipeline's clock now, after its set-up
    /// (streams, buffers), so its time counts from the loop's first call:
    /// what the CPU's issuing costs is in it, and nothing else.
    pub fn start_clock(&mut self) -> Result<()> {
        if self.gate.is_some() || self.capture.is_some() {
            return Ok(());
        }
        if self.gpu_ops > 0 || !self.schedule.ops.is_empty() {
            return Err(LabError::config("start_clock after the loop began"));
        }
        self.base.record(&self.base_stream)?;
        self.align_clocks()
    }

    /// Lets the GPU start everything issued so far (once).
    fn open_gate(&mut self) -> Result<()> {
        if let Some(mut g) = self.gate.take() {
            g.release();
            g.put_back(&self.gpu);
            self.align_clocks()?;
        }
        Ok(())
    }

    pub fn stream(&mut self, s: &'a Stream, name: &str) -> StreamRef {
        let r = self.lanes.add(&mut self.schedule, StreamDecl::new(s.kind(), s.priority(), s.gpu().ordinal()), name);
        self.add_lane(r.0, s);
        r
    }

    /// The state of lane `lane` on stream `s`, set up from the thread whose
    /// lane it is: held behind the gate, an end event, CUPTI's name for it.
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
            if let Err(e) = self.cpu.run(owner, || s.wait_event(fork)) {
                self.capture_broken.get_or_insert(format!("a stream could not join the capture ({e})"));
            }
        }
        if self.gate.is_some() {
            // Held behind the base event (itself behind the gate), so no op
            // can start before the base: every time is >= 0.
            let base = &self.base;
            // SAFETY: the stream is borrowed for the pipeline's life; the base event is the pipeline's own.
            if self.cpu.run(owner, || unsafe { driver::stream_wait_event(s.raw(), base.raw) }).is_err() {
                // A stream that cannot be held would start early: start all.
                let _ = self.open_gate();
            }
        }
        // A pipeline that cannot make an event fails at its first op instead.
        if let Ok(e) = gpu.timing_event() {
            self.stream_ends.push(e);
        }
        if self.source == TimelineSource::Cupti {
            // A stream CUPTI cannot name gets u32::MAX: its ops then fail to
            // match, loudly. Another thread's per-thread stream has no handle
            // of its own to name: plans that use one are timed with events.
            let id = if owner == 0 {
                // SAFETY: the stream was created in this context and is borrowed for the pipeline's life.
                unsafe { driver::activity::stream_id(gpu.ctx.cu_ctx(), s.raw()) }.unwrap_or(u32::MAX)
            } else {
                u32::MAX
            };
            self.cupti_streams.push(id);
        }
        self.streams.push(s);
        self.reusable_end.push(None);
        // Making the end event made the stream's GPU current.
        let _ = self.gpu.bind();
    }

    /// A stream of another GPU joins the pipeline: per-op CUDA events of
    /// two GPUs cannot be compared (cuEventElapsedTime takes one context's),
    /// so its timeline needs CUPTI; a graph this crate captures holds one
    /// GPU's streams.
    fn join_gpu(&mut self, gpu: &Gpu) {
        if self.capture.is_some() {
            self.capture_broken.get_or_insert(format!(
                "a stream of GPU {} joined a capture on GPU {}: a captured graph holds one GPU's streams",
                gpu.ordinal(),
                self.gpu.ordinal()
            ));
        }
        if self.source == TimelineSource::Events {
            eprintln!("timeline: off for this run (per-op CUDA events cannot be compared across GPUs; a pipeline over several GPUs is timed by CUPTI, which another tool holds)");
            self.source = TimelineSource::Off;
        }
        self.gpus.push(gpu.clone());
    }

    /// Synchronizes every GPU the pipeline's streams belong to (cuCtxSynchronize on each).
    fn synchronize_gpus(&self) -> Result<()> {
        for g in &self.gpus {
            g.bind()?;
            driver::context_synchronize()?;
        }
        self.gpu.bind()
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
    /// [`Issue::issue_from`]); its OS thread is made on first use.
    pub fn issue_from(&mut self, thread: usize) -> Result<()> {
        self.lanes.issue_from(thread)?;
        self.cpu.ensure(&self.gpu, thread)
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

    pub fn device(&mut self, d: &'a DeviceBuffer, name: &str) -> DevRef {
        self.devices.push(DeviceEntry { span: d.span(), hold: Holding::lab(name), gpu: d.gpu().clone() });
        DevRef(self.devices.len() - 1)
    }
    /// Borrows a host buffer exclusively for the pipeline's life.
    pub fn host(&mut self, h: &'a mut dyn HostBuffer, name: &str) -> HostRef {
        let words = h.words().len();
        let page_locked = h.kind().is_page_locked();
        let ptr = h.words_mut().as_mut_ptr();
        self.hosts.push(HostEntry { ptr, words, hold: Holding::lab(name), page_locked });
        HostRef(self.hosts.len() - 1)
    }
    /// An event for dependencies (record / wait / host_wait). It takes no
    /// timestamp: a timed event costs the engine that records it a flush.
    pub fn event(&mut self) -> Result<EventRef> {
        let gpu = &self.gpu;
        let event = self.cpu.driver_call(self.lanes.thread(), || gpu.sync_event())?;
        self.user_events.push(Arc::new(event));
        Ok(EventRef(self.user_events.len() - 1))
    }

    fn host_range(&self, h: HostRef, at: usize, bytes: usize) -> Result<(*mut u64, Access)> {
        let e = self.host_entry(h)?;
        e.hold.live()?;
        if at % 8 != 0 || bytes % 8 != 0 || bytes == 0 || at.checked_add(bytes).is_none_or(|end| end > e.words * 8) {
            return Err(LabError::config(format!("{} bytes at {at} do not fit host buffer {} ({} bytes, 8-byte aligned)", bytes, e.hold.name, e.words * 8)));
        }
        // SAFETY: in bounds (checked above).
        let p = unsafe { e.ptr.add(at / 8) };
        Ok((p, Access { buffer: e.hold.name.clone(), start: at as u64, end: (at + bytes) as u64, write: false }))
    }
    /// A copy's host side; a pageable one opens the gate first, since such
    /// a call blocks until its DMA ran.
    fn copy_host_range(&mut self, h: HostRef, at: usize, bytes: usize) -> Result<(*mut u64, Access)> {
        let r = self.host_range(h, at, bytes)?;
        if !self.hosts[h.0].page_locked {
            self.open_gate()?;
        }
        Ok(r)
    }
    fn dev_range(&self, d: DevRef, at: usize, bytes: usize) -> Result<(u64, Access)> {
        let e = self.device_entry(d)?;
        e.hold.live()?;
        let (buf, name) = (e.span, &e.hold.name);
        if bytes == 0 || at.checked_add(bytes).is_none_or(|end| end > buf.bytes) {
            return Err(LabError::config(format!("{bytes} bytes at {at} do not fit device buffer {name} ({} bytes)", buf.bytes)));
        }
        Ok((buf.ptr + at as u64, Access { buffer: name.clone(), start: at as u64, end: (at + bytes) as u64, write: false }))
    }

    /// Runs `issue` bracketed by timeline events on `s`, from the current
    /// CPU thread.
    fn gpu_op(&mut self, s: StreamRef, kind: OpKind, label: &str, accesses: Vec<Access>, issue: impl FnOnce(&Stream) -> Result<()> + Send) -> Result<OpId> {
        let _r = trace::range(&format!("enqueue: {label}"));
        let lane = self.lane(s)?;
        let (mark, start, end) = self.op_marks(lane)?;
        let stream = self.streams[lane];
        let events = &self.pool.events;
        // Over several GPUs, calls go to the stream's GPU's context.
        let bind = (self.gpus.len() > 1).then(|| stream.gpu().clone());
        self.cpu.driver_call(self.lanes.thread(), || {
            if let Some(g) = bind {
                g.bind()?;
            }
            if let Some(a) = start {
                events[a].record(stream)?;
            }
            issue(stream)?;
            end.map_or(Ok(()), |b| events[b].record(stream))
        })?;
        let id = self.schedule.gpu_op(self.lanes.thread(), lane, kind, label, accesses);
        self.marks.push(mark);
        Ok(id)
    }

    /// One more GPU op on lane `lane`: how it is timed (its mark), and the
    /// pool events to record before it (None: the previous op's end is its
    /// start) and after it.
    fn op_marks(&mut self, lane: usize) -> Result<(Mark, Option<usize>, Option<usize>)> {
        if let Some(why) = &self.capture_broken {
            return Err(LabError::config(format!("the CUDA graph capture failed: {why}")));
        }
        if self.gpu_ops >= MAX_GATED_OPS {
            self.open_gate()?;
        }
        self.gpu_ops += 1;
        Ok(match self.source {
            TimelineSource::Cupti => (Mark::Activity(self.gpu_ops - 1), None, None),
            TimelineSource::Events => {
                // Each timed event after a copy costs the copy engine a flush, so
                // events are shared: the previous op's end on this stream is this
                // op's start, unless something (a wait, host work) came between.
                let (a, fresh) = match self.reusable_end[lane] {
                    Some(e) => (e, false),
                    None => (self.pool.take(&self.gpu)?, true),
                };
                let b = self.pool.take(&self.gpu)?;
                self.reusable_end[lane] = Some(b);
                (Mark::Gpu(a, b), fresh.then_some(a), Some(b))
            }
            TimelineSource::Off => (Mark::None, None, None),
        })
    }

    /// The NCCL communicators [`Self::all_reduce`] uses: one per GPU of
    /// the all-reduces' ranks, in their order.
    pub fn use_communicators(&mut self, c: &'a Communicators) {
        self.communicators = Some(c);
    }

    /// Sums `bytes` at byte `at` of each rank's device buffer in place
    /// across the ranks (an NCCL all-reduce, one grouped call): `ranks`
    /// holds a (stream, buffer) per GPU of the pipeline's communicators,
    /// in their order. Each rank's part is an op on its stream, timed like
    /// any other.
    pub fn all_reduce(&mut self, ranks: &[(StreamRef, DevRef)], at: usize, bytes: usize, label: &str) -> Result<()> {
        let _r = trace::range(&format!("enqueue: {label}"));
        self.not_captured("an all-reduce")?;
        // NCCL's communicators are used by one thread: the loop's.
        self.lanes.on_loop_thread("an all-reduce")?;
        let Some(comms) = self.communicators else {
            return Err(LabError::config(
                "an all-reduce needs NCCL: this pipeline has no communicators (run the plan on a rig made with NCCL, PlanRig::with_nccl)",
            ));
        };
        if bytes % 4 != 0 {
            return Err(LabError::config(format!("an all-reduce of {bytes} bytes: give whole f32 elements")));
        }
        let mut parts = Vec::with_capacity(ranks.len());
        for &(s, d) in ranks {
            let lane = self.lane(s)?;
            let (ptr, access) = self.dev_range(d, at, bytes)?;
            parts.push((lane, d, ptr, access));
        }
        let sides: Vec<(&str, usize, &str, usize)> = parts
            .iter()
            .map(|(lane, d, _, a)| (self.lanes.name(*lane), self.streams[*lane].gpu().ordinal(), a.buffer.as_str(), self.devices[d.0].gpu.ordinal()))
            .collect();
        let kind = OpKind::AllReduce(check_ranks(&sides)?);
        let gpus: Vec<usize> = sides.iter().map(|s| s.1).collect();
        if gpus != comms.ordinals() {
            return Err(LabError::config(format!(
                "an all-reduce over GPUs {gpus:?}, and NCCL's communicators are for GPUs {:?}: give one (stream, buffer) per GPU, in that order",
                comms.ordinals()
            )));
        }
        let mut marks = Vec::with_capacity(parts.len());
        for &(lane, ..) in &parts {
            marks.push(self.op_marks(lane)?);
        }
        let events = &self.pool.events;
        let spans: Vec<(DeviceSpan, &Stream)> = parts.iter().map(|&(lane, _, ptr, _)| (DeviceSpan { ptr, bytes }, self.streams[lane])).collect();
        let called = Instant::now();
        let issued = (|| {
            for ((_, start, _), (_, s)) in marks.iter().zip(&spans) {
                if let Some(a) = start {
                    s.gpu().bind()?;
                    events[*a].record(s)?;
                }
            }
            // SAFETY: each span lies in its buffer (dev_range), which the
            // pipeline borrows until it has synchronized every GPU.
            unsafe { comms.all_reduce_spans(&spans) }?;
            for ((_, _, end), (_, s)) in marks.iter().zip(&spans) {
                if let Some(b) = end {
                    s.gpu().bind()?;
                    events[*b].record(s)?;
                }
            }
            self.gpu.bind()
        })();
        self.cpu.in_driver += called.elapsed();
        issued?;
        let accesses: Vec<(usize, Vec<Access>)> = parts.into_iter().map(|(lane, _, _, a)| (lane, vec![a.clone(), Access { write: true, ..a }])).collect();
        self.schedule.collective(self.lanes.thread(), &accesses, kind, label);
        self.marks.extend(marks.into_iter().map(|m| m.0));
        Ok(())
    }

    /// Copies `bytes` from host buffer `src` at byte `src_at` to device `dst` at `dst_at`.
    pub fn h2d(&mut self, s: StreamRef, dst: DevRef, dst_at: usize, src: HostRef, src_at: usize, bytes: usize, label: &str) -> Result<()> {
        self.on_stream_gpu(s, dst, "an H2D")?;
        let (hp, mut ha) = self.copy_host_range(src, src_at, bytes)?;
        let (dp, mut da) = self.dev_range(dst, dst_at, bytes)?;
        ha.write = false;
        da.write = true;
        let copy = RawCopy { up: true, host: hp as *mut c_void, device: dp, bytes };
        // SAFETY: ranges checked; the pipeline holds both borrows until it synchronizes.
        self.gpu_op(s, OpKind::H2d, label, vec![ha, da], move |st| unsafe { copy.enqueue(st) }).map(|_| ())
    }

    /// Copies `bytes` from device `src` at `src_at` to host buffer `dst` at byte `dst_at`.
    pub fn d2h(&mut self, s: StreamRef, dst: HostRef, dst_at: usize, src: DevRef, src_at: usize, bytes: usize, label: &str) -> Result<()> {
        self.on_stream_gpu(s, src, "a D2H")?;
        let (hp, mut ha) = self.copy_host_range(dst, dst_at, bytes)?;
        let (dp, mut da) = self.dev_range(src, src_at, bytes)?;
        ha.write = true;
        da.write = false;
        let copy = RawCopy { up: false, host: hp as *mut c_void, device: dp, bytes };
        // SAFETY: as for h2d.
        self.gpu_op(s, OpKind::D2h, label, vec![da, ha], move |st| unsafe { copy.enqueue(st) }).map(|_| ())
    }

    /// Copies `bytes` from device `src` at `src_at` to device `dst` at
    /// `dst_at`: within one GPU, or from one GPU's memory to another's (a
    /// peer copy, on a stream of either GPU).
    pub fn d2d(&mut self, s: StreamRef, dst: DevRef, dst_at: usize, src: DevRef, src_at: usize, bytes: usize, label: &str) -> Result<()> {
        let (sp, mut sa) = self.dev_range(src, src_at, bytes)?;
        let (dp, mut da) = self.dev_range(dst, dst_at, bytes)?;
        sa.write = false;
        da.write = true;
        let lane = self.lane(s)?;
        let (src_gpu, dst_gpu) = (self.devices[src.0].gpu.clone(), self.devices[dst.0].gpu.clone());
        let link = d2d_link(self.streams[lane].gpu().ordinal(), self.lanes.name(lane), (src_gpu.ordinal(), &sa.buffer), (dst_gpu.ordinal(), &da.buffer))?;
        let (to, from) = (DeviceSpan { ptr: dp, bytes }, DeviceSpan { ptr: sp, bytes });
        // The copy within a GPU refuses overlapping ranges (two GPUs'
        // memories cannot overlap); the pipeline holds both buffers'
        // borrows until it synchronizes.
        self.gpu_op(s, OpKind::D2d(link), label, vec![sa, da], move |st| {
            if link.is_peer() {
                st.enqueue_peer_copy(to, &dst_gpu, from, &src_gpu, bytes)
            } else {
                st.enqueue_copy_on_device(to, from, bytes)
            }
        })
        .map(|_| ())
    }

    /// Refuses `what` on `s` touching device buffer `d` of another GPU ([`same_gpu`]).
    fn on_stream_gpu(&mut self, s: StreamRef, d: DevRef, what: &str) -> Result<()> {
        let lane = self.lane(s)?;
        let e = self.device_entry(d)?;
        same_gpu(what, (self.lanes.name(lane), self.streams[lane].gpu().ordinal()), (&e.hold.name, e.gpu.ordinal()))
    }

    /// `output[out_at..+n] = compute(input[in_at..+n])`, indices in f32 elements.
    #[allow(clippy::too_many_arguments)]
    pub fn compute(
        &mut self,
        s: StreamRef,
        k: &'a ComputeKernel,
        input: DevRef,
        in_at: usize,
        output: DevRef,
        out_at: usize,
        n: usize,
        iterations: i32,
        label: &str,
    ) -> Result<()> {
        self.on_stream_gpu(s, input, "a kernel")?;
        self.on_stream_gpu(s, output, "a kernel")?;
        let (_, mut ia) = self.dev_range(input, in_at * 4, n * 4)?;
        let (_, mut oa) = self.dev_range(output, out_at * 4, n * 4)?;
        ia.write = false;
        oa.write = true;
        let (ib, ob) = (self.devices[input.0].span, self.devices[output.0].span);
        self.gpu_op(s, OpKind::Kernel, label, vec![ia, oa], |st| k.enqueue(st, ib, in_at, ob, out_at, n, iterations)).map(|_| ())
    }

    /// A lab's own GPU operation (a kernel or copy of its own buffers):
    /// `enqueue` puts it on the stream; `accesses` name what it reads and
    /// writes, for the race check. Timed and ordered like every other op.
    pub fn op(&mut self, s: StreamRef, kind: OpKind, label: &str, accesses: Vec<Access>, enqueue: impl FnOnce(&Stream) -> Result<()> + Send) -> Result<OpId> {
        self.gpu_op(s, kind, label, accesses, enqueue)
    }

    /// A host function on `s` (cuLaunchHostFunc): `task` runs on the
    /// driver's callback thread once `s` reaches it, and `s` waits for it.
    /// Timed by the task itself, not on this pipeline's timeline.
    pub fn host_fn<T: HostTask>(&mut self, s: StreamRef, label: &str, accesses: Vec<Access>, task: T) -> Result<OpId> {
        self.not_captured("a host function")?;
        self.lanes.on_loop_thread("a host function")?;
        let lane = self.lane(s)?;
        // The CPU takes part from here: the GPU must be running.
        self.open_gate()?;
        self.streams[lane].launch_host_task(task)?;
        // The stream waits for the CPU: its next op does not start where this one was issued.
        self.reusable_end[lane] = None;
        let id = self.schedule.gpu_op(0, lane, OpKind::Host, label, accesses);
        self.marks.push(Mark::Elsewhere);
        Ok(id)
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

    /// Event `e`, for another thread to wait on.
    pub fn shared_event(&self, e: EventRef) -> Arc<Event> {
        self.user_events[e.0].clone()
    }

    /// The host clock this pipeline's timeline counts from.
    pub fn host_base(&self) -> Instant {
        self.host_base
    }

    /// cuEventRecord: `e` completes when `s` has done everything issued so far.
    pub fn record(&mut self, e: EventRef, s: StreamRef) -> Result<()> {
        let lane = self.lane(s)?;
        let (mut event, stream) = (self.user_event(e)?, self.streams[lane]);
        if event.gpu.ordinal() != stream.gpu().ordinal() {
            // An event is recorded on its own context's streams: a record
            // on another GPU's stream takes a new event there (a wait
            // takes the latest record, as CUDA's does).
            let gpu = stream.gpu().clone();
            event = Arc::new(self.cpu.driver_call(self.lanes.thread(), || gpu.sync_event())?);
            self.user_events[e.0] = event.clone();
            self.gpu.bind()?;
        }
        self.cpu.driver_call(self.lanes.thread(), || event.record(stream))?;
        self.schedule.record_event(e.0, lane);
        Ok(())
    }
    /// cuStreamWaitEvent: later work on `s` waits for `e`.
    pub fn wait(&mut self, s: StreamRef, e: EventRef) -> Result<()> {
        let lane = self.lane(s)?;
        let (event, stream) = (self.user_event(e)?, self.streams[lane]);
        self.cpu.driver_call(self.lanes.thread(), || stream.wait_event(&event))?;
        self.reusable_end[lane] = None;
        self.schedule.stream_wait_event(lane, e.0);
        Ok(())
    }
    /// cuEventSynchronize: the CPU waits for `e`.
    pub fn host_wait(&mut self, e: EventRef) -> Result<()> {
        self.not_captured("a CPU wait (cuEventSynchronize)")?;
        let _r = trace::range("host waits on event");
        self.open_gate()?;
        let event = self.user_event(e)?;
        self.cpu.run(self.lanes.thread(), || event.synchronize())?;
        self.forget_reusable_ends();
        self.schedule.host_wait_event(self.lanes.thread(), e.0);
        Ok(())
    }
    /// [`Issue::signal`]: a host function on `s` that raises a flag.
    pub fn signal(&mut self, s: StreamRef, label: &str) -> Result<SignalRef> {
        let flag = Arc::new(super::host_fn::Flag::default());
        let id = self.host_fn(s, label, Vec::new(), super::host_fn::Raise(flag.clone()))?;
        self.signals.push((flag, id));
        Ok(SignalRef(self.signals.len() - 1))
    }
    /// [`Issue::host_wait_signal`]: the CPU sleeps until the flag is raised.
    pub fn host_wait_signal(&mut self, g: SignalRef) -> Result<()> {
        self.lanes.on_loop_thread("a wait for a host function")?;
        let (flag, id) =
            self.signals.get(g.0).cloned().ok_or_else(|| LabError::config(format!("signal {} was never made ({} exist)", g.0, self.signals.len())))?;
        let _r = trace::range("host waits for a host function");
        if !flag.wait(SIGNAL_TIMEOUT) {
            return Err(LabError::config(format!(
                "a host function did not run within {} s of the CPU waiting for it: its stream never reached it (is it waiting for an event recorded later?)",
                SIGNAL_TIMEOUT.as_secs()
            )));
        }
        self.learns(0, id);
        Ok(())
    }
    /// cuStreamSynchronize: the CPU waits for everything issued to `s`.
    pub fn host_sync(&mut self, s: StreamRef) -> Result<()> {
        self.not_captured("a CPU wait (cuStreamSynchronize)")?;
        let lane = self.lane(s)?;
        self.open_gate()?;
        let stream = self.streams[lane];
        self.cpu.run(self.lanes.thread(), || stream.synchronize())?;
        self.forget_reusable_ends();
        self.schedule.host_wait_stream(self.lanes.thread(), lane);
        Ok(())
    }
    fn user_event(&self, e: EventRef) -> Result<Arc<Event>> {
        self.user_events.get(e.0).cloned().ok_or_else(|| LabError::config(format!("event {} was never made", e.0)))
    }

    fn host_op<R>(&mut self, label: &str, h: HostRef, at: usize, bytes: usize, write: bool, f: impl FnOnce(&mut [u64]) -> R) -> Result<R> {
        self.not_captured("CPU work")?;
        self.lanes.on_loop_thread("CPU work")?;
        let (p, mut a) = self.host_range(h, at, bytes)?;
        a.write = write;
        // Host work takes part in the schedule: the GPU must be running.
        self.open_gate()?;
        self.forget_reusable_ends();
        self.schedule.host_op(0, label, vec![a]);
        let _r = trace::range(label);
        let t0 = self.host_base.elapsed().as_secs_f64() * 1e6;
        // SAFETY: in bounds; the pipeline holds the buffer's exclusive borrow.
        // Whether the GPU may still be using it is what the schedule checks.
        let r = f(unsafe { std::slice::from_raw_parts_mut(p, bytes / 8) });
        let t1 = self.host_base.elapsed().as_secs_f64() * 1e6;
        self.marks.push(Mark::Host(t0, t1));
        Ok(r)
    }

    /// (start, end) µs of every GPU op from CUPTI's records: those of this
    /// pipeline's streams, in correlation order (the order the API calls
    /// were made), are its GPU ops in issue order.
    fn activity_times(&self) -> Result<Vec<(f64, f64)>> {
        let mut recs: Vec<_> = driver::activity::finish()?.into_iter().filter(|r| self.cupti_streams.contains(&r.stream_id)).collect();
        recs.sort_by_key(|r| r.correlation);
        // Only copies and kernels leave activity records (memory calls are timed on the host).
        let kinds: Vec<OpKind> = self.schedule.ops.iter().filter(|o| o.kind.is_device_work()).map(|o| o.kind).collect();
        if recs.len() != kinds.len() {
            return Err(LabError::Driver { call: "CUPTI", message: format!("{} activity records for {} operations", recs.len(), kinds.len()) });
        }
        // The host reads CUPTI's clock just after the base completes, which
        // may be a few µs after the first op started: start at that op then.
        let t0 = recs.iter().map(|r| r.start_ns).min().map_or(self.cupti_t0, |first| first.min(self.cupti_t0)) as f64;
        recs.iter()
            .zip(kinds)
            .enumerate()
            .map(|(i, (r, k))| {
                // CUPTI_ACTIVITY_MEMCPY_KIND_*: HTOD 1, DTOH 2, DTOD 8, PTOP 10.
                let want = match k {
                    OpKind::H2d => 1,
                    OpKind::D2h => 2,
                    OpKind::D2d(link) if link.is_peer() => 10,
                    OpKind::D2d(_) => 8,
                    _ => 0,
                };
                if r.copy_kind != want {
                    return Err(LabError::Driver { call: "CUPTI", message: format!("operation {i} is {k:?} but its record has copy kind {}", r.copy_kind) });
                }
                Ok(((r.start_ns as f64 - t0) / 1e3, (r.end_ns as f64 - t0) / 1e3))
            })
            .collect()
    }

    /// After host work or a host wait, streams may sit idle until the next
    /// op is issued: a shared end event would date its start too early.
    fn forget_reusable_ends(&mut self) {
        self.reusable_end.iter_mut().for_each(|e| *e = None);
    }

    /// CPU work that writes `bytes` of host buffer `h` at byte `at`.
    pub fn host_write<R>(&mut self, label: &str, h: HostRef, at: usize, bytes: usize, f: impl FnOnce(&mut [u64]) -> R) -> Result<R> {
        self.host_op(label, h, at, bytes, true, f)
    }
    /// CPU work that reads `bytes` of host buffer `h` at byte `at`.
    pub fn host_read<R>(&mut self, label: &str, h: HostRef, at: usize, bytes: usize, f: impl FnOnce(&[u64]) -> R) -> Result<R> {
        self.host_op(label, h, at, bytes, false, |w| f(w))
    }

    /// cuCtxSynchronize: the CPU waits for every stream.
    pub fn sync_device(&mut self) -> Result<()> {
        self.not_captured("a CPU wait (cuCtxSynchronize)")?;
        let _r = trace::range("host waits for the device");
        self.open_gate()?;
        let gpus = self.gpus.clone();
        self.cpu.run(self.lanes.thread(), || {
            for g in &gpus {
                g.bind()?;
                driver::context_synchronize()?;
            }
            gpus[0].bind()
        })?;
        self.forget_reusable_ends();
        self.schedule.host_wait_all(self.lanes.thread());
        Ok(())
    }

    // ---- memory as operations -------------------------------------------

    /// Makes the driver call `call` as operation `kind` on `s` (stream-
    /// ordered) or on the CPU (blocking), timed on the host clock: what the
    /// call costs the CPU, including anything it waits for. The GPU must be
    /// running (the CPU takes part). A release that races with earlier use
    /// of its buffer is refused before the call: freeing memory the GPU may
    /// still touch is never made.
    fn memory_call<R>(&mut self, s: Option<StreamRef>, kind: OpKind, label: &str, accesses: Vec<Access>, call: impl FnOnce() -> Result<R>) -> Result<R> {
        self.not_captured("a memory call")?;
        self.lanes.on_loop_thread("a memory call")?;
        self.open_gate()?;
        let id = match s {
            Some(s) => {
                let lane = self.lane(s)?;
                // The stream's next op does not start where this one was issued.
                self.reusable_end[lane] = None;
                self.schedule.gpu_op(0, lane, kind, label, accesses)
            }
            None => {
                self.forget_reusable_ends();
                self.schedule.host_call(0, kind, label, accesses)
            }
        };
        if let (OpKind::Free(_), Some(r)) = (kind, self.schedule.races().iter().find(|r| r.later == id)) {
            self.marks.push(Mark::None);
            return Err(LabError::schedule(format!("refused to release memory the GPU may still use: {}", r.what)));
        }
        let _r = trace::range(label);
        if self.gpus.len() > 1 {
            // An op on another GPU's stream made that GPU current.
            self.gpu.bind()?;
        }
        let t0 = self.host_base.elapsed().as_secs_f64() * 1e6;
        let r = call();
        let t1 = self.host_base.elapsed().as_secs_f64() * 1e6;
        self.marks.push(if r.is_ok() { Mark::Host(t0, t1) } else { Mark::None });
        r
    }
    fn host_entry(&self, h: HostRef) -> Result<&HostEntry> {
        self.hosts.get(h.0).ok_or_else(|| LabError::config(format!("host buffer {} was never made", h.0)))
    }
    fn device_entry(&self, d: DevRef) -> Result<&DeviceEntry> {
        self.devices.get(d.0).ok_or_else(|| LabError::config(format!("device buffer {} was never made", d.0)))
    }
    fn stream_ref(&self, s: StreamRef) -> Result<&'a Stream> {
        self.streams
            .get(s.0)
            .copied()
            .filter(|_| s.0 < self.lanes.len())
            .ok_or_else(|| LabError::config(format!("stream {} was never added to the pipeline", s.0)))
    }

    /// What a new allocation named `name` is tracked by ([`unique_name`]).
    fn new_name(&self, name: &str) -> String {
        unique_name(self.devices.iter().map(|d| d.hold.name.as_str()).chain(self.hosts.iter().map(|h| h.hold.name.as_str())), name)
    }

    /// cuMemAllocAsync on `s`: `bytes` from the device's pool.
    pub fn alloc_async(&mut self, s: StreamRef, bytes: usize, name: &str) -> Result<DevRef> {
        check_alloc(name, bytes, "bytes")?;
        let name = &self.new_name(name);
        let stream = self.stream_ref(s)?;
        if stream.gpu().ordinal() != self.gpu.ordinal() {
            return Err(LabError::config(format!(
                "cuMemAllocAsync on a stream of GPU {}: this executor allocates on its own GPU ({}) only",
                stream.gpu().ordinal(),
                self.gpu.ordinal()
            )));
        }
        let raw = stream.raw();
        let whole = Access::write(name, 0, bytes as u64);
        // SAFETY: the stream is borrowed for the pipeline's life.
        let ptr = self.memory_call(Some(s), OpKind::Alloc(Memory::Pool), &Memory::Pool.label(true, name), vec![whole], || unsafe {
            driver::mem_alloc_async(bytes, raw)
        })?;
        self.devices.push(DeviceEntry { span: DeviceSpan { ptr, bytes }, hold: Holding::allocated(name, Memory::Pool), gpu: self.gpu.clone() });
        Ok(DevRef(self.devices.len() - 1))
    }
    /// cuMemAlloc (blocking).
    pub fn alloc(&mut self, bytes: usize, name: &str) -> Result<DevRef> {
        check_alloc(name, bytes, "bytes")?;
        let name = &self.new_name(name);
        let whole = Access::write(name, 0, bytes as u64);
        let ptr = self.memory_call(None, OpKind::Alloc(Memory::Device), &Memory::Device.label(true, name), vec![whole], || driver::device_alloc(bytes))?;
        self.devices.push(DeviceEntry { span: DeviceSpan { ptr, bytes }, hold: Holding::allocated(name, Memory::Device), gpu: self.gpu.clone() });
        Ok(DevRef(self.devices.len() - 1))
    }
    /// Releases device buffer `d` by `how`'s call (on `s` when stream-ordered).
    fn release_device(&mut self, s: Option<StreamRef>, d: DevRef, how: Memory) -> Result<()> {
        let raw = s.map(|s| self.stream_ref(s).map(|st| st.raw())).transpose()?;
        let e = self.device_entry(d)?;
        let (label, ptr, whole) = (e.hold.release_label(how)?, e.span.ptr, Access::write(&e.hold.name, 0, e.span.bytes as u64));
        // SAFETY: the loop's own allocation of this kind, released once
        // (checked); every use is ordered before it (memory_call refuses a race).
        self.memory_call(s, OpKind::Free(how), &label, vec![whole], || unsafe {
            match raw {
                Some(raw) => driver::mem_free_async(ptr, raw),
                None => driver::device_free(ptr),
            }
        })?;
        self.devices[d.0].hold.released_by(how);
        Ok(())
    }
    /// cuMemFreeAsync on `s`.
    pub fn free_async(&mut self, s: StreamRef, d: DevRef) -> Result<()> {
        self.release_device(Some(s), d, Memory::Pool)
    }
    /// cuMemFree (blocking).
    pub fn free(&mut self, d: DevRef) -> Result<()> {
        self.release_device(None, d, Memory::Device)
    }
    /// cuMemHostAlloc (blocking): page-locked, cached host memory.
    pub fn alloc_pinned(&mut self, bytes: usize, name: &str) -> Result<HostRef> {
        check_alloc(name, bytes, "bytes")?;
        if bytes % 8 != 0 {
            return Err(LabError::config(format!("{name}: {bytes} bytes of host memory: give a multiple of 8 (an even number of f32 elements)")));
        }
        let name = &self.new_name(name);
        let whole = Access::write(name, 0, bytes as u64);
        let label = Memory::Pinned.label(true, name);
        let ptr = self.memory_call(None, OpKind::Alloc(Memory::Pinned), &label, vec![whole], || driver::host_alloc(bytes, driver::HOST_ALLOC_PINNED))?;
        self.hosts.push(HostEntry { ptr: ptr as *mut u64, words: bytes / 8, hold: Holding::allocated(name, Memory::Pinned), page_locked: true });
        Ok(HostRef(self.hosts.len() - 1))
    }
    /// Releases host buffer `h` by `how`'s call (cuMemFreeHost, or
    /// cuMemHostUnregister: then it is the lab's ordinary memory again).
    fn release_host(&mut self, h: HostRef, how: Memory) -> Result<()> {
        let e = self.host_entry(h)?;
        let (label, ptr, whole) = (e.hold.release_label(how)?, e.ptr as *mut c_void, Access::write(&e.hold.name, 0, e.words as u64 * 8));
        // SAFETY: allocated or registered by the loop as `how` says, released
        // once (checked); every copy of it is ordered before this (refused otherwise).
        self.memory_call(None, OpKind::Free(how), &label, vec![whole], || unsafe {
            if how == Memory::Registered {
                driver::host_unregister(ptr)
            } else {
                driver::host_free(ptr)
            }
        })?;
        let e = &mut self.hosts[h.0];
        e.hold.released_by(how);
        if how == Memory::Registered {
            e.page_locked = false;
        }
        Ok(())
    }
    /// cuMemFreeHost (blocking).
    pub fn free_pinned(&mut self, h: HostRef) -> Result<()> {
        self.release_host(h, Memory::Pinned)
    }
    /// cuMemHostRegister (blocking): pins the lab's ordinary buffer `h` in place.
    pub fn pin(&mut self, h: HostRef) -> Result<()> {
        let e = self.host_entry(h)?;
        e.hold.live()?;
        if e.page_locked {
            return Err(LabError::config(format!("{} is already page-locked: pin ordinary memory only", e.hold.name)));
        }
        let (ptr, bytes, label) = (e.ptr, e.words * 8, Memory::Registered.label(true, &e.hold.name));
        // SAFETY: the pipeline holds the buffer's exclusive borrow for its
        // life and unregisters it before that ends (unpin, or finish).
        self.memory_call(None, OpKind::Alloc(Memory::Registered), &label, vec![], || unsafe { driver::host_register(ptr as *mut c_void, bytes) })?;
        let e = &mut self.hosts[h.0];
        (e.page_locked, e.hold.memory) = (true, Some(Memory::Registered));
        Ok(())
    }
    /// cuMemHostUnregister (blocking): `h` is ordinary memory again.
    pub fn unpin(&mut self, h: HostRef) -> Result<()> {
        self.release_host(h, Memory::Registered)
    }

    /// Releases what the loop allocated and did not release (the device is
    /// idle: called after a context synchronize). Returns their names.
    fn release_leftovers(&mut self) -> Vec<String> {
        let mut names = Vec::new();
        for e in self.devices.iter_mut().filter(|e| e.hold.leaked()) {
            let Some(m) = e.hold.memory else { continue };
            // SAFETY: the loop's own allocation, released once; the device is idle.
            let _ = match m {
                Memory::Pool => unsafe { driver::mem_free_async(e.span.ptr, self.base_stream.raw()) }.and_then(|_| self.base_stream.synchronize()),
                _ => unsafe { driver::device_free(e.span.ptr) },
            };
            e.hold.released_by(m);
            names.push(e.hold.name.clone());
        }
        for e in self.hosts.iter_mut().filter(|e| e.hold.leaked()) {
            let Some(m) = e.hold.memory else { continue };
            // SAFETY: the loop's own allocation or registration, released once; the device is idle.
            let _ = match m {
                Memory::Registered => unsafe { driver::host_unregister(e.ptr as *mut c_void) },
                _ => unsafe { driver::host_free(e.ptr as *mut c_void) },
            };
            e.hold.released_by(m);
            names.push(e.hold.name.clone());
        }
        names
    }

    /// Ends a capture ([`Gpu::capture_pipeline`]): every stream joins the
    /// base stream again, and the captured graph is made executable. Also
    /// the schedule the loop made (its races, for the checker).
    pub fn finish_capture(mut self) -> Result<(Graph, PipelineRun)> {
        if self.capture.is_none() {
            return Err(LabError::config("finish_capture on a pipeline that was not capturing"));
        }
        if let Some(why) = &self.capture_broken {
            return Err(LabError::config(format!("the CUDA graph capture failed: {why}")));
        }
        // Each stream's last work joins the base stream, so the graph ends
        // when all of it has.
        let mut joins = Vec::with_capacity(self.streams.len());
        for (lane, s) in self.streams.iter().enumerate() {
            let join = self.gpu.sync_event()?;
            self.cpu.run(self.lanes.owner(lane), || join.record(s))?;
            self.base_stream.wait_event(&join)?;
            joins.push(join);
        }
        self.capture = None;
        self.finished = true;
        // SAFETY: the base stream began capturing in `capture_pipeline`, on this thread.
        let graph = unsafe { driver::stream_end_capture(self.base_stream.raw()) }?;
        // SAFETY: just captured in this context; the Graph owns it from here.
        let graph = unsafe { Graph::instantiate(&self.gpu, graph) }?;
        Ok((graph, self.run(None, 0.0, Vec::new())))
    }

    /// Waits for all work, then resolves the timeline and the races.
    pub fn finish(mut self) -> Result<PipelineRun> {
        if self.capture.is_some() {
            return Err(LabError::config("a capturing pipeline ends with finish_capture, which makes its graph"));
        }
        self.open_gate()?;
        if self.stream_ends.len() != self.streams.len() {
            return Err(LabError::Driver { call: "cuEventCreate", message: "could not make a stream's end event".into() });
        }
        for (lane, (s, e)) in self.streams.iter().zip(&self.stream_ends).enumerate() {
            // From the thread whose stream it is (a per-thread stream's handle means the caller's).
            self.cpu.run(self.lanes.owner(lane), || e.record(s))?;
        }
        // Another GPU's stream ends are timed on this GPU's clock: the base
        // stream waits for them, then records when it got there.
        let foreign: Vec<&Event> = self.stream_ends.iter().filter(|e| e.gpu.ordinal() != self.gpu.ordinal()).collect();
        let joined = if foreign.is_empty() {
            None
        } else {
            for e in &foreign {
                self.base_stream.wait_event(e)?;
            }
            let joined = self.gpu.timing_event()?;
            joined.record(&self.base_stream)?;
            Some(joined)
        };
        self.synchronize_gpus()?;
        // Only now may the borrows end (an error above leaves Drop to wait).
        self.finished = true;
        let unreleased = self.release_leftovers();
        let mut total_ms = 0.0f64;
        for e in self.stream_ends.iter().filter(|e| e.gpu.ordinal() == self.gpu.ordinal()).chain(&joined) {
            total_ms = total_ms.max(self.base.elapsed_ms(e)?);
        }
        // An op CUPTI's records do not match leaves the run with no
        // timeline, never a failed lab.
        let activity = if self.source == TimelineSource::Cupti {
            match self.activity_times() {
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
        let timeline = if self.source != TimelineSource::Off {
            let mut times = Vec::with_capacity(self.marks.len());
            for m in &self.marks {
                times.push(match *m {
                    Mark::Gpu(a, b) => (self.base.elapsed_ms(&self.pool.events[a])? * 1e3, self.base.elapsed_ms(&self.pool.events[b])? * 1e3),
                    Mark::Activity(i) => activity.as_ref().map_or((0.0, 0.0), |a| a[i]),
                    Mark::Host(a, b) => (a, b),
                    Mark::None => (0.0, 0.0),
                    Mark::Elsewhere => (f64::NAN, f64::NAN),
                });
            }
            let mut t = Timeline::from_schedule("measured", &self.device_label, &self.schedule, &times, &self.lanes.names());
            t.spans.retain(|s| s.start_us.is_finite());
            t.source = self.source.label().into();
            Some(t)
        } else {
            None
        };
        Ok(self.run(timeline, total_ms, unreleased))
    }

    /// What the pipeline leaves behind: its schedule (taken), races and
    /// lanes, with what `finish` or `finish_capture` measured.
    fn run(&mut self, timeline: Option<Timeline>, total_ms: f64, unreleased: Vec<String>) -> PipelineRun {
        PipelineRun {
            races: self.schedule.races().to_vec(),
            schedule: std::mem::take(&mut self.schedule),
            timeline,
            total_ms,
            stream_names: self.lanes.names(),
            unreleased,
            issue_ms: 0.0,
            driver_ms: self.cpu.in_driver.as_secs_f64() * 1e3,
        }
    }
}

impl Drop for Pipeline<'_> {
    fn drop(&mut self) {
        if self.capture.take().is_some() {
            // A capture that failed part way: end it (nothing ran) and
            // discard what it made, so the streams work again.
            let _ = self.gpu.bind();
            // SAFETY: the base stream began capturing in `capture_pipeline`.
            if let Ok(g) = unsafe { driver::stream_end_capture(self.base_stream.raw()) } {
                // SAFETY: the graph just returned, owned by no one else.
                let _ = unsafe { driver::graph_destroy(g) };
            }
        }
        if !self.finished {
            // Never let the borrows end while the GPU may still use the buffers.
            let _ = self.gpu.bind();
            let _ = self.open_gate();
            let _ = self.synchronize_gpus();
            self.release_leftovers();
            if self.source == TimelineSource::Cupti {
                let _ = driver::activity::finish();
            }
        }
    }
}

// ---- the vocabulary on this executor ---------------------------------------

/// How long the CPU waits for a host function before calling it lost (a
/// stream that never reaches it would otherwise hang the lab).
const SIGNAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Where the producer's data comes from on a real pipeline: a dataset made
/// in advance (so producing is a cheap, verifiable copy).
pub struct Dataset<'a> {
    pub words: &'a [u64],
    /// Elements per batch.
    pub batch_elements: usize,
}

/// A real pipeline plus the lab's kernel settings.
pub struct GpuIssuer<'p, 'a> {
    pub pipeline: &'p mut Pipeline<'a>,
    pub kernel: &'a ComputeKernel,
    pub iterations: i32,
    /// Needed only by labs with a producer.
    pub dataset: Option<Dataset<'a>>,
}

/// Elements to bytes, refusing a count no buffer could hold.
fn bytes(elements: usize) -> Result<usize> {
    elements.checked_mul(4).ok_or_else(|| LabError::config(format!("{elements} elements is more bytes than memory has")))
}

impl Issue for GpuIssuer<'_, '_> {
    fn h2d(&mut self, s: StreamRef, dst: DevRef, dst_at: usize, src: HostRef, src_at: usize, n: usize, label: &str) -> Result<()> {
        self.pipeline.h2d(s, dst, bytes(dst_at)?, src, bytes(src_at)?, bytes(n)?, label)
    }
    fn d2h(&mut self, s: StreamRef, dst: HostRef, dst_at: usize, src: DevRef, src_at: usize, n: usize, label: &str) -> Result<()> {
        self.pipeline.d2h(s, dst, bytes(dst_at)?, src, bytes(src_at)?, bytes(n)?, label)
    }
    fn compute(&mut self, s: StreamRef, input: DevRef, in_at: usize, output: DevRef, out_at: usize, n: usize, label: &str) -> Result<()> {
        self.pipeline.compute(s, self.kernel, input, in_at, output, out_at, n, self.iterations, label)
    }
    fn d2d(&mut self, s: StreamRef, dst: DevRef, dst_at: usize, src: DevRef, src_at: usize, n: usize, label: &str) -> Result<()> {
        self.pipeline.d2d(s, dst, bytes(dst_at)?, src, bytes(src_at)?, bytes(n)?, label)
    }
    fn all_reduce(&mut self, ranks: &[(StreamRef, DevRef)], at: usize, n: usize, label: &str) -> Result<()> {
        self.pipeline.all_reduce(ranks, bytes(at)?, bytes(n)?, label)
    }
    fn event(&mut self) -> Result<EventRef> {
        self.pipeline.event()
    }
    fn record(&mut self, e: EventRef, s: StreamRef) -> Result<()> {
        self.pipeline.record(e, s)
    }
    fn wait(&mut self, s: StreamRef, e: EventRef) -> Result<()> {
        self.pipeline.wait(s, e)
    }
    fn host_wait(&mut self, e: EventRef) -> Result<()> {
        self.pipeline.host_wait(e)
    }
    fn host_sync(&mut self, s: StreamRef) -> Result<()> {
        self.pipeline.host_sync(s)
    }
    fn signal(&mut self, s: StreamRef, label: &str) -> Result<SignalRef> {
        self.pipeline.signal(s, label)
    }
    fn host_wait_signal(&mut self, g: SignalRef) -> Result<()> {
        self.pipeline.host_wait_signal(g)
    }
    fn produce(&mut self, h: HostRef, at: usize, n: usize, batch: usize, label: &str) -> Result<()> {
        let d = self.dataset.as_ref().ok_or_else(|| LabError::config("this lab has no producer"))?;
        if n % 2 != 0 || at % 2 != 0 || n > d.batch_elements {
            return Err(LabError::config(format!("produce {n} elements at {at}: counts and offsets must be even and at most a batch")));
        }
        let first = batch * d.batch_elements / 2;
        let src = d.words.get(first..first + n / 2).ok_or_else(|| LabError::config(format!("batch {batch} is past the dataset")))?;
        self.pipeline.host_write(label, h, at * 4, n * 4, |w| crate::measure::pattern::copy_streaming(w, src))
    }
    fn sync_device(&mut self) -> Result<()> {
        self.pipeline.sync_device()
    }
    fn alloc_async(&mut self, s: StreamRef, n: usize, name: &str) -> Result<DevRef> {
        self.pipeline.alloc_async(s, bytes(n)?, name)
    }
    fn free_async(&mut self, s: StreamRef, d: DevRef) -> Result<()> {
        self.pipeline.free_async(s, d)
    }
    fn alloc(&mut self, n: usize, name: &str) -> Result<DevRef> {
        self.pipeline.alloc(bytes(n)?, name)
    }
    fn free(&mut self, d: DevRef) -> Result<()> {
        self.pipeline.free(d)
    }
    fn alloc_pinned(&mut self, n: usize, name: &str) -> Result<HostRef> {
        self.pipeline.alloc_pinned(bytes(n)?, name)
    }
    fn free_pinned(&mut self, h: HostRef) -> Result<()> {
        self.pipeline.free_pinned(h)
    }
    fn pin(&mut self, h: HostRef) -> Result<()> {
        self.pipeline.pin(h)
    }
    fn unpin(&mut self, h: HostRef) -> Result<()> {
        self.pipeline.unpin(h)
    }
    fn issue_from(&mut self, thread: usize) -> Result<()> {
        self.pipeline.issue_from(thread)
    }
}

/// The OS threads that make the calls of CPU threads 1, 2, ... of a
/// pipeline (thread 0's are made by the caller): one each, made when first
/// used, with the GPU's context current. The caller waits for each call, so
/// the threads take turns; what differs is which thread the driver sees,
/// and so which per-thread default stream `CU_STREAM_PER_THREAD` means.
/// Also the host time the pipeline spent in the driver's issuing calls.
#[derive(Default)]
struct CpuThreads {
    threads: Vec<rayon::ThreadPool>,
    in_driver: std::time::Duration,
}

impl CpuThreads {
    /// Makes the OS threads up to `thread`.
    fn ensure(&mut self, gpu: &Gpu, thread: usize) -> Result<()> {
        while self.threads.len() < thread {
            let (n, gpu) = (self.threads.len() + 1, gpu.clone());
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .thread_name(move |_| format!("overlap-lab CPU thread {n}"))
                .start_handler(move |_| {
                    // A failure shows as the context error of its first call.
                    let _ = gpu.bind();
                })
                .build()
                .map_err(|e| LabError::config(format!("could not start CPU thread {n}: {e}")))?;
            self.threads.push(pool);
        }
        Ok(())
    }
    /// [`Self::run`] for a driver call that issues GPU work (copies,
    /// kernels, creating and recording events, stream waits), its time
    /// counted in `in_driver`.
    fn driver_call<R: Send>(&mut self, thread: usize, call: impl FnOnce() -> Result<R> + Send) -> Result<R> {
        let called = Instant::now();
        let r = self.run(thread, call);
        self.in_driver += called.elapsed();
        r
    }
    /// Makes `call` on CPU thread `thread` and waits for it.
    fn run<R: Send>(&self, thread: usize, call: impl FnOnce() -> Result<R> + Send) -> Result<R> {
        match thread {
            0 => call(),
            t => self.threads.get(t - 1).ok_or_else(|| LabError::config(format!("CPU thread {t} was never started")))?.install(call),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TimelineSource;

    #[test]
    fn the_fallback_line_says_why_and_names_the_tools_that_hold_cupti() {
        let held = TimelineSource::fallback_line("cuptiActivityRegisterCallbacks: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED");
        assert!(held.contains("compute-sanitizer") && held.contains("MULTIPLE_SUBSCRIBERS") && held.contains("\"cuda events\""), "{held}");
        let missing = TimelineSource::fallback_line("libcupti could not be loaded");
        assert!(missing.contains("libcupti could not be loaded") && !missing.contains("another tool"), "{missing}");
        // One line, and nothing a notebook runner takes for an error.
        assert!(!held.contains('\n') && !held.contains("Error:") && !held.contains("panicked"));
    }
}
