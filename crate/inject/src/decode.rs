//! One CUPTI activity record → one [`Record`] of our own.
//!
//! The struct behind a record depends on the libcupti loaded at run time,
//! not on the one these bindings were made from: newer versions only append
//! fields (`Kernel9` … `Kernel13` share their first thirty), so each kind
//! is read through the oldest struct that has every field read here, and
//! only those fields, as Kineto reads them. Fields are read one by one
//! (`addr_of!` … `read_unaligned`): a record's enum-typed fields are never
//! read whole, so a value newer than these bindings cannot be misread.

use cudarc::cupti::sys::{self, CUpti_ActivityKind as Kind};
use overlap_lab_tracefile::records::{Api, Call, Copy, Device, EventRecord, GpuSpan, Kernel, Marker, Memset, Record, Sync};
use std::collections::HashMap;
use std::ffi::{c_char, CStr};

/// A record, read.
#[derive(Debug, PartialEq)]
pub enum Decoded {
    Record(Record),
    /// A record CUPTI could not time (start and end both 0).
    NoTimestamp,
    /// A kind not traced.
    Other,
}

/// Names of functions (by API and callback id) and of kernels, looked up
/// once each.
pub trait Names {
    fn call(&mut self, api: Api, cbid: u32) -> String;
    /// # Safety
    /// `mangled` is a NUL-terminated string that lives as long as the process.
    unsafe fn kernel(&mut self, mangled: *const c_char) -> String;
}

/// Names from `cuptiGetCallbackName` and the C++ runtime's demangler, cached.
#[derive(Default)]
pub struct CuptiNames {
    calls: HashMap<(bool, u32), String>,
    kernels: crate::demangle::Demangled,
}

impl Names for CuptiNames {
    fn call(&mut self, api: Api, cbid: u32) -> String {
        self.calls.entry((api == Api::Runtime, cbid)).or_insert_with(|| crate::cupti::callback_name(api, cbid)).clone()
    }
    unsafe fn kernel(&mut self, mangled: *const c_char) -> String {
        // SAFETY: as this function's own contract.
        unsafe { self.kernels.name(mangled) }
    }
}

/// Reads one field of the record `$p` (a `*const $t`).
macro_rules! field {
    ($p:expr, $f:ident) => {
        // SAFETY: `$p` points at a whole record of this type (the caller's
        // contract); the field is read unaligned, by itself.
        unsafe { std::ptr::addr_of!((*$p).$f).read_unaligned() }
    };
}

/// Where and when the GPU op `$p` (a kernel, copy or memset record) ran:
/// the fields these records share by name.
macro_rules! span {
    ($p:expr) => {
        GpuSpan {
            device: field!($p, deviceId),
            context: field!($p, contextId),
            stream: field!($p, streamId),
            correlation: field!($p, correlationId),
            start_ns: field!($p, start),
            end_ns: field!($p, end),
        }
    };
}

/// Copies a string field of the record `$p` (null: None).
macro_rules! string {
    ($p:expr, $f:ident) => {{
        let s = field!($p, $f);
        // SAFETY: a NUL-terminated string CUPTI owns, valid while the
        // record's buffer is (the caller's contract), or null.
        unsafe { text(s) }
    }};
}

/// Copies a C string CUPTI owns (valid while its buffer is); None for null.
///
/// # Safety
/// `s` is null or a NUL-terminated string valid for the call.
unsafe fn text(s: *const c_char) -> Option<String> {
    // SAFETY: non-null, NUL-terminated and valid (# Safety).
    (!s.is_null()).then(|| unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
}

/// Decodes one record.
///
/// # Safety
/// `record` points at a whole activity record as CUPTI delivers it (its
/// `kind` says which struct it is, of the libcupti's version or a newer
/// one with the same leading fields); the strings it points at are valid.
pub unsafe fn decode(record: *const sys::CUpti_Activity, names: &mut impl Names) -> Decoded {
    // SAFETY: every record starts with its kind, a 32-bit value (# Safety).
    let kind = unsafe { record.cast::<u32>().read_unaligned() };
    let timed = |start: u64, end: u64, r: Record| if start == 0 && end == 0 { Decoded::NoTimestamp } else { Decoded::Record(r) };
    if kind == Kind::CUPTI_ACTIVITY_KIND_RUNTIME as u32 || kind == Kind::CUPTI_ACTIVITY_KIND_DRIVER as u32 {
        let p = record.cast::<sys::CUpti_ActivityAPI>();
        let api = if kind == Kind::CUPTI_ACTIVITY_KIND_RUNTIME as u32 { Api::Runtime } else { Api::Driver };
        let cbid: u32 = field!(p, cbid);
        let (start, end) = (field!(p, start), field!(p, end));
        let call = Call {
            api,
            cbid,
            name: names.call(api, cbid),
            pid: field!(p, processId),
            tid: field!(p, threadId),
            start_ns: start,
            end_ns: end,
            correlation: field!(p, correlationId),
            returned: field!(p, returnValue),
        };
        return timed(start, end, Record::Call(call));
    }
    if kind == Kind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL as u32 || kind == Kind::CUPTI_ACTIVITY_KIND_KERNEL as u32 {
        let p = record.cast::<sys::CUpti_ActivityKernel9>();
        let dynamic: i32 = field!(p, dynamicSharedMemory);
        let static_: i32 = field!(p, staticSharedMemory);
        let name: *const c_char = field!(p, name);
        let k = Kernel {
            // SAFETY: CUPTI's kernel names are static strings (# Safety).
            name: if name.is_null() { "kernel".into() } else { unsafe { names.kernel(name) } },
            at: span!(p),
            grid: [field!(p, gridX), field!(p, gridY), field!(p, gridZ)],
            block: [field!(p, blockX), field!(p, blockY), field!(p, blockZ)],
            registers_per_thread: field!(p, registersPerThread),
            shared_bytes: i64::from(static_) + i64::from(dynamic),
        };
        return timed(k.at.start_ns, k.at.end_ns, Record::Kernel(k));
    }
    if kind == Kind::CUPTI_ACTIVITY_KIND_MEMCPY as u32 {
        let p = record.cast::<sys::CUpti_ActivityMemcpy6>();
        let c = Copy { kind: field!(p, copyKind), src: field!(p, srcKind), dst: field!(p, dstKind), bytes: field!(p, bytes), at: span!(p), peer: None };
        return timed(c.at.start_ns, c.at.end_ns, Record::Copy(c));
    }
    if kind == Kind::CUPTI_ACTIVITY_KIND_MEMCPY2 as u32 {
        let p = record.cast::<sys::CUpti_ActivityMemcpyPtoP4>();
        let c = Copy {
            kind: field!(p, copyKind),
            src: field!(p, srcKind),
            dst: field!(p, dstKind),
            bytes: field!(p, bytes),
            at: span!(p),
            peer: Some([field!(p, srcDeviceId), field!(p, dstDeviceId)]),
        };
        return timed(c.at.start_ns, c.at.end_ns, Record::Copy(c));
    }
    if kind == Kind::CUPTI_ACTIVITY_KIND_MEMSET as u32 {
        let p = record.cast::<sys::CUpti_ActivityMemset4>();
        let m = Memset { value: field!(p, value), bytes: field!(p, bytes), memory: field!(p, memoryKind), at: span!(p) };
        return timed(m.at.start_ns, m.at.end_ns, Record::Memset(m));
    }
    if kind == Kind::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION as u32 {
        let p = record.cast::<sys::CUpti_ActivitySynchronization>();
        let (start, end) = (field!(p, start), field!(p, end));
        // SAFETY: the type is a 32-bit enum; read as its number.
        let sync_type = unsafe { std::ptr::addr_of!((*p).type_).cast::<u32>().read_unaligned() };
        let s = Sync {
            kind: sync_type,
            context: field!(p, contextId),
            stream: field!(p, streamId),
            event: field!(p, cudaEventId),
            correlation: field!(p, correlationId),
            start_ns: start,
            end_ns: end,
        };
        return timed(start, end, Record::Sync(s));
    }
    if kind == Kind::CUPTI_ACTIVITY_KIND_CUDA_EVENT as u32 {
        let p = record.cast::<sys::CUpti_ActivityCudaEvent2>();
        return Decoded::Record(Record::EventRecord(EventRecord {
            device: field!(p, deviceId),
            context: field!(p, contextId),
            stream: field!(p, streamId),
            event: field!(p, eventId),
            correlation: field!(p, correlationId),
        }));
    }
    if kind == Kind::CUPTI_ACTIVITY_KIND_MARKER as u32 {
        let p = record.cast::<sys::CUpti_ActivityMarker2>();
        // SAFETY: the flags and the object kind are 32-bit enums, read as
        // numbers; the object id is a union of (process, thread) and
        // (device, context, stream), whose first two words are read.
        let (flags, object) =
            unsafe { (std::ptr::addr_of!((*p).flags).cast::<u32>().read_unaligned(), std::ptr::addr_of!((*p).objectId).cast::<[u32; 2]>().read_unaligned()) };
        let m = Marker {
            flags,
            at_ns: field!(p, timestamp),
            id: field!(p, id),
            pid: object[0],
            tid: object[1],
            name: string!(p, name),
            domain: string!(p, domain),
        };
        return Decoded::Record(Record::Marker(m));
    }
    if kind == Kind::CUPTI_ACTIVITY_KIND_DEVICE as u32 {
        let p = record.cast::<sys::CUpti_ActivityDevice5>();
        return Decoded::Record(Record::Device(Device {
            id: field!(p, id),
            name: string!(p, name).unwrap_or_default(),
            global_memory: field!(p, globalMemorySize),
            compute_major: field!(p, computeCapabilityMajor),
            compute_minor: field!(p, computeCapabilityMinor),
            multiprocessors: field!(p, numMultiprocessors),
        }));
    }
    Decoded::Other
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::MaybeUninit;

    struct Table;
    impl Names for Table {
        fn call(&mut self, api: Api, cbid: u32) -> String {
            format!("{api:?}{cbid}_v7000")
        }
        unsafe fn kernel(&mut self, mangled: *const c_char) -> String {
            // SAFETY: a static string in these tests.
            format!("kernel {}", unsafe { CStr::from_ptr(mangled) }.to_string_lossy())
        }
    }

    /// A zeroed record of type `T`, its kind set, `fill` writing the rest.
    fn record<T>(kind: Kind, fill: impl FnOnce(*mut T)) -> Box<MaybeUninit<T>> {
        let mut r = Box::new(MaybeUninit::<T>::zeroed());
        let p = r.as_mut_ptr();
        // SAFETY: `p` points at a zeroed `T` that starts with a 32-bit kind.
        unsafe { p.cast::<u32>().write_unaligned(kind as u32) };
        fill(p);
        r
    }

    fn decoded<T>(r: &MaybeUninit<T>) -> Decoded {
        // SAFETY: `r` is a whole record of the type its kind names, its
        // pointers null or static strings.
        unsafe { decode(r.as_ptr().cast(), &mut Table) }
    }

    macro_rules! set {
        ($p:expr, $f:ident, $v:expr) => {
            // SAFETY: `$p` points at a whole record; the field is written unaligned.
            unsafe { std::ptr::addr_of_mut!((*$p).$f).write_unaligned($v) }
        };
    }

    #[test]
    fn a_runtime_call_keeps_its_thread_times_correlation_and_name() {
        let r = record::<sys::CUpti_ActivityAPI>(Kind::CUPTI_ACTIVITY_KIND_RUNTIME, |p| {
            set!(p, cbid, 211);
            set!(p, start, 100);
            set!(p, end, 150);
            set!(p, processId, 7);
            set!(p, threadId, 8);
            set!(p, correlationId, 9);
        });
        let Decoded::Record(Record::Call(c)) = decoded(&r) else { panic!("not a call") };
        assert_eq!(
            (c.api, c.cbid, c.name.as_str(), c.pid, c.tid, c.start_ns, c.end_ns, c.correlation),
            (Api::Runtime, 211, "Runtime211_v7000", 7, 8, 100, 150, 9)
        );
    }

    #[test]
    fn a_kernel_keeps_its_stream_name_and_launch_shape() {
        static NAME: &CStr = c"_Z4tilePf";
        let r = record::<sys::CUpti_ActivityKernel9>(Kind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, |p| {
            set!(p, start, 1000);
            set!(p, end, 3000);
            set!(p, deviceId, 1);
            set!(p, streamId, 13);
            set!(p, correlationId, 44);
            set!(p, gridX, 128);
            set!(p, blockX, 256);
            set!(p, staticSharedMemory, 1024);
            set!(p, dynamicSharedMemory, 2048);
            set!(p, name, NAME.as_ptr());
        });
        let Decoded::Record(Record::Kernel(k)) = decoded(&r) else { panic!("not a kernel") };
        assert_eq!(
            (k.name.as_str(), k.at.device, k.at.stream, k.at.correlation, k.grid[0], k.block[0], k.shared_bytes),
            ("kernel _Z4tilePf", 1, 13, 44, 128, 256, 3072)
        );
    }

    #[test]
    fn a_copy_keeps_its_direction_memory_kinds_and_bytes_and_a_peer_copy_its_devices() {
        let r = record::<sys::CUpti_ActivityMemcpy6>(Kind::CUPTI_ACTIVITY_KIND_MEMCPY, |p| {
            set!(p, copyKind, 1);
            set!(p, srcKind, 1);
            set!(p, dstKind, 3);
            set!(p, bytes, 1 << 20);
            set!(p, start, 5);
            set!(p, end, 6);
            set!(p, streamId, 7);
            set!(p, correlationId, 3);
        });
        let Decoded::Record(Record::Copy(c)) = decoded(&r) else { panic!("not a copy") };
        assert_eq!((c.kind, c.src, c.dst, c.bytes, c.at.stream, c.at.correlation, c.peer), (1, 1, 3, 1 << 20, 7, 3, None));
        let r = record::<sys::CUpti_ActivityMemcpyPtoP4>(Kind::CUPTI_ACTIVITY_KIND_MEMCPY2, |p| {
            set!(p, copyKind, 10);
            set!(p, start, 5);
            set!(p, end, 6);
            set!(p, srcDeviceId, 0);
            set!(p, dstDeviceId, 1);
        });
        let Decoded::Record(Record::Copy(c)) = decoded(&r) else { panic!("not a copy") };
        assert_eq!(c.peer, Some([0, 1]));
    }

    #[test]
    fn syncs_markers_and_event_records_are_read_and_untimed_records_counted() {
        let r = record::<sys::CUpti_ActivitySynchronization>(Kind::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, |p| {
            // SAFETY: the type is a 32-bit enum; 2 is "stream wait event".
            unsafe { std::ptr::addr_of_mut!((*p).type_).cast::<u32>().write_unaligned(2) };
            set!(p, start, 10);
            set!(p, end, 20);
            set!(p, streamId, 14);
            set!(p, cudaEventId, 5);
        });
        let Decoded::Record(Record::Sync(s)) = decoded(&r) else { panic!("not a sync") };
        assert_eq!((s.kind, s.stream, s.event), (2, 14, 5));
        static RANGE: &CStr = c"step";
        let r = record::<sys::CUpti_ActivityMarker2>(Kind::CUPTI_ACTIVITY_KIND_MARKER, |p| {
            // SAFETY: the flags are a 32-bit enum; 2 is a range's start.
            unsafe { std::ptr::addr_of_mut!((*p).flags).cast::<u32>().write_unaligned(2) };
            // SAFETY: the object id's first two words are (process, thread).
            unsafe { std::ptr::addr_of_mut!((*p).objectId).cast::<[u32; 2]>().write_unaligned([70, 71]) };
            set!(p, timestamp, 99);
            set!(p, id, 3);
            set!(p, name, RANGE.as_ptr());
        });
        let Decoded::Record(Record::Marker(m)) = decoded(&r) else { panic!("not a marker") };
        assert_eq!((m.flags, m.pid, m.tid, m.id, m.at_ns, m.name.as_deref()), (2, 70, 71, 3, 99, Some("step")));
        let r = record::<sys::CUpti_ActivityCudaEvent2>(Kind::CUPTI_ACTIVITY_KIND_CUDA_EVENT, |p| {
            set!(p, streamId, 14);
            set!(p, eventId, 5);
            set!(p, correlationId, 77);
        });
        assert!(matches!(decoded(&r), Decoded::Record(Record::EventRecord(EventRecord { stream: 14, event: 5, correlation: 77, .. }))));
        let r = record::<sys::CUpti_ActivityMemset4>(Kind::CUPTI_ACTIVITY_KIND_MEMSET, |_| {});
        assert_eq!(decoded(&r), Decoded::NoTimestamp);
        let r = record::<sys::CUpti_ActivityAPI>(Kind::CUPTI_ACTIVITY_KIND_OVERHEAD, |_| {});
        assert_eq!(decoded(&r), Decoded::Other);
    }
}
