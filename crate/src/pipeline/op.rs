//! The operations of a pipeline as both executors record them: what each
//! op is ([`OpKind`]: a copy, a kernel, a host function, a memory call, an
//! all-reduce), where it runs (a stream's [`StreamDecl`], a [`Lane`]) and
//! what it touches ([`Access`]). No CUDA.

use serde::{Deserialize, Serialize};
use std::fmt;

pub type OpId = usize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpKind {
    H2d,
    Kernel,
    D2h,
    /// CPU work on a host thread.
    Host,
    /// Memory made usable: a stream-ordered call on a stream's lane
    /// (cuMemAllocAsync), a blocking call on a host thread's (cuMemAlloc,
    /// cuMemHostAlloc, cuMemHostRegister).
    Alloc(Memory),
    /// Memory given back: stream-ordered (cuMemFreeAsync) or blocking
    /// (cuMemFree, cuMemFreeHost, cuMemHostUnregister).
    Free(Memory),
    /// A device-to-device copy: within one GPU (`from == to`), or from one
    /// GPU's memory to another's (a peer copy, over NVLink or PCIe).
    D2d(Link),
    /// One rank's part of a collective sum over this many GPUs (an NCCL
    /// all-reduce): an op on one stream of each GPU, none of which can end
    /// before every rank has reached its own ([`Schedule::collective`](super::schedule::Schedule::collective)).
    AllReduce(u8),
}

/// The GPUs a device-to-device copy moves data between (by device index).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Link {
    pub from: u8,
    pub to: u8,
}

impl Link {
    /// The copy from GPU `from` to GPU `to`; `None` past GPU 255.
    pub fn between(from: usize, to: usize) -> Option<Link> {
        Some(Link { from: u8::try_from(from).ok()?, to: u8::try_from(to).ok()? })
    }
    /// Whether it crosses from one GPU to another.
    pub fn is_peer(self) -> bool {
        self.from != self.to
    }
}

impl fmt::Display for Link {
    /// "GPU 0 -> GPU 1", or "GPU 0" for a copy within one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_peer() {
            write!(f, "GPU {} -> GPU {}", self.from, self.to)
        } else {
            write!(f, "GPU {}", self.from)
        }
    }
}

/// Which memory an allocation or release is about: what lab 6 compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Memory {
    /// Device memory from cuMemAlloc / cuMemFree (blocking calls).
    Device,
    /// Device memory from the stream-ordered pool (cuMemAllocAsync / cuMemFreeAsync).
    Pool,
    /// Page-locked host memory from cuMemHostAlloc / cuMemFreeHost.
    Pinned,
    /// Ordinary host memory pinned in place (cuMemHostRegister / cuMemHostUnregister).
    Registered,
}

impl Memory {
    /// The driver call that allocates (`alloc`) or releases it.
    pub fn call(self, alloc: bool) -> &'static str {
        match (self, alloc) {
            (Memory::Device, true) => "cuMemAlloc",
            (Memory::Device, false) => "cuMemFree",
            (Memory::Pool, true) => "cuMemAllocAsync",
            (Memory::Pool, false) => "cuMemFreeAsync",
            (Memory::Pinned, true) => "cuMemHostAlloc",
            (Memory::Pinned, false) => "cuMemFreeHost",
            (Memory::Registered, true) => "cuMemHostRegister",
            (Memory::Registered, false) => "cuMemHostUnregister",
        }
    }
    /// The operation's label: the call and the buffer, e.g. "cuMemFreeAsync scratch 3".
    pub fn label(self, alloc: bool, buffer: &str) -> String {
        format!("{} {buffer}", self.call(alloc))
    }
}

impl OpKind {
    /// A chunk's three GPU stages, in pipeline order.
    pub const STAGES: [OpKind; 3] = [OpKind::H2d, OpKind::Kernel, OpKind::D2h];
    pub fn label(self) -> &'static str {
        match self {
            OpKind::H2d => "H2D",
            OpKind::Kernel => "kernel",
            OpKind::D2h => "D2H",
            OpKind::Host => "host",
            OpKind::Alloc(_) => "alloc",
            OpKind::Free(_) => "free",
            OpKind::D2d(l) if l.is_peer() => "peer",
            OpKind::D2d(_) => "D2D",
            OpKind::AllReduce(_) => "all-reduce",
        }
    }
    /// Every kind as drawn (one colour and legend entry each).
    pub fn drawn(self) -> OpKind {
        match self {
            OpKind::Alloc(_) => OpKind::Alloc(Memory::Device),
            OpKind::Free(_) => OpKind::Free(Memory::Device),
            OpKind::D2d(l) => OpKind::D2d(if l.is_peer() { Link { from: 0, to: 1 } } else { Link { from: 0, to: 0 } }),
            OpKind::AllReduce(_) => OpKind::AllReduce(2),
            k => k,
        }
    }
    /// Work the GPU's engines or SMs run (copies and kernels): it leaves an
    /// activity record in CUPTI, and a plan's costs are measured op by op
    /// for it.
    pub fn is_device_work(self) -> bool {
        matches!(self, OpKind::H2d | OpKind::Kernel | OpKind::D2h | OpKind::D2d(_) | OpKind::AllReduce(_))
    }
    /// The stage's place in H2D -> kernel -> D2H (host work counts as 0).
    pub fn stage_index(self) -> usize {
        match self {
            OpKind::Kernel => 1,
            OpKind::D2h => 2,
            _ => 0,
        }
    }
}

/// How a stream is ordered against the legacy default stream (the "NULL
/// stream", CU_STREAM_LEGACY): what lab 5 measures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum StreamKind {
    /// The legacy default stream: an op on it waits for all earlier work of
    /// every blocking stream, and later work on those waits for it.
    Legacy,
    /// Created without CU_STREAM_NON_BLOCKING: ordered against the legacy stream.
    Blocking,
    /// CU_STREAM_NON_BLOCKING: independent of the legacy stream (the labs' own streams).
    #[default]
    NonBlocking,
    /// A host thread's per-thread default stream (CU_STREAM_PER_THREAD):
    /// independent of other threads' but ordered against the legacy stream
    /// like a blocking stream.
    PerThread,
}

impl StreamKind {
    /// Whether work on this stream is ordered against the legacy stream.
    pub fn meets_legacy(self) -> bool {
        matches!(self, StreamKind::Blocking | StreamKind::PerThread)
    }
}

/// A stream as declared to a schedule: how it is ordered against the
/// legacy stream, its priority, and the GPU it belongs to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamDecl {
    pub kind: StreamKind,
    /// CUDA's numbers: lower runs first; 0 is the default.
    pub priority: i32,
    pub gpu: usize,
}

impl StreamDecl {
    pub fn new(kind: StreamKind, priority: i32, gpu: usize) -> StreamDecl {
        StreamDecl { kind, priority, gpu }
    }
}

/// Where an operation runs, in issue terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Lane {
    Stream(usize),
    HostThread(usize),
}

impl fmt::Display for Lane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Lane::Stream(s) => write!(f, "stream {s}"),
            Lane::HostThread(0) => write!(f, "CPU main"),
            Lane::HostThread(t) => write!(f, "CPU thread {t}"),
        }
    }
}

/// A byte range of a named buffer that an operation reads or writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Access {
    pub buffer: String,
    pub start: u64,
    pub end: u64,
    pub write: bool,
}

impl Access {
    pub fn read(buffer: &str, start: u64, end: u64) -> Access {
        Access { buffer: buffer.into(), start, end, write: false }
    }
    pub fn write(buffer: &str, start: u64, end: u64) -> Access {
        Access { buffer: buffer.into(), start, end, write: true }
    }
    pub(super) fn overlaps(&self, o: &Access) -> bool {
        self.buffer == o.buffer && self.start < o.end && o.start < self.end
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Op {
    pub id: OpId,
    pub kind: OpKind,
    pub lane: Lane,
    pub label: String,
    pub accesses: Vec<Access>,
    /// Operations that directly happen before this one.
    pub deps: Vec<OpId>,
    /// Its stream's priority (CUDA's numbers: lower runs first; 0 is the default).
    #[serde(default)]
    pub priority: i32,
    /// GPU work the issuing thread waited for before issuing this GPU op
    /// (a host wait or synchronize), in id order (searched by the queue
    /// model): it cannot start before that thread woke up and issued it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_host_wait: Vec<OpId>,
    /// The GPU whose stream it runs on (0 for a host thread's work).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpu: usize,
}

impl Op {
    /// Work a GPU runs: an op on a stream other than a host function (which
    /// runs on the CPU, in stream order).
    pub fn is_gpu_work(&self) -> bool {
        matches!(self.lane, Lane::Stream(_)) && self.kind != OpKind::Host
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}
