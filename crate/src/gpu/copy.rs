//! The copy primitive every host<->device copy of the labs is made of
//! (`RawCopy`: one cuMemcpyHtoDAsync or cuMemcpyDtoHAsync on a stream):
//! lab 1 times batches of it here ([`CopyTimer`]); a
//! [`Runner`](super::Runner) issues the same calls as one operation of a loop.
//!
//! Timing host<->device copies the way nvbandwidth does: CUDA events on the
//! streams for device time, the host clock around the API calls for how long
//! the CPU was blocked, and (for page-locked memory) every stream held behind a
//! gate until all copies are issued, so enqueue cost never pollutes the device
//! time. The call waits for its copies before returning, which is what makes
//! this API safe: no buffer can be dropped or touched while a copy is in flight.

use super::gate::Gate;
use super::{driver, DeviceBuffer, Event, Gpu, HostBuffer, Stream};
use crate::error::{LabError, Result};
use std::ffi::c_void;
use std::time::{Duration, Instant};

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
    /// callers: `CopyTimer::run` waits for it; a `Runner` holds its
    /// buffers until it synchronizes and checks the order of their uses).
    pub(super) unsafe fn enqueue(&self, stream: &Stream) -> Result<()> {
        if self.up {
            // SAFETY: as the caller guarantees.
            unsafe { driver::memcpy_htod_async(self.device, self.host as *const c_void, self.bytes, stream.raw()) }
        } else {
            // SAFETY: as the caller guarantees.
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
    /// of its buffers end (as `CopyTimer::run` and `Stream::upload` do).
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

/// What one timed batch of copies cost.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CopyTiming {
    /// Device time from the first copy's start to the last copy's end (events).
    pub device_ms: f64,
    /// Host time spent inside one copy call (mean over the batch; the slowest lane).
    pub host_call_ms: f64,
    /// Whether the streams were held behind the gate while copies were issued.
    pub gated: bool,
}

struct Lane {
    stream: Stream,
    start: Event,
    end: Event,
}

/// Streams, events and a gate, created once and reused for every sample.
pub struct CopyTimer {
    gpu: Gpu,
    lanes: Vec<Lane>,
    gate: Option<Gate>,
}

impl CopyTimer {
    /// `lanes` streams (one per concurrent copy). The gate is used if the
    /// device supports stream memory operations; else copies run ungated.
    pub fn new(gpu: &Gpu, lanes: usize) -> Result<CopyTimer> {
        let lanes =
            (0..lanes.max(1)).map(|_| Ok(Lane { stream: gpu.stream()?, start: gpu.timing_event()?, end: gpu.timing_event()? })).collect::<Result<Vec<_>>>()?;
        Ok(CopyTimer { gpu: gpu.clone(), lanes, gate: Gate::take(gpu) })
    }

    pub fn has_gate(&self) -> bool {
        self.gate.is_some()
    }

    /// Issues op i `reps` times back to back on lane i (each op from its own
    /// host thread when there are several, so a blocking pageable call does
    /// not serialize the others), waits for all, and returns the timing.
    /// `gated` must only be asked for page-locked memory: a pageable copy
    /// blocks inside the call until its staged DMA ran, which a held stream
    /// never does.
    pub fn run(&mut self, ops: &mut [CopyOp<'_>], reps: usize, gated: bool) -> Result<CopyTiming> {
        if ops.is_empty() || ops.len() > self.lanes.len() {
            return Err(LabError::config(format!("{} copies for {} streams", ops.len(), self.lanes.len())));
        }
        if reps == 0 {
            return Err(LabError::config("copies per sample must be at least 1"));
        }
        for op in ops.iter() {
            op.validate()?;
        }
        self.gpu.bind()?;
        // Once a watchdog had to open a gate (a serializing tool), run ungated.
        let gate = if gated && !super::gate::forced_open() { self.gate.as_mut() } else { None };
        let gated = gate.is_some();
        let lanes = &self.lanes[..ops.len()];
        let mut held = Ok(());
        for lane in lanes {
            if let Some(g) = gate.as_deref() {
                held = held.and_then(|_| g.hold(&lane.stream));
            }
            held = held.and_then(|_| lane.start.record(&lane.stream));
        }
        let issued: Vec<Result<Duration>> = if held.is_err() {
            vec![]
        } else if ops.len() == 1 {
            vec![issue(&self.gpu, &mut ops[0], &lanes[0], reps)]
        } else {
            let gpu = &self.gpu;
            std::thread::scope(|s| {
                let handles: Vec<_> = ops.iter_mut().zip(lanes).map(|(op, lane)| s.spawn(move || issue(gpu, op, lane, reps))).collect();
                handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(LabError::config("copy thread panicked")))).collect()
            })
        };
        // Whatever happened, open the gate and drain the streams before the
        // buffers' borrows end.
        if let Some(g) = gate {
            g.release();
        }
        let drained: Result<Vec<()>> = lanes.iter().map(|l| l.stream.synchronize()).collect();
        held?;
        let host = issued.into_iter().collect::<Result<Vec<_>>>()?;
        drained?;
        let base = &lanes[0].start;
        let mut first = 0.0f64;
        let mut last = f64::MIN;
        for lane in lanes {
            first = first.min(base.elapsed_ms(&lane.start)?);
            last = last.max(base.elapsed_ms(&lane.end)?);
        }
        let host_max = host.iter().max().copied().unwrap_or_default();
        Ok(CopyTiming {
            device_ms: last - first,
            host_call_ms: host_max.as_secs_f64() * 1e3 / reps as f64,
            // Not gated after all if the watchdog had to open the gate.
            gated: gated && !super::gate::forced_open(),
        })
    }
}

impl Drop for CopyTimer {
    fn drop(&mut self) {
        if let Some(g) = self.gate.take() {
            g.put_back(&self.gpu);
        }
    }
}

fn issue(gpu: &Gpu, op: &mut CopyOp<'_>, lane: &Lane, reps: usize) -> Result<Duration> {
    gpu.bind()?;
    let t = Instant::now();
    for _ in 0..reps {
        // SAFETY: `run` synchronizes every lane's stream before the ops' borrows end.
        unsafe { op.enqueue(&lane.stream) }?;
    }
    let spent = t.elapsed();
    lane.end.record(&lane.stream)?;
    Ok(spent)
}
