//! The four kinds of host memory a copy can come from or go to, as types.
//!
//! * [`PageableBuffer`]: ordinary `Vec` memory. The driver cannot DMA from it
//!   directly, so every copy is staged through a driver-owned pinned buffer
//!   and the "async" call blocks the CPU.
//! * [`PinnedBuffer`]: page-locked memory from `cuMemHostAlloc` (cached, not
//!   write-combined): the copy engine reads and writes it directly.
//! * [`WriteCombinedBuffer`]: pinned and write-combined: fast for the CPU to
//!   write and the GPU to read, very slow for the CPU to read.
//! * [`RegisteredBuffer`]: page-aligned ordinary memory pinned after the fact
//!   with `cuMemHostRegister` (how you pin memory another library allocated).

use super::{driver, Gpu};
use crate::error::{LabError, Result};
use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::alloc::Layout;
use std::ffi::c_void;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum HostMemoryKind {
    Pageable,
    Pinned,
    WriteCombined,
    Registered,
}

impl HostMemoryKind {
    pub const ALL: [HostMemoryKind; 4] = [HostMemoryKind::Pageable, HostMemoryKind::Pinned, HostMemoryKind::WriteCombined, HostMemoryKind::Registered];

    pub fn label(self) -> &'static str {
        match self {
            HostMemoryKind::Pageable => "pageable",
            HostMemoryKind::Pinned => "pinned",
            HostMemoryKind::WriteCombined => "write-combined",
            HostMemoryKind::Registered => "registered",
        }
    }
    /// Page-locked kinds the copy engine can reach directly.
    pub fn is_page_locked(self) -> bool {
        self != HostMemoryKind::Pageable
    }
    /// Whether the CPU may read it at normal speed (write-combined memory is
    /// uncached for reads: verify it through the GPU instead).
    pub fn cpu_readable(self) -> bool {
        self != HostMemoryKind::WriteCombined
    }
}

impl std::fmt::Display for HostMemoryKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// Host memory seen as 64-bit words, whatever its kind.
pub trait HostBuffer: Send + Sync {
    fn kind(&self) -> HostMemoryKind;
    fn words(&self) -> &[u64];
    fn words_mut(&mut self) -> &mut [u64];
    fn bytes(&self) -> usize {
        self.words().len() * 8
    }
}

fn check_size(bytes: usize) -> Result<usize> {
    if bytes == 0 || bytes % 8 != 0 {
        return Err(LabError::config(format!("host buffer of {bytes} bytes: must be a non-zero multiple of 8")));
    }
    Ok(bytes / 8)
}

/// Allocates `bytes` of the given kind (pinned kinds need an open GPU).
pub fn alloc_host(gpu: &Gpu, kind: HostMemoryKind, bytes: usize) -> Result<Box<dyn HostBuffer>> {
    Ok(match kind {
        HostMemoryKind::Pageable => Box::new(PageableBuffer::new(bytes)?),
        HostMemoryKind::Pinned => Box::new(PinnedBuffer::new(gpu, bytes)?),
        HostMemoryKind::WriteCombined => Box::new(WriteCombinedBuffer::new(gpu, bytes)?),
        HostMemoryKind::Registered => Box::new(RegisteredBuffer::new(gpu, bytes)?),
    })
}

/// Ordinary heap memory.
pub struct PageableBuffer(Vec<u64>);

impl PageableBuffer {
    pub fn new(bytes: usize) -> Result<Self> {
        let words = check_size(bytes)?;
        let mut v = Vec::new();
        v.try_reserve_exact(words).map_err(|_| LabError::OutOfMemory { what: "host", call: "malloc", bytes: Bytes(bytes as u64) })?;
        v.resize(words, 0);
        Ok(PageableBuffer(v))
    }
    /// Ordinary memory holding `words`, as the caller made them (in
    /// parallel, say: a `Vec` filled by many threads touches its pages on
    /// all of them, where [`PageableBuffer::new`] zeroes every page on one
    /// first).
    pub fn from_words(words: Vec<u64>) -> Result<Self> {
        check_size(words.len() * 8)?;
        Ok(PageableBuffer(words))
    }
}

impl HostBuffer for PageableBuffer {
    fn kind(&self) -> HostMemoryKind {
        HostMemoryKind::Pageable
    }
    fn words(&self) -> &[u64] {
        &self.0
    }
    fn words_mut(&mut self) -> &mut [u64] {
        &mut self.0
    }
}

/// Memory from cuMemHostAlloc; freed with cuMemFreeHost.
struct DriverHostAlloc {
    ptr: *mut c_void,
    words: usize,
    gpu: Gpu,
}

// SAFETY: plain page-locked memory that any thread of the process may use
// (CUDA allows it), owned by this value alone and freed only by `Drop`.
unsafe impl Send for DriverHostAlloc {}
// SAFETY: `&DriverHostAlloc` only reads the words; writing needs `&mut`.
unsafe impl Sync for DriverHostAlloc {}

impl DriverHostAlloc {
    fn new(gpu: &Gpu, bytes: usize, flags: u32) -> Result<Self> {
        let words = check_size(bytes)?;
        gpu.bind()?;
        let ptr = driver::host_alloc(bytes, flags)?;
        Ok(DriverHostAlloc { ptr, words, gpu: gpu.clone() })
    }
    fn words(&self) -> &[u64] {
        // SAFETY: ptr is a live allocation of `words` u64s, 8-aligned (page-aligned).
        unsafe { std::slice::from_raw_parts(self.ptr as *const u64, self.words) }
    }
    fn words_mut(&mut self) -> &mut [u64] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u64, self.words) }
    }
}

impl Drop for DriverHostAlloc {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: allocated by host_alloc; every copy using it was synchronized.
        let _ = unsafe { driver::host_free(self.ptr) };
    }
}

/// Declares a host-buffer type backed by cuMemHostAlloc with the given flags.
macro_rules! driver_host_buffer {
    ($(#[$doc:meta])* $name:ident, $kind:ident, $flags:expr) => {
        $(#[$doc])*
        pub struct $name(DriverHostAlloc);

        impl $name {
            pub fn new(gpu: &Gpu, bytes: usize) -> Result<Self> {
                Ok($name(DriverHostAlloc::new(gpu, bytes, $flags)?))
            }
        }

        impl HostBuffer for $name {
            fn kind(&self) -> HostMemoryKind {
                HostMemoryKind::$kind
            }
            fn words(&self) -> &[u64] {
                self.0.words()
            }
            fn words_mut(&mut self) -> &mut [u64] {
                self.0.words_mut()
            }
        }
    };
}

driver_host_buffer!(
    /// Page-locked, cached host memory (cuMemHostAlloc, flags 0).
    PinnedBuffer, Pinned, driver::HOST_ALLOC_PINNED
);
driver_host_buffer!(
    /// Page-locked, write-combined host memory (CU_MEMHOSTALLOC_WRITECOMBINED).
    WriteCombinedBuffer, WriteCombined, driver::HOST_ALLOC_WRITE_COMBINED
);

/// Page-locked, cached host memory the GPU can read in place
/// (CU_MEMHOSTALLOC_DEVICEMAP): a kernel given its device address reads it
/// over the host link as it goes ("zero-copy"), no copy first.
pub struct MappedBuffer(DriverHostAlloc);

impl MappedBuffer {
    pub fn new(gpu: &Gpu, bytes: usize) -> Result<Self> {
        Ok(MappedBuffer(DriverHostAlloc::new(gpu, bytes, driver::HOST_ALLOC_MAPPED)?))
    }
    /// Its address as the GPU sees it.
    pub(crate) fn device_span(&self) -> Result<super::DeviceSpan> {
        self.0.gpu.bind()?;
        // SAFETY: allocated with HOST_ALLOC_MAPPED, alive as long as `self`.
        let ptr = unsafe { driver::host_device_pointer(self.0.ptr) }?;
        Ok(super::DeviceSpan { ptr, bytes: self.0.words * 8 })
    }
}

impl HostBuffer for MappedBuffer {
    fn kind(&self) -> HostMemoryKind {
        HostMemoryKind::Pinned
    }
    fn words(&self) -> &[u64] {
        self.0.words()
    }
    fn words_mut(&mut self) -> &mut [u64] {
        self.0.words_mut()
    }
}

/// Page-aligned heap memory pinned in place with cuMemHostRegister.
pub struct RegisteredBuffer {
    ptr: *mut u64,
    /// Requested length; the allocation is rounded up to whole pages.
    words: usize,
    layout: Layout,
    gpu: Gpu,
}

// SAFETY: plain heap memory, pinned, that any thread of the process may use
// (CUDA allows it), owned by this value alone and freed only by `Drop`.
unsafe impl Send for RegisteredBuffer {}
// SAFETY: `&RegisteredBuffer` only reads the words; writing needs `&mut`.
unsafe impl Sync for RegisteredBuffer {}

pub(crate) const PAGE: usize = 4096;

impl RegisteredBuffer {
    pub fn new(gpu: &Gpu, bytes: usize) -> Result<Self> {
        Self::new_timed(gpu, bytes).map(|(buf, _)| buf)
    }
}

impl RegisteredBuffer {
    /// Pins memory that already exists and was written (the real use case:
    /// pinning data another library allocated) and reports how long
    /// cuMemHostRegister alone took.
    pub fn new_timed(gpu: &Gpu, bytes: usize) -> Result<(Self, std::time::Duration)> {
        check_size(bytes)?;
        let layout =
            Layout::from_size_align(bytes.div_ceil(PAGE) * PAGE, PAGE).map_err(|_| LabError::config(format!("host buffer of {bytes} bytes is too large")))?;
        // SAFETY: non-zero size; zeroed so every page is touched before pinning.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut u64;
        if ptr.is_null() {
            return Err(LabError::OutOfMemory { what: "host", call: "aligned alloc", bytes: Bytes(bytes as u64) });
        }
        // alloc_zeroed may hand out untouched zero pages: write them.
        // SAFETY: live allocation of layout.size() bytes.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 1, layout.size()) };
        gpu.bind()?;
        let t = std::time::Instant::now();
        // SAFETY: live page-aligned allocation, unregistered before it is freed.
        if let Err(e) = unsafe { driver::host_register(ptr as *mut c_void, layout.size()) } {
            // SAFETY: allocated above with this layout.
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
            return Err(e);
        }
        let took = t.elapsed();
        Ok((RegisteredBuffer { ptr, words: bytes / 8, layout, gpu: gpu.clone() }, took))
    }

    /// Unpins (timed) and frees (untimed) the memory.
    pub fn release_timed(self) -> std::time::Duration {
        let this = std::mem::ManuallyDrop::new(self);
        let _ = this.gpu.bind();
        let t = std::time::Instant::now();
        // SAFETY: registered at creation; no copy uses it any more.
        let _ = unsafe { driver::host_unregister(this.ptr as *mut c_void) };
        let took = t.elapsed();
        // SAFETY: allocated with this layout; Drop never runs (ManuallyDrop),
        // so the memory is freed and the Gpu handle released exactly once.
        unsafe {
            std::alloc::dealloc(this.ptr as *mut u8, this.layout);
            drop(std::ptr::read(&this.gpu));
        }
        took
    }
}

impl HostBuffer for RegisteredBuffer {
    fn kind(&self) -> HostMemoryKind {
        HostMemoryKind::Registered
    }
    fn words(&self) -> &[u64] {
        // SAFETY: live allocation of at least `words` u64s.
        unsafe { std::slice::from_raw_parts(self.ptr, self.words) }
    }
    fn words_mut(&mut self) -> &mut [u64] {
        // SAFETY: as above, exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.words) }
    }
}

impl Drop for RegisteredBuffer {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: registered in new(); no copy uses it any more.
        let _ = unsafe { driver::host_unregister(self.ptr as *mut c_void) };
        // SAFETY: allocated in new() with this layout.
        unsafe { std::alloc::dealloc(self.ptr as *mut u8, self.layout) };
    }
}

/// Where [`TouchedPages`] gets its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PagesFrom {
    /// Fresh pages from the OS (`mmap`): memory the process never used, as
    /// a program's first buffer of a size is.
    Os,
    /// The C allocator (`malloc`): in a loop that allocates and frees one
    /// size, glibc hands back pages it still has mapped below its mmap
    /// threshold (128 KiB, rising to at most 32 MiB once such blocks are
    /// freed), and asks the OS for fresh ones above it.
    Allocator,
}

/// Pageable memory made usable the way a program first uses it: one write
/// per 4 KiB page, so each page that is not yet mapped faults in (and the OS
/// zeroes it). Only for pricing allocation (lab 1), so not a [`HostBuffer`].
pub struct TouchedPages {
    ptr: *mut u8,
    len: usize,
    from: PagesFrom,
}

impl TouchedPages {
    pub fn new(from: PagesFrom, bytes: usize) -> Result<Self> {
        check_size(bytes)?;
        let oom = |call| LabError::OutOfMemory { what: "host", call, bytes: Bytes(bytes as u64) };
        let ptr = match from {
            PagesFrom::Os => {
                // SAFETY: a private anonymous mapping; no file, no fixed address.
                let p = unsafe { libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
                if p == libc::MAP_FAILED {
                    return Err(oom("mmap"));
                }
                p as *mut u8
            }
            PagesFrom::Allocator => {
                // SAFETY: non-zero size (checked above).
                let p = unsafe { libc::malloc(bytes) } as *mut u8;
                if p.is_null() {
                    return Err(oom("malloc"));
                }
                p
            }
        };
        for off in (0..bytes).step_by(PAGE) {
            // SAFETY: inside the live allocation; volatile so the write stays.
            unsafe { std::ptr::write_volatile(ptr.add(off), 1) };
        }
        Ok(TouchedPages { ptr, len: bytes, from })
    }
}

impl Drop for TouchedPages {
    fn drop(&mut self) {
        // SAFETY: allocated in new() by the matching call, released once.
        unsafe {
            match self.from {
                PagesFrom::Os => {
                    libc::munmap(self.ptr as *mut c_void, self.len);
                }
                PagesFrom::Allocator => libc::free(self.ptr as *mut c_void),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pageable_rejects_bad_sizes_without_panicking() {
        assert!(PageableBuffer::new(0).is_err());
        assert!(PageableBuffer::new(12).is_err());
        let b = PageableBuffer::new(4096).unwrap();
        assert_eq!(b.bytes(), 4096);
        assert_eq!(b.kind(), HostMemoryKind::Pageable);
    }

    #[test]
    fn pageable_reports_out_of_memory_as_error() {
        let err = PageableBuffer::new(usize::MAX - 7).err().expect("cannot allocate 16 EiB");
        assert!(err.to_string().contains("out of host memory"), "{err}");
    }

    #[test]
    fn touched_pages_come_from_the_os_or_the_allocator_and_go_back() {
        for from in [PagesFrom::Os, PagesFrom::Allocator] {
            for bytes in [4096, 3 * 4096 + 8, 8 << 20] {
                let p = TouchedPages::new(from, bytes).unwrap();
                if from == PagesFrom::Os {
                    // SAFETY: reading the last byte of a live allocation.
                    assert_eq!(unsafe { std::ptr::read_volatile(p.ptr.add(bytes - 1)) }, 0, "fresh pages are zero");
                }
                // SAFETY: the first byte was touched.
                assert_eq!(unsafe { std::ptr::read_volatile(p.ptr) }, 1);
            }
            assert!(TouchedPages::new(from, 0).is_err());
        }
        let e = TouchedPages::new(PagesFrom::Os, usize::MAX - 7).err().expect("cannot map 16 EiB");
        assert!(e.to_string().contains("out of host memory"), "{e}");
    }

    #[test]
    fn kinds_have_stable_names() {
        let names: Vec<_> = HostMemoryKind::ALL.iter().map(|k| k.label()).collect();
        assert_eq!(names, ["pageable", "pinned", "write-combined", "registered"]);
        assert_eq!(serde_json::to_string(&HostMemoryKind::WriteCombined).unwrap(), "\"write-combined\"");
        assert!(!HostMemoryKind::WriteCombined.cpu_readable());
        assert!(!HostMemoryKind::Pageable.is_page_locked());
    }
}
