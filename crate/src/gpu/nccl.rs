//! NCCL, loaded at run time: collective communication between GPUs (lab
//! 8's all-reduce of "gradients" beside compute). Where the library is
//! looked for, how it is loaded and its raw calls are in the thin raw
//! layer (`driver::nccl_*`, each call on a raw communicator an
//! `unsafe fn`); here are the safe types: [`Nccl`], the library loaded,
//! and [`Communicators`], which own one communicator per GPU.
//!
//! NVLink multicast (NCCL's NVLS) stays off: [`Nccl::load`] sets the
//! variables of [`MULTICAST_OFF`] where they are unset, and a child
//! process this crate starts (PyTorch's reference) gets them too: a
//! program that uses multicast can put a host's GPUs, which others may
//! share, out of service.

use super::{driver, DeviceBuffer, DeviceSpan, Gpu, Stream};
use crate::error::{LabError, Result};

pub use driver::MULTICAST_OFF;

/// [`MULTICAST_OFF`] for a child process's environment: each variable as
/// this process has it if set, else its value there.
pub fn multicast_off_env() -> Vec<(String, String)> {
    MULTICAST_OFF.iter().map(|&(k, v)| (k.to_string(), std::env::var(k).unwrap_or_else(|_| v.to_string()))).collect()
}

/// NCCL, loaded.
pub struct Nccl {
    /// Where it was loaded from.
    pub path: String,
}

impl Nccl {
    /// Loads NCCL once per process (`driver::nccl_load` says where it looks).
    pub fn load() -> Result<Nccl> {
        Ok(Nccl { path: driver::nccl_load()?.to_string() })
    }

    /// "2.27.7".
    pub fn version(&self) -> Result<String> {
        let v = driver::nccl_version()?;
        // NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9.
        Ok(format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
    }
}

/// One NCCL communicator per GPU of a group (ncclCommInitAll: one process
/// driving every GPU).
pub struct Communicators {
    /// The library its calls go to, loaded.
    _loaded: Nccl,
    comms: Vec<driver::NcclComm>,
    ordinals: Vec<usize>,
}

// SAFETY: NCCL lets a communicator be used from any thread, one thread at
// a time; Communicators is not Sync, so only its owner's thread calls it.
unsafe impl Send for Communicators {}

impl Communicators {
    /// A communicator for each of `gpus` (distinct GPUs).
    pub fn new(nccl: Nccl, gpus: &[Gpu]) -> Result<Communicators> {
        let ordinals: Vec<usize> = gpus.iter().map(|g| g.ordinal()).collect();
        if ordinals.is_empty() || (1..ordinals.len()).any(|i| ordinals[..i].contains(&ordinals[i])) {
            return Err(LabError::config(format!("NCCL communicators need distinct GPUs, one each: got {ordinals:?}")));
        }
        let devs: Vec<i32> = ordinals.iter().map(|&o| o as i32).collect();
        let comms = driver::nccl_comm_init_all(&devs)?;
        Ok(Communicators { _loaded: nccl, comms, ordinals })
    }

    pub fn len(&self) -> usize {
        self.comms.len()
    }
    pub fn is_empty(&self) -> bool {
        self.comms.is_empty()
    }

    /// The GPUs of the group, by rank.
    pub fn ordinals(&self) -> &[usize] {
        &self.ordinals
    }

    /// An in-place sum all-reduce of the first `count` f32 of `bufs[i]` on
    /// `streams[i]`, one per GPU in the group's order, as one NCCL group;
    /// returns once every stream has run it (the buffers are borrowed
    /// until then). A runner's all-reduce is issued with the others of its
    /// loop instead (`Runner::all_reduce`).
    pub fn all_reduce_sum(&self, bufs: &[&DeviceBuffer], count: usize, streams: &[&Stream]) -> Result<()> {
        if bufs.len() != self.len() || streams.len() != self.len() {
            return Err(LabError::config(format!("an all-reduce over {} GPUs takes one buffer and one stream each", self.len())));
        }
        for (i, b) in bufs.iter().enumerate() {
            if b.gpu().ordinal() != self.ordinals[i] {
                return Err(LabError::config(format!("rank {i} of the all-reduce is GPU {}: its buffer is on GPU {}", self.ordinals[i], b.gpu().ordinal())));
            }
            if count == 0 || count.checked_mul(4).is_none_or(|bytes| bytes > b.bytes()) {
                return Err(LabError::config(format!("an all-reduce of {count} f32 does not fit GPU {}'s buffer of {} bytes", self.ordinals[i], b.bytes())));
            }
        }
        let ranks: Vec<(DeviceSpan, &Stream)> = bufs.iter().map(|b| DeviceSpan { ptr: b.span().ptr, bytes: count * 4 }).zip(streams.iter().copied()).collect();
        // SAFETY: each span is the start of its buffer and fits it (checked
        // above); the streams are synchronized below, while the borrows last.
        let queued = unsafe { self.all_reduce_spans(&ranks) };
        let _keep = driver::KeepCurrent::save()?;
        for s in streams {
            s.gpu().bind()?;
            s.synchronize()?;
        }
        queued
    }

    /// Enqueues an in-place sum all-reduce of each rank's span (all of one
    /// length, a whole number of f32) on its stream, as one NCCL group:
    /// `ranks[i]` is rank i's, on its GPU.
    ///
    /// # Safety
    /// Each span lies in device memory of its rank's GPU that stays
    /// allocated until its stream has run the call.
    pub(crate) unsafe fn all_reduce_spans(&self, ranks: &[(DeviceSpan, &Stream)]) -> Result<()> {
        if ranks.len() != self.len() {
            return Err(LabError::config(format!("an all-reduce over {} GPUs takes one buffer and one stream each (got {})", self.len(), ranks.len())));
        }
        let bytes = ranks[0].0.bytes;
        for (i, (span, s)) in ranks.iter().enumerate() {
            let want = self.ordinals[i];
            if s.gpu().ordinal() != want {
                return Err(LabError::config(format!("rank {i} of the all-reduce is GPU {want}: its stream is on GPU {}", s.gpu().ordinal())));
            }
            if span.bytes != bytes || bytes == 0 || bytes % 4 != 0 {
                return Err(LabError::config(format!(
                    "an all-reduce's ranks each sum the same whole number of f32: rank {i} has {} bytes, rank 0 {bytes}",
                    span.bytes
                )));
            }
        }
        let _keep = driver::KeepCurrent::save()?;
        driver::nccl_group_start()?;
        let mut issued = Ok(());
        for (&comm, (span, s)) in self.comms.iter().zip(ranks) {
            // SAFETY: the communicator is this rank's, owned by `self` until
            // it drops; the stream belongs to the same GPU (checked above);
            // the span is the caller's promise (this function's # Safety).
            issued = unsafe { driver::nccl_all_reduce_sum_f32(comm, span.ptr, bytes / 4, s.raw()) };
            if issued.is_err() {
                break;
            }
        }
        // Closes the group opened above, also after a failed call.
        let ended = driver::nccl_group_end();
        issued.and(ended)
    }
}

impl Drop for Communicators {
    fn drop(&mut self) {
        for &c in &self.comms {
            // SAFETY: made by `new` and owned by `self`, destroyed once, here;
            // no call on it is being issued (`self` is being dropped).
            let _ = unsafe { driver::nccl_comm_destroy(c) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_no_nccl_the_error_names_what_to_install() {
        // Only when this machine has none (CI); where it has one, loading works.
        match Nccl::load() {
            Ok(n) => assert!(n.version().unwrap().starts_with("2."), "{}", n.path),
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("NCCL (libnccl.so.2) could not be loaded") && msg.contains("pip install nvidia-nccl-cu13") && msg.contains("libnccl.so.2:"),
                    "{msg}"
                );
            }
        }
    }
}
