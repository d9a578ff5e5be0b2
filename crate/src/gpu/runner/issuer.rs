//! The pipeline vocabulary ([`Issue`]) on the runner: sizes and offsets
//! in f32 elements become bytes, the lab's kernel and its work per element
//! are supplied, and a producer's batches come from a dataset made in
//! advance.

use super::Runner;
use crate::error::{LabError, Result};
use crate::gpu::ComputeKernel;
use crate::pipeline::issue::{DevRef, EventRef, HostRef, Issue, SignalRef, StreamRef};

/// Where the producer's data comes from on the runner: a dataset made
/// in advance (so producing is a cheap, verifiable copy).
pub struct Dataset<'a> {
    pub words: &'a [u64],
    /// Elements per batch.
    pub batch_elements: usize,
}

/// A runner plus the lab's kernel settings.
pub struct GpuIssuer<'p, 'a> {
    pub runner: &'p mut Runner<'a>,
    pub kernel: &'a ComputeKernel,
    pub iterations: i32,
    /// Needed only by labs with a producer.
    pub dataset: Option<Dataset<'a>>,
}

/// Elements to bytes, refusing a count no buffer could hold.
pub(super) fn bytes(elements: usize) -> Result<usize> {
    elements.checked_mul(4).ok_or_else(|| LabError::config(format!("{elements} elements is more bytes than memory has")))
}

/// The calls of the vocabulary that both runner executors ([`GpuIssuer`]
/// and `super::LabRunner`) make the same way: sizes and offsets in f32
/// elements become bytes, everything else goes to `self.runner` as it is.
/// Each executor writes `compute` and `produce` itself.
macro_rules! issue_on_the_runner {
    () => {
        fn h2d(&mut self, s: StreamRef, dst: DevRef, dst_at: usize, src: HostRef, src_at: usize, n: usize, label: &str) -> Result<()> {
            self.runner.h2d(
                s,
                dst,
                $crate::gpu::runner::issuer::bytes(dst_at)?,
                src,
                $crate::gpu::runner::issuer::bytes(src_at)?,
                $crate::gpu::runner::issuer::bytes(n)?,
                label,
            )
        }
        fn d2h(&mut self, s: StreamRef, dst: HostRef, dst_at: usize, src: DevRef, src_at: usize, n: usize, label: &str) -> Result<()> {
            self.runner.d2h(
                s,
                dst,
                $crate::gpu::runner::issuer::bytes(dst_at)?,
                src,
                $crate::gpu::runner::issuer::bytes(src_at)?,
                $crate::gpu::runner::issuer::bytes(n)?,
                label,
            )
        }
        fn d2d(&mut self, s: StreamRef, dst: DevRef, dst_at: usize, src: DevRef, src_at: usize, n: usize, label: &str) -> Result<()> {
            self.runner.d2d(
                s,
                dst,
                $crate::gpu::runner::issuer::bytes(dst_at)?,
                src,
                $crate::gpu::runner::issuer::bytes(src_at)?,
                $crate::gpu::runner::issuer::bytes(n)?,
                label,
            )
        }
        fn all_reduce(&mut self, ranks: &[(StreamRef, DevRef)], at: usize, n: usize, label: &str) -> Result<()> {
            self.runner.all_reduce(ranks, $crate::gpu::runner::issuer::bytes(at)?, $crate::gpu::runner::issuer::bytes(n)?, label)
        }
        fn event(&mut self) -> Result<EventRef> {
            self.runner.event()
        }
        fn record(&mut self, e: EventRef, s: StreamRef) -> Result<()> {
            self.runner.record(e, s)
        }
        fn wait(&mut self, s: StreamRef, e: EventRef) -> Result<()> {
            self.runner.wait(s, e)
        }
        fn host_wait(&mut self, e: EventRef) -> Result<()> {
            self.runner.host_wait(e)
        }
        fn host_sync(&mut self, s: StreamRef) -> Result<()> {
            self.runner.host_sync(s)
        }
        fn signal(&mut self, s: StreamRef, label: &str) -> Result<SignalRef> {
            self.runner.signal(s, label)
        }
        fn host_wait_signal(&mut self, g: SignalRef) -> Result<()> {
            self.runner.host_wait_signal(g)
        }
        fn sync_device(&mut self) -> Result<()> {
            self.runner.sync_device()
        }
        fn timed_from_here(&mut self) -> Result<()> {
            self.runner.timed_from_here()
        }
        fn alloc_async(&mut self, s: StreamRef, n: usize, name: &str) -> Result<DevRef> {
            self.runner.alloc_async(s, $crate::gpu::runner::issuer::bytes(n)?, name)
        }
        fn free_async(&mut self, s: StreamRef, d: DevRef) -> Result<()> {
            self.runner.free_async(s, d)
        }
        fn alloc(&mut self, n: usize, name: &str) -> Result<DevRef> {
            self.runner.alloc($crate::gpu::runner::issuer::bytes(n)?, name)
        }
        fn free(&mut self, d: DevRef) -> Result<()> {
            self.runner.free(d)
        }
        fn alloc_pinned(&mut self, n: usize, name: &str) -> Result<HostRef> {
            self.runner.alloc_pinned($crate::gpu::runner::issuer::bytes(n)?, name)
        }
        fn free_pinned(&mut self, h: HostRef) -> Result<()> {
            self.runner.free_pinned(h)
        }
        fn pin(&mut self, h: HostRef) -> Result<()> {
            self.runner.pin(h)
        }
        fn unpin(&mut self, h: HostRef) -> Result<()> {
            self.runner.unpin(h)
        }
        fn issue_from(&mut self, thread: usize) -> Result<()> {
            self.runner.issue_from(thread)
        }
    };
}
pub(super) use issue_on_the_runner;

impl<'a> Issue for GpuIssuer<'_, 'a> {
    issue_on_the_runner!();
    fn compute(&mut self, s: StreamRef, input: DevRef, in_at: usize, output: DevRef, out_at: usize, n: usize, label: &str) -> Result<()> {
        self.runner.compute(s, self.kernel, input, bytes(in_at)?, output, bytes(out_at)?, bytes(n)?, self.iterations, label)
    }
    fn produce(&mut self, h: HostRef, at: usize, n: usize, batch: usize, label: &str) -> Result<()> {
        let d = self.dataset.as_ref().ok_or_else(|| LabError::config("this lab has no producer"))?;
        if n % 2 != 0 || at % 2 != 0 || n > d.batch_elements {
            return Err(LabError::config(format!("produce {n} elements at {at}: counts and offsets must be even and at most a batch")));
        }
        let (first, words): (usize, &'a [u64]) = (batch * d.batch_elements / 2, d.words);
        let src = words.get(first..first + n / 2).ok_or_else(|| LabError::config(format!("batch {batch} is past the dataset")))?;
        self.runner.host_write(label, h, at * 4, n * 4, move |w| crate::measure::pattern::copy_streaming(w, src))
    }
}
