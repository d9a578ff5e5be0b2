//! The plain driver loop: lab 5's three-stream chunk loop
//! ([`stage_streams`] with [`WaitBy::StreamWaitEvent`], issued live) made
//! with the driver's calls and nothing else, on the rig's own streams and
//! buffers. Per chunk: cuMemcpyHtoDAsync, cuEventRecord,
//! cuStreamWaitEvent, the kernel's launch (through
//! `ComputeKernel::enqueue`: one bounds check before cuLaunchKernel),
//! cuEventRecord, cuStreamWaitEvent, cuMemcpyDtoHAsync; its events made
//! before the loop, as a C program written for speed would. The runner
//! replays the same calls for the same plan; this loop is what its issuing
//! is held against (lab 5's "plain driver loop" row).

use super::{streams_of, PlanRig};
use crate::error::{LabError, Result};
use crate::gpu::HostBuffer;
use crate::gpu::{driver, Event};
use crate::pipeline::dry_run::DryRun;
use crate::pipeline::plan::{chunk, stage_streams, Plan, WaitBy};
use std::ffi::c_void;
use std::time::Instant;

/// One run of the plain loop, ms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlainRun {
    /// From the loop's first call to the last op's end (CUDA events).
    pub total_ms: f64,
    /// Host time from the loop's first call to its last.
    pub issue_ms: f64,
}

/// The loop the plain driver calls make by hand, as a plan: its streams,
/// and (its model) what every output element must hold afterwards.
pub struct PlainLoop {
    chunks: usize,
    plan: Plan,
    model: DryRun,
}

impl PlainLoop {
    /// The loop over `elements` in `chunks` chunks.
    pub fn new(elements: usize, chunks: usize) -> Result<PlainLoop> {
        if chunks == 0 || chunks > elements / 2 {
            return Err(LabError::config(format!("the plain loop over {elements} elements in {chunks} chunks: give 1 to {} chunks", elements / 2)));
        }
        let plan = stage_streams(&format!("{chunks} chunks, plain driver loop"), elements, chunks, WaitBy::StreamWaitEvent).issued_live();
        let model = plan.dry_run()?;
        Ok(PlainLoop { chunks, plan, model })
    }
}

impl PlanRig {
    /// Runs the plain loop on fresh data and verifies its output.
    pub fn plain_stage_loop(&mut self, plain: &PlainLoop) -> Result<PlainRun> {
        let (plan, chunks) = (&plain.plan, plain.chunks);
        self.ready(plan)?;
        let seed = self.fresh_data(plan)?;
        self.make_streams(plan)?;
        let streams = streams_of(&self.streams, plan);
        let (up, kernels, down) = (streams[0], streams[1], streams[2]);
        // Set-up, outside the timed loop: the events, the base and ends.
        let events: Vec<Event> = (0..2 * chunks).map(|_| self.gpu.sync_event()).collect::<Result<_>>()?;
        let ends: Vec<Event> = (0..3).map(|_| self.gpu.timing_event()).collect::<Result<_>>()?;
        let base = self.gpu.timing_event()?;
        let (host_in, host_out) = (self.host_in.words().as_ptr() as *const c_void, self.host_out.words_mut().as_mut_ptr() as *mut c_void);
        let (d_in, d_out) = (self.device(0, 0)?.span(), self.device(0, 1)?.span());
        let (kernel, iterations) = (&self.kernel, self.iterations);
        // The clock starts at the loop's first call, as a live run's does.
        base.record(&self.launch)?;
        base.synchronize()?;
        let started = Instant::now();
        let issued = (|| -> Result<()> {
            for c in 0..chunks {
                let (at, n) = chunk(plan.elements, chunks, c);
                let (off, bytes) = (at as u64 * 4, n * 4);
                let (uploaded, computed) = (&events[2 * c], &events[2 * c + 1]);
                // SAFETY: every range lies in the rig's buffers (the plan
                // fits the rig, checked above), which outlive the
                // synchronize below; each handle is live.
                unsafe {
                    driver::memcpy_htod_async(d_in.ptr + off, host_in.add(4 * at), bytes, up.raw())?;
                    driver::event_record(uploaded.raw, up.raw())?;
                    driver::stream_wait_event(kernels.raw(), uploaded.raw)?;
                    kernel.enqueue(kernels, d_in, at, d_out, at, n, iterations)?;
                    driver::event_record(computed.raw, kernels.raw())?;
                    driver::stream_wait_event(down.raw(), computed.raw)?;
                    driver::memcpy_dtoh_async(host_out.add(4 * at), d_out.ptr + off, bytes, down.raw())?;
                }
            }
            Ok(())
        })();
        let issue_ms = started.elapsed().as_secs_f64() * 1e3;
        let recorded = ends.iter().zip([up, kernels, down]).try_for_each(|(e, s)| e.record(s));
        // Whatever failed, nothing queued may outlive the borrows.
        for s in [up, kernels, down] {
            s.synchronize()?;
        }
        issued?;
        recorded?;
        let mut total_ms = 0.0f64;
        for e in &ends {
            total_ms = total_ms.max(base.elapsed_ms(e)?);
        }
        self.check(plan, &plan.checked_cells(&plain.model), seed)?;
        Ok(PlainRun { total_ms, issue_ms })
    }
}
