//! A start gate, as nvbandwidth uses: streams wait (cuStreamWaitValue32) on a
//! word of mapped pinned memory until the host writes the next value. Work
//! issued behind a closed gate starts all at once when it opens, so the time
//! the CPU spends issuing it never shows up as device time.
//!
//! Rules that keep a gate from deadlocking, enforced by its users: open it
//! before the CPU waits for anything on a held stream, before a pageable copy
//! (such a call blocks until its staged DMA ran), and before the GPU's queues
//! could fill (a bounded number of operations).
//!
//! One case no rule can foresee: a tool that serializes GPU work (Nsight
//! Compute replays every kernel inside its launch call, compute-sanitizer's
//! initcheck waits inside calls) blocks the CPU in the first call issued
//! behind a closed gate, so the CPU never reaches the release. A watchdog
//! thread per gate opens it if it stays closed for [`WATCHDOG`], says so
//! once, and from then on the process runs ungated.

use super::{driver, Gpu, Stream};
use crate::error::Result;
use cudarc::driver::CudaContext;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a gate may stay closed before its watchdog opens it. Issuing
/// the most a gated run holds (256 operations) takes about a millisecond.
pub(crate) const WATCHDOG: Duration = Duration::from_millis(250);

/// Set once a watchdog had to open a gate: every later run is ungated.
static FORCED_OPEN: AtomicBool = AtomicBool::new(false);

/// Whether a watchdog opened a gate in this process (see the module doc).
pub fn forced_open() -> bool {
    FORCED_OPEN.load(Ordering::Relaxed)
}

/// The mapped word, as the watchdog thread sees it.
struct Word(*mut u32);
// SAFETY: the pointer is only written (volatile) by the watchdog thread,
// and the word it points at stays allocated until that thread is joined
// (`Drop for Gate` joins it before freeing the word).
unsafe impl Send for Word {}

#[derive(Default)]
struct WatchState {
    /// The value that opens the gate, and when to write it.
    armed: Option<(u32, Instant)>,
    quit: bool,
}

/// A thread that opens the gate if it stays closed too long.
struct Watchdog {
    state: Arc<(Mutex<WatchState>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn start(word: Word) -> Option<Watchdog> {
        let state = Arc::new((Mutex::new(WatchState::default()), Condvar::new()));
        let shared = state.clone();
        let thread = std::thread::Builder::new()
            .name("gate-watchdog".into())
            .spawn(move || {
                let word = word;
                let (lock, cv) = &*shared;
                let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
                while !s.quit {
                    s = match s.armed {
                        None => cv.wait(s).unwrap_or_else(|e| e.into_inner()),
                        Some((value, deadline)) if Instant::now() >= deadline => {
                            // SAFETY: the word is allocated until this thread is
                            // joined (see Word); a volatile store of the value
                            // `release` would write, which the GPU reads.
                            unsafe { word.0.write_volatile(value) };
                            std::sync::atomic::fence(Ordering::SeqCst);
                            s.armed = None;
                            if !FORCED_OPEN.swap(true, Ordering::Relaxed) {
                                eprintln!(
                                    "overlap-lab: the start gate stayed closed for {} ms while work was issued behind it, so a tool (Nsight Compute, compute-sanitizer) must be serializing GPU work; it was opened, and this run goes on ungated: device times include the time to issue the work",
                                    WATCHDOG.as_millis()
                                );
                            }
                            s
                        }
                        Some((_, deadline)) => cv.wait_timeout(s, deadline - Instant::now()).map(|(g, _)| g).unwrap_or_else(|e| e.into_inner().0),
                    };
                }
            })
            .ok()?;
        Some(Watchdog { state, thread: Some(thread) })
    }

    fn update(&self, f: impl FnOnce(&mut WatchState)) {
        let (lock, cv) = &*self.state;
        f(&mut lock.lock().unwrap_or_else(|e| e.into_inner()));
        cv.notify_one();
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.update(|s| s.quit = true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The word and the next value that opens it.
pub(crate) struct Gate {
    host: *mut u32,
    dev: driver::CUdeviceptr,
    next: u32,
    ctx: Arc<CudaContext>,
    /// Joined in `Drop for Gate` before the word is freed.
    watchdog: Option<Watchdog>,
}

// SAFETY: the word is written only through &mut self (and by the watchdog
// with the same value release would write); the GPU only reads it; and the
// context handle is an Arc of cudarc's thread-safe context.
unsafe impl Send for Gate {}

/// A device's spare gate, so pipelines do not allocate pinned memory each
/// (cuMemFreeHost may synchronize the device).
pub(crate) type GateSlot = Arc<Mutex<Option<Gate>>>;

impl Gate {
    /// A gate that was checked to work: a stream held behind it and released
    /// completes. `None` where stream memory operations are unsupported.
    pub(crate) fn new(gpu: &Gpu) -> Option<Gate> {
        let mut gate = Gate::alloc(gpu).ok()?;
        let s = gpu.stream().ok()?;
        let held = gate.hold(&s);
        gate.release();
        (held.is_ok() && s.synchronize().is_ok()).then_some(gate)
    }

    fn alloc(gpu: &Gpu) -> Result<Gate> {
        gpu.bind()?;
        let host = driver::host_alloc(4096, driver::HOST_ALLOC_MAPPED)? as *mut u32;
        // SAFETY: mapped pinned memory from host_alloc, just made.
        let dev = match unsafe { driver::host_device_pointer(host as *mut c_void) } {
            Ok(d) => d,
            Err(e) => {
                // SAFETY: allocated just above, freed once, never used by the GPU.
                let _ = unsafe { driver::host_free(host as *mut c_void) };
                return Err(e);
            }
        };
        // SAFETY: a live allocation of 4096 bytes, page-aligned, that nothing
        // else can reach yet.
        unsafe { host.write_volatile(0) };
        let watchdog = Watchdog::start(Word(host));
        Ok(Gate { host, dev, next: 1, ctx: gpu.ctx.clone(), watchdog })
    }

    /// Takes the device's spare gate, or makes one; none once a watchdog
    /// had to open a gate (a serializing tool is attached).
    pub(crate) fn take(gpu: &Gpu) -> Option<Gate> {
        if forced_open() {
            return None;
        }
        let spare = gpu.gate.lock().unwrap_or_else(|e| e.into_inner()).take();
        spare.or_else(|| Gate::new(gpu))
    }

    /// Gives an open gate back to its device for the next user.
    pub(crate) fn put_back(self, gpu: &Gpu) {
        let mut slot = gpu.gate.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(self);
        }
    }

    /// Later work on `stream` waits until the next `release` (or, if that
    /// never comes in time, the watchdog). The word the stream waits on
    /// outlives the wait: the gate opens, and waits for the GPU, before it
    /// frees it (`Drop`).
    pub(crate) fn hold(&self, stream: &Stream) -> Result<()> {
        if let Some(w) = &self.watchdog {
            let next = self.next;
            w.update(|s| {
                if s.armed.is_none() {
                    s.armed = Some((next, Instant::now() + WATCHDOG));
                }
            });
        }
        // SAFETY: `self.dev` aliases the gate's mapped word, which stays
        // allocated until every wait on it completed (`Drop` opens the gate
        // and waits for the GPU first); the stream is live (borrowed).
        unsafe { driver::stream_wait_value_geq(stream.raw(), self.dev, self.next) }
    }

    /// Opens the gate for everything held so far.
    pub(crate) fn release(&mut self) {
        // SAFETY: the gate's live mapped word (freed only by `Drop`);
        // volatile so the store is not elided: the GPU reads it.
        unsafe { self.host.write_volatile(self.next) };
        std::sync::atomic::fence(Ordering::SeqCst);
        if let Some(w) = &self.watchdog {
            w.update(|s| s.armed = None);
        }
        self.next = self.next.wrapping_add(1).max(1);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        // The watchdog thread must be gone before the word it writes is freed.
        drop(self.watchdog.take());
        // Open it for any stream still held (the value only grows), and let
        // every wait on the word complete before it goes.
        self.release();
        let _ = driver::bind(&self.ctx);
        let _ = driver::context_synchronize();
        // SAFETY: allocated by `alloc`, freed once, here; no wait on it is
        // left (opened and waited for above) and the watchdog is joined.
        let _ = unsafe { driver::host_free(self.host as *mut c_void) };
    }
}
