//! What the runner hands the driver: one `Command` per call of the loop,
//! already checked and recorded, holding nothing but what its driver calls
//! need (stream and event handles, addresses, sizes). A runner that defers
//! keeps them in one vector and runs them one after another at `finish`
//! ([`super::Runner::finish`]); one that does not runs each as it is made.
//! Either way the same command makes the same calls.
//!
//! The loop's common calls (copies, kernels, event records, stream waits)
//! are plain data in the vector, so a replay walks memory in order and
//! frees nothing per call: a boxed closure per call costs a loop of small
//! chunks a visible share over a plain loop of the same driver calls.
//! What is rarer (copies between GPUs, all-reduces, a lab's own ops, host
//! work) is a boxed closure.

use super::super::{driver, ComputeKernel, DeviceSpan, Stream};
use crate::error::Result;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Driver calls made from the thread that runs the command.
pub(super) type Call<'a> = Box<dyn FnOnce() -> Result<()> + Send + 'a>;

/// An event handle the runner keeps alive until it has synchronized
/// (its pool's, or the loop's own events, all held for its life).
#[derive(Clone, Copy, Debug)]
pub(super) struct EventHandle(pub driver::CUevent);

// SAFETY: event handles may be used from any thread of the process (as
// `Event`'s own Send and Sync say); the runner keeps the event alive.
unsafe impl Send for EventHandle {}
// SAFETY: as for Send: a copy of the handle is all `&EventHandle` gives.
unsafe impl Sync for EventHandle {}

/// The timing events recorded around an op (a timeline timed by CUDA
/// events): before it (None where the stream's previous op's end serves),
/// and after it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Bracket {
    pub start: Option<EventHandle>,
    pub end: Option<EventHandle>,
}

/// What one command does.
pub(super) enum What<'a> {
    /// A copy between host memory and a GPU's (`up`: to the GPU).
    Copy { stream: &'a Stream, up: bool, host: Place, device: Place, bytes: usize, bracket: Bracket, bind: bool },
    /// The lab's kernel over `n` f32: `output[out_at..] = f(input[in_at..])`.
    Kernel {
        stream: &'a Stream,
        kernel: &'a ComputeKernel,
        input: Span,
        output: Span,
        in_at: usize,
        out_at: usize,
        n: usize,
        iterations: i32,
        bracket: Bracket,
        bind: bool,
    },
    /// cuEventRecord.
    Record { stream: &'a Stream, event: EventHandle },
    /// cuStreamWaitEvent.
    Wait { stream: &'a Stream, event: EventHandle },
    /// Other work handed to the GPU (a copy within or between GPUs, an
    /// all-reduce, a lab's own op): driver calls that return at once.
    Issue(Call<'a>),
    /// A call the CPU takes part in (it waits, works on host memory,
    /// allocates or frees, or copies from pageable memory, which blocks):
    /// the start gate opens first, since a held GPU would never get there.
    /// With `timed`, its host-clock span is what the op's timeline shows
    /// (slot `timed` of the runner's host times).
    Host { timed: Option<usize>, call: Call<'a> },
    /// A GPU call that blocks the CPU until the GPU ran it (a copy from
    /// pageable memory): the start gate opens first, as for `Host`.
    Blocking(Call<'a>),
    /// Opens the start gate: a gated loop past the ops a closed gate may hold.
    OpenGate,
    /// What came before was set-up: wait for all of it, then start the
    /// run's clock again, behind a closed gate again where the run was
    /// gated (the streams `hold` wait for the new base).
    Restart { gpus: Vec<super::super::Gpu>, hold: Vec<&'a Stream> },
}

/// One call of the loop, made from CPU thread `thread`.
pub(super) struct Command<'a> {
    pub thread: usize,
    pub what: What<'a>,
}

impl<'a> What<'a> {
    /// The driver call a command that hands work to the GPU makes, as a
    /// timeline names the CPU's span of issuing it.
    pub fn call_name(&self) -> &'static str {
        match self {
            What::Copy { up: true, .. } => "issue H2D",
            What::Copy { up: false, .. } => "issue D2H",
            What::Kernel { .. } => "issue kernel",
            What::Record { .. } => "issue event record",
            What::Wait { .. } => "issue stream wait",
            _ => "issue",
        }
    }
    /// Makes the driver calls of a command that hands work to the GPU (not
    /// `Host`, `Blocking` or `OpenGate`, which the runner's clock and gate
    /// handle, except where the gate is already open).
    ///
    /// # Safety
    /// Every address lies in memory that stays allocated until the runner
    /// has synchronized, and every handle is alive (the runner holds what
    /// its commands name).
    pub unsafe fn issue(self) -> Result<()> {
        match self {
            What::Copy { stream, up, host, device, bytes, bracket, bind } => {
                let s = prepare(stream, bind, bracket.start)?;
                let (h, d) = (host.addr() as *mut c_void, device.addr());
                // SAFETY: the caller's contract; sizes were checked when recorded.
                unsafe {
                    if up {
                        driver::memcpy_htod_async(d, h, bytes, s)?;
                    } else {
                        driver::memcpy_dtoh_async(h, d, bytes, s)?;
                    }
                }
                finish(s, bracket.end)
            }
            What::Kernel { stream, kernel, input, output, in_at, out_at, n, iterations, bracket, bind } => {
                let s = prepare(stream, bind, bracket.start)?;
                // SAFETY: the caller's contract; the kernel checks the ranges against the spans.
                unsafe { kernel.enqueue(stream, input.get(), in_at, output.get(), out_at, n, iterations) }?;
                finish(s, bracket.end)
            }
            // SAFETY: both handles are alive (the caller's contract).
            What::Record { stream, event } => unsafe { driver::event_record(event.0, stream.raw()) },
            // SAFETY: both handles are alive, as for a record (the caller's contract).
            What::Wait { stream, event } => unsafe { driver::stream_wait_event(stream.raw(), event.0) },
            What::Issue(call) | What::Host { call, .. } | What::Blocking(call) => call(),
            What::OpenGate | What::Restart { .. } => Ok(()),
        }
    }
}

/// Before an op: its GPU's context where the runner spans several, then
/// its start event.
fn prepare(stream: &Stream, bind: bool, start: Option<EventHandle>) -> Result<driver::CUstream> {
    if bind {
        stream.gpu().bind()?;
    }
    if let Some(e) = start {
        // SAFETY: a pool event of the runner, alive for its life; the stream is borrowed.
        unsafe { driver::event_record(e.0, stream.raw()) }?;
    }
    Ok(stream.raw())
}

/// After an op: its end event.
fn finish(stream: driver::CUstream, end: Option<EventHandle>) -> Result<()> {
    match end {
        // SAFETY: as in `prepare`.
        Some(e) => unsafe { driver::event_record(e.0, stream) },
        None => Ok(()),
    }
}

/// Where a buffer's memory starts: known when the runner was given the
/// buffer, or written when the loop's own allocation runs (in a deferred
/// loop, at replay, after the calls that use it were recorded).
#[derive(Clone, Debug)]
pub(super) enum Base {
    Fixed(u64),
    Later(Arc<AtomicU64>),
}

impl Base {
    /// An allocation still to be made.
    pub fn later() -> Base {
        Base::Later(Arc::new(AtomicU64::new(0)))
    }
    /// The address (0: an allocation that has not run).
    pub fn get(&self) -> u64 {
        match self {
            Base::Fixed(p) => *p,
            Base::Later(cell) => cell.load(Ordering::Acquire),
        }
    }
    /// Where the allocation came out (once it ran).
    pub fn set(&self, ptr: u64) {
        if let Base::Later(cell) = self {
            cell.store(ptr, Ordering::Release);
        }
    }
}

/// A byte range of a buffer whose address may be known only at replay.
#[derive(Clone, Debug)]
pub(super) struct Place {
    pub base: Base,
    pub at: u64,
}

impl Place {
    pub fn addr(&self) -> u64 {
        self.base.get() + self.at
    }
}

/// A whole device buffer whose address may be known only at replay.
#[derive(Clone, Debug)]
pub(super) struct Span {
    pub base: Base,
    pub bytes: usize,
}

impl Span {
    pub fn get(&self) -> DeviceSpan {
        DeviceSpan::new(self.base.get(), self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_base_reads_what_the_allocation_wrote_and_a_fixed_one_never_moves() {
        let later = Base::later();
        let place = Place { base: later.clone(), at: 64 };
        assert_eq!(later.get(), 0, "not allocated yet");
        later.set(4096);
        assert_eq!(place.addr(), 4160, "a place recorded before the allocation sees its address");
        let fixed = Base::Fixed(128);
        fixed.set(7);
        assert_eq!(Place { base: fixed, at: 8 }.addr(), 136);
    }

    #[test]
    fn the_common_calls_are_small_plain_data() {
        // A replay walks these in order: they stay a few cache lines each.
        assert!(std::mem::size_of::<Command<'static>>() <= 160, "{}", std::mem::size_of::<Command<'static>>());
    }
}
