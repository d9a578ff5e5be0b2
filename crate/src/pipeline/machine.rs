//! What the queue model knows of the machine: copy engines and how the
//! two directions of a link slow each other, how kernels of two streams
//! overlap, what a host function's round trip and a CPU thread's wake-up
//! cost, and which blocking calls wait for which GPU work. Measured by the
//! labs (`gpu::MachineFacts`), read by [`super::predict`].

use super::op::{Memory, OpKind};
use serde::{Deserialize, Serialize};

/// What the model knows of the hardware and the driver.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: 1 = one copy engine shared by
    /// both directions; 2 or more = H2D and D2H can run at once.
    pub copy_engines: u32,
    /// A host function's round trip on its stream (the driver's callback
    /// thread wakes, runs it, releases the stream), when that thread had
    /// gone to sleep: its stream pays half before the body and half after.
    #[serde(default)]
    pub host_fn_round_trip: f64,
    /// The same round trip while the callback thread is awake (it ran
    /// something within the last round trip).
    #[serde(default)]
    pub host_fn_awake: f64,
    /// How long a host thread blocked on GPU work (an event or stream
    /// synchronize) takes to wake after that work ends: measured up to the
    /// start of the next GPU op it issues, so that op's issuing is in it.
    #[serde(default)]
    pub host_wake: f64,
    /// Each direction's speed while H2D and D2H run at once, as a share of
    /// its speed alone (the measured bidirectional ceiling: 1 = the two
    /// engines never slow each other; below 1 where the host link carries
    /// less both ways than twice one way).
    #[serde(default = "full_speed")]
    pub both_ways: f64,
    /// The same for a link between two GPUs: each direction's speed while
    /// peer copies run both ways at once, as a share of its speed alone.
    #[serde(default = "full_speed")]
    pub peer_both_ways: f64,
    /// How much of a kernel's time it saves when it takes the SMs straight
    /// from another stream's kernel while already waiting for them: its
    /// first blocks start while that kernel's last ones drain (a kernel
    /// after one on its own stream waits for the whole drain). Measured as
    /// kernels alternating over two streams against the same kernels back
    /// to back on one.
    #[serde(default)]
    pub kernel_overlap: f64,
    /// Whether kernels of different streams run side by side, each stream
    /// with a share of the SMs of its own (a CUDA graph's branches of
    /// kernels too small to fill the GPU); false: each kernel fills the
    /// GPU, and they run one at a time.
    #[serde(default)]
    pub kernels_side_by_side: bool,
    /// The CPU time to issue one GPU op (the driver call and the
    /// pipeline's bookkeeping, its events and waits included), ms. A loop
    /// issued behind a gate has all the issuing thread issued before it
    /// first waits or works there when the GPU starts; after that (or from
    /// the start, for a schedule [`Schedule::issued_live`](super::schedule::Schedule::issued_live)), each op
    /// reaches the GPU this long after the one before it.
    #[serde(default)]
    pub issue: f64,
    /// How long a CPU thread blocked on a host function's signal
    /// ([`crate::pipeline::issue::Issue::signal`]) takes to resume after
    /// the host function ran: the driver's callback thread wakes it, and
    /// it issues its next op (measured to that op's start; 0: at once).
    #[serde(default)]
    pub signal_wake: f64,
    /// Which blocking memory calls wait until the device is idle (measured
    /// by lab 6, not promised by CUDA: the model times them so, but never
    /// counts on them for ordering).
    #[serde(default)]
    pub device_waits: DeviceWaits,
}

/// What a blocking memory call waits for before it returns: the GPU work
/// of these kinds already issued, on every stream (each one a measured
/// fact of a driver: lab 6 probes each call beside busy kernels, uploads
/// and downloads).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitsFor {
    pub kernels: bool,
    pub uploads: bool,
    pub downloads: bool,
}

impl WaitsFor {
    /// Waits for nothing: returns as soon as its own work is done.
    pub const NOTHING: WaitsFor = WaitsFor { kernels: false, uploads: false, downloads: false };
    /// Waits until the device is idle.
    pub const EVERYTHING: WaitsFor = WaitsFor { kernels: true, uploads: true, downloads: true };
    /// Whether it waits for GPU work of `kind` (waiting for everything
    /// includes a stream's host functions and stream-ordered memory calls).
    pub fn includes(self, kind: OpKind) -> bool {
        if self == WaitsFor::EVERYTHING {
            return true;
        }
        match kind {
            OpKind::Kernel => self.kernels,
            OpKind::H2d => self.uploads,
            OpKind::D2h => self.downloads,
            _ => false,
        }
    }
    pub fn any(self) -> bool {
        self.kernels || self.uploads || self.downloads
    }
    /// "kernels and downloads", "nothing", "all GPU work".
    pub fn describe(self) -> String {
        if self == WaitsFor::EVERYTHING {
            return "all GPU work".into();
        }
        let kinds: Vec<&str> =
            [(self.kernels, "kernels"), (self.uploads, "uploads"), (self.downloads, "downloads")].into_iter().filter(|k| k.0).map(|k| k.1).collect();
        match kinds.as_slice() {
            [] => "nothing".into(),
            [one] => one.to_string(),
            [a, b] => format!("{a} and {b}"),
            _ => kinds.join(", "),
        }
    }
}

/// How much slower a blocking call runs while GPU work of each kind runs
/// at once (a multiple of its time on an idle GPU; 1: not slowed): not a
/// wait, but a call that shares something with that work (lab 6's probes
/// measure it: an allocation beside a download, say, takes longer than on
/// an idle GPU without waiting for the download).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SlowedBy {
    pub kernels: f64,
    pub uploads: f64,
    pub downloads: f64,
}

impl Default for SlowedBy {
    fn default() -> Self {
        SlowedBy::NOT
    }
}

impl SlowedBy {
    /// Runs at the same speed whatever runs beside it.
    pub const NOT: SlowedBy = SlowedBy { kernels: 1.0, uploads: 1.0, downloads: 1.0 };
    /// The slowdown while GPU work of `kind` runs (1 for other kinds).
    pub fn beside(self, kind: OpKind) -> f64 {
        let f = match kind {
            OpKind::Kernel => self.kernels,
            OpKind::H2d => self.uploads,
            OpKind::D2h => self.downloads,
            _ => 1.0,
        };
        if f.is_finite() {
            f.max(1.0)
        } else {
            1.0
        }
    }
    pub fn any(self) -> bool {
        [OpKind::Kernel, OpKind::H2d, OpKind::D2h].into_iter().any(|k| self.beside(k) > 1.0)
    }
    /// "3.20x beside downloads", "not slowed".
    pub fn describe(self) -> String {
        let parts: Vec<String> = [(OpKind::Kernel, "kernels"), (OpKind::H2d, "uploads"), (OpKind::D2h, "downloads")]
            .into_iter()
            .filter(|&(k, _)| self.beside(k) > 1.0)
            .map(|(k, name)| format!("{:.2}x beside {name}", self.beside(k)))
            .collect();
        if parts.is_empty() {
            "not slowed".into()
        } else {
            parts.join(", ")
        }
    }
}

/// What each blocking memory call waits for before it returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceWaits {
    /// cuMemAlloc.
    pub alloc: WaitsFor,
    /// cuMemFree.
    pub free: WaitsFor,
    /// cuMemHostAlloc.
    pub pinned_alloc: WaitsFor,
    /// cuMemFreeHost.
    pub pinned_free: WaitsFor,
    /// cuMemHostRegister.
    pub register: WaitsFor,
    /// cuMemHostUnregister.
    pub unregister: WaitsFor,
    /// How much slower cuMemAlloc runs beside each kind of GPU work
    /// (recordings made before it was measured: not slowed).
    #[serde(default)]
    pub alloc_slowed: SlowedBy,
}

impl DeviceWaits {
    /// What a blocking call of `kind` waits for.
    pub fn waits(&self, kind: OpKind) -> WaitsFor {
        match kind {
            OpKind::Alloc(Memory::Device) => self.alloc,
            OpKind::Free(Memory::Device) => self.free,
            OpKind::Alloc(Memory::Pinned) => self.pinned_alloc,
            OpKind::Free(Memory::Pinned) => self.pinned_free,
            OpKind::Alloc(Memory::Registered) => self.register,
            OpKind::Free(Memory::Registered) => self.unregister,
            _ => WaitsFor::NOTHING,
        }
    }
    /// How much a blocking call of `kind` is slowed beside GPU work.
    pub fn slowed(&self, kind: OpKind) -> SlowedBy {
        match kind {
            OpKind::Alloc(Memory::Device) => self.alloc_slowed,
            _ => SlowedBy::NOT,
        }
    }
}

fn full_speed() -> f64 {
    1.0
}

impl Machine {
    /// A GPU with `copy_engines` copy engines and host costs that do not
    /// matter at the pipeline's scale (zero).
    pub fn engines(copy_engines: u32) -> Machine {
        Machine {
            copy_engines,
            host_fn_round_trip: 0.0,
            host_fn_awake: 0.0,
            host_wake: 0.0,
            both_ways: 1.0,
            peer_both_ways: 1.0,
            kernel_overlap: 0.0,
            kernels_side_by_side: false,
            issue: 0.0,
            signal_wake: 0.0,
            device_waits: DeviceWaits::default(),
        }
    }
    /// `copy_engines` engines, each direction slowed while both run as
    /// measured: an H2D and a D2H alone, and both at once (ms); the share
    /// is max(H, D) over H|D.
    pub fn copies_measured(copy_engines: u32, h2d_ms: f64, d2h_ms: f64, both_ms: f64) -> Machine {
        let both_ways = (h2d_ms.max(d2h_ms) / both_ms).clamp(0.01, 1.0);
        Machine { both_ways: if both_ways.is_finite() { both_ways } else { 1.0 }, ..Machine::engines(copy_engines) }
    }
    /// This machine with the time a kernel saves behind another stream's:
    /// `count` kernels of `alone_ms` each took `alternating_ms` in all when
    /// alternating over two streams (all issued at once, so each after the
    /// first took the SMs while waiting).
    pub fn with_kernel_overlap(self, alone_ms: f64, count: usize, alternating_ms: f64) -> Machine {
        let saved = (count as f64 * alone_ms - alternating_ms) / (count.max(2) - 1) as f64;
        Machine { kernel_overlap: if saved.is_finite() { saved.clamp(0.0, alone_ms / 2.0) } else { 0.0 }, ..self }
    }
}
