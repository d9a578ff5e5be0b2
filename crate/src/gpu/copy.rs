//! The copy primitive every host<->device copy outside a loop is made of
//! (`RawCopy`: one cuMemcpyHtoDAsync or cuMemcpyDtoHAsync on a stream, and
//! [`CopyOp`], a copy of the first bytes of two buffers): the untimed set-up
//! copies of [`Stream::upload`] and [`Stream::download`]. What a lab times
//! goes through a [`Runner`](super::Runner), which makes the same driver
//! calls.
//!
//! And [`plain_copies`]: copies made with the driver's calls alone, beside
//! the runner's in the same run, what lab 1's figures are held to (so they
//! show what CUDA's copies cost and nothing of ours). Per direction, a loop
//! of cuMemcpyHtoDAsync or cuMemcpyDtoHAsync, the first direction's from
//! the calling thread and the other's from a thread of its own (a copy from
//! pageable memory blocks its caller), a CUDA event on the stream before
//! and after the loop, and for page-locked memory the streams held behind
//! the start gate until both loops are issued. Hand-written, not run
//! through the runner, because it is what the runner is measured against.

use super::gate::Gate;
use super::{driver, DeviceBuffer, Event, Gpu, HostBuffer, Stream};
use crate::error::{LabError, Result};
use std::ffi::c_void;
use std::time::Instant;

/// One copy between host memory and device memory, as the driver sees it.
#[derive(Clone, Copy, Debug)]
pub(super) struct RawCopy {
    /// Host to device (else device to host).
    pub up: bool,
    pub host: *mut c_void,
    pub device: driver::CUdeviceptr,
    pub bytes: usize,
}

// SAFETY: a RawCopy only describes a copy (two addresses and a size);
// enqueueing it is the unsafe step, and its caller keeps both ranges alive.
// A pipeline hands it to the OS thread of one of its CPU threads and waits
// for that thread to enqueue it, so nothing about the ranges changes.
unsafe impl Send for RawCopy {}

impl RawCopy {
    /// Enqueues the copy on `stream`.
    ///
    /// # Safety
    /// Both ranges are inside live allocations that outlive the copy, and
    /// nothing else touches them until it completes on `stream` (the
    /// callers wait for the stream before their borrows end).
    pub(super) unsafe fn enqueue(&self, stream: &Stream) -> Result<()> {
        if self.up {
            // SAFETY: both ranges live until the copy completed (# Safety);
            // the stream is live (borrowed).
            unsafe { driver::memcpy_htod_async(self.device, self.host as *const c_void, self.bytes, stream.raw()) }
        } else {
            // SAFETY: both ranges live, and the host side untouched, until the
            // copy completed (# Safety); the stream is live (borrowed).
            unsafe { driver::memcpy_dtoh_async(self.host, self.device, self.bytes, stream.raw()) }
        }
    }
}

/// One copy of the first `bytes` of a buffer.
pub enum CopyOp<'a> {
    HostToDevice { src: &'a dyn HostBuffer, dst: &'a DeviceBuffer, bytes: usize },
    DeviceToHost { src: &'a DeviceBuffer, dst: &'a mut dyn HostBuffer, bytes: usize },
}

impl CopyOp<'_> {
    pub(crate) fn validate(&self) -> Result<()> {
        let (bytes, host, dev) = match self {
            CopyOp::HostToDevice { src, dst, bytes } => (*bytes, src.bytes(), dst.bytes()),
            CopyOp::DeviceToHost { src, dst, bytes } => (*bytes, dst.bytes(), src.bytes()),
        };
        if bytes == 0 || bytes > host || bytes > dev {
            return Err(LabError::config(format!("copy of {bytes} bytes does not fit buffers of {host} (host) and {dev} (device) bytes")));
        }
        Ok(())
    }

    /// Enqueues the copy (its sizes validated first by [`Self::validate`]).
    ///
    /// # Safety
    /// The caller waits for `stream` to run the copy before the borrows
    /// of its buffers end (as `Stream::upload` does).
    pub(crate) unsafe fn enqueue(&mut self, stream: &Stream) -> Result<()> {
        let raw = match self {
            CopyOp::HostToDevice { src, dst, bytes } => RawCopy { up: true, host: src.words().as_ptr() as *mut c_void, device: dst.ptr(), bytes: *bytes },
            CopyOp::DeviceToHost { src, dst, bytes } => {
                RawCopy { up: false, host: dst.words_mut().as_mut_ptr() as *mut c_void, device: src.ptr(), bytes: *bytes }
            }
        };
        // SAFETY: sizes validated; the caller waits for the stream before
        // the borrows of src and dst end.
        unsafe { raw.enqueue(stream) }
    }
}

/// One direction's copies: `copies` copies of `bytes` between `host` and
/// `device` (`up`: to the device) on `stream`.
pub struct PlainLane<'a> {
    pub stream: &'a Stream,
    pub up: bool,
    pub host: &'a mut dyn HostBuffer,
    pub device: &'a DeviceBuffer,
}

/// What one batch of plain copies cost, per copy, ms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlainTiming {
    /// Device time from the first copy's start to the last one's end, per copy.
    pub device_ms: f64,
    /// Host time inside one copy call (the slowest thread), per copy.
    pub host_call_ms: f64,
}

/// Issues every lane's copies at once (each from its own thread, the first
/// from this one), behind
/// the start gate where `gated` and the device has one, and waits for them.
pub fn plain_copies(gpu: &Gpu, lanes: &mut [PlainLane<'_>], bytes: usize, copies: usize, gated: bool) -> Result<PlainTiming> {
    if lanes.is_empty() || copies == 0 {
        return Err(LabError::config("plain copies need a direction and at least one copy"));
    }
    for l in lanes.iter() {
        if bytes == 0 || bytes > l.host.bytes() || bytes > l.device.bytes() {
            return Err(LabError::config(format!("a copy of {bytes} bytes does not fit {} (host) and {} (device) bytes", l.host.bytes(), l.device.bytes())));
        }
    }
    gpu.bind()?;
    let marks: Vec<(Event, Event)> = lanes.iter().map(|_| Ok((gpu.timing_event()?, gpu.timing_event()?))).collect::<Result<_>>()?;
    let mut gate = if gated { Gate::take(gpu) } else { None };
    let mut held = Ok(());
    for (l, (start, _)) in lanes.iter().zip(&marks) {
        if let Some(g) = &gate {
            held = held.and(g.hold(l.stream));
        }
        held = held.and(start.record(l.stream));
    }
    let issued: Vec<Result<f64>> = if held.is_err() {
        Vec::new()
    } else {
        // The first direction from this thread, as the runner makes its
        // thread 0's calls; the other from a thread of its own.
        let (first, rest) = lanes.split_at_mut(1);
        std::thread::scope(|scope| {
            let others: Vec<_> = rest
                .iter_mut()
                .zip(&marks[1..])
                .map(|(l, (_, end))| {
                    // SAFETY: every lane's sizes were checked above, and its
                    // stream is drained below, before the lanes' borrows end.
                    scope.spawn(move || unsafe { issue(gpu, l, end, bytes, copies) })
                })
                .collect();
            // SAFETY: as for the others.
            let mut times = vec![unsafe { issue(gpu, &mut first[0], &marks[0].1, bytes, copies) }];
            times.extend(others.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(LabError::Thread("a copy thread panicked".into())))));
            times
        })
    };
    // Whatever happened, open the gate and drain the streams before the
    // buffers' borrows end.
    if let Some(mut g) = gate.take() {
        g.release();
        g.put_back(gpu);
    }
    let drained: Result<Vec<()>> = lanes.iter().map(|l| l.stream.synchronize()).collect();
    held?;
    let host_ms = issued.into_iter().collect::<Result<Vec<f64>>>()?;
    drained?;
    let base = &marks[0].0;
    let (mut first, mut last) = (0.0f64, f64::MIN);
    for (start, end) in &marks {
        first = first.min(base.elapsed_ms(start)?);
        last = last.max(base.elapsed_ms(end)?);
    }
    Ok(PlainTiming { device_ms: (last - first) / copies as f64, host_call_ms: host_ms.iter().copied().fold(0.0, f64::max) / copies as f64 })
}

/// One lane's loop of driver calls, then its end event; its host time, ms.
///
/// # Safety
/// The lane's host and device buffers hold at least `bytes`, and its stream
/// is synchronized before their borrows end.
unsafe fn issue(gpu: &Gpu, l: &mut PlainLane<'_>, end: &Event, bytes: usize, copies: usize) -> Result<f64> {
    gpu.bind()?;
    let copy = RawCopy { up: l.up, host: l.host.words_mut().as_mut_ptr() as *mut c_void, device: l.device.ptr(), bytes };
    let t = Instant::now();
    for _ in 0..copies {
        // SAFETY: both ranges hold `bytes` and stay borrowed until the
        // stream is synchronized (# Safety).
        unsafe { copy.enqueue(l.stream) }?;
    }
    let ms = t.elapsed().as_secs_f64() * 1e3;
    end.record(l.stream)?;
    Ok(ms)
}
