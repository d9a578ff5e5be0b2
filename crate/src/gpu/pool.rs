//! The device's stream-ordered memory pool: the one cuMemAllocAsync draws
//! from. Its release threshold says how much memory it keeps reserved at a
//! synchronization point instead of giving it back to the driver (0, the
//! default: everything; u64::MAX: all of it), and its reserved and used
//! memory say what it holds now. Allocations from it ([`PoolBuffer`]) are
//! made, used and freed in the order of one stream.

use super::{driver, Gpu, Stream};
use crate::error::{LabError, Result};
use driver::PoolAttr;
use serde::{Deserialize, Serialize};

/// The device's default pool (the driver owns it; this is a handle).
pub struct MemPool {
    raw: driver::CUmemoryPool,
    gpu: Gpu,
}

/// What a pool holds, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolUsage {
    /// Backed by device memory, in use or kept for reuse.
    pub reserved: u64,
    /// Handed out by cuMemAllocAsync and not yet freed.
    pub used: u64,
}

impl MemPool {
    /// The pool cuMemAllocAsync uses on `gpu`.
    pub fn default_of(gpu: &Gpu) -> Result<MemPool> {
        gpu.bind()?;
        Ok(MemPool { raw: driver::default_mem_pool(gpu.ctx.cu_device())?, gpu: gpu.clone() })
    }

    fn get(&self, attr: PoolAttr) -> Result<u64> {
        // SAFETY: a live pool (the device's default, which the driver keeps);
        // every attribute asked for here is 64 bits wide.
        unsafe { driver::mem_pool_get_u64(self.raw, attr) }
    }

    /// Bytes the pool keeps reserved at a synchronization point.
    pub fn release_threshold(&self) -> Result<u64> {
        self.get(PoolAttr::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
    }

    /// Sets the release threshold (process-wide for this device's default
    /// pool: [`ThresholdGuard`] puts the old one back).
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        self.gpu.bind()?;
        // SAFETY: a live pool; the release threshold is a u64.
        unsafe { driver::mem_pool_set_u64(self.raw, PoolAttr::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, bytes) }
    }

    /// Sets the threshold until the guard drops.
    pub fn threshold_for_now(&self, bytes: u64) -> Result<ThresholdGuard<'_>> {
        let old = self.release_threshold()?;
        self.set_release_threshold(bytes)?;
        Ok(ThresholdGuard { pool: self, old })
    }

    /// What the pool holds now.
    pub fn usage(&self) -> Result<PoolUsage> {
        Ok(PoolUsage { reserved: self.get(PoolAttr::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?, used: self.get(PoolAttr::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)? })
    }

    /// The most it held since [`Self::reset_high_water`].
    pub fn high_water(&self) -> Result<PoolUsage> {
        Ok(PoolUsage { reserved: self.get(PoolAttr::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?, used: self.get(PoolAttr::CU_MEMPOOL_ATTR_USED_MEM_HIGH)? })
    }

    pub fn reset_high_water(&self) -> Result<()> {
        self.gpu.bind()?;
        for attr in [PoolAttr::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, PoolAttr::CU_MEMPOOL_ATTR_USED_MEM_HIGH] {
            // SAFETY: a live pool; the high-water marks are u64 and take 0.
            unsafe { driver::mem_pool_set_u64(self.raw, attr, 0) }?;
        }
        Ok(())
    }

    /// Gives every reserved byte not in use back to the driver (cuMemPoolTrimTo 0).
    pub fn trim(&self) -> Result<()> {
        self.gpu.bind()?;
        // SAFETY: the device's default pool, which the driver keeps for the
        // process's life; trimming gives back only memory no allocation holds.
        unsafe { driver::mem_pool_trim_to(self.raw, 0) }
    }
}

/// Puts a pool's release threshold back when dropped.
pub struct ThresholdGuard<'p> {
    pool: &'p MemPool,
    old: u64,
}

impl Drop for ThresholdGuard<'_> {
    fn drop(&mut self) {
        let _ = self.pool.set_release_threshold(self.old);
    }
}

/// Device memory from the stream-ordered pool, made on a stream: it is
/// filled and freed in that stream's order (freed when dropped, if not
/// before), so no other stream can use it.
pub struct PoolBuffer<'s> {
    ptr: driver::CUdeviceptr,
    bytes: usize,
    stream: &'s Stream,
}

impl Stream {
    /// cuMemAllocAsync of `bytes` on this stream.
    pub fn alloc_async(&self, bytes: usize) -> Result<PoolBuffer<'_>> {
        if bytes == 0 || bytes % 4 != 0 {
            return Err(LabError::config(format!("a pool allocation of {bytes} bytes: give a non-zero multiple of 4")));
        }
        self.gpu.bind()?;
        // SAFETY: `self` is a live stream of the bound context.
        let ptr = unsafe { driver::mem_alloc_async(bytes, self.raw()) }?;
        Ok(PoolBuffer { ptr, bytes, stream: self })
    }
}

impl PoolBuffer<'_> {
    pub fn bytes(&self) -> usize {
        self.bytes
    }
    /// The allocation, for a kernel or library call on its stream.
    pub(crate) fn span(&self) -> super::DeviceSpan {
        super::DeviceSpan::new(self.ptr, self.bytes)
    }
    /// Enqueues a fill of every 32-bit word with `value` on its stream
    /// (the batch's use of its scratch memory).
    pub fn fill_u32(&self, value: u32) -> Result<()> {
        // SAFETY: the whole allocation, which is freed only later on the same stream.
        unsafe { driver::memset_d32_async(self.ptr, value, self.bytes / 4, self.stream.raw()) }
    }
    /// cuMemFreeAsync on its stream.
    pub fn free(self) -> Result<()> {
        let r = self.release();
        std::mem::forget(self);
        r
    }
    fn release(&self) -> Result<()> {
        // SAFETY: allocated on this stream, used only on it, freed once
        // (`free` forgets `self`, so Drop does not free it again).
        unsafe { driver::mem_free_async(self.ptr, self.stream.raw()) }
    }
}

impl Drop for PoolBuffer<'_> {
    fn drop(&mut self) {
        let _ = self.stream.gpu().bind();
        let _ = self.release();
    }
}
