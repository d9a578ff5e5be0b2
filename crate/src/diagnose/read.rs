//! Reading a trace file: a Chrome trace exported by `torch.profiler`
//! (Kineto's format), or one the course wrote, as `.json` or `.json.gz`.
//!
//! The file is streamed: each event is read, kept if it is GPU work, a CUDA
//! call or a CPU op, and dropped otherwise, so a trace of hundreds of MB
//! needs memory only for what it keeps. Every way a file can be wrong ends
//! in one line naming the file and what is missing or wrong; nothing here
//! panics on a file's content. This room opens the file, unzips it where it
//! is gzipped, reports progress and words the errors; what the events mean
//! is `kineto`'s (torch.profiler's format) and `course`'s (the course's own
//! timelines).
//!
//! May use: `error`, `measure` (a path as outputs show it), `events`,
//! `kineto` (the events as they stream past).

use super::events::Trace;
use super::kineto::{Builder, TopLevel};
use crate::error::{LabError, Result};
use crate::measure::record::display_path;
use serde::de::DeserializeSeed;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// How often reading reports progress: every this many bytes of the file.
pub const PROGRESS_EVERY_BYTES: u64 = 1 << 20;

/// Reads the trace at `path`. `progress(read, total)` is told how many of
/// the file's bytes have been read, every [`PROGRESS_EVERY_BYTES`] and at
/// the end. Errors name the file and what is wrong with it, in one line.
pub fn read_trace(path: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<Trace> {
    let shown = display_path(path);
    let file = std::fs::File::open(path).map_err(|e| reading(&shown, e))?;
    let total = file.metadata().map_err(|e| reading(&shown, e))?.len();
    if total == 0 {
        return Err(bad_content(&shown, "the file is empty (the profiler wrote nothing: did the program end before the trace was exported?)".into()));
    }
    let counted = Counted { inner: file, read: 0, total, next_report: PROGRESS_EVERY_BYTES, progress };
    let mut raw = BufReader::with_capacity(1 << 20, counted);
    let gzipped = raw.fill_buf().map_err(|e| reading(&shown, e))?.starts_with(&[0x1f, 0x8b]);
    let (trace, counted) = if gzipped {
        let mut unzipped = BufReader::with_capacity(1 << 20, flate2::bufread::MultiGzDecoder::new(raw));
        let trace = parse(&mut unzipped, true).map_err(|why| bad_content(&shown, why))?;
        (trace, unzipped.into_inner().into_inner().into_inner())
    } else {
        let trace = parse(&mut raw, false).map_err(|why| bad_content(&shown, why))?;
        (trace, raw.into_inner())
    };
    (counted.progress)(total, total);
    Ok(trace)
}

/// Reads a trace from text held in memory (tests, and notebooks that
/// build one): as [`read_trace`], errors naming `name`.
pub fn read_trace_text(name: &str, text: &str) -> Result<Trace> {
    if text.is_empty() {
        return Err(bad_content(name, "the file is empty".into()));
    }
    parse(&mut BufReader::new(text.as_bytes()), false).map_err(|why| bad_content(name, why))
}

/// The error of reading the trace `shown`: "reading trace t.json: ...".
fn reading(shown: &str, e: std::io::Error) -> LabError {
    LabError::io(format!("reading trace {shown}"), e)
}

/// What is wrong with the content of the trace `shown` ("the JSON is cut
/// short ..."), as the error of reading it.
fn bad_content(shown: &str, why: String) -> LabError {
    reading(shown, std::io::Error::new(std::io::ErrorKind::InvalidData, why))
}

/// The file as it is read, counting its bytes for progress.
struct Counted<'p> {
    inner: std::fs::File,
    read: u64,
    total: u64,
    next_report: u64,
    progress: &'p mut dyn FnMut(u64, u64),
}

impl Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read >= self.next_report {
            (self.progress)(self.read.min(self.total), self.total);
            self.next_report = self.read + PROGRESS_EVERY_BYTES;
        }
        Ok(n)
    }
}

/// The first bytes of what is to be parsed, as a reason it is not JSON
/// (`None` when it may be: it opens an object or a list).
fn not_json(head: &[u8], gzipped: bool) -> Option<String> {
    let start = head.iter().position(|b| !b.is_ascii_whitespace())?;
    let head = &head[start..];
    // An object or a list may be a trace; a number or a string is JSON
    // too, and the parser says it is not a trace.
    if head.starts_with(b"{") || head.starts_with(b"[") || head.starts_with(b"\"") || head[0].is_ascii_digit() || head[0] == b'-' {
        return None;
    }
    let inside = if gzipped { "the gzip file holds " } else { "" };
    Some(if head.starts_with(b"SQLite format 3\0") {
        format!("{inside}an SQLite database (an Nsight Systems export?), not a Chrome trace: export one from torch.profiler (`prof.export_chrome_trace(\"trace.json\")`)")
    } else if head.starts_with(b"PK\x03\x04") {
        format!("{inside}a zip archive (an Nsight Systems report?), not a Chrome trace JSON")
    } else if head.iter().take(64).any(|&b| b < 0x09 || (0x0e..0x20).contains(&b)) {
        format!("{inside}binary data, not JSON (a Perfetto protobuf trace or an Nsight report?): export a Chrome trace JSON from torch.profiler")
    } else {
        let text: String = String::from_utf8_lossy(&head[..head.len().min(24)]).chars().filter(|c| !c.is_control()).collect();
        format!("{inside}text that is not JSON (it starts with `{text}`)")
    })
}

/// Parses the JSON of a trace from `input`, whose start is not yet consumed.
fn parse(input: &mut dyn BufRead, gzipped: bool) -> std::result::Result<Trace, String> {
    let head = match input.fill_buf() {
        Ok(h) => h.to_vec(),
        Err(e) if gzipped => return Err(format!("the gzip data is corrupt or cut short ({e})")),
        Err(e) => return Err(format!("cannot be read ({e})")),
    };
    if head.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(if gzipped { "the gzip file holds no data".into() } else { "the file holds only whitespace".into() });
    }
    if let Some(why) = not_json(&head, gzipped) {
        return Err(why);
    }
    let mut builder = Builder::default();
    let mut de = serde_json::Deserializer::from_reader(input);
    let result = TopLevel { builder: &mut builder }.deserialize(&mut de).and_then(|()| de.end());
    if let Some(why) = builder.error.take() {
        return Err(why);
    }
    if let Err(e) = result {
        return Err(json_error(&e, &builder, gzipped));
    }
    builder.finish()
}

/// A JSON error as one line that says what went wrong and where.
fn json_error(e: &serde_json::Error, b: &Builder, gzipped: bool) -> String {
    let at = format!("line {} column {}", e.line(), e.column());
    let inside = if b.in_events { format!(", in traceEvents after {} events", b.events) } else { String::new() };
    // serde's message without the position it appends (`at` says it).
    let msg = e.to_string();
    let what = msg.split(" at line ").next().unwrap_or(&msg);
    match e.classify() {
        serde_json::error::Category::Eof => {
            format!("the JSON is cut short at {at}{inside}: the trace is truncated (the profiler may not have finished writing it)")
        }
        serde_json::error::Category::Io if gzipped => format!("the gzip data is corrupt or cut short{inside} ({what})"),
        serde_json::error::Category::Io => format!("cannot be read{inside} ({what})"),
        serde_json::error::Category::Syntax => format!("malformed JSON at {at}{inside}: {what}"),
        serde_json::error::Category::Data => format!("not a trace at {at}{inside}: {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::events::{Direction, GpuOpKind, HostMemory, Thread, TraceFormat};

    /// A small trace as torch.profiler writes one: metadata, a CPU op, a
    /// launch, its kernel and the flow between them, Kineto's closing
    /// instant event with its empty pid.
    const KINETO: &str = r#"{
      "schemaVersion": 1,
      "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045346304, "computeMajor": 9, "computeMinor": 0}],
      "displayTimeUnit": "ms", "baseTimeNanoseconds": 1700000000000000000,
      "traceEvents": [
        {"name": "process_name", "ph": "M", "ts": 0.000, "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
        {"name": "thread_name", "ph": "M", "ts": 0.000, "pid": 0, "tid": 7, "args": {"name": "stream 7"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::to", "pid": 4242, "tid": 4242, "ts": 100.000, "dur": 50.500, "args": {"External id": 3, "Input Dims": [[4, 4], []]}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 4242, "tid": 4242, "ts": 101.250, "dur": 40.000, "args": {"External id": 3, "cbid": 41, "correlation": 77}},
        {"ph": "s", "id": 77, "pid": 4242, "tid": 4242, "ts": 101.250, "cat": "ac2g", "name": "ac2g"},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7, "ts": 110.000, "dur": 30.000, "args": {"External id": 3, "device": 0, "context": 1, "stream": 7, "correlation": 77, "bytes": 1048576, "memory bandwidth (GB/s)": 34.95}},
        {"ph": "f", "id": 77, "pid": 0, "tid": 7, "ts": 110.000, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7, "ts": 141.000, "dur": 0.000, "args": {"device": 0, "context": 1, "stream": 7, "correlation": 78, "bytes": 0, "memory bandwidth (GB/s)": "N/A"}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemsetAsync", "pid": 4242, "tid": 4242, "ts": 142.000, "dur": 3.000, "args": {"cbid": 51, "correlation": 78}},
        {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": 200.000}
      ],
      "traceName": "/tmp/trace.json"
    }"#;

    /// Launches into a stream being captured, from any thread of the
    /// process, issue no GPU work (a graph's launch runs them later): the
    /// trace reads whole; a launch outside the capture whose work is
    /// missing is still an error.
    #[test]
    fn launches_captured_into_a_graph_are_not_missing_work() {
        let on = |tid: u32, name: &str, ts: f64, corr: u64| {
            format!(
                r#"{{"ph": "X", "cat": "cuda_runtime", "name": "{name}", "pid": 1, "tid": {tid}, "ts": {ts}, "dur": 2, "args": {{"correlation": {corr}}}}}"#
            )
        };
        let call = |name: &str, ts: f64, corr: u64| on(1, name, ts, corr);
        let kernel = |ts: f64, corr: u64| {
            format!(
                r#"{{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": {ts}, "dur": 5, "args": {{"device": 0, "stream": 7, "correlation": {corr}}}}}"#
            )
        };
        let trace = |captured: bool| {
            let events = [
                call("cudaLaunchKernel", 10.0, 1),
                kernel(12.0, 1),
                call(if captured { "cudaStreamBeginCapture" } else { "cudaStreamIsCapturing" }, 20.0, 2),
                call("cudaLaunchKernel", 25.0, 3),
                // autograd's thread launching into the same capture
                on(2, "cudaLaunchKernel", 27.0, 6),
                call(if captured { "cudaStreamEndCapture" } else { "cudaStreamIsCapturing" }, 30.0, 4),
                call("cudaGraphLaunch", 40.0, 5),
                kernel(42.0, 5),
            ];
            format!(r#"{{"schemaVersion": 1, "traceEvents": [{}]}}"#, events.join(", "))
        };
        let t = read_trace_text("captured.json", &trace(true)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.gpu_ops.len(), 2);
        let e = read_trace_text("lost.json", &trace(false)).unwrap_err().to_string();
        assert!(e.contains("GPU work is missing: cudaLaunchKernel at ts 25"), "{e}");
    }

    #[test]
    fn a_torch_profiler_trace_reads_into_gpu_ops_calls_and_cpu_ops() {
        let t = read_trace_text("t.json", KINETO).unwrap();
        assert_eq!(t.format, Some(TraceFormat::Kineto));
        assert_eq!(t.gpu_name(0), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(t.gpu_ops.len(), 2);
        let copy = &t.gpu_ops[0];
        assert_eq!(copy.kind, GpuOpKind::Copy { direction: Direction::H2d, host: Some(HostMemory::Pageable) });
        assert_eq!((copy.stream, copy.correlation, copy.bytes, copy.start_us, copy.end_us), (7, Some(77), Some(1 << 20), 110.0, 140.0));
        assert_eq!(t.gpu_ops[1].kind, GpuOpKind::Memset);
        assert_eq!(t.calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["cudaMemcpyAsync", "cudaMemsetAsync"]);
        assert_eq!(t.cpu_ops[0].name, "aten::to");
        assert!(!t.cpu_ops[0].annotation);
        let old_step = KINETO.replace("\"cat\": \"cpu_op\", \"name\": \"aten::to\"", "\"cat\": \"cpu_op\", \"name\": \"ProfilerStep#3\"");
        assert!(read_trace_text("t.json", &old_step).unwrap().cpu_ops[0].annotation, "a step filed as a CPU op is still the profiler's step");
        assert_eq!(t.threads[t.calls[0].thread], Thread { pid: "4242".into(), tid: "4242".into() });
    }

    /// CUDA sync events as torch.profiler writes them with
    /// `enable_cuda_sync_events=True` (on the GPU's lanes, with durations),
    /// a `cuda_event` record, and sync events whose args are missing, text,
    /// -1 or not numbers at all, inserted into [`KINETO`].
    const SYNC_EVENTS: &str = r#"
        {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 7, "ts": 90.000, "dur": 60.000, "args": {"device": 0, "context": 1, "stream": 7, "correlation": 75, "wait_on_stream": 13, "wait_on_cuda_event_record_corr_id": 74, "wait_on_cuda_event_id": 3}},
        {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 7, "ts": 150.000, "dur": 40.000, "args": {"device": "0", "stream": "7", "correlation": "76", "wait_on_stream": "13", "wait_on_cuda_event_record_corr_id": -1}},
        {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 7, "ts": 150.000, "dur": 40.000, "args": {"device": 0, "stream": 7, "correlation": 79, "wait_on_stream": -1, "wait_on_cuda_event_record_corr_id": 73}},
        {"ph": "X", "cat": "cuda_event", "name": "cudaEventRecord", "pid": 0, "tid": 13, "ts": 80.000, "dur": 0.000, "args": {"device": 0, "stream": 13, "correlation": 73, "cuda_event_id": 2}},
        {"ph": "X", "cat": "cuda_event", "name": "cudaEventRecord", "pid": 0, "tid": 13, "ts": 80.000, "dur": 0.000, "args": {"stream": "x13", "correlation": 72}},
        {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 7, "ts": 150.000, "dur": 40.000, "args": {"device": 0, "stream": -1, "correlation": 80, "wait_on_stream": 13}},
        {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 7, "ts": 150.000, "dur": 40.000, "args": {"device": 0, "stream": 7, "correlation": "soon", "wait_on_stream": [13]}},
        {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 7, "ts": 150.000, "dur": 40.000, "args": {"device": 0, "stream": 7, "correlation": -1, "wait_on_stream": 13}},
        {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": "GPU", "tid": 7},
        {"ph": "X", "cat": "cuda_sync", "name": "Context Sync", "pid": 0, "tid": 4294967295, "ts": "soon", "dur": -3.0, "args": {"device": 0, "stream": -1, "correlation": 81}},
        {"ph": "X", "cat": "cuda_sync", "name": "Event Sync", "pid": 0, "tid": 7, "ts": 160.000, "dur": 30.000, "args": {"device": 0, "stream": 7, "correlation": 82, "wait_on_stream": 13, "wait_on_cuda_event_record_corr_id": 74}},
        {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": 0, "tid": 7, "ts": 160.000, "dur": 30.000, "args": {"device": 0, "stream": 7, "correlation": 83}},
        {"name": "Record Window End""#;

    #[test]
    fn cuda_sync_events_are_read_as_stream_waits_and_never_as_gpu_work() {
        use crate::diagnose::events::{EventRecord, StreamWait};
        let plain = read_trace_text("t.json", KINETO).unwrap();
        assert!(!plain.carries_sync_events() && plain.stream_waits.is_empty() && plain.event_records.is_empty());
        let text = KINETO.replace("{\"name\": \"Record Window End\"", SYNC_EVENTS.trim_start());
        let t = read_trace_text("t.json", &text).unwrap();
        assert_eq!(t.sync_events, 10, "every cuda_sync event counted, however malformed");
        assert!(t.carries_sync_events());
        let wait = |call_correlation, recorded_stream, record_correlation| StreamWait {
            gpu: 0,
            stream: 7,
            call_correlation,
            recorded_stream,
            record_correlation,
            event_id: None,
        };
        // Numbers written as text read; -1 is unknown; a wait with no
        // waiting stream or call is left out, as are the other kinds.
        let first = StreamWait { event_id: Some(3), ..wait(75, Some(13), Some(74)) };
        assert_eq!(t.stream_waits, [first, wait(76, Some(13), None), wait(79, None, Some(73))]);
        assert_eq!(t.event_records, [EventRecord { gpu: 0, stream: 13, correlation: 73 }]);
        // Not GPU work: the ops, calls and window are the plain trace's.
        assert_eq!((&t.gpu_ops, &t.calls, &t.cpu_ops, t.window_us()), (&plain.gpu_ops, &plain.calls, &plain.cpu_ops, plain.window_us()));
        // A trace of sync events alone has no GPU work.
        let only = r#"{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": 0, "tid": 7, "ts": 1, "dur": 5, "args": {"stream": 7, "correlation": 9}}]}"#;
        let e = read_trace_text("t.json", only).unwrap_err().to_string();
        assert!(e.contains("no GPU activity"), "{e}");
    }

    #[test]
    fn gzipped_traces_read_the_same_and_report_progress_to_the_end() {
        use std::io::Write;
        let dir = crate::testing::temp_dir("diagnose-gz");
        let path = dir.join("t.json.gz");
        let mut gz = flate2::write::GzEncoder::new(std::fs::File::create(&path).unwrap(), flate2::Compression::default());
        gz.write_all(KINETO.as_bytes()).unwrap();
        gz.finish().unwrap();
        let mut seen = Vec::new();
        let t = read_trace(&path, &mut |read, total| seen.push((read, total))).unwrap();
        assert_eq!(t, read_trace_text("t.json", KINETO).unwrap());
        let size = std::fs::metadata(&path).unwrap().len();
        assert_eq!(seen.last(), Some(&(size, size)), "{seen:?}");
    }

    #[test]
    fn the_courses_own_timelines_read_as_gpu_work_on_their_streams() {
        use crate::pipeline::op::OpKind;
        use crate::pipeline::timeline::{Span, Timeline};
        let span =
            |lane: &str, kind, label: &str, start_us, end_us| Span { lane: lane.into(), kind, label: label.into(), start_us, end_us, class: None, index: None };
        let tl = Timeline {
            title: "lab 2".into(),
            device: "GPU 0 (NVIDIA H200)".into(),
            spans: vec![
                span("stream 0: copy", OpKind::H2d, "H2D chunk 0", 0.0, 10.0),
                span("stream 1", OpKind::Kernel, "compute chunk 0", 10.0, 30.0),
                span("stream 0: copy", OpKind::D2h, "D2H chunk 0", 30.0, 35.0),
                span("CPU main", OpKind::Host, "check", 35.0, 40.0),
            ],
            ..Timeline::default()
        };
        let t = read_trace_text("lab2.json", &serde_json::to_string(&tl.chrome_trace()).unwrap()).unwrap();
        assert_eq!(t.format, Some(TraceFormat::Course));
        assert_eq!(t.gpu_name(0), Some("NVIDIA H200"));
        let kinds: Vec<(u64, String)> = t.gpu_ops.iter().map(|o| (o.stream, o.kind.label())).collect();
        assert_eq!(kinds, [(0, "H2D pinned".to_string()), (1, "kernel".into()), (0, "D2H pinned".into())]);
        assert!(t.calls.is_empty());
    }
}
