//! The CPU side of lab 4: the argmin job, the three places it can run (a
//! host function on the driver's callback thread, a worker thread fed by a
//! host function, a thread that waits on events), and the state one run
//! shares between them. No CUDA call is made from a host function here:
//! [`CallbackTask`] holds only CPU data (see `gpu::host_fn`).

use super::slots::{Lease, SlotBook};
use crate::error::{LabError, Result};
use crate::gpu::host_fn::{panic_message, sealed, HostTask};
use crate::pipeline::op::OpKind;
use crate::pipeline::timeline::Span;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// The enqueue loop's thread: the lane where the runner draws its calls too.
pub const MAIN_LANE: &str = "CPU main";
pub const CALLBACK_LANE: &str = "CPU: CUDA callback thread";
pub const WORKER_LANE: &str = "CPU: worker thread";
pub const WAITER_LANE: &str = "CPU: event-waiting thread";
/// What a result holds before its argmin wrote it.
pub const NO_RESULT: u32 = u32::MAX;

/// The first index of the smallest score. Blocks of 16 lanes keep the
/// running minimum in vector registers; the index is found in a second scan.
pub fn argmin(scores: &[f32]) -> u32 {
    if scores.is_empty() {
        return NO_RESULT;
    }
    let mut lanes = [f32::INFINITY; 16];
    let blocks = scores.chunks_exact(16);
    let tail = blocks.remainder();
    for b in blocks {
        for (m, &x) in lanes.iter_mut().zip(b) {
            *m = if x < *m { x } else { *m };
        }
    }
    let min = tail.iter().chain(&lanes).fold(f32::INFINITY, |m, &x| if x < m { x } else { m });
    scores.iter().position(|&x| x == min).map_or(0, |i| i as u32)
}

/// The lab's CPU work: the argmin `passes` times over the same scores (its
/// cost is the knob). Every pass must agree, so none can be skipped; a
/// disagreement means the scores changed under the reader.
pub fn heavy_argmin(scores: &[f32], passes: u32) -> std::result::Result<u32, String> {
    let first = argmin(std::hint::black_box(scores));
    for p in 1..passes {
        let again = argmin(std::hint::black_box(scores));
        if again != first {
            return Err(format!("argmin pass {p} found {again}, pass 0 found {first}: the scores changed while being read"));
        }
    }
    Ok(first)
}

/// One slot's pinned scores as the CPU sees them: `rows` f32 then a u32
/// stamp the kernel wrote (the iteration). The memory belongs to the rig,
/// which outlives every run (it joins the threads and syncs the streams).
#[derive(Clone, Copy, Debug)]
pub struct ScoresView {
    ptr: *const u32,
    rows: usize,
}

// SAFETY: a view of pinned memory that outlives every thread using it;
// who may read it when is what the slot book decides.
unsafe impl Send for ScoresView {}
unsafe impl Sync for ScoresView {}

impl ScoresView {
    /// # Safety
    /// `ptr` points at `rows + 1` u32 that stay allocated while views exist.
    pub unsafe fn new(ptr: *const u32, rows: usize) -> ScoresView {
        ScoresView { ptr, rows }
    }
    /// The stamp word, read as memory a DMA may write at any time.
    pub fn stamp(&self) -> u32 {
        // SAFETY: in bounds (rows + 1 words).
        unsafe { std::ptr::read_volatile(self.ptr.add(self.rows)) }
    }
    /// The scores. Whoever reads them holds the slot's lease, or (a
    /// standalone measurement) has synced the copy.
    pub fn scores(&self) -> &[f32] {
        // SAFETY: in bounds; if a copy lands meanwhile (a misused slot), the
        // stamp and generation checks around the read report it.
        unsafe { std::slice::from_raw_parts(self.ptr as *const f32, self.rows) }
    }
}

/// One iteration's argmin, owning its slot's lease.
#[derive(Debug)]
pub struct ArgminJob {
    pub lease: Lease,
}

/// Everything one run's threads share. Plain CPU data.
pub struct RunState {
    pub book: Arc<SlotBook>,
    views: Vec<ScoresView>,
    passes: u32,
    results: Vec<AtomicU32>,
    host_base: Instant,
    /// Latest end of any argmin, ns after `host_base`.
    last_end_ns: AtomicU64,
    /// Each iteration's argmin duration, ns (host clock, on its thread).
    argmin_ns: Vec<AtomicU64>,
    done: AtomicUsize,
    spans: Option<Mutex<Vec<Span>>>,
    errors: Mutex<Vec<String>>,
    /// Tests: the argmin of this iteration panics.
    pub(crate) panic_at: Option<usize>,
}

impl RunState {
    pub fn new(book: Arc<SlotBook>, views: Vec<ScoresView>, iterations: usize, passes: u32, host_base: Instant, spans: bool) -> RunState {
        RunState {
            book,
            views,
            passes: passes.max(1),
            results: (0..iterations).map(|_| AtomicU32::new(NO_RESULT)).collect(),
            host_base,
            last_end_ns: AtomicU64::new(0),
            argmin_ns: (0..iterations).map(|_| AtomicU64::new(0)).collect(),
            done: AtomicUsize::new(0),
            spans: spans.then(|| Mutex::new(Vec::with_capacity(iterations * 3))),
            errors: Mutex::new(Vec::new()),
            panic_at: None,
        }
    }

    pub fn now_us(&self) -> f64 {
        self.host_base.elapsed().as_secs_f64() * 1e6
    }

    pub fn span(&self, lane: &str, label: String, start_us: f64, end_us: f64) {
        if let Some(s) = &self.spans {
            s.lock().unwrap_or_else(|p| p.into_inner()).push(Span { lane: lane.into(), kind: OpKind::Host, label, start_us, end_us, class: None, index: None });
        }
    }

    pub fn error(&self, msg: String) {
        self.errors.lock().unwrap_or_else(|p| p.into_inner()).push(msg);
    }

    /// Runs one argmin on the calling thread: checks the scores are its
    /// iteration's before and after reading them, stores the result, gives
    /// the slot back. Never panics and never keeps a slot: a failure is
    /// recorded and surfaces when the run ends.
    pub fn argmin(&self, job: ArgminJob, lane: &str, range: &str) {
        let start = self.now_us();
        let _r = crate::gpu::trace::range(range);
        let lease = job.lease;
        let (t, view) = (lease.iteration, self.views[lease.slot]);
        let before = view.stamp();
        let work_start = Instant::now();
        let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if self.panic_at == Some(t) {
                panic!("injected failure in the argmin of iteration {t}");
            }
            heavy_argmin(view.scores(), self.passes)
        }));
        self.argmin_ns[t].store(work_start.elapsed().as_nanos() as u64, Ordering::Release);
        let (after, current) = (view.stamp(), self.book.is_current(&lease));
        let slot = lease.slot;
        match found {
            // The kernel stamps the scores with its iteration: a later one
            // means the slot was taken again, anything else that ours had
            // not arrived yet.
            _ if before != t as u32 && (before as usize) > t && before != NO_RESULT => {
                self.error(format!("slot {slot} held iteration {before}'s scores when iteration {t} read it: the slot was reused too early"))
            }
            _ if before != t as u32 => {
                self.error(format!("iteration {t} read slot {slot} before its scores arrived (stamp {before:#x}): the argmin ran before the D2H finished"))
            }
            _ if after != t as u32 || !current => {
                self.error(format!("slot {slot} was overwritten while iteration {t} read it (stamp {after:#x}): the slot was reused too early"))
            }
            Ok(Err(why)) => self.error(format!("iteration {t}: {why}")),
            Err(p) => self.error(format!("the argmin of iteration {t} panicked: {}", panic_message(&*p))),
            Ok(Ok(i)) => self.results[t].store(i, Ordering::Release),
        }
        if let Err(e) = self.book.give_back(lease) {
            self.error(e.to_string());
        }
        let end = self.now_us();
        self.span(lane, format!("argmin {t}"), start, end);
        self.last_end_ns.fetch_max((end * 1e3) as u64, Ordering::AcqRel);
        self.done.fetch_add(1, Ordering::AcqRel);
    }

    /// A job that could not run: recorded, its slot given back.
    pub fn drop_job(&self, job: ArgminJob, why: String) {
        self.error(format!("iteration {}: {why}", job.lease.iteration));
        let _ = self.book.give_back(job.lease);
        self.done.fetch_add(1, Ordering::AcqRel);
    }

    pub fn done(&self) -> usize {
        self.done.load(Ordering::Acquire)
    }
    /// From the start to the end of the last argmin, ms.
    pub fn total_ms(&self) -> f64 {
        self.last_end_ns.load(Ordering::Acquire) as f64 / 1e6
    }
    /// Median argmin duration over the iterations that ran, ms.
    pub fn median_argmin_ms(&self) -> Option<f64> {
        let v: Vec<f64> = self.argmin_ns.iter().map(|a| a.load(Ordering::Acquire)).filter(|&ns| ns > 0).map(|ns| ns as f64 / 1e6).collect();
        crate::measure::stats::Summary::of(&v).ok().map(|s| s.median)
    }
    pub fn results(&self) -> Vec<u32> {
        self.results.iter().map(|r| r.load(Ordering::Acquire)).collect()
    }
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    pub fn take_spans(&self) -> Vec<Span> {
        self.spans.as_ref().map_or_else(Vec::new, |s| std::mem::take(&mut *s.lock().unwrap_or_else(|p| p.into_inner())))
    }
}

/// What a host function of lab 4 may do.
pub enum CallbackTask {
    /// Variants 1 and 2: the argmin itself, on the driver's callback thread.
    Argmin { state: Arc<RunState>, job: ArgminJob },
    /// Variant 3 (the fix the exercise asks for): only hand the job to the worker.
    HandOff { state: Arc<RunState>, job: ArgminJob, to: Sender<ArgminJob> },
    /// Nothing: measures a host function's own round trip.
    Nothing,
}

impl sealed::Sealed for CallbackTask {}

impl HostTask for CallbackTask {
    fn run(self: Box<Self>) {
        name_callback_thread();
        match *self {
            CallbackTask::Argmin { state, job } => state.argmin(job, CALLBACK_LANE, "host_callback_argmin"),
            CallbackTask::HandOff { state, job, to } => {
                let start = state.now_us();
                let t = job.lease.iteration;
                {
                    let _r = crate::gpu::trace::range("host_callback_enqueue");
                    if let Err(returned) = to.send(job) {
                        state.drop_job(returned.0, "the worker was gone when the callback handed it over".into());
                    }
                }
                state.span(CALLBACK_LANE, format!("hand-off {t}"), start, state.now_us());
            }
            CallbackTask::Nothing => {}
        }
    }
}

/// Names the driver's callback thread for Nsight, once.
fn name_callback_thread() {
    thread_local!(static NAMED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    if !NAMED.with(|n| n.replace(true)) {
        nvtx::name_current_thread(c"CUDA callback thread");
    }
}

/// Waits until an iteration's scores have landed (variant 4's event wait).
pub type WaitForScores = Box<dyn Fn(&Lease) -> Result<()> + Send>;

/// A named thread that runs argmin jobs in order; with `wait_first`, it
/// first waits for each job's scores itself (no host function involved).
/// Joined when dropped, so no thread outlives its run.
pub struct Worker {
    tx: Option<Sender<ArgminJob>>,
    handle: Option<JoinHandle<()>>,
    name: String,
}

impl Worker {
    pub fn spawn(name: &str, lane: &'static str, state: Arc<RunState>, wait_first: Option<WaitForScores>) -> Result<Worker> {
        let (tx, rx) = channel::<ArgminJob>();
        let thread_name = name.to_string();
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                nvtx::name_current_thread(nvtx::Str::from_str_lossy(&thread_name));
                let book = state.book.clone();
                let body = std::panic::AssertUnwindSafe(|| {
                    for job in rx {
                        if let Some(wait) = &wait_first {
                            let start = state.now_us();
                            let waited = {
                                let _r = crate::gpu::trace::range("wait: D2H scores event");
                                wait(&job.lease)
                            };
                            state.span(lane, format!("wait for scores {}", job.lease.iteration), start, state.now_us());
                            if let Err(e) = waited {
                                state.drop_job(job, format!("waiting for its scores failed: {e}"));
                                continue;
                            }
                        }
                        state.argmin(job, lane, "worker_argmin");
                    }
                });
                if let Err(p) = std::panic::catch_unwind(body) {
                    let msg = format!("the {thread_name} thread panicked: {}", panic_message(&*p));
                    state.error(msg.clone());
                    // Wake the enqueue loop instead of letting it wait for slots forever.
                    book.fail(msg);
                }
            })
            .map_err(|e| LabError::io(format!("starting the {name} thread"), e))?;
        Ok(Worker { tx: Some(tx), handle: Some(handle), name: name.into() })
    }

    pub fn sender(&self) -> Sender<ArgminJob> {
        self.tx.clone().expect("a live worker has a sender")
    }

    /// Closes the queue and joins the thread once every job sent is done.
    pub fn join(mut self) -> Result<()> {
        self.tx.take();
        match self.handle.take().map(JoinHandle::join) {
            Some(Err(p)) => Err(LabError::Thread(format!("the {} thread panicked: {}", self.name, panic_message(&*p)))),
            _ => Ok(()),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// One run's CPU side over `slots` slots of `rows` scores + stamp in
    /// plain memory (as a rig would pin them): the memory, the book, the state.
    fn fixture(slots: usize, rows: usize, iterations: usize, passes: u32, timeout_s: f64, spans: bool) -> (Vec<Vec<u32>>, Arc<SlotBook>, RunState) {
        let mem: Vec<Vec<u32>> = (0..slots).map(|_| vec![0u32; rows + 1]).collect();
        let views = mem.iter().map(|m| unsafe { ScoresView::new(m.as_ptr(), rows) }).collect();
        let book = Arc::new(SlotBook::new(slots, Duration::from_secs_f64(timeout_s)));
        let state = RunState::new(book.clone(), views, iterations, passes, Instant::now(), spans);
        (mem, book, state)
    }
    /// Writes iteration t's scores (its argmin at t % rows) and stamp.
    fn land(mem: &mut [u32], t: usize) {
        let rows = mem.len() - 1;
        for (i, w) in mem[..rows].iter_mut().enumerate() {
            *w = ((i as f32) + 1.0).to_bits();
        }
        mem[t % rows] = (-1.0f32).to_bits();
        mem[rows] = t as u32;
    }

    #[test]
    fn argmin_is_the_first_smallest_at_any_length() {
        assert_eq!(argmin(&[]), NO_RESULT);
        for n in [1usize, 15, 16, 17, 100, 1000] {
            for at in [0, n / 2, n - 1] {
                let mut v: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
                v[at] = -5.0;
                if at + 1 < n {
                    v[n - 1] = -5.0; // a tie later on: the first wins
                }
                assert_eq!(argmin(&v), at as u32, "n {n} at {at}");
                assert_eq!(heavy_argmin(&v, 3), Ok(at as u32));
            }
        }
    }

    #[test]
    fn the_worker_runs_every_job_gives_every_slot_back_and_joins() {
        let rows = 64;
        let (mut mem, book, state) = fixture(3, rows, 200, 2, 10.0, true);
        let state = Arc::new(state);
        let worker = Worker::spawn("test-worker", WORKER_LANE, state.clone(), None).unwrap();
        let tx = worker.sender();
        for t in 0..200 {
            let lease = book.take(t).unwrap();
            land(&mut mem[lease.slot], t);
            tx.send(ArgminJob { lease }).unwrap();
        }
        drop(tx);
        worker.join().unwrap();
        assert_eq!(state.done(), 200);
        assert!(state.errors().is_empty(), "{:?}", state.errors());
        let want: Vec<u32> = (0..200).map(|t| (t % rows) as u32).collect();
        assert_eq!(state.results(), want);
        book.wait_all_back().unwrap();
        assert_eq!(state.take_spans().len(), 200);
    }

    #[test]
    fn scores_that_have_not_arrived_are_reported_not_used() {
        let rows = 16;
        let (mut mem, book, state) = fixture(1, rows, 4, 1, 1.0, false);
        land(&mut mem[0], 0);
        let lease = book.take(1).unwrap(); // iteration 1 reads what iteration 0 left
        state.argmin(ArgminJob { lease }, WORKER_LANE, "test");
        assert!(state.errors()[0].contains("iteration 1 read slot 0 before its scores arrived"), "{:?}", state.errors());
        assert_eq!(state.results()[1], NO_RESULT);
        book.wait_all_back().unwrap();
    }

    #[test]
    fn a_panicking_argmin_becomes_an_error_and_frees_its_slot() {
        let rows = 16;
        let (mut mem, book, mut state) = fixture(1, rows, 2, 1, 1.0, false);
        state.panic_at = Some(0);
        let state = Arc::new(state);
        let worker = Worker::spawn("test-worker", WORKER_LANE, state.clone(), None).unwrap();
        land(&mut mem[0], 0);
        worker.sender().send(ArgminJob { lease: book.take(0).unwrap() }).unwrap();
        let lease = book.take(1).expect("the slot came back despite the panic");
        land(&mut mem[0], 1);
        worker.sender().send(ArgminJob { lease }).unwrap();
        worker.join().unwrap();
        assert!(state.errors()[0].contains("argmin of iteration 0 panicked: injected failure"), "{:?}", state.errors());
        assert_eq!(state.results(), vec![NO_RESULT, 1]);
    }

    #[test]
    fn a_worker_that_dies_fails_the_enqueue_loop_instead_of_hanging_it() {
        let rows = 16;
        let (_mem, book, state) = fixture(1, rows, 2, 1, 30.0, false);
        let state = Arc::new(state);
        let wait: WaitForScores = Box::new(|_| panic!("the event wait blew up"));
        let worker = Worker::spawn("test-waiter", WAITER_LANE, state.clone(), Some(wait)).unwrap();
        worker.sender().send(ArgminJob { lease: book.take(0).unwrap() }).unwrap();
        let t = Instant::now();
        let e = book.take(1).unwrap_err().to_string();
        assert!(t.elapsed() < Duration::from_secs(10) && e.contains("test-waiter thread panicked"), "{e}");
        assert!(worker.join().is_ok(), "the panic was caught inside the thread, which then ended");
        assert!(state.errors()[0].contains("the event wait blew up"));
    }

    #[test]
    fn a_host_task_can_hand_off_to_the_worker() {
        let rows = 16;
        let (mut mem, book, state) = fixture(1, rows, 1, 1, 1.0, true);
        let state = Arc::new(state);
        let worker = Worker::spawn("test-worker", WORKER_LANE, state.clone(), None).unwrap();
        land(&mut mem[0], 0);
        let task = Box::new(CallbackTask::HandOff { state: state.clone(), job: ArgminJob { lease: book.take(0).unwrap() }, to: worker.sender() });
        std::thread::spawn(move || task.run()).join().unwrap();
        worker.join().unwrap();
        assert_eq!(state.results(), vec![0]);
        let lanes: Vec<String> = state.take_spans().into_iter().map(|s| s.lane).collect();
        assert!(lanes.contains(&CALLBACK_LANE.to_string()) && lanes.contains(&WORKER_LANE.to_string()), "{lanes:?}");
    }
}
