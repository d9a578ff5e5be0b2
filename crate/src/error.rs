//! One error type for the whole crate: every failure a learner or instructor can
//! hit (no driver, out of memory, bad sizes, missing data) becomes a one-line
//! message, never a panic.

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("no CUDA driver found (libcuda.so could not be loaded): this machine has no usable NVIDIA GPU")]
    NoDriver,
    #[error("no CUDA device {ordinal}: the driver reports {count} device(s)")]
    NoDevice { ordinal: usize, count: usize },
    #[error("CUDA call {call} failed: {message}")]
    Driver { call: &'static str, message: String },
    #[error("out of {what} memory: {call} could not allocate {bytes}")]
    OutOfMemory { what: &'static str, call: &'static str, bytes: crate::units::Bytes },
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Wrong bytes: a buffer holds something other than what the CPU
    /// reference says it should.
    #[error("data verification failed: {buffer}, element {element}: {detail}")]
    Verification { buffer: String, element: usize, detail: String },
    /// Timing could not be established (a kernel whose time does not grow with
    /// its work, a cost that will not settle): not a data error.
    #[error("calibration failed: {what}. {advice}")]
    Calibration { what: String, advice: String },
    /// A schedule that cannot run correctly: an access not ordered after a
    /// conflicting one, a slot reused too early, work never issued.
    #[error("schedule error: {0}")]
    Schedule(String),
    /// A thread the lab started (a worker, a waiter) stopped unexpectedly.
    #[error("{0}")]
    Thread(String),
    /// `path` as outputs show it (repo-relative where it can be).
    #[error("no recorded data: {path} does not exist (run `overlap-lab all` on a GPU machine to record it)")]
    MissingData { path: String },
    #[error("recorded data {path} is unreadable: {reason}")]
    BadData { path: String, reason: String },
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error("kernel {0}")]
    Kernel(String),
    /// What this GPU cannot do (a kernel written for a later architecture).
    #[error("not supported on this GPU: {0}")]
    Unsupported(String),
    #[error("chart: {0}")]
    Chart(String),
    /// A figure asked of results that do not hold what it draws (a part
    /// of the lab that was skipped, or had no timeline): says why.
    #[error("nothing to draw: {0}")]
    NothingToDraw(String),
    /// A script the lab runs (lab 10's PyTorch programs) that could not
    /// start or failed, in its own last words.
    #[error("{0}")]
    Script(String),
    /// A lab that cannot run on this machine and says why (lab 10 where
    /// Python has no PyTorch): within `overlap-lab all` a line, not the end
    /// of the run.
    #[error("{0}")]
    Skipped(String),
    /// A library loaded at run time that is not there (NCCL).
    #[error("{library} could not be loaded: {why}")]
    MissingLibrary { library: &'static str, why: String },
}

pub type Result<T, E = LabError> = std::result::Result<T, E>;

impl LabError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        LabError::Io { context: context.into(), source }
    }
    pub fn config(msg: impl Into<String>) -> Self {
        LabError::Config(msg.into())
    }
    /// `buffer`'s element `element` is wrong; `detail` says got/expected.
    pub fn wrong_data(buffer: impl Into<String>, element: usize, detail: impl Into<String>) -> Self {
        LabError::Verification { buffer: buffer.into(), element, detail: detail.into() }
    }
    pub fn schedule(msg: impl Into<String>) -> Self {
        LabError::Schedule(msg.into())
    }
    pub fn calibration(what: impl Into<String>, advice: impl Into<String>) -> Self {
        LabError::Calibration { what: what.into(), advice: advice.into() }
    }
}

/// The text of a panic payload (what `panic!` was given).
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_else(|| "(no message)".into())
}

thread_local! {
    /// `Some` while [`catch_quietly`] runs code on this thread: the panic
    /// hook puts the panic's message and place here instead of printing it.
    static CAUGHT: std::cell::RefCell<Option<Option<String>>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f`; a panic comes back as `Err("message (at file:line)")` and is
/// not printed: no "thread panicked at" and no backtrace on stderr, even
/// with `RUST_BACKTRACE` set. For panics that are expected and reported
/// otherwise: a learner's code in a check (which becomes a failed check,
/// shown once, and a notebook runner does not take for a crash), a host
/// task whose panic must not unwind into the driver.
///
/// The panic hook is process-wide and tests run in threads, so it is
/// installed once and stays silent only on a thread inside this call (a
/// thread-local flag); any other panic, on any thread, goes to the hook
/// that was there before, as if this one were not. A panic on another
/// thread that `f` starts is that thread's, and is printed.
pub fn catch_quietly<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let caught = CAUGHT.with(|c| {
                let mut c = c.borrow_mut();
                match c.as_mut() {
                    Some(slot) => {
                        *slot = Some(format!(
                            "{}{}",
                            panic_message(info.payload()),
                            info.location().map_or(String::new(), |l| format!(" (at {}:{})", l.file(), l.line()))
                        ));
                        true
                    }
                    None => false,
                }
            });
            if !caught {
                previous(info);
            }
        }));
    });
    // Nested calls (a check inside learner code inside a check) each keep
    // their own message: the outer slot is set aside and put back.
    let outer = CAUGHT.with(|c| c.borrow_mut().replace(None));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    let caught = CAUGHT.with(|c| std::mem::replace(&mut *c.borrow_mut(), outer)).flatten();
    r.map_err(|p| caught.unwrap_or_else(|| panic_message(&*p)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panic inside `catch_quietly` comes back as its message and place
    /// and prints nothing, even with `RUST_BACKTRACE=1`; a panic outside it,
    /// on another thread at the same time, is printed as ever. Run in a
    /// child process of this test binary, whose stderr the test reads.
    #[test]
    fn a_caught_panic_prints_nothing_and_any_other_is_printed_as_ever() {
        const CHILD: &str = "OVERLAP_LAB_TEST_QUIET_PANIC_CHILD";
        if std::env::var_os(CHILD).is_some() {
            let caught = catch_quietly(|| -> u32 { panic!("caught boom") });
            assert!(caught.as_ref().is_err_and(|e| e.starts_with("caught boom (at crate/src/error.rs:")), "{caught:?}");
            assert_eq!(catch_quietly(|| 7), Ok(7));
            // The hook stays: a panic on another thread is that thread's.
            let loud = std::thread::spawn(|| -> u32 { panic!("stray boom") }).join();
            assert!(loud.is_err());
            return;
        }
        let name = format!("{}::a_caught_panic_prints_nothing_and_any_other_is_printed_as_ever", module_path!().trim_start_matches("overlap_lab::"));
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([name.as_str(), "--exact", "--test-threads=1", "--nocapture"])
            .env(CHILD, "1")
            .env("RUST_BACKTRACE", "1")
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && stdout.contains("1 passed"), "the child did not pass: {stdout}{stderr}");
        assert!(!stderr.contains("caught boom"), "a caught panic was printed:\n{stderr}");
        assert!(stderr.contains("panicked at") && stderr.contains("stray boom"), "another panic should print as ever:\n{stderr}");
    }
}
