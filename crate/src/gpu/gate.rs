//! A start gate, as nvbandwidth uses: streams wait (cuStreamWaitValue32) on a
//! word of mapped pinned memory until the host writes the next value. Work
//! issued behind a closed gate starts all at once when it opens, so the time
//! the CPU spends issuing it never shows up as device time.
//!
//! Rules that keep a gate from deadlocking, enforced by its users: open it
//! before the CPU waits for anything on a held stream, before a pageable copy
//! (such a call blocks until its staged DMA ran), and before the GPU's queues
//! could fill (a bounded number of operations).

use super::{driver, Gpu, Stream};
use crate::error::Result;
use cudarc::driver::CudaContext;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// The word and the next value that opens it.
pub(crate) struct Gate {
    host: *mut u32,
    dev: driver::CUdeviceptr,
    next: u32,
    ctx: Arc<CudaContext>,
}

// SAFETY: the word is written only through &mut self; the GPU only reads it.
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
        // SAFETY: mapped pinned memory from host_alloc.
        let dev = match unsafe { driver::host_device_pointer(host as *mut c_void) } {
            Ok(d) => d,
            Err(e) => {
                // SAFETY: allocated just above, never used.
                let _ = unsafe { driver::host_free(host as *mut c_void) };
                return Err(e);
            }
        };
        // SAFETY: live allocation.
        unsafe { host.write_volatile(0) };
        Ok(Gate { host, dev, next: 1, ctx: gpu.ctx.clone() })
    }

    /// Takes the device's spare gate, or makes one.
    pub(crate) fn take(gpu: &Gpu) -> Option<Gate> {
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

    /// Later work on `stream` waits until the next `release`.
    pub(crate) fn hold(&self, stream: &Stream) -> Result<()> {
        driver::stream_wait_value_geq(stream.raw(), self.dev, self.next)
    }

    /// Opens the gate for everything held so far.
    pub(crate) fn release(&mut self) {
        // SAFETY: live mapped word; volatile so the store is not elided.
        unsafe { self.host.write_volatile(self.next) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.next = self.next.wrapping_add(1).max(1);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        let _ = driver::bind(&self.ctx);
        // SAFETY: every stream that waited on it was released (the value only
        // grows) before any user let go of it.
        let _ = unsafe { driver::host_free(self.host as *mut c_void) };
    }
}
