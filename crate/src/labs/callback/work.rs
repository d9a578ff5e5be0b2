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

/// One slot's pinned scores as the CPU sees them: `rows` f32 then a u32
/// stamp the kernel wrote (the iteration). The memory belongs to the rig,
/// which outlives every run (it joins the threads and syncs the streams).
///
/// A copy may land in the slot while the CPU reads it: a loop that hands
/// an argmin out before its D2H has finished, or reuses a slot too early,
/// is a mistake this lab must catch, not undefined behaviour. So the view
/// never lends the scores out as a slice (which would promise that nothing
/// changes them meanwhile): it reads them itself with volatile loads, the
/// way to read memory that a device may write, 16 bytes at a time.
#[derive(Clone, Copy, Debug)]
pub struct ScoresView {
    ptr: *const u32,
    rows: usize,
}

// SAFETY: a view of pinned memory that outlives every thread using it
// (`new`'s contract), read only with volatile loads, which are sound while
// a copy writes it; who may read it when is what the slot book decides.
unsafe impl Send for ScoresView {}
// SAFETY: as for Send: `&ScoresView` only reads, with volatile loads.
unsafe impl Sync for ScoresView {}

/// Four scores, read with one volatile 16-byte load.
type Four = [f32; 4];

impl ScoresView {
    /// # Safety
    /// `ptr` is 16-byte aligned and points at `rows + 1` u32 that stay
    /// allocated while views exist.
    pub unsafe fn new(ptr: *const u32, rows: usize) -> ScoresView {
        debug_assert_eq!(ptr as usize % 16, 0, "a score slot starts 16-byte aligned");
        ScoresView { ptr, rows }
    }
    /// The stamp word, read as memory a DMA may write at any time.
    pub fn stamp(&self) -> u32 {
        // SAFETY: in bounds (rows + 1 words, `new`'s contract), aligned, and
        // read with a volatile load (a copy may be writing it).
        unsafe { std::ptr::read_volatile(self.ptr.add(self.rows)) }
    }
    /// Score `i` (< rows), read as memory a DMA may write.
    fn score(&self, i: usize) -> f32 {
        debug_assert!(i < self.rows);
        // SAFETY: in bounds (i < rows), aligned (u32 and f32 alike), and a
        // volatile load.
        f32::from_bits(unsafe { std::ptr::read_volatile(self.ptr.add(i)) })
    }
    /// Scores `4·j .. 4·j + 4` (4·j + 4 <= rows), in one 16-byte load.
    fn four(&self, j: usize) -> Four {
        debug_assert!(4 * j + 4 <= self.rows);
        let at = self.ptr as *const Four;
        // SAFETY: in bounds (4·j + 4 <= rows) and 16-byte aligned (the
        // slot starts so, `new`'s contract); a volatile load. On x86_64 and
        // aarch64 it is one vector load, so the scan costs what a slice's
        // would; elsewhere four scalar ones.
        unsafe {
            #[cfg(target_arch = "x86_64")]
            let four = std::mem::transmute::<std::arch::x86_64::__m128, Four>(std::ptr::read_volatile(at.add(j) as *const std::arch::x86_64::__m128));
            #[cfg(target_arch = "aarch64")]
            let four =
                std::mem::transmute::<std::arch::aarch64::float32x4_t, Four>(std::ptr::read_volatile(at.add(j) as *const std::arch::aarch64::float32x4_t));
            #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
            let four = std::ptr::read_volatile(at.add(j));
            four
        }
    }

    /// The first index of the smallest score. Four blocks of four lanes
    /// keep the running minimum in vector registers; the index is found in
    /// a second scan ([`NO_RESULT`] for no rows).
    pub fn argmin(&self) -> u32 {
        if self.rows == 0 {
            return NO_RESULT;
        }
        let mut lanes = [[f32::INFINITY; 4]; 4];
        let blocks = self.rows / 16;
        for b in 0..blocks {
            for (q, lane) in lanes.iter_mut().enumerate() {
                for (m, x) in lane.iter_mut().zip(self.four(4 * b + q)) {
                    *m = if x < *m { x } else { *m };
                }
            }
        }
        let tail = (16 * blocks..self.rows).map(|i| self.score(i));
        let min = tail.chain(lanes.into_iter().flatten()).fold(f32::INFINITY, |m, x| if x < m { x } else { m });
        (0..self.rows).find(|&i| self.score(i) == min).map_or(0, |i| i as u32)
    }

    /// The lab's CPU work: the argmin `passes` times over the same scores
    /// (its cost is the knob). Every pass must agree, so none can be
    /// skipped; a disagreement means the scores changed under the reader.
    pub fn heavy_argmin(&self, passes: u32) -> std::result::Result<u32, String> {
        let first = std::hint::black_box(self).argmin();
        for p in 1..passes {
            let again = std::hint::black_box(self).argmin();
            if again != first {
                return Err(format!("argmin pass {p} found {again}, pass 0 found {first}: the scores changed while being read"));
            }
        }
        Ok(first)
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
        // A panic is recorded below as this iteration's failure, and printed nowhere else.
        let found = crate::error::catch_quietly(|| {
            if self.panic_at == Some(t) {
                panic!("injected failure in the argmin of iteration {t}");
            }
            view.heavy_argmin(self.passes)
        });
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
            Err(p) => self.error(format!("the argmin of iteration {t} panicked: {p}")),
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
                if let Err(p) = crate::error::catch_quietly(body) {
                    let msg = format!("the {thread_name} thread panicked: {p}");
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

    /// Four words, 16-byte aligned, as the rig's pinned slots are.
    #[derive(Clone, Copy, Debug, Default)]
    #[repr(C, align(16))]
    struct Words4([u32; 4]);

    /// A slot's memory for a test: `rows` scores and the stamp, reached
    /// only through its raw pointer (as the views and a DMA reach the
    /// rig's), so a write here never invalidates a view.
    struct SlotMem {
        ptr: *mut Words4,
        len: usize,
    }

    impl SlotMem {
        fn new(rows: usize) -> SlotMem {
            let words = vec![Words4::default(); (rows + 1).div_ceil(4)].into_boxed_slice();
            let len = words.len();
            SlotMem { ptr: Box::into_raw(words) as *mut Words4, len }
        }
        fn set(&self, i: usize, word: u32) {
            assert!(i < 4 * self.len);
            // SAFETY: in bounds (asserted) of the live allocation `self` owns.
            unsafe { std::ptr::write_volatile((self.ptr as *mut u32).add(i), word) }
        }
        /// A view of its first `rows` scores (and the stamp after them).
        fn view(&self, rows: usize) -> ScoresView {
            assert!(rows < 4 * self.len);
            // SAFETY: 16-byte aligned (Words4), rows + 1 words long
            // (asserted); every test keeps `self` alive while its views are used.
            unsafe { ScoresView::new(self.ptr as *const u32, rows) }
        }
        /// Writes iteration t's `rows` scores (its argmin at t % rows) and stamp.
        fn land(&self, rows: usize, t: usize) {
            for i in 0..rows {
                self.set(i, ((i as f32) + 1.0).to_bits());
            }
            self.set(t % rows, (-1.0f32).to_bits());
            self.set(rows, t as u32);
        }
    }

    impl Drop for SlotMem {
        fn drop(&mut self) {
            // SAFETY: made by `Box::into_raw` of a slice of `len` in `new`,
            // freed once, here.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
        }
    }

    /// One run's CPU side over `slots` slots of `rows` scores + stamp in
    /// plain memory (as a rig would pin them): the memory, the book, the state.
    fn fixture(slots: usize, rows: usize, iterations: usize, passes: u32, timeout_s: f64, spans: bool) -> (Vec<SlotMem>, Arc<SlotBook>, RunState) {
        let mem: Vec<SlotMem> = (0..slots).map(|_| SlotMem::new(rows)).collect();
        let views = mem.iter().map(|m| m.view(rows)).collect();
        let book = Arc::new(SlotBook::new(slots, Duration::from_secs_f64(timeout_s)));
        let state = RunState::new(book.clone(), views, iterations, passes, Instant::now(), spans);
        (mem, book, state)
    }

    #[test]
    fn argmin_is_the_first_smallest_at_any_length() {
        assert_eq!(SlotMem::new(0).view(0).argmin(), NO_RESULT);
        for n in [1usize, 3, 15, 16, 17, 31, 100, 1000] {
            for at in [0, n / 2, n - 1] {
                let mem = SlotMem::new(n);
                for i in 0..n {
                    mem.set(i, ((i % 7) as f32).to_bits());
                }
                mem.set(at, (-5.0f32).to_bits());
                if at + 1 < n {
                    mem.set(n - 1, (-5.0f32).to_bits()); // a tie later on: the first wins
                }
                let v = mem.view(n);
                assert_eq!(v.argmin(), at as u32, "n {n} at {at}");
                assert_eq!(v.heavy_argmin(3), Ok(at as u32));
            }
        }
    }

    #[test]
    fn the_worker_runs_every_job_gives_every_slot_back_and_joins() {
        let rows = 64;
        let (mem, book, state) = fixture(3, rows, 200, 2, 10.0, true);
        let state = Arc::new(state);
        let worker = Worker::spawn("test-worker", WORKER_LANE, state.clone(), None).unwrap();
        let tx = worker.sender();
        for t in 0..200 {
            let lease = book.take(t).unwrap();
            mem[lease.slot].land(rows, t);
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
        let (mem, book, state) = fixture(1, rows, 4, 1, 1.0, false);
        mem[0].land(rows, 0);
        let lease = book.take(1).unwrap(); // iteration 1 reads what iteration 0 left
        state.argmin(ArgminJob { lease }, WORKER_LANE, "test");
        assert!(state.errors()[0].contains("iteration 1 read slot 0 before its scores arrived"), "{:?}", state.errors());
        assert_eq!(state.results()[1], NO_RESULT);
        book.wait_all_back().unwrap();
    }

    #[test]
    fn a_panicking_argmin_becomes_an_error_and_frees_its_slot() {
        let rows = 16;
        let (mem, book, mut state) = fixture(1, rows, 2, 1, 1.0, false);
        state.panic_at = Some(0);
        let state = Arc::new(state);
        let worker = Worker::spawn("test-worker", WORKER_LANE, state.clone(), None).unwrap();
        mem[0].land(rows, 0);
        worker.sender().send(ArgminJob { lease: book.take(0).unwrap() }).unwrap();
        let lease = book.take(1).expect("the slot came back despite the panic");
        mem[0].land(rows, 1);
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
        let (mem, book, state) = fixture(1, rows, 1, 1, 1.0, true);
        let state = Arc::new(state);
        let worker = Worker::spawn("test-worker", WORKER_LANE, state.clone(), None).unwrap();
        mem[0].land(rows, 0);
        let task = Box::new(CallbackTask::HandOff { state: state.clone(), job: ArgminJob { lease: book.take(0).unwrap() }, to: worker.sender() });
        std::thread::spawn(move || task.run()).join().unwrap();
        worker.join().unwrap();
        assert_eq!(state.results(), vec![0]);
        let lanes: Vec<String> = state.take_spans().into_iter().map(|s| s.lane).collect();
        assert!(lanes.contains(&CALLBACK_LANE.to_string()) && lanes.contains(&WORKER_LANE.to_string()), "{lanes:?}");
    }
}
