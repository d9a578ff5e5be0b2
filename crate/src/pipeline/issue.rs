//! What a learner's issue loop may call, so the same loop runs on the GPU
//! (`gpu::Runner`) or, with no GPU, on the dry run
//! ([`super::dry_run::DryRun`]), which records the schedule and tracks
//! where every element's data came from. Either way the checker can say what
//! is wrong: wrong data, a race, no overlap, or too little of it. A lab
//! with operations of its own adds them through one hook,
//! [`super::lab_op::LabIssue`].

use super::op::{Link, Memory, StreamDecl, StreamKind};
use super::schedule::Schedule;
use crate::error::{LabError, Result};
use std::collections::HashMap;

/// A stream of a pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamRef(pub usize);
/// A device buffer of a pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevRef(pub usize);
/// A host buffer of a pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostRef(pub usize);
/// An event of a pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventRef(pub usize);
/// A host function's signal to the CPU ([`Issue::signal`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignalRef(pub usize);

/// The operations of a copy/compute pipeline, in learner-facing form. Sizes
/// and offsets are in f32 elements.
pub trait Issue {
    /// Copies `n` elements from `src[src_at..]` (host) to `dst[dst_at..]` (device) on `s`.
    fn h2d(&mut self, s: StreamRef, dst: DevRef, dst_at: usize, src: HostRef, src_at: usize, n: usize, label: &str) -> Result<()>;
    /// Copies `n` elements from `src[src_at..]` (device) to `dst[dst_at..]` (host) on `s`.
    fn d2h(&mut self, s: StreamRef, dst: HostRef, dst_at: usize, src: DevRef, src_at: usize, n: usize, label: &str) -> Result<()>;
    /// Runs the lab's kernel: `output[out_at..+n] = f(input[in_at..+n])` on `s`.
    fn compute(&mut self, s: StreamRef, input: DevRef, in_at: usize, output: DevRef, out_at: usize, n: usize, label: &str) -> Result<()>;
    /// Copies `n` elements from `src[src_at..]` to `dst[dst_at..]`, both
    /// device buffers, on `s`: within one GPU, or from one GPU's memory to
    /// another's (a peer copy, cuMemcpyPeerAsync), issued on a stream of
    /// either GPU ([`d2d_link`]).
    fn d2d(&mut self, s: StreamRef, dst: DevRef, dst_at: usize, src: DevRef, src_at: usize, n: usize, label: &str) -> Result<()>;
    /// Sums `n` elements at `at` of every rank's device buffer, in place
    /// (an NCCL all-reduce): `ranks` holds one (stream, buffer) per GPU,
    /// the stream of the buffer's GPU, no GPU twice. Afterwards each rank's
    /// elements hold the sum over all ranks. Each rank's part runs in order
    /// with its stream's other work, and no rank gets past it before every
    /// rank has reached it (so it waits for what each rank's stream did
    /// before; what later work needs, it orders by each stream).
    fn all_reduce(&mut self, ranks: &[(StreamRef, DevRef)], at: usize, n: usize, label: &str) -> Result<()>;
    fn event(&mut self) -> Result<EventRef>;
    /// `e` completes when `s` has done all work issued to it so far.
    fn record(&mut self, e: EventRef, s: StreamRef) -> Result<()>;
    /// Later work on `s` waits for `e`.
    fn wait(&mut self, s: StreamRef, e: EventRef) -> Result<()>;
    /// Later work on `waiter` waits (on the GPU) for everything issued to
    /// `s` so far: a new event recorded on `s` and waited on by `waiter`
    /// (cuEventRecord, cuStreamWaitEvent; the two streams may belong to
    /// different GPUs).
    fn wait_for(&mut self, waiter: StreamRef, s: StreamRef) -> Result<()> {
        let e = self.event()?;
        self.record(e, s)?;
        self.wait(waiter, e)
    }
    /// The CPU waits for `e`.
    fn host_wait(&mut self, e: EventRef) -> Result<()>;
    /// The CPU waits until `s` has done everything issued to it so far.
    fn host_sync(&mut self, s: StreamRef) -> Result<()>;
    /// A host function on `s` (cuLaunchHostFunc) that tells the CPU when
    /// `s` has done all work issued to it so far: it makes no CUDA call,
    /// and a CPU thread blocked in [`Self::host_wait_signal`] sleeps until
    /// it runs (nothing polls). How a ring of pinned slots learns that a
    /// slot's upload is done. `s` waits for it (the driver's callback
    /// thread wakes, runs it, and releases the stream).
    fn signal(&mut self, s: StreamRef, label: &str) -> Result<SignalRef>;
    /// The CPU sleeps until `g`'s host function ran.
    fn host_wait_signal(&mut self, g: SignalRef) -> Result<()>;
    /// CPU work: the producer writes batch `batch` (`n` elements) into host
    /// buffer `h` at element `at`.
    fn produce(&mut self, h: HostRef, at: usize, n: usize, batch: usize, label: &str) -> Result<()>;
    /// The CPU waits until every stream has done everything issued so far
    /// (cuCtxSynchronize).
    fn sync_device(&mut self) -> Result<()>;
    /// Everything issued so far is set-up (data put in place before what
    /// is measured): the CPU waits for all of it, as [`Self::sync_device`],
    /// and the run's time counts from here. What a measurement by
    /// difference uses to keep set-up and its noise out of both runs.
    fn timed_from_here(&mut self) -> Result<()>;

    // ---- memory as operations: what allocating costs and blocks ----------

    /// cuMemAllocAsync: `n` elements from the device's stream-ordered pool,
    /// usable by work issued to `s` after this (other streams must be
    /// ordered after it, by an event).
    fn alloc_async(&mut self, s: StreamRef, n: usize, name: &str) -> Result<DevRef>;
    /// cuMemFreeAsync: `d` goes back to the pool when `s` reaches this
    /// point; work on other streams that uses `d` must be ordered before it.
    fn free_async(&mut self, s: StreamRef, d: DevRef) -> Result<()>;
    /// cuMemAlloc: `n` elements of device memory (a blocking call).
    fn alloc(&mut self, n: usize, name: &str) -> Result<DevRef>;
    /// cuMemFree (a blocking call): every use of `d` must be ordered before it.
    fn free(&mut self, d: DevRef) -> Result<()>;
    /// cuMemHostAlloc: `n` elements of page-locked host memory (a blocking call).
    fn alloc_pinned(&mut self, n: usize, name: &str) -> Result<HostRef>;
    /// cuMemFreeHost (a blocking call): every copy of `h` must be ordered before it.
    fn free_pinned(&mut self, h: HostRef) -> Result<()>;
    /// cuMemHostRegister: pins ordinary host buffer `h` in place, so later
    /// copies of it run from the copy engine without staging.
    fn pin(&mut self, h: HostRef) -> Result<()>;
    /// cuMemHostUnregister: `h` is ordinary memory again; every copy of it
    /// must be ordered before this.
    fn unpin(&mut self, h: HostRef) -> Result<()>;

    // ---- several CPU threads ---------------------------------------------

    /// The CPU thread that makes the calls that follow: 0 is the loop's
    /// own thread (where every loop starts), 1, 2, ... other threads of the
    /// program. What a thread waits for orders only its own later calls,
    /// and each thread has its own per-thread default stream: a stream of
    /// kind [`StreamKind::PerThread`] is the calling thread's, as
    /// `CU_STREAM_PER_THREAD` (or a program built with `--default-stream
    /// per-thread`) resolves it. On the GPU each thread is a real OS
    /// thread; the threads make their calls in the order the loop gives.
    fn issue_from(&mut self, thread: usize) -> Result<()>;
}

/// The most CPU threads a loop may issue from ([`Issue::issue_from`]).
pub const MAX_THREADS: usize = 64;

/// The streams a pipeline's ops run on and the CPU thread making its
/// calls, as both executors track them: the loop's own streams (numbered
/// as it made them), then, for each per-thread default stream a CPU thread
/// other than 0 used, that thread's own stream (CUDA resolves
/// `CU_STREAM_PER_THREAD` by the calling thread, so one handle is a
/// different stream on each thread). Every lane is declared in the
/// executor's schedule as it is made.
#[derive(Clone, Debug, Default)]
pub struct Lanes {
    /// Per lane: how it was declared, its name and the thread whose stream it is.
    lanes: Vec<(StreamDecl, String, usize)>,
    /// (stream, thread) -> lane, for per-thread streams of other threads.
    per_thread: HashMap<(usize, usize), usize>,
    /// How many streams the loop made (lanes past these were resolved).
    made: usize,
    /// The CPU thread making the calls ([`Issue::issue_from`]).
    thread: usize,
}

impl Lanes {
    /// A stream the loop made (before any per-thread lane is resolved),
    /// declared in `schedule`.
    pub fn add(&mut self, schedule: &mut Schedule, decl: StreamDecl, name: &str) -> StreamRef {
        // A stream made after a per-thread lane was resolved would take
        // that lane's number: the executors make every stream first.
        assert_eq!(self.made, self.lanes.len(), "a pipeline's streams are all added before its loop issues");
        self.lanes.push((decl, name.into(), 0));
        self.made += 1;
        schedule.declare_stream(self.made - 1, decl);
        StreamRef(self.made - 1)
    }
    /// The lane `s` means for the calling thread: `s` itself, or for a
    /// per-thread stream called from another thread, that thread's own
    /// (made and declared in `schedule` the first time: `Ok((lane, true))`).
    pub fn resolve(&mut self, schedule: &mut Schedule, s: StreamRef) -> Result<(usize, bool)> {
        let thread = self.thread;
        let Some(decl) = self.lanes.get(s.0).filter(|_| s.0 < self.made).map(|l| l.0) else {
            return Err(LabError::config(format!("stream {} was never created (the loop has {})", s.0, self.made)));
        };
        if decl.kind != StreamKind::PerThread || thread == 0 {
            return Ok((s.0, false));
        }
        if let Some(&lane) = self.per_thread.get(&(s.0, thread)) {
            return Ok((lane, false));
        }
        // The thread's own per-thread stream, on the same GPU.
        let own = StreamDecl::new(StreamKind::PerThread, 0, decl.gpu);
        let name = format!("{} of CPU thread {thread}", self.lanes[s.0].1);
        self.lanes.push((own, name, thread));
        let lane = self.lanes.len() - 1;
        self.per_thread.insert((s.0, thread), lane);
        schedule.declare_stream(lane, own);
        Ok((lane, true))
    }
    /// Whether [`Self::resolve`] would make a lane for `s`.
    pub fn would_add(&self, s: StreamRef) -> bool {
        s.0 < self.made && self.thread != 0 && self.lanes[s.0].0.kind == StreamKind::PerThread && !self.per_thread.contains_key(&(s.0, self.thread))
    }
    /// The CPU thread making the calls.
    pub fn thread(&self) -> usize {
        self.thread
    }
    /// [`Issue::issue_from`]: refuses a thread number no loop needs.
    pub fn issue_from(&mut self, thread: usize) -> Result<()> {
        if thread >= MAX_THREADS {
            return Err(LabError::config(format!("issue_from({thread}): CPU threads are numbered 0 to {}", MAX_THREADS - 1)));
        }
        self.thread = thread;
        Ok(())
    }
    /// Refuses `what` (CPU work, a memory call) from any thread but 0: in
    /// this vocabulary other threads issue GPU work, events and waits only.
    pub fn on_loop_thread(&self, what: &str) -> Result<()> {
        if self.thread != 0 {
            return Err(LabError::config(format!(
                "{what} from CPU thread {}: other threads issue GPU work, events and waits; CPU work and memory calls are thread 0's (call issue_from(0) first)",
                self.thread
            )));
        }
        Ok(())
    }
    pub fn kind(&self, lane: usize) -> StreamKind {
        self.lanes[lane].0.kind
    }
    /// The GPU `lane`'s stream belongs to.
    pub fn gpu(&self, lane: usize) -> usize {
        self.lanes[lane].0.gpu
    }
    /// The thread whose per-thread stream `lane` is (0 for every stream
    /// the loop made: any thread may use those).
    pub fn owner(&self, lane: usize) -> usize {
        self.lanes[lane].2
    }
    /// `lane`'s name (what errors and timelines call it).
    pub fn name(&self, lane: usize) -> &str {
        &self.lanes[lane].1
    }
    /// Every lane's name, by lane (what timelines label them with).
    pub fn names(&self) -> Vec<String> {
        self.lanes.iter().map(|l| l.1.clone()).collect()
    }
    pub fn len(&self) -> usize {
        self.lanes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.lanes.is_empty()
    }
}

/// Who holds a buffer of a pipeline, as both executors track it: the lab
/// (it gave the buffer to the pipeline) or the loop (one of its calls
/// allocated or pinned it, and the matching call must release it), and
/// whether it was released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    pub name: String,
    /// What the loop allocated or pinned; None: the lab's own buffer.
    pub memory: Option<Memory>,
    /// The call that released it: nothing may use it after that.
    pub released: Option<&'static str>,
}

impl Holding {
    /// A buffer the lab gave the pipeline.
    pub fn lab(name: &str) -> Holding {
        Holding { name: name.into(), memory: None, released: None }
    }
    /// A buffer the loop allocated.
    pub fn allocated(name: &str, memory: Memory) -> Holding {
        Holding { name: name.into(), memory: Some(memory), released: None }
    }
    /// Refuses a use after the buffer was released.
    pub fn live(&self) -> Result<()> {
        match self.released {
            Some(call) => Err(LabError::schedule(format!("{} is used after {call} released it: released memory is no longer the buffer's", self.name))),
            None => Ok(()),
        }
    }
    /// Checks that `how`'s release call may release the buffer now, and
    /// gives that operation's label.
    pub fn release_label(&self, how: Memory) -> Result<String> {
        if let Some(call) = self.released {
            return Err(LabError::schedule(format!(
                "{} is released twice: {call} already released it, and {} would release it again (a double free)",
                self.name,
                how.call(false)
            )));
        }
        match self.memory {
            Some(m) if m == how => Ok(how.label(false, &self.name)),
            Some(m) => Err(LabError::config(format!("{} came from {}: release it with {}, not {}", self.name, m.call(true), m.call(false), how.call(false)))),
            None => Err(LabError::config(format!("{} belongs to the lab, not to the loop: the loop may only release what it allocated", self.name))),
        }
    }
    /// After `how`'s release call: released, or (unpinned) the lab's
    /// ordinary memory again, usable and pinnable on.
    pub fn released_by(&mut self, how: Memory) {
        if how == Memory::Registered {
            self.memory = None;
        } else {
            self.released = Some(how.call(false));
        }
    }
    /// Allocated or pinned by the loop and never released.
    pub fn leaked(&self) -> bool {
        self.memory.is_some() && self.released.is_none()
    }
}

/// The name a new allocation is tracked by: `name`, or `name #2`, `#3`...
/// when a buffer of the pipeline already has it (a loop that names every
/// batch's scratch "scratch" makes a new buffer each time, and the race
/// check must not take one for another).
pub fn unique_name<'n>(taken: impl Iterator<Item = &'n str> + Clone, name: &str) -> String {
    if !taken.clone().any(|t| t == name) {
        return name.to_string();
    }
    (2..).map(|k| format!("{name} #{k}")).find(|c| !taken.clone().any(|t| t == c)).expect("some number is free")
}

/// Refuses `what` on stream `stream` (of GPU `stream_gpu`) touching
/// device buffer `buffer` in GPU `buffer_gpu`'s memory, where the two
/// differ: the copies and kernels of this vocabulary run where their data
/// is, and a peer copy ([`Issue::d2d`]) moves it. Both executors judge so.
pub fn same_gpu(what: &str, (stream, stream_gpu): (&str, usize), (buffer, buffer_gpu): (&str, usize)) -> Result<()> {
    if stream_gpu == buffer_gpu {
        return Ok(());
    }
    Err(LabError::config(format!(
        "{what} on stream {stream} (GPU {stream_gpu}) touches {buffer}, which is in GPU {buffer_gpu}'s memory: an operation on a stream reaches only its own GPU's memory, and only a peer copy moves data between GPUs"
    )))
}

/// The link a device-to-device copy on a stream of GPU `stream_gpu` (named
/// `stream`) uses from buffer `src` to `dst` (each its GPU and name), as
/// both executors judge it: the stream must belong to one of the two GPUs
/// (CUDA runs a peer copy on either's stream; a third GPU's stream would
/// make a copy neither side orders against).
pub fn d2d_link(stream_gpu: usize, stream: &str, (src_gpu, src): (usize, &str), (dst_gpu, dst): (usize, &str)) -> Result<Link> {
    if stream_gpu != src_gpu && stream_gpu != dst_gpu {
        return Err(LabError::config(format!(
            "a copy from {src} (GPU {src_gpu}) to {dst} (GPU {dst_gpu}) on stream {stream} of GPU {stream_gpu}: a copy runs on a stream of one of the two GPUs it joins, here GPU {src_gpu} or GPU {dst_gpu}"
        )));
    }
    Link::between(src_gpu, dst_gpu).ok_or_else(|| LabError::config(format!("a copy between GPU {src_gpu} and GPU {dst_gpu}: GPUs are numbered up to 255")))
}

/// The rank count of an all-reduce whose ranks are `ranks` (each: its
/// stream's name and GPU, its buffer's name and GPU), as both executors
/// judge it: at least one, each stream of its buffer's GPU, no GPU twice.
pub fn check_ranks(ranks: &[(&str, usize, &str, usize)]) -> Result<u8> {
    if ranks.is_empty() {
        return Err(LabError::config("an all-reduce needs at least one rank: a (stream, buffer) per GPU"));
    }
    for (i, &(stream, stream_gpu, buffer, buffer_gpu)) in ranks.iter().enumerate() {
        same_gpu("an all-reduce", (stream, stream_gpu), (buffer, buffer_gpu))?;
        if let Some(j) = ranks[..i].iter().position(|r| r.1 == stream_gpu) {
            return Err(LabError::config(format!(
                "an all-reduce with two ranks on GPU {stream_gpu} ({} and {stream}): give one (stream, buffer) per GPU",
                ranks[j].0
            )));
        }
    }
    u8::try_from(ranks.len()).map_err(|_| LabError::config(format!("an all-reduce over {} GPUs: at most 255", ranks.len())))
}

/// An allocation's size in `unit`s, refusing nothing and absurd sizes
/// (memory that does not fit returns the driver's out-of-memory error).
pub fn check_alloc(name: &str, n: usize, unit: &str) -> Result<()> {
    if n == 0 || n > (1usize << 48) {
        return Err(LabError::config(format!("{name}: allocating {n} {unit} (give at least 1 and less than 2^48)")));
    }
    Ok(())
}

/// Runs a loop synchronously: after every copy and kernel the CPU waits
/// for its stream (the synchronous baseline, as `cudaMemcpy` gives it).
pub struct SyncEach<'i>(pub &'i mut dyn Issue);

impl Issue for SyncEach<'_> {
    fn h2d(&mut self, s: StreamRef, dst: DevRef, dst_at: usize, src: HostRef, src_at: usize, n: usize, label: &str) -> Result<()> {
        self.0.h2d(s, dst, dst_at, src, src_at, n, label)?;
        self.0.host_sync(s)
    }
    fn d2h(&mut self, s: StreamRef, dst: HostRef, dst_at: usize, src: DevRef, src_at: usize, n: usize, label: &str) -> Result<()> {
        self.0.d2h(s, dst, dst_at, src, src_at, n, label)?;
        self.0.host_sync(s)
    }
    fn compute(&mut self, s: StreamRef, input: DevRef, in_at: usize, output: DevRef, out_at: usize, n: usize, label: &str) -> Result<()> {
        self.0.compute(s, input, in_at, output, out_at, n, label)?;
        self.0.host_sync(s)
    }
    fn d2d(&mut self, s: StreamRef, dst: DevRef, dst_at: usize, src: DevRef, src_at: usize, n: usize, label: &str) -> Result<()> {
        self.0.d2d(s, dst, dst_at, src, src_at, n, label)?;
        self.0.host_sync(s)
    }
    fn all_reduce(&mut self, ranks: &[(StreamRef, DevRef)], at: usize, n: usize, label: &str) -> Result<()> {
        self.0.all_reduce(ranks, at, n, label)?;
        ranks.iter().try_for_each(|&(s, _)| self.0.host_sync(s))
    }
    fn event(&mut self) -> Result<EventRef> {
        self.0.event()
    }
    fn record(&mut self, e: EventRef, s: StreamRef) -> Result<()> {
        self.0.record(e, s)
    }
    fn wait(&mut self, s: StreamRef, e: EventRef) -> Result<()> {
        self.0.wait(s, e)
    }
    fn host_wait(&mut self, e: EventRef) -> Result<()> {
        self.0.host_wait(e)
    }
    fn host_sync(&mut self, s: StreamRef) -> Result<()> {
        self.0.host_sync(s)
    }
    fn signal(&mut self, s: StreamRef, label: &str) -> Result<SignalRef> {
        self.0.signal(s, label)
    }
    fn host_wait_signal(&mut self, g: SignalRef) -> Result<()> {
        self.0.host_wait_signal(g)
    }
    fn produce(&mut self, h: HostRef, at: usize, n: usize, batch: usize, label: &str) -> Result<()> {
        self.0.produce(h, at, n, batch, label)
    }
    fn sync_device(&mut self) -> Result<()> {
        self.0.sync_device()
    }
    fn timed_from_here(&mut self) -> Result<()> {
        self.0.timed_from_here()
    }
    fn alloc_async(&mut self, s: StreamRef, n: usize, name: &str) -> Result<DevRef> {
        self.0.alloc_async(s, n, name)
    }
    fn free_async(&mut self, s: StreamRef, d: DevRef) -> Result<()> {
        self.0.free_async(s, d)
    }
    fn alloc(&mut self, n: usize, name: &str) -> Result<DevRef> {
        self.0.alloc(n, name)
    }
    fn free(&mut self, d: DevRef) -> Result<()> {
        self.0.free(d)
    }
    fn alloc_pinned(&mut self, n: usize, name: &str) -> Result<HostRef> {
        self.0.alloc_pinned(n, name)
    }
    fn free_pinned(&mut self, h: HostRef) -> Result<()> {
        self.0.free_pinned(h)
    }
    fn pin(&mut self, h: HostRef) -> Result<()> {
        self.0.pin(h)
    }
    fn unpin(&mut self, h: HostRef) -> Result<()> {
        self.0.unpin(h)
    }
    fn issue_from(&mut self, thread: usize) -> Result<()> {
        self.0.issue_from(thread)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_per_thread_stream_is_each_calling_threads_own() {
        let (mut l, mut s) = (Lanes::default(), Schedule::new());
        let made = l.add(&mut s, StreamDecl::new(StreamKind::Blocking, 0, 0), "s0");
        let legacy = l.add(&mut s, StreamDecl::new(StreamKind::Legacy, 0, 0), "NULL");
        let mine = l.add(&mut s, StreamDecl::new(StreamKind::PerThread, 0, 0), "default");
        l.issue_from(3).unwrap();
        assert_eq!(l.resolve(&mut s, made).unwrap(), (0, false), "a stream the loop made is the same on every thread");
        assert_eq!(l.resolve(&mut s, legacy).unwrap(), (1, false), "so is the legacy stream");
        l.issue_from(0).unwrap();
        assert_eq!(l.resolve(&mut s, mine).unwrap(), (2, false), "thread 0's per-thread stream is the one made");
        assert!(!l.would_add(mine));
        l.issue_from(2).unwrap();
        assert!(l.would_add(mine) && !l.would_add(made));
        assert_eq!(l.resolve(&mut s, mine).unwrap(), (3, true), "thread 2's is another stream");
        assert!(!l.would_add(mine));
        assert_eq!(l.resolve(&mut s, mine).unwrap(), (3, false), "the same one each time");
        l.issue_from(1).unwrap();
        assert_eq!(l.resolve(&mut s, mine).unwrap(), (4, true));
        assert_eq!((l.owner(3), l.kind(3)), (2, StreamKind::PerThread));
        assert_eq!(l.names()[3], "default of CPU thread 2");
        let e = l.resolve(&mut s, StreamRef(3)).unwrap_err().to_string();
        assert!(e.contains("stream 3 was never created (the loop has 3)"), "{e}");
        assert!(l.on_loop_thread("CPU work").unwrap_err().to_string().contains("CPU work from CPU thread 1"));
        assert!(l.issue_from(MAX_THREADS).unwrap_err().to_string().contains("CPU threads are numbered 0 to 63"));
    }
}
