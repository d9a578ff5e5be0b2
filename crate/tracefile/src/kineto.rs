//! A raw trace file as a Chrome trace in Kineto's schema (what
//! `torch.profiler` exports): the same categories (`kernel`, `gpu_memcpy`,
//! `gpu_memset`, `cuda_runtime`, `cuda_driver`, `cuda_sync`, `cuda_event`,
//! `user_annotation`), GPU ops on the lane `pid` = device, `tid` = stream,
//! calls on the OS process and thread, every op's `correlation` tying it to
//! the call that issued it, and copies named with their memory kinds
//! (`Memcpy HtoD (Pageable -> Device)`). Perfetto, `chrome://tracing`, HTA
//! and `overlap-lab diagnose` open it as they open Kineto's.
//!
//! Times are microseconds from the trace's first timestamp, with three
//! decimals (nanoseconds), as Kineto writes them; `baseTimeNanoseconds` is
//! that first timestamp on CUPTI's clock.
//!
//! Where it differs from Kineto, and why:
//! * every driver call is written (Kineto keeps a few): a program on the
//!   driver API (cudarc, the course's own labs) has no other calls;
//! * a call that issues GPU work but has none under its correlation (it
//!   failed, or copied nothing) is left out, and counted in the trace's
//!   `overlap_lab` block: a reader takes such a call for lost records;
//! * an op's end that CUPTI puts past the end of the next op on its
//!   stream, issued by another call, is moved back to that op's start
//!   (ops of one stream run one after another: a dependent launch may
//!   start early, but cannot end first; only a graph's own nodes, which
//!   share their launch's correlation, may run side by side there), and
//!   counted: on
//!   an H200 with CUPTI 13.0 a program's first device-to-device copy after
//!   a graph's capture read 134-165 ms, its neighbours on the stream 8 µs
//!   (torch.profiler's trace of the same program: 9 µs);
//! * `Stream Wait Event` and `Event Sync` name the stream and the record
//!   call of the event they waited for, from CUPTI's event records (Kineto
//!   leaves them -1); the records themselves are not drawn (`cuda_event`:
//!   CUPTI gives them no time of their own);
//! * a sync event's stream is its lane (`tid`) only, not `args.stream`:
//!   HTA takes every event with an `args.stream` for GPU work, and would
//!   stretch the GPU's window and idle time over the host's syncs.

use crate::issues_gpu_work;
use crate::raw::RawTrace;
use crate::records::{Api, Call, GpuSpan, Record, NO_STREAM, PEER_COPIES};
use serde::Serialize;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::Path;

/// What a converted trace holds, in counts (the `overlap_lab` block of the
/// trace, and what `overlap-lab trace` prints).
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub pid: u32,
    pub exe: String,
    pub argv: Vec<String>,
    pub kernels: usize,
    pub copies: usize,
    pub memsets: usize,
    pub calls: usize,
    pub syncs: usize,
    pub nvtx_ranges: usize,
    /// Calls that issue GPU work but had none recorded, by name: left out.
    pub calls_left_out: BTreeMap<String, usize>,
    /// GPU ops whose end CUPTI put past the end of the next op on their
    /// stream (a different call's): ended where that op started, as stream
    /// order has it.
    pub ends_clamped: usize,
    /// Records CUPTI dropped (a full buffer) or gave no timestamps.
    pub dropped: u64,
    pub without_timestamps: u64,
    /// The process flushed as it ended; false: it was killed (SIGKILL) or
    /// called `_exit`, and its last records may be missing.
    pub complete: bool,
    /// The signal that ended it (a crash, abort or kill), where one did.
    pub signal: Option<i32>,
    /// Activity kinds CUPTI refused in this process, with why.
    pub refused_kinds: Vec<String>,
    /// Calls that copy between two GPUs (`cudaMemcpyPeerAsync` and the
    /// like) with no copy record, where CUPTI's peer-copy records were not
    /// asked for (`overlap-lab trace --peer-copies` asks). CUPTI 13 records
    /// such copies as plain copies without them, so a call counted here
    /// failed or never ran, unless this CUPTI records them only as peer
    /// copies.
    pub peer_copies_not_recorded: usize,
    /// Whether CUPTI's peer-copy records were left out in this process
    /// (not asked for).
    pub peer_copies_not_asked: bool,
}

impl Summary {
    /// Kernels, copies and memsets.
    pub fn gpu_ops(&self) -> usize {
        self.kernels + self.copies + self.memsets
    }
}

/// A converted trace: the Chrome trace's JSON, and its summary.
pub struct Kineto {
    pub json: Value,
    pub summary: Summary,
}

/// A CUPTI function name without its version suffix (`cudaLaunchKernel_v7000`
/// → `cudaLaunchKernel`), as Kineto names calls; a `_v2` (part of a driver
/// function's name, `cuMemcpyHtoDAsync_v2`) stays.
pub fn unversioned(name: &str) -> &str {
    match name.rfind("_v") {
        Some(i) if name.len() - i - 2 >= 4 && name[i + 2..].bytes().all(|b| b.is_ascii_digit()) => &name[..i],
        _ => name,
    }
}

/// Whether a call copies memory (`cudaMemcpy*`, `cuMemcpy*`).
pub fn is_copy_call(call: &str) -> bool {
    call.starts_with("cudaMemcpy") || call.starts_with("cuMemcpy")
}

/// Whether a call copies between two GPUs (`cudaMemcpyPeerAsync`,
/// `cuMemcpyPeer`, `cudaMemcpy3DPeer`, ...): CUPTI 13 records its copy as
/// a plain copy of kind PtoP, and with peer-copy records asked for, as one
/// naming both GPUs.
pub fn is_peer_copy(call: &str) -> bool {
    is_copy_call(call) && call.contains("Peer")
}

/// CUPTI's copy kind as Kineto writes it.
fn copy_direction(kind: u8) -> &'static str {
    match kind {
        1 => "HtoD",
        2 => "DtoH",
        3 => "HtoA",
        4 => "AtoH",
        5 => "AtoA",
        6 => "AtoD",
        7 => "DtoA",
        8 => "DtoD",
        9 => "HtoH",
        10 => "PtoP",
        _ => "Unknown",
    }
}

/// CUPTI's memory kind as Kineto writes it.
fn memory_kind(kind: u16) -> &'static str {
    match kind {
        1 => "Pageable",
        2 => "Pinned",
        3 => "Device",
        4 => "Array",
        5 => "Managed",
        6 => "Device Static",
        7 => "Managed Static",
        _ => "Unknown",
    }
}

/// CUPTI's synchronization type as Kineto names the event.
fn sync_name(kind: u32) -> &'static str {
    match kind {
        1 => "Event Sync",
        2 => "Stream Wait Event",
        3 => "Stream Sync",
        4 => "Context Sync",
        _ => "Unknown Sync",
    }
}

/// A kernel's name for people: demangled where it is a mangled C++ name.
fn kernel_name(name: &str) -> String {
    cpp_demangle::Symbol::new(name).ok().and_then(|s| s.demangle(&cpp_demangle::DemangleOptions::default()).ok()).unwrap_or_else(|| name.to_string())
}

/// Converts a raw trace; `trace_name` becomes its `traceName`.
pub fn convert(raw: &RawTrace, trace_name: &str) -> Kineto {
    let mut summary = Summary {
        pid: raw.process.pid,
        exe: raw.process.exe.clone(),
        argv: raw.process.argv.clone(),
        complete: raw.complete,
        signal: raw.signal,
        refused_kinds: raw.process.refused_kinds.clone(),
        ..Summary::default()
    };
    // The first timestamp: every `ts` counts from it.
    let starts = raw.records.iter().filter_map(|r| match r {
        Record::Call(c) => Some(c.start_ns),
        Record::Kernel(_) | Record::Copy(_) | Record::Memset(_) => gpu_span(r).map(|at| at.start_ns),
        Record::Sync(s) => Some(s.start_ns),
        Record::Marker(m) => Some(m.at_ns),
        _ => None,
    });
    let base = starts.min().unwrap_or(0);
    let us = |ns: u64| ns.saturating_sub(base) as f64 / 1000.0;
    let dur = |start: u64, end: u64| end.saturating_sub(start) as f64 / 1000.0;

    // Which device each context is on, and which correlations issued GPU work.
    let mut context_device: HashMap<u32, u32> = HashMap::new();
    // Each event's records (by context and id): the latest before a wait's
    // correlation is what the wait waited for.
    let mut event_records: HashMap<(u32, u32), Vec<(u32, u32)>> = HashMap::new();
    let mut with_work: HashSet<u32> = HashSet::new();
    for r in &raw.records {
        let (ctx, dev, corr) = match (r, gpu_span(r)) {
            (_, Some(at)) => (at.context, at.device, at.correlation),
            (Record::EventRecord(e), None) => {
                context_device.entry(e.context).or_insert(e.device);
                event_records.entry((e.context, e.event)).or_default().push((e.correlation, e.stream));
                continue;
            }
            _ => continue,
        };
        context_device.entry(ctx).or_insert(dev);
        with_work.insert(corr);
    }
    let device_of = |ctx: u32| context_device.get(&ctx).copied().unwrap_or(0);
    for v in event_records.values_mut() {
        v.sort_unstable();
    }
    let awaited = |ctx: u32, event: u32, before: u32| -> Option<(u32, u32)> {
        let v = event_records.get(&(ctx, event))?;
        let i = v.partition_point(|(corr, _)| *corr < before);
        i.checked_sub(1).map(|i| v[i])
    };

    let ends = stream_ordered_ends(&raw.records);
    summary.ends_clamped = ends.iter().filter(|e| e.is_some()).count();
    let end_of = |i: usize, end: u64| ends[i].unwrap_or(end);

    // CUPTI's peer-copy records are taken only on request (the injection
    // library's `ON_REQUEST`); a peer copy call without any record is
    // counted apart where they were not asked for.
    let peer_not_asked = raw.process.kinds_not_asked.iter().any(|k| k == PEER_COPIES);
    summary.peer_copies_not_asked = peer_not_asked;
    let mut events: Vec<Value> = Vec::new();
    let mut lanes: BTreeMap<(u32, u32), ()> = BTreeMap::new();
    let mut threads: BTreeMap<(u32, u32), ()> = BTreeMap::new();
    let mut open_ranges: HashMap<u32, &crate::records::Marker> = HashMap::new();
    let mut devices: Vec<Value> = Vec::new();
    let mut last_ns = base;
    for (i, r) in raw.records.iter().enumerate() {
        match r {
            Record::Call(c) => {
                last_ns = last_ns.max(c.end_ns);
                let name = unversioned(&c.name);
                if issues_gpu_work(name) && !with_work.contains(&c.correlation) {
                    if peer_not_asked && is_peer_copy(name) {
                        summary.peer_copies_not_recorded += 1;
                    } else {
                        *summary.calls_left_out.entry(name.to_string()).or_default() += 1;
                    }
                    continue;
                }
                summary.calls += 1;
                threads.insert((c.pid, c.tid), ());
                events.push(call_event(c, name, us(c.start_ns), dur(c.start_ns, c.end_ns)));
            }
            Record::Kernel(_) | Record::Copy(_) | Record::Memset(_) => {
                let at = gpu_span(r).expect("a GPU op");
                let end = end_of(i, at.end_ns);
                last_ns = last_ns.max(end);
                lanes.insert((at.device, at.stream), ());
                let d = dur(at.start_ns, end);
                let mut args = json!({"device": at.device, "context": at.context, "stream": at.stream, "correlation": at.correlation});
                let (cat, name, bytes) = match r {
                    Record::Kernel(k) => {
                        summary.kernels += 1;
                        args["registers per thread"] = json!(k.registers_per_thread);
                        args["shared memory"] = json!(k.shared_bytes);
                        args["grid"] = json!(k.grid);
                        args["block"] = json!(k.block);
                        ("kernel", kernel_name(&k.name), None)
                    }
                    Record::Copy(c) => {
                        summary.copies += 1;
                        if let Some([from, to]) = c.peer {
                            args["fromDevice"] = json!(from);
                            args["inDevice"] = json!(at.device);
                            args["toDevice"] = json!(to);
                        }
                        let name = format!("Memcpy {} ({} -> {})", copy_direction(c.kind), memory_kind(c.src.into()), memory_kind(c.dst.into()));
                        ("gpu_memcpy", name, Some(c.bytes))
                    }
                    Record::Memset(m) => {
                        summary.memsets += 1;
                        ("gpu_memset", format!("Memset ({})", memory_kind(m.memory)), Some(m.bytes))
                    }
                    _ => unreachable!("a GPU op"),
                };
                if let Some(bytes) = bytes {
                    args["bytes"] = json!(bytes);
                    if d > 0.0 {
                        args["memory bandwidth (GB/s)"] = json!(bytes as f64 / (d * 1000.0));
                    }
                }
                events.push(json!({"ph": "X", "cat": cat, "name": name, "pid": at.device, "tid": at.stream, "ts": us(at.start_ns), "dur": d, "args": args}));
            }
            Record::Sync(s) => {
                summary.syncs += 1;
                let device = device_of(s.context);
                let stream: i64 = if s.stream == NO_STREAM { -1 } else { s.stream.into() };
                let mut args = json!({
                    "cuda_sync_kind": sync_name(s.kind), "correlation": s.correlation, "device": device, "context": s.context,
                });
                if s.kind == 1 || s.kind == 2 {
                    let (record, recorded_on) = awaited(s.context, s.event, s.correlation).map_or((-1, -1), |(c, st)| (i64::from(c), i64::from(st)));
                    args["wait_on_stream"] = json!(recorded_on);
                    args["wait_on_cuda_event_record_corr_id"] = json!(record);
                    args["wait_on_cuda_event_id"] = json!(s.event);
                }
                events.push(json!({
                    "ph": "X", "cat": "cuda_sync", "name": sync_name(s.kind),
                    "pid": device, "tid": stream, "ts": us(s.start_ns), "dur": dur(s.start_ns, s.end_ns), "args": args,
                }));
            }
            // Read into the waits' `wait_on_*` above; not drawn (CUPTI gives
            // an event record no time of its own).
            Record::EventRecord(_) => {}
            Record::Marker(m) => {
                last_ns = last_ns.max(m.at_ns);
                match m.flags {
                    2 => {
                        open_ranges.insert(m.id, m);
                    }
                    4 => {
                        if let Some(start) = open_ranges.remove(&m.id) {
                            summary.nvtx_ranges += 1;
                            events.push(range_event(start, us(start.at_ns), dur(start.at_ns, m.at_ns), false));
                        }
                    }
                    _ => events.push(json!({
                        "ph": "i", "s": "t", "cat": "user_annotation", "name": m.name.as_deref().unwrap_or("NVTX mark"),
                        "pid": m.pid, "tid": m.tid, "ts": us(m.at_ns),
                    })),
                }
            }
            Record::Device(d) => devices.push(json!({
                "id": d.id, "name": d.name, "totalGlobalMem": d.global_memory,
                "computeMajor": d.compute_major, "computeMinor": d.compute_minor, "numSms": d.multiprocessors,
            })),
            Record::Lost(l) => {
                summary.dropped += l.dropped;
                summary.without_timestamps += l.without_timestamps;
            }
            Record::Process(_) | Record::End(_) => {}
        }
    }
    // Ranges still open when the records end: drawn to the last timestamp.
    let mut unfinished: Vec<_> = open_ranges.into_values().collect();
    unfinished.sort_by_key(|m| m.id);
    for m in unfinished {
        summary.nvtx_ranges += 1;
        events.push(range_event(m, us(m.at_ns), dur(m.at_ns, last_ns), true));
    }
    // Names for the lanes, as Kineto gives them.
    let exe_name = Path::new(&raw.process.exe).file_name().and_then(|n| n.to_str()).unwrap_or("process").to_string();
    let mut meta = vec![json!({"ph": "M", "name": "process_name", "pid": raw.process.pid, "tid": 0, "args": {"name": exe_name}})];
    let gpus: HashSet<u32> = lanes.keys().map(|(d, _)| *d).collect();
    let mut gpus: Vec<u32> = gpus.into_iter().collect();
    gpus.sort_unstable();
    for d in gpus {
        meta.push(json!({"ph": "M", "name": "process_name", "pid": d, "tid": 0, "args": {"name": format!("GPU {d}")}}));
    }
    for (d, s) in lanes.keys() {
        meta.push(json!({"ph": "M", "name": "thread_name", "pid": d, "tid": s, "args": {"name": format!("stream {s}")}}));
    }
    for (p, t) in threads.keys() {
        meta.push(json!({"ph": "M", "name": "thread_name", "pid": p, "tid": t, "args": {"name": format!("thread {t}")}}));
    }
    meta.extend(events);
    let mut top = Map::new();
    top.insert("schemaVersion".into(), json!(1));
    top.insert("deviceProperties".into(), Value::Array(devices));
    top.insert("cupti_version".into(), json!(raw.process.cupti_version));
    top.insert("displayTimeUnit".into(), json!("ms"));
    top.insert("baseTimeNanoseconds".into(), json!(base));
    top.insert("overlap_lab".into(), serde_json::to_value(&summary).expect("a summary serializes"));
    top.insert("traceEvents".into(), Value::Array(meta));
    top.insert("traceName".into(), json!(trace_name));
    Kineto { json: Value::Object(top), summary }
}

/// Where and when a GPU op (kernel, copy, memset) ran; None for other records.
fn gpu_span(r: &Record) -> Option<&GpuSpan> {
    match r {
        Record::Kernel(k) => Some(&k.at),
        Record::Copy(c) => Some(&c.at),
        Record::Memset(m) => Some(&m.at),
        _ => None,
    }
}

/// For each record that is a GPU op whose end lies past the end of the
/// next op on its stream issued by another call: that op's start (None
/// for every other record).
fn stream_ordered_ends(records: &[Record]) -> Vec<Option<u64>> {
    /// An op on a lane: (start, end, correlation, its record's index).
    type LaneOp = (u64, u64, u32, usize);
    let mut lanes: HashMap<(u32, u32), Vec<LaneOp>> = HashMap::new();
    for (i, r) in records.iter().enumerate() {
        if let Some(at) = gpu_span(r) {
            lanes.entry((at.device, at.stream)).or_default().push((at.start_ns, at.end_ns, at.correlation, i));
        }
    }
    let mut ends = vec![None; records.len()];
    for ops in lanes.values_mut() {
        ops.sort_unstable();
        for (j, &(start, end, corr, i)) in ops.iter().enumerate() {
            // The first later op on the stream that another call issued:
            // it may start before this one ends (a kernel launched
            // dependent on this one starts early, and waits inside), but
            // it cannot end first.
            if let Some(&(next, next_end, ..)) = ops[j + 1..].iter().find(|o| o.2 != corr && o.0 >= start) {
                if end > next_end {
                    ends[i] = Some(next.max(start));
                }
            }
        }
    }
    ends
}

fn call_event(c: &Call, name: &str, ts: f64, dur: f64) -> Value {
    let cat = match c.api {
        Api::Runtime => "cuda_runtime",
        Api::Driver => "cuda_driver",
    };
    let mut args = json!({"cbid": c.cbid, "correlation": c.correlation});
    if c.returned != 0 {
        args["returned"] = json!(c.returned);
    }
    json!({"ph": "X", "cat": cat, "name": name, "pid": c.pid, "tid": c.tid, "ts": ts, "dur": dur, "args": args})
}

fn range_event(start: &crate::records::Marker, ts: f64, dur: f64, unfinished: bool) -> Value {
    let mut args = json!({});
    if let Some(d) = &start.domain {
        args["domain"] = json!(d);
    }
    if unfinished {
        args["unfinished"] = json!(true);
    }
    json!({
        "ph": "X", "cat": "user_annotation", "name": start.name.as_deref().unwrap_or("NVTX range"),
        "pid": start.pid, "tid": start.tid, "ts": ts, "dur": dur, "args": args,
    })
}

/// Writes a converted trace as `.json.gz` (or plain JSON where the path
/// does not end in `.gz`).
pub fn write(path: &Path, trace: &Value) -> std::io::Result<()> {
    let file = std::io::BufWriter::new(std::fs::File::create(path)?);
    if path.extension().is_some_and(|e| e == "gz") {
        let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
        serde_json::to_writer(&mut gz, trace)?;
        gz.finish()?.flush()
    } else {
        let mut file = file;
        serde_json::to_writer(&mut file, trace)?;
        file.flush()
    }
}
