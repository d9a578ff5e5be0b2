//! This process's raw trace file: CUPTI's buffers (handed out and taken
//! back here), their records decoded and appended as lines by a writer
//! thread of the library's own (by the ending thread for what is left at
//! exit or on a fatal signal, and by CUPTI's callback itself where the
//! writer falls [`MAX_PENDING`] buffers behind), and at exit the End line
//! and the Chrome trace.

use crate::cupti;
use crate::decode::{decode, CuptiNames, Decoded};
use overlap_lab_tracefile::raw::{raw_path, refused_path, write_record};
use overlap_lab_tracefile::records::{End, Lost, Process, Record};
use std::alloc::{alloc, dealloc, Layout};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};

/// The size of each buffer CUPTI fills (as the crate's own timelines use).
const BUFFER: usize = 8 << 20;

static SINK: Mutex<Option<Sink>> = Mutex::new(None);
static NAMES: Mutex<Option<CuptiNames>> = Mutex::new(None);
/// The process that attached (0: none): a forked child is not it.
static OWNER: AtomicU32 = AtomicU32::new(0);

fn pid() -> u32 {
    std::process::id()
}

fn trace_dir() -> PathBuf {
    std::env::var_os("OVERLAP_LAB_TRACE_DIR").map_or_else(|| PathBuf::from("."), PathBuf::from)
}

/// An open raw trace file.
pub struct Sink {
    out: BufWriter<File>,
    path: PathBuf,
}

/// Creates this process's raw trace file.
pub fn open() -> Result<Sink, String> {
    let path = raw_path(&trace_dir(), pid());
    let file = File::create(&path).map_err(|e| format!("cannot write the trace file {}: {e}", path.display()))?;
    Ok(Sink { out: BufWriter::new(file), path })
}

impl Sink {
    /// Writes the process line (the file's first).
    pub fn begin(&mut self, cupti_version: u32, refused_kinds: Vec<String>, kinds_not_asked: Vec<String>) -> Result<(), String> {
        let argv = std::fs::read("/proc/self/cmdline")
            .map(|b| b.split(|c| *c == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect())
            .unwrap_or_default();
        let exe = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default();
        let process = Process { pid: pid(), parent_pid: std::os::unix::process::parent_id(), exe, argv, cupti_version, refused_kinds, kinds_not_asked };
        self.write(&[Record::Process(process)]).map_err(|e| format!("cannot write the trace file {}: {e}", self.path.display()))
    }

    /// Removes the file (the process runs untraced).
    pub fn discard(&self) {
        let _ = std::fs::remove_file(&self.path);
    }

    fn write(&mut self, records: &[Record]) -> std::io::Result<()> {
        for r in records {
            write_record(&mut self.out, r)?;
        }
        self.out.flush()
    }
}

/// Makes `sink` the file records go to, this process its owner.
pub fn install(sink: Sink) {
    *SINK.lock().unwrap_or_else(|e| e.into_inner()) = Some(sink);
    OWNER.store(pid(), Ordering::SeqCst);
}

/// Whether this process is the one that attached (not a forked child).
pub fn is_owner() -> bool {
    OWNER.load(Ordering::SeqCst) == pid()
}

/// Whether `overlap-lab trace` runs this process (it converts the raw
/// files and speaks for the library).
fn under_the_command() -> bool {
    std::env::var_os("OVERLAP_LAB_TRACE_RAW").is_some_and(|v| v == "1")
}

/// Says why this process runs untraced: the `.refused` file `overlap-lab
/// trace` reads (it says so itself), else a line on stderr.
pub fn refuse(why: &str) {
    let _ = std::fs::write(refused_path(&trace_dir(), pid()), format!("{why}\n"));
    if !under_the_command() {
        eprintln!("overlap-lab trace: cannot trace process {}: {why}; it runs untraced", pid());
    }
}

/// Set while a fatal signal's handler flushes: no lock is then waited for
/// without end (the crash may have come while one was held): each is
/// tried for at most a second ([`lock_now`]).
static IN_SIGNAL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Set once the End line is written: buffers CUPTI still hands over are
/// freed unread.
static FINISHED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

thread_local! {
    /// Whether this thread is the writer (a fault in its decoding must not
    /// wait for the lock it holds itself).
    static IS_WRITER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `m` locked: waited for as long as it takes, except in a fatal signal's
/// handler, where it is tried for at most a second (None: not had).
fn lock_now<T>(m: &'static Mutex<T>) -> Option<std::sync::MutexGuard<'static, T>> {
    if !IN_SIGNAL.load(Ordering::SeqCst) {
        return Some(m.lock().unwrap_or_else(|e| e.into_inner()));
    }
    for _ in 0..1000 {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => std::thread::sleep(std::time::Duration::from_millis(1)),
        }
    }
    None
}

/// As the process ends: the End line (with the signal that ends it, if
/// one does), then, on a plain exit, the Chrome trace beside the raw file
/// (unless `overlap-lab trace` converts it), the raw file then removed.
pub fn finish(signal: Option<i32>) {
    // Every pending buffer written first; the writer then writes no more.
    let Some(_writing) = drain() else { return };
    let Some(mut guard) = lock_now(&SINK) else { return };
    let Some(mut sink) = guard.take() else { return };
    drop(guard);
    FINISHED.store(true, Ordering::SeqCst);
    let at_ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    if sink.write(&[Record::End(End { at_ns, signal })]).is_err() {
        return;
    }
    drop(sink.out);
    if under_the_command() {
        return;
    }
    if let Some(sig) = signal {
        // Converting allocates and writes much: not in a dying process.
        eprintln!("overlap-lab trace: process {} ended by signal {sig}; its records are in {}", pid(), sink.path.display());
        return;
    }
    let out = sink.path.with_extension("json.gz");
    match overlap_lab_tracefile::convert_file(&sink.path, &out) {
        Ok(s) => {
            let _ = std::fs::remove_file(&sink.path);
            eprintln!("overlap-lab trace: process {} wrote {} ({} GPU ops, {} calls)", pid(), out.display(), s.gpu_ops(), s.calls);
        }
        Err(e) => eprintln!("overlap-lab trace: process {}: the raw trace {} is kept: {e}", pid(), sink.path.display()),
    }
}

/// The signals whose default action ends the process without `exit`
/// (no atexit handlers): each flushes CUPTI first, where the program left
/// it at its default.
const FATAL: [libc::c_int; 7] = [libc::SIGABRT, libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTERM, libc::SIGINT];

/// Flushes on each fatal signal the program has not taken over itself:
/// its handler runs once (the default action is back as it runs), flushes
/// what CUPTI holds into the file, then raises the signal again.
pub fn catch_fatal_signals() {
    for sig in FATAL {
        // SAFETY: reads the current action into a zeroed struct, then
        // installs a handler (a plain function, reset to the default on
        // entry) only where the action was the default.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 || old.sa_sigaction != libc::SIG_DFL {
                continue;
            }
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_fatal_signal as extern "C" fn(libc::c_int) as usize;
            new.sa_flags = libc::SA_RESETHAND | libc::SA_NODEFER;
            libc::sigemptyset(&mut new.sa_mask);
            libc::sigaction(sig, &new, std::ptr::null_mut());
        }
    }
}

extern "C" fn on_fatal_signal(sig: libc::c_int) {
    if is_owner() && !IN_SIGNAL.swap(true, Ordering::SeqCst) {
        let _ = std::panic::catch_unwind(|| {
            let _ = cupti::flush_all(true);
            finish(Some(sig));
        });
    }
    // SAFETY: the action is the default again (SA_RESETHAND): the signal
    // ends the process as it would have without this handler.
    unsafe { libc::raise(sig) };
}

fn layout() -> Layout {
    Layout::from_size_align(BUFFER, 8).expect("a static layout")
}

/// CUPTI asks for a buffer to fill.
///
/// # Safety
/// Called by CUPTI only, with three valid out-pointers.
pub unsafe extern "C" fn requested(buffer: *mut *mut u8, size: *mut usize, max_records: *mut usize) {
    // SAFETY: a non-zero static layout; freed in `completed`.
    let b = unsafe { alloc(layout()) };
    // SAFETY: the out-pointers are valid (# Safety).
    unsafe {
        *buffer = b;
        *size = if b.is_null() { 0 } else { BUFFER };
        *max_records = 0;
    }
}

/// A buffer CUPTI completed, waiting for the writer: its address (a
/// `usize`, to cross threads), its bytes of records, and the records CUPTI
/// dropped for its context and stream.
struct Completed {
    buffer: usize,
    valid: usize,
    dropped: u64,
}

/// How many completed buffers may wait for the writer (8 MiB each): past
/// that, CUPTI's callback writes its buffer itself, and so holds CUPTI
/// back as the writer catches up, instead of the process's memory growing.
pub const MAX_PENDING: usize = 16;

/// Completed buffers not yet written, oldest first.
static PENDING: Mutex<VecDeque<Completed>> = Mutex::new(VecDeque::new());
/// Wakes the writer when a buffer arrives.
static ARRIVED: Condvar = Condvar::new();
/// Held while one buffer is decoded and written, by the writer or by the
/// process's end (which then writes the End line after the last).
static WRITING: Mutex<()> = Mutex::new(());

/// CUPTI hands back a buffer `requested` gave it, `valid` bytes of it
/// records. Its records are decoded and written by the writer thread
/// ([`start_writer`]), not here: CUPTI waits for this callback, and so may
/// the program's threads that need a buffer meanwhile (Kineto's callback
/// too only keeps the buffer). Where [`MAX_PENDING`] wait already, it is
/// written here.
///
/// # Safety
/// Called by CUPTI only, once per buffer from `requested`.
pub unsafe extern "C" fn completed(ctx: cudarc::driver::sys::CUcontext, stream: u32, buffer: *mut u8, _size: usize, valid: usize) {
    if buffer.is_null() {
        return;
    }
    let kept = std::panic::catch_unwind(|| {
        if !is_owner() || FINISHED.load(Ordering::SeqCst) {
            return false;
        }
        // SAFETY: the context and stream CUPTI passed in.
        let dropped = unsafe { cupti::dropped(ctx, stream) } as u64;
        let job = Completed { buffer: buffer as usize, valid, dropped };
        let Some(mut q) = lock_now(&PENDING) else {
            return false;
        };
        if q.len() < MAX_PENDING {
            q.push_back(job);
            ARRIVED.notify_one();
            return true;
        }
        drop(q);
        // The writer is behind: this buffer written here, in its turn.
        if let Some(_writing) = lock_now(&WRITING) {
            write_buffer(job);
            return true;
        }
        false
    });
    if !matches!(kept, Ok(true)) {
        // SAFETY: allocated in `requested` with this layout and handed back
        // once (# Safety); nothing else holds it.
        unsafe { dealloc(buffer, layout()) };
    }
}

/// Starts the thread that decodes completed buffers and appends their
/// records to the file, at a lower priority than the program's threads
/// (nice 10), so that tracing takes what CPU time the program leaves. It
/// blocks the signals a program may be sent (Ctrl-C, SIGTERM, …), so that
/// none lands on it while it holds the file's locks.
pub fn start_writer() {
    let _ = std::thread::Builder::new().name("overlap-lab-trace".into()).spawn(|| {
        IS_WRITER.with(|w| w.set(true));
        // SAFETY: plain calls on this thread's own id and signal mask,
        // with a set made here.
        unsafe {
            libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut set);
            for sync in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGABRT] {
                libc::sigdelset(&mut set, sync);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        }
        loop {
            {
                let mut q = PENDING.lock().unwrap_or_else(|e| e.into_inner());
                while q.is_empty() {
                    q = ARRIVED.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            }
            let _writing = WRITING.lock().unwrap_or_else(|e| e.into_inner());
            let job = PENDING.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
            if let Some(job) = job {
                write_buffer(job);
            }
        }
    });
}

/// Writes every buffer still pending, in this thread (the process is
/// ending); the writer's buffer in hand is finished first. None where the
/// writer's lock cannot be had (this is the writer, faulting; or, in a
/// signal's handler, the writer did not let go within a second).
fn drain() -> Option<std::sync::MutexGuard<'static, ()>> {
    if IS_WRITER.with(|w| w.get()) {
        return None;
    }
    let writing = lock_now(&WRITING)?;
    loop {
        let job = lock_now(&PENDING).and_then(|mut q| q.pop_front());
        match job {
            Some(job) => write_buffer(job),
            None => return Some(writing),
        }
    }
}

/// Decodes one completed buffer, appends its records to the file, and
/// frees it. The caller holds `WRITING`.
fn write_buffer(job: Completed) {
    let buffer = job.buffer as *mut u8;
    let _ = std::panic::catch_unwind(|| {
        if FINISHED.load(Ordering::SeqCst) {
            return;
        }
        let mut records = Vec::new();
        let mut without_timestamps = 0u64;
        let Some(mut names) = lock_now(&NAMES) else { return };
        let names = names.get_or_insert_with(CuptiNames::default);
        let mut at = std::ptr::null_mut();
        // SAFETY: a buffer CUPTI completed with `valid` bytes of records,
        // walked from its start; not yet freed (only here frees it).
        while let Some(r) = unsafe { cupti::next_record(buffer, job.valid, at) } {
            at = r;
            // SAFETY: a whole record CUPTI handed over, read while its buffer lives.
            match unsafe { decode(r, names) } {
                Decoded::Record(rec) => records.push(rec),
                Decoded::NoTimestamp => without_timestamps += 1,
                Decoded::Other => {}
            }
        }
        if job.dropped > 0 || without_timestamps > 0 {
            records.push(Record::Lost(Lost { dropped: job.dropped, without_timestamps }));
        }
        if let Some(mut guard) = lock_now(&SINK) {
            if let Some(sink) = guard.as_mut() {
                let _ = sink.write(&records);
            }
        }
    });
    // SAFETY: allocated in `requested` with this layout, completed once,
    // taken from the queue (or handed here by `completed`) once; no record
    // of it is read after this.
    unsafe { dealloc(buffer, layout()) };
}
