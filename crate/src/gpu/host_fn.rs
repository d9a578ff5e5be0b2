//! Host functions (cuLaunchHostFunc): CPU work a stream runs in its order,
//! on the driver's single callback thread.
//!
//! A host function must make no CUDA call: the driver's callback thread
//! would then wait on work that waits on it (CUDA documents this as
//! undefined, in practice a deadlock), and every host function of the
//! process shares that one thread. Two things keep that from happening by
//! accident here:
//! - only [`HostTask`]s can be launched, and the trait is sealed: the crate
//!   implements it for task types that hold plain CPU data (a slot lease,
//!   a pointer into pinned memory, a channel sender), never a `Gpu`,
//!   `Stream`, `Event` or buffer, so a task cannot even drop a CUDA object;
//! - while a task runs, the driver layer refuses the CUDA calls labs make
//!   ([`driver::in_host_function`]), so a mistake is an error, not a hang.

use super::{driver, Stream};
use crate::error::Result;
use std::ffi::c_void;

pub(crate) mod sealed {
    /// Only this crate can make host tasks (see the module docs).
    pub trait Sealed {}
}

/// CPU work a stream may run as a host function.
pub trait HostTask: sealed::Sealed + Send + 'static {
    /// Runs on the driver's callback thread. Must not panic across the FFI
    /// boundary (the trampoline catches it and reports it on stderr), and
    /// must report its own failures through its own state.
    fn run(self: Box<Self>);
}

impl Stream {
    /// Enqueues `task` on this stream (cuLaunchHostFunc).
    pub fn launch_host_task<T: HostTask>(&self, task: T) -> Result<()> {
        let arg = Box::into_raw(Box::new(task)) as *mut c_void;
        // SAFETY: `trampoline::<T>` takes back exactly this box, once; a
        // HostTask makes no CUDA call (sealed, and refused while it runs).
        let r = unsafe { driver::launch_host_function(self.raw(), trampoline::<T>, arg) };
        if r.is_err() {
            // Not enqueued: the box is still ours.
            // SAFETY: made by Box::into_raw above and never handed out.
            drop(unsafe { Box::from_raw(arg as *mut T) });
        }
        r
    }
}

/// A flag a host function raises for a CPU thread that sleeps until then
/// (a mutex and a condition variable: nothing polls).
#[derive(Debug, Default)]
pub struct Flag {
    raised: std::sync::Mutex<bool>,
    woken: std::sync::Condvar,
}

impl Flag {
    /// Sleeps until the flag is raised; false if `timeout` passed first.
    pub fn wait(&self, timeout: std::time::Duration) -> bool {
        let raised = self.raised.lock().unwrap_or_else(|p| p.into_inner());
        let (raised, _) = self.woken.wait_timeout_while(raised, timeout, |r| !*r).unwrap_or_else(|p| p.into_inner());
        *raised
    }
    fn raise(&self) {
        *self.raised.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.woken.notify_all();
    }
}

/// The host task that raises a [`Flag`] (it holds plain CPU data only).
pub struct Raise(pub std::sync::Arc<Flag>);
impl sealed::Sealed for Raise {}
impl HostTask for Raise {
    fn run(self: Box<Self>) {
        self.0.raise();
    }
}

unsafe extern "C" fn trampoline<T: HostTask>(arg: *mut c_void) {
    // SAFETY: `arg` is the box made in launch_host_task, passed here once.
    let task = unsafe { Box::from_raw(arg as *mut T) };
    let _scope = driver::host_function_scope();
    // A panic must not unwind into the driver (that aborts the process). It
    // is said here, in one line with its place, and not by the panic hook
    // too (no second report with a backtrace).
    if let Err(panic) = crate::error::catch_quietly(|| task.run()) {
        eprintln!("overlap-lab: a host function panicked: {panic}");
    }
}

pub use crate::error::panic_message;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    struct Probe(mpsc::Sender<(bool, bool)>);
    impl sealed::Sealed for Probe {}
    impl HostTask for Probe {
        fn run(self: Box<Self>) {
            let refused = driver::context_synchronize().is_err_and(|e| e.to_string().contains("inside a host function"));
            let _ = self.0.send((driver::in_host_function(), refused));
        }
    }

    struct Panics;
    impl sealed::Sealed for Panics {}
    impl HostTask for Panics {
        fn run(self: Box<Self>) {
            panic!("boom");
        }
    }

    #[test]
    fn a_raised_flag_wakes_its_waiter_and_an_unraised_one_times_out() {
        let flag = std::sync::Arc::new(Flag::default());
        assert!(!flag.wait(std::time::Duration::from_millis(5)));
        let task = Raise(flag.clone());
        let arg = Box::into_raw(Box::new(task)) as usize;
        let waiter = {
            let flag = flag.clone();
            std::thread::spawn(move || flag.wait(std::time::Duration::from_secs(30)))
        };
        // SAFETY: `arg` is a boxed `Raise` made above, handed to the
        // trampoline once, as the driver would.
        std::thread::spawn(move || unsafe { trampoline::<Raise>(arg as *mut c_void) }).join().unwrap();
        assert!(waiter.join().unwrap());
        assert!(flag.wait(std::time::Duration::ZERO), "stays raised");
    }

    #[test]
    fn a_task_runs_marked_as_a_host_function_and_cuda_calls_are_refused() {
        let (tx, rx) = mpsc::channel();
        let arg = Box::into_raw(Box::new(Probe(tx))) as *mut c_void;
        // What the driver's callback thread does, on another thread.
        let arg = arg as usize;
        // SAFETY: `arg` is a boxed `Probe` made above, handed to the
        // trampoline once, as the driver would.
        std::thread::spawn(move || unsafe { trampoline::<Probe>(arg as *mut c_void) }).join().unwrap();
        assert_eq!(rx.recv().unwrap(), (true, true));
        assert!(!driver::in_host_function(), "the mark is per thread and ends with the task");
    }

    #[test]
    fn a_panicking_task_does_not_unwind_into_the_driver() {
        let arg = Box::into_raw(Box::new(Panics)) as usize;
        let t = std::thread::spawn(move || {
            // SAFETY: `arg` is a boxed `Panics` made above, handed to the
            // trampoline once, as the driver would.
            unsafe { trampoline::<Panics>(arg as *mut c_void) };
            driver::in_host_function()
        });
        assert!(!t.join().expect("the callback thread survives"), "the mark is cleared after a panic");
    }
}
