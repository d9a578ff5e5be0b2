//! What the runner hands the driver: one [`Command`] per call of the loop,
//! already checked and recorded, holding nothing but what its driver calls
//! need (stream and event handles, addresses, sizes). A runner that defers
//! keeps them and runs them one after another at `finish`
//! ([`super::Runner::finish`]); one that does not runs each as it is made.
//! Either way the same command makes the same calls.

use crate::error::Result;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The driver calls of one operation, made from CPU thread `thread`.
pub(super) type Call<'a> = Box<dyn FnOnce() -> Result<()> + Send + 'a>;

/// One call of the loop, ready to run.
pub(super) enum Command<'a> {
    /// Work handed to the GPU (copies, kernels, event records, stream
    /// waits): driver calls that return at once.
    Issue { thread: usize, call: Call<'a> },
    /// A call the CPU takes part in (it waits, works on host memory,
    /// allocates or frees, or copies from pageable memory, which blocks):
    /// the start gate opens first, since a held GPU would never get there.
    /// With `timed`, its host-clock span is what the op's timeline shows
    /// (mark `timed` of the runner's host times).
    Host { thread: usize, timed: Option<usize>, call: Call<'a> },
    /// Opens the start gate: a gated loop past the ops a closed gate may hold.
    OpenGate,
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
}
