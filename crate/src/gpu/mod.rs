//! The GPU: the only part of the crate with raw CUDA. Raw calls live in
//! [`driver`] only — the driver's, CUPTI's, cuBLAS's and NCCL's — each call
//! on a raw handle an `unsafe fn`; the safe types here own the handles. A
//! function whose soundness rests on its caller (memory the GPU may still
//! be using when it returns) is an `unsafe fn` whose `# Safety` says what
//! the caller keeps, and every `unsafe` block says why it is sound where
//! it is (the crate denies `unsafe_op_in_unsafe_fn` and
//! `clippy::undocumented_unsafe_blocks`).
//!
//! The types: a device handle, streams, timing events, device buffers, the
//! four kinds of host memory, the copy primitive every copy is made of and
//! lab 1's timer for it ([`copy`]), and the [`Runner`] ([`runner`]), which
//! executes the pipeline vocabulary (`crate::pipeline`) on real streams as
//! operations of one schedule — recorded first and replayed with nothing
//! between its driver calls, or made as it comes, or captured into a CUDA
//! [`Graph`]; its streams may belong to several GPUs, and a copy may cross
//! between them. [`plan`] runs the vocabulary's plans on fresh, verified
//! data ([`PlanRig`]); the stream-ordered memory pool ([`pool`]). Also the
//! machine's GPUs and the links between them ([`topology`]), NCCL's
//! communicators and all-reduce ([`nccl`]), cuBLAS's half-precision GEMM
//! on a stream with the workspace it keeps ([`blas`]), the NVRTC kernels'
//! sources ([`kernels`]), a loaded kernel and its launch ([`Module`], on
//! which each lab builds its own kernels' wrappers in its folder) with the
//! pipelines' compute kernel ([`ComputeKernel`]), and NVTX ranges
//! ([`trace`]).
//!
//! May use: `error`, `pipeline` (the vocabulary it executes), `measure`
//! (data patterns that prove a copy happened), `units`.

pub mod blas;
pub mod copy;
pub mod driver;
mod fingerprint;
mod gate;
pub mod graph;
pub mod host;
pub mod host_fn;
pub mod kernel;
pub mod kernels;
pub mod nccl;
pub mod plan;
pub mod pool;
pub mod runner;
pub mod topology;
pub mod trace;

pub use crate::pipeline::op::StreamKind;
pub use blas::{Blas, Fp8Scales, MatrixE4M3, MatrixF16, ScalarF32};
pub use copy::{plain_copies, CopyOp, PlainLane, PlainTiming};
pub use graph::Graph;
pub use host::{
    alloc_host, HostBuffer, HostMemoryKind, MappedBuffer, PageableBuffer, PagesFrom, PinnedBuffer, RegisteredBuffer, TouchedPages, WriteCombinedBuffer,
};
pub use host_fn::HostTask;
pub use kernel::{Blocks, ComputeKernel, KernelArg, Module};
pub use plan::{CapturedPlan, MachineFacts, PlanRig, Replay};
pub use pool::{MemPool, PoolBuffer, PoolUsage, ThresholdGuard};
pub use runner::{Dataset, GpuIssuer, LabOnGpu, LabRunner, Run, Runner, TimelineSource};

/// Whether CUPTI can record this process's GPU activity: `Err(why)` where
/// libcupti is missing or another tool already holds it (compute-sanitizer,
/// Nsight Systems and Nsight Compute each do). Probed once per process:
/// attaching costs a few ms.
pub fn cupti_free() -> std::result::Result<(), &'static str> {
    cupti_probe()
}

/// Why CUPTI cannot record here where another tool holds it (a sanitizer,
/// Nsight): `None` where it can, or where only libcupti is missing (which
/// stops this process's timelines, not a child's own CUPTI).
pub fn cupti_held_by_another_tool() -> Option<&'static str> {
    cupti_probe().err().filter(|why| why.contains("MULTIPLE_SUBSCRIBERS"))
}

fn cupti_probe() -> std::result::Result<(), &'static str> {
    static CUPTI: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    CUPTI
        .get_or_init(|| if driver::activity::available() { driver::activity::probe() } else { Err("libcupti could not be loaded".into()) })
        .as_ref()
        .map(|_| ())
        .map_err(String::as_str)
}

use crate::error::{LabError, Result};
use crate::measure::fingerprint::Fingerprint;
use crate::units::Bytes;
use cudarc::driver::CudaContext;
use std::sync::Arc;

/// Whether this machine can run the live labs, and if not, why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    Ready { devices: usize },
    NoDriver,
    NoDevice,
    Broken(String),
}

impl Availability {
    pub fn probe() -> Availability {
        if !driver::driver_present() {
            return Availability::NoDriver;
        }
        match driver::device_count() {
            Ok(0) => Availability::NoDevice,
            Ok(n) => Availability::Ready { devices: n },
            Err(e) => Availability::Broken(e.to_string()),
        }
    }
    pub fn is_ready(&self) -> bool {
        matches!(self, Availability::Ready { .. })
    }
    /// Why there is no GPU, in words (empty when ready).
    pub fn reason(&self) -> String {
        match self {
            Availability::Ready { .. } => String::new(),
            Availability::NoDriver => LabError::NoDriver.to_string(),
            Availability::NoDevice => "the CUDA driver reports no device".into(),
            Availability::Broken(why) => format!("the CUDA driver failed to initialise ({why})"),
        }
    }
}

/// An opened CUDA device (its primary context, event tracking off).
#[derive(Clone)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    ordinal: usize,
    name: Arc<str>,
    gate: gate::GateSlot,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu({})", self.ordinal)
    }
}

impl Gpu {
    /// Opens device `ordinal`. With no driver this is an error, never a panic.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        if !driver::driver_present() {
            return Err(LabError::NoDriver);
        }
        let count = driver::device_count()?;
        if ordinal >= count {
            return Err(LabError::NoDevice { ordinal, count });
        }
        let ctx = driver::open_context(ordinal)?;
        let name = driver::device_name(ctx.cu_device())?.into();
        Ok(Gpu { ctx, ordinal, name, gate: Default::default() })
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// e.g. "NVIDIA H200".
    pub fn name(&self) -> &str {
        &self.name
    }

    /// "GPU 0 (NVIDIA H200)": the process name in timelines and traces.
    pub fn label(&self) -> String {
        format!("GPU {} ({})", self.ordinal, self.name)
    }

    /// CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT.
    pub fn copy_engines(&self) -> Result<u32> {
        driver::attribute(self.ctx.cu_device(), cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT).map(|v| v as u32)
    }

    /// The compute capability as (major, minor): (9, 0) on Hopper.
    pub fn compute_capability(&self) -> Result<(u32, u32)> {
        use cudarc::driver::sys::CUdevice_attribute as Attr;
        let attr = |a| driver::attribute(self.ctx.cu_device(), a).map(|v| v as u32);
        Ok((attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?, attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?))
    }

    /// CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR (2048 on Hopper).
    pub fn max_threads_per_sm(&self) -> Result<u32> {
        driver::attribute(self.ctx.cu_device(), cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR).map(|v| v as u32)
    }

    /// The most dynamic shared memory a block may be allowed, bytes
    /// (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 227 KiB on Hopper).
    pub fn max_smem_per_block(&self) -> Result<u32> {
        driver::attribute(self.ctx.cu_device(), cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map(|v| v as u32)
    }

    /// Makes this device's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        driver::bind(&self.ctx)
    }

    /// Whether this GPU can map `peer`'s memory (cuDeviceCanAccessPeer).
    pub fn can_access_peer(&self, peer: &Gpu) -> Result<bool> {
        driver::can_access_peer(self.ctx.cu_device(), peer.ctx.cu_device())
    }

    /// Lets this GPU's kernels and copies reach `peer`'s memory over the
    /// link (cuCtxEnablePeerAccess; once enabled it stays so). A GPU that
    /// cannot is told so, naming the pair.
    pub fn enable_peer_access(&self, peer: &Gpu) -> Result<()> {
        if peer.ordinal() == self.ordinal() {
            return Ok(());
        }
        if !self.can_access_peer(peer)? {
            return Err(LabError::Unsupported(format!(
                "GPU {} cannot map GPU {}'s memory (no peer access between them): copies between them are staged through host memory",
                self.ordinal(),
                peer.ordinal()
            )));
        }
        self.bind()?;
        // SAFETY: `peer` holds its primary context, alive while it lives; this GPU's is current.
        unsafe { driver::enable_peer_access(peer.ctx.cu_ctx()) }
    }

    pub fn fingerprint(&self) -> Result<Fingerprint> {
        self.bind()?;
        Fingerprint::read(self.ctx.cu_device(), self.ordinal)
    }

    /// (free, total) device memory.
    pub fn memory_info(&self) -> Result<(u64, u64)> {
        self.bind()?;
        driver::memory_info()
    }

    /// Fails with a clear message if `bytes` more device memory cannot fit.
    pub fn ensure_free(&self, bytes: u64, purpose: &str) -> Result<()> {
        let (free, _) = self.memory_info()?;
        if bytes > free {
            return Err(LabError::config(format!("{purpose} needs {} of device memory but only {} is free", Bytes(bytes), Bytes(free))));
        }
        Ok(())
    }

    /// A new non-blocking stream at the default priority (what the labs' pipelines use).
    pub fn stream(&self) -> Result<Stream> {
        self.bind()?;
        Ok(Stream { raw: driver::stream_create_non_blocking()?, gpu: self.clone(), kind: StreamKind::NonBlocking, priority: 0 })
    }

    /// A stream of `kind` at `priority` (lower runs first; 0 is the
    /// default): a new blocking or non-blocking stream, or a handle to the
    /// legacy default stream or the calling thread's per-thread default
    /// stream (those two run at the default priority only).
    pub fn stream_of(&self, kind: StreamKind, priority: i32) -> Result<Stream> {
        self.bind()?;
        let (least, greatest) = driver::stream_priority_range()?;
        if !(greatest..=least).contains(&priority) {
            return Err(LabError::config(format!("stream priority {priority} is outside this GPU's range {greatest} (first) to {least} (default)")));
        }
        let raw = match kind {
            StreamKind::NonBlocking | StreamKind::Blocking => driver::stream_create_with_priority(kind == StreamKind::NonBlocking, priority)?,
            StreamKind::Legacy | StreamKind::PerThread if priority != 0 => {
                return Err(LabError::config(format!(
                    "the {kind:?} default stream runs at the default priority 0, not {priority}: create a stream to give it one"
                )));
            }
            StreamKind::Legacy => driver::STREAM_LEGACY,
            StreamKind::PerThread => driver::STREAM_PER_THREAD,
        };
        Ok(Stream { raw, gpu: self.clone(), kind, priority })
    }

    /// This GPU's stream priorities: (least, greatest); the default 0 is the least.
    pub fn stream_priority_range(&self) -> Result<(i32, i32)> {
        self.bind()?;
        driver::stream_priority_range()
    }

    pub fn timing_event(&self) -> Result<Event> {
        self.bind()?;
        Ok(Event { raw: driver::event_create_timing()?, gpu: self.clone() })
    }

    /// An event for dependencies only (no timestamp; `elapsed_ms` on it fails).
    pub fn sync_event(&self) -> Result<Event> {
        self.bind()?;
        Ok(Event { raw: driver::event_create_sync_only()?, gpu: self.clone() })
    }

    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        if bytes == 0 {
            return Err(LabError::config("device buffer of 0 bytes"));
        }
        self.bind()?;
        Ok(DeviceBuffer { ptr: driver::device_alloc(bytes)?, bytes, gpu: self.clone() })
    }
}

/// A non-blocking stream (no implicit sync with the legacy default stream).
pub struct Stream {
    raw: driver::CUstream,
    gpu: Gpu,
    kind: StreamKind,
    priority: i32,
}

// SAFETY: a CUDA stream handle may be used from any thread of the process,
// by several at once (the driver serializes calls on one stream); the
// handle is only destroyed by `Drop`, when no borrow is left.
unsafe impl Send for Stream {}
// SAFETY: as for Send: `&Stream` only enqueues to the handle or waits on
// it, which the driver allows from any thread at once.
unsafe impl Sync for Stream {}

impl Stream {
    pub(crate) fn raw(&self) -> driver::CUstream {
        self.raw
    }
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
    /// How it is ordered against the legacy default stream.
    pub fn kind(&self) -> StreamKind {
        self.kind
    }
    /// Its priority (lower runs first; 0 is the default).
    pub fn priority(&self) -> i32 {
        self.priority
    }
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: `self` owns a live stream.
        unsafe { driver::stream_synchronize(self.raw) }
    }
    /// Copies the first `bytes` of `src` into `dst` and waits (untimed setup).
    pub fn upload(&self, dst: &DeviceBuffer, src: &dyn HostBuffer, bytes: usize) -> Result<()> {
        let mut op = CopyOp::HostToDevice { src, dst, bytes };
        op.validate()?;
        // SAFETY: waited for below, while both borrows last.
        let queued = unsafe { op.enqueue(self) };
        self.synchronize()?;
        queued
    }
    /// Copies `bytes` of `src` from its byte `at` into the start of `dst`
    /// and waits (untimed setup: a resident layer's weights, say).
    pub fn upload_range(&self, dst: &DeviceBuffer, src: &dyn HostBuffer, at: usize, bytes: usize) -> Result<()> {
        if bytes == 0 || at.checked_add(bytes).is_none_or(|end| end > src.bytes()) || bytes > dst.bytes() {
            return Err(LabError::config(format!(
                "a copy of {bytes} bytes from byte {at} does not fit buffers of {} (host) and {} (device) bytes",
                src.bytes(),
                dst.bytes()
            )));
        }
        // SAFETY: `at` is inside `src` (checked above), so the pointer stays in its allocation.
        let host = unsafe { (src.words().as_ptr() as *const u8).add(at) } as *mut std::ffi::c_void;
        let raw = copy::RawCopy { up: true, host, device: dst.ptr(), bytes };
        // SAFETY: both ranges are inside live buffers borrowed until the
        // synchronize below, and a host-to-device copy only reads the host side.
        let queued = unsafe { raw.enqueue(self) };
        self.synchronize()?;
        queued
    }
    /// Copies the first `bytes` of `src` into `dst` and waits (untimed setup).
    pub fn download(&self, dst: &mut dyn HostBuffer, src: &DeviceBuffer, bytes: usize) -> Result<()> {
        let mut op = CopyOp::DeviceToHost { src, dst, bytes };
        op.validate()?;
        // SAFETY: waited for below, while both borrows last.
        let queued = unsafe { op.enqueue(self) };
        self.synchronize()?;
        queued
    }
    /// Enqueues a copy of `bytes` from `src` into pinned `dst` and returns
    /// at once.
    ///
    /// # Safety
    /// Nothing may read `dst` until the copy has completed on this stream,
    /// and `dst` must outlive it: the caller orders that (lab 4 does it with
    /// slot leases, and syncs before freeing).
    pub unsafe fn download_async(&self, dst: &PinnedBuffer, src: &DeviceBuffer, bytes: usize) -> Result<()> {
        if bytes == 0 || bytes > src.bytes() || bytes > dst.words().len() * 8 {
            return Err(LabError::config(format!("a D2H of {bytes} bytes does not fit {} -> {} bytes", src.bytes(), dst.words().len() * 8)));
        }
        let copy = copy::RawCopy { up: false, host: dst.words().as_ptr() as *mut std::ffi::c_void, device: src.ptr, bytes };
        // SAFETY: sizes checked; the caller orders the reads and keeps `dst` alive.
        unsafe { copy.enqueue(self) }
    }
    /// Later work on this stream waits for `e` (cuStreamWaitEvent).
    pub fn wait_event(&self, e: &Event) -> Result<()> {
        // SAFETY: both handles are owned by live values.
        unsafe { driver::stream_wait_event(self.raw, e.raw) }
    }
    /// Enqueues a device-to-device copy of `bytes` from `src` to `dst`
    /// (refused where the ranges overlap or do not fit).
    ///
    /// # Safety
    /// Both spans' memory stays allocated until the stream has run the
    /// copy (a [`Runner`] holds its buffers' borrows until it synchronizes).
    pub unsafe fn enqueue_copy_on_device(&self, dst: DeviceSpan, src: DeviceSpan, bytes: usize) -> Result<()> {
        let disjoint = src.ptr + bytes as u64 <= dst.ptr || dst.ptr + bytes as u64 <= src.ptr;
        if bytes == 0 || bytes > src.bytes || bytes > dst.bytes || !disjoint {
            return Err(LabError::config(format!("a D2D copy of {bytes} bytes does not fit {} -> {} bytes of two separate buffers", src.bytes, dst.bytes)));
        }
        // SAFETY: both ranges lie in live allocations (checked above; the
        // caller keeps them alive until the copy has run) and do not overlap
        // (checked above).
        unsafe { driver::memcpy_dtod_async(dst.ptr, src.ptr, bytes, self.raw) }
    }
    /// Enqueues a copy of `bytes` from `src` in `src_gpu`'s memory to `dst`
    /// in `dst_gpu`'s (cuMemcpyPeerAsync): over the link between them where
    /// peer access is enabled ([`Gpu::enable_peer_access`]), else staged
    /// by the driver through host memory.
    ///
    /// # Safety
    /// `dst` lies in `dst_gpu`'s memory and `src` in `src_gpu`'s, and both
    /// stay allocated until the stream has run the copy.
    pub unsafe fn enqueue_peer_copy(&self, dst: DeviceSpan, dst_gpu: &Gpu, src: DeviceSpan, src_gpu: &Gpu, bytes: usize) -> Result<()> {
        if bytes == 0 || bytes > src.bytes || bytes > dst.bytes {
            return Err(LabError::config(format!("a copy of {bytes} bytes between GPUs does not fit {} -> {} bytes", src.bytes, dst.bytes)));
        }
        // SAFETY: both ranges lie in live allocations of their GPUs (checked
        // above; the caller keeps them alive until the copy has run), and
        // the contexts are the primary contexts the two Gpus hold.
        unsafe { driver::memcpy_peer_async(dst.ptr, dst_gpu.ctx.cu_ctx(), src.ptr, src_gpu.ctx.cu_ctx(), bytes, self.raw) }
    }
    /// Fills `buf` with the 32-bit word `value` (to poison it) and waits.
    pub fn fill_u32(&self, buf: &DeviceBuffer, value: u32) -> Result<()> {
        // SAFETY: the span is all of `buf`, borrowed until this returns.
        unsafe { self.fill_span_u32(buf.span(), value) }
    }
    /// As [`Stream::fill_u32`], over any span of device memory.
    ///
    /// # Safety
    /// The span's memory stays allocated until this returns (it waits for
    /// the fill).
    pub(in crate::gpu) unsafe fn fill_span_u32(&self, span: DeviceSpan, value: u32) -> Result<()> {
        // The memset goes to the current context: the stream's.
        self.gpu.bind()?;
        // SAFETY: the range is exactly the span, allocated until the
        // synchronize below (# Safety); the stream is `self`'s, live.
        let queued = unsafe { driver::memset_d32_async(span.ptr, value, span.bytes / 4, self.raw) };
        self.synchronize()?;
        queued
    }
    /// A span of device memory as whole 64-bit words (a trailing partial
    /// word is left out), read back and waited for (small untimed reads: a
    /// module's variables).
    ///
    /// # Safety
    /// The span's memory stays allocated until this returns (it waits for
    /// the copy).
    pub(in crate::gpu) unsafe fn read_words(&self, span: DeviceSpan) -> Result<Vec<u64>> {
        let words = span.bytes / 8;
        let mut v = vec![0u64; words];
        if words > 0 {
            // SAFETY: `v` holds `words` words and lives past the synchronize,
            // and nothing reads it before; the span is allocated until this
            // returns (# Safety) and holds at least `words * 8` bytes.
            let queued = unsafe { driver::memcpy_dtoh_async(v.as_mut_ptr() as *mut std::ffi::c_void, span.ptr, words * 8, self.raw) };
            self.synchronize()?;
            queued?;
        }
        Ok(v)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if matches!(self.kind, StreamKind::Legacy | StreamKind::PerThread) {
            // The default streams belong to the driver.
            return;
        }
        let _ = self.gpu.bind();
        // SAFETY: the stream is owned by `self` and destroyed only here.
        let _ = unsafe { driver::stream_destroy(self.raw) };
    }
}

/// A CUDA event with timing enabled.
pub struct Event {
    raw: driver::CUevent,
    gpu: Gpu,
}

// SAFETY: a CUDA event handle may be used from any thread of the process
// (records, waits and queries are thread-safe in the driver); it is only
// destroyed by `Drop`.
unsafe impl Send for Event {}
// SAFETY: as for Send: `&Event` only records, waits on or queries it.
unsafe impl Sync for Event {}

impl Event {
    pub fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: both handles are owned by live values.
        unsafe { driver::event_record(self.raw, stream.raw) }
    }
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: `self` owns a live event.
        unsafe { driver::event_synchronize(self.raw) }
    }
    /// Device milliseconds from `self` to `end` (both recorded and complete).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f64> {
        // SAFETY: both are live timing events (created by `Gpu::timing_event`);
        // the driver returns an error, not UB, when one has not completed.
        unsafe { driver::event_elapsed_ms(self.raw, end.raw) }.map(f64::from)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: the event is owned by `self` and destroyed only here.
        let _ = unsafe { driver::event_destroy(self.raw) };
    }
}

/// Device memory from cuMemAlloc.
pub struct DeviceBuffer {
    ptr: driver::CUdeviceptr,
    bytes: usize,
    gpu: Gpu,
}

// SAFETY: a device address is a plain number the host never dereferences;
// the memory is reached only through enqueued GPU work (ordered by streams)
// and freed only by `Drop`.
unsafe impl Send for DeviceBuffer {}
// SAFETY: as for Send: `&DeviceBuffer` gives out only its address and size.
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// The GPU whose memory it is.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
    pub fn bytes(&self) -> usize {
        self.bytes
    }
    pub(crate) fn ptr(&self) -> driver::CUdeviceptr {
        self.ptr
    }
    /// Where it is and how big, for the enqueues that take spans (each an
    /// `unsafe fn` whose caller keeps the buffer allocated until the GPU
    /// ran it).
    pub fn span(&self) -> DeviceSpan {
        DeviceSpan { ptr: self.ptr, bytes: self.bytes }
    }
}

/// Where a device allocation is and how big, whoever owns it (a
/// [`DeviceBuffer`], a module's variable, or an allocation a runner made
/// and will free). Made only inside `gpu/`: a span names memory the GPU
/// may write, so nothing outside can point one elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceSpan {
    ptr: driver::CUdeviceptr,
    bytes: usize,
}

impl DeviceSpan {
    pub(in crate::gpu) fn new(ptr: driver::CUdeviceptr, bytes: usize) -> DeviceSpan {
        DeviceSpan { ptr, bytes }
    }
    /// Its size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
    /// The `bytes` bytes from byte `at` of it (a narrower span of the same
    /// memory, never a wider one): None where they do not lie inside it.
    pub fn part(&self, at: usize, bytes: usize) -> Option<DeviceSpan> {
        (at.checked_add(bytes)? <= self.bytes).then(|| DeviceSpan { ptr: self.ptr + at as driver::CUdeviceptr, bytes })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: the allocation is owned by `self` and freed only here; the
        // pipelines that use it synchronize before their borrows end.
        let _ = unsafe { driver::device_free(self.ptr) };
    }
}
