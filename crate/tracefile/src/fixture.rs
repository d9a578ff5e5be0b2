//! Made-up raw trace files, as the injection library would write them for
//! two small programs: what the tests of the converter, of `overlap-lab
//! trace`'s reading and of HTA's agreement share. No GPU made them.

use crate::raw::write_record;
use crate::records::*;

/// The made-up process and its thread.
pub const PID: u32 = 4242;
pub const TID: u32 = 4243;
/// CUPTI's clock at the first record: the trace counts from here.
pub const T0: u64 = 1_790_000_000_000_000_000;

/// A runtime or driver call on the made-up thread, µs after [`T0`].
pub fn call(api: Api, name: &str, start_us: u64, end_us: u64, correlation: u32) -> Record {
    Record::Call(Call {
        api,
        cbid: 1,
        name: name.into(),
        pid: PID,
        tid: TID,
        start_ns: T0 + start_us * 1000,
        end_ns: T0 + end_us * 1000,
        correlation,
        returned: 0,
    })
}

/// Device 0, context 1: where and when an op ran, from µs after T0.
pub fn at(stream: u32, start_us: u64, end_us: u64, correlation: u32) -> GpuSpan {
    GpuSpan { device: 0, context: 1, stream, correlation, start_ns: T0 + start_us * 1000, end_ns: T0 + end_us * 1000 }
}

/// A copy of 64 MiB on device 0.
pub fn copy(kind: u8, src: u8, dst: u8, stream: u32, start_us: u64, end_us: u64, correlation: u32) -> Record {
    Record::Copy(Copy { kind, src, dst, bytes: 64 << 20, at: at(stream, start_us, end_us, correlation), peer: None })
}

/// A kernel on device 0.
pub fn kernel(name: &str, stream: u32, start_us: u64, end_us: u64, correlation: u32) -> Record {
    Record::Kernel(Kernel {
        name: name.into(),
        at: at(stream, start_us, end_us, correlation),
        grid: [264, 1, 1],
        block: [256, 1, 1],
        registers_per_thread: 32,
        shared_bytes: 0,
    })
}

/// A program's records: a pageable upload on the legacy stream's side
/// stream 13, a kernel, a pinned download, a host sync after each step; an
/// event recorded on stream 13 and waited for on stream 14; a failed
/// launch; an NVTX range around it all; the GPU's name.
pub fn program() -> String {
    let mut r = vec![Record::Process(Process {
        pid: PID,
        parent_pid: 1,
        exe: "/home/learner/patterns".into(),
        argv: vec!["./patterns".into(), "serial".into()],
        cupti_version: 130001,
        refused_kinds: vec![],
        kinds_not_asked: vec![],
    })];
    r.push(Record::Device(Device { id: 0, name: "NVIDIA H200".into(), global_memory: 150 << 30, compute_major: 9, compute_minor: 0, multiprocessors: 132 }));
    r.push(Record::Marker(Marker { flags: 2, at_ns: T0, id: 1, pid: PID, tid: TID, name: Some("loop".into()), domain: None }));
    let mut corr = 10;
    let mut t = 10;
    for _step in 0..3 {
        r.push(call(Api::Runtime, "cudaMemcpyAsync_v3020", t, t + 1200, corr));
        r.push(copy(1, 1, 3, 13, t + 5, t + 1200, corr));
        r.push(call(Api::Runtime, "cudaLaunchKernel_v7000", t + 1210, t + 1215, corr + 1));
        r.push(kernel("_Z4workPKfPfmiff", 13, t + 1220, t + 1820, corr + 1));
        r.push(call(Api::Driver, "cuMemcpyDtoHAsync_v2", t + 1216, t + 1220, corr + 2));
        r.push(copy(2, 3, 2, 13, t + 1830, t + 2430, corr + 2));
        r.push(call(Api::Runtime, "cudaStreamSynchronize_v3020", t + 1221, t + 2440, corr + 3));
        r.push(Record::Sync(Sync {
            kind: 3,
            context: 1,
            stream: 13,
            event: 0,
            correlation: corr + 3,
            start_ns: T0 + (t + 1221) * 1000,
            end_ns: T0 + (t + 2440) * 1000,
        }));
        corr += 4;
        t += 2500;
    }
    // An event recorded on 13, waited for on 14, then a kernel on 14.
    r.push(call(Api::Runtime, "cudaEventRecord_v3020", t, t + 2, corr));
    r.push(Record::EventRecord(EventRecord { device: 0, context: 1, stream: 13, event: 5, correlation: corr }));
    r.push(call(Api::Runtime, "cudaStreamWaitEvent_v3020", t + 3, t + 4, corr + 1));
    r.push(Record::Sync(Sync { kind: 2, context: 1, stream: 14, event: 5, correlation: corr + 1, start_ns: T0 + (t + 3) * 1000, end_ns: T0 + (t + 4) * 1000 }));
    r.push(call(Api::Runtime, "cudaLaunchKernel_v7000", t + 5, t + 8, corr + 2));
    r.push(kernel("_Z4workPKfPfmiff", 14, t + 10, t + 600, corr + 2));
    // A launch that failed: no GPU work under its correlation.
    let mut failed = call(Api::Runtime, "cudaLaunchKernel_v7000", t + 9, t + 10, corr + 3);
    if let Record::Call(c) = &mut failed {
        c.returned = 98;
    }
    r.push(failed);
    r.push(Record::Marker(Marker { flags: 4, at_ns: T0 + (t + 700) * 1000, id: 1, pid: PID, tid: TID, name: None, domain: None }));
    r.push(Record::Lost(Lost { dropped: 0, without_timestamps: 2 }));
    r.push(Record::End(End { at_ns: T0 + (t + 800) * 1000, signal: None }));
    let mut out = Vec::new();
    for rec in &r {
        write_record(&mut out, rec).unwrap();
    }
    String::from_utf8(out).unwrap()
}

/// A program's records that compute on four streams at once: each batch
/// in chunks, chunk c's upload, kernel and download on stream 20 + c; the
/// four kernels of a batch overlap, each slowed by the others.
pub fn chunks_on_four_streams() -> String {
    let mut r = vec![Record::Process(Process {
        pid: PID,
        parent_pid: 1,
        exe: "/tmp/patterns".into(),
        argv: vec![],
        cupti_version: 130001,
        refused_kinds: vec![],
        kinds_not_asked: vec![],
    })];
    let mut corr = 100;
    for batch in 0..5u64 {
        let t = 10 + batch * 1000;
        for c in 0..4u64 {
            let stream = 20 + c as u32;
            let up = t + c * 100;
            r.push(call(Api::Runtime, "cudaMemcpyAsync_v3020", t + c * 3, t + c * 3 + 1, corr));
            r.push(copy(1, 2, 3, stream, up, up + 100, corr));
            r.push(call(Api::Runtime, "cudaLaunchKernel_v7000", t + c * 3 + 1, t + c * 3 + 2, corr + 1));
            r.push(kernel("_Z4workPKfPfmiff", stream, up + 100, up + 600, corr + 1));
            r.push(call(Api::Runtime, "cudaMemcpyAsync_v3020", t + c * 3 + 2, t + c * 3 + 3, corr + 2));
            r.push(copy(2, 3, 2, stream, up + 600, up + 700, corr + 2));
            corr += 3;
        }
    }
    r.push(Record::End(End { at_ns: T0 + 10_000_000, signal: None }));
    let mut out = Vec::new();
    for rec in &r {
        write_record(&mut out, rec).unwrap();
    }
    String::from_utf8(out).unwrap()
}
