//! Reading a trace file: a Chrome trace exported by `torch.profiler`
//! (Kineto's format), or one the course wrote, as `.json` or `.json.gz`.
//!
//! The file is streamed: each event is read, kept if it is GPU work, a CUDA
//! call or a CPU op, and dropped otherwise, so a trace of hundreds of MB
//! needs memory only for what it keeps. Every way a file can be wrong ends
//! in one line naming the file and what is missing or wrong; nothing here
//! panics on a file's content.
//!
//! Kineto's format, as `libkineto/src/output_json.cpp` and
//! `CuptiActivity.cpp` write it: a JSON object with `schemaVersion`,
//! `deviceProperties` (each GPU's `id` and `name`), `displayTimeUnit`,
//! `baseTimeNanoseconds` and `traceEvents`. Each complete event (`"ph":
//! "X"`) has `cat`, `name`, `pid`, `tid`, `ts` and `dur` in µs, and `args`:
//! a kernel's, copy's or memset's hold `device`, `stream` and
//! `correlation` (a copy's also `bytes` and `memory bandwidth (GB/s)`), a
//! `cuda_runtime` or `cuda_driver` call's `cbid` and `correlation`. GPU
//! events sit on `pid` = device, `tid` = stream. Traces of PyTorch 1.8-1.10
//! name the categories `Kernel`, `Memcpy`, `Memset`, `Runtime` and
//! `Operator`; they read the same.

use super::events::{copy_kind_from_name, Call, CpuOp, Direction, GpuOp, GpuOpKind, Thread, Trace, TraceFormat};
use crate::error::{LabError, Result};
use crate::measure::record::display_path;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::fmt;
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

/// A number as a trace may write it: a JSON number, or a string holding
/// one ("N/A" where Kineto had none).
#[derive(Clone, Debug, PartialEq)]
enum Num {
    Value(f64),
    Text(String),
    /// A list, an object or a boolean.
    Other,
}

impl fmt::Display for Num {
    /// As the trace wrote it: `12.5`, `"soon"`, or what it was instead.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Num::Value(v) => write!(f, "{v}"),
            Num::Text(t) => write!(f, "\"{t}\""),
            Num::Other => f.write_str("a list, an object or a boolean"),
        }
    }
}

impl Num {
    fn value(&self) -> Option<f64> {
        match self {
            Num::Value(v) => Some(*v),
            Num::Text(t) => t.trim().parse().ok(),
            Num::Other => None,
        }
    }
}

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Num, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Num;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number")
            }
            fn visit_u64<E>(self, v: u64) -> std::result::Result<Num, E> {
                Ok(Num::Value(v as f64))
            }
            fn visit_i64<E>(self, v: i64) -> std::result::Result<Num, E> {
                Ok(Num::Value(v as f64))
            }
            fn visit_f64<E>(self, v: f64) -> std::result::Result<Num, E> {
                Ok(Num::Value(v))
            }
            fn visit_str<E>(self, v: &str) -> std::result::Result<Num, E> {
                Ok(Num::Text(v.to_string()))
            }
            fn visit_bool<E>(self, _: bool) -> std::result::Result<Num, E> {
                Ok(Num::Other)
            }
            fn visit_unit<E>(self) -> std::result::Result<Num, E> {
                Ok(Num::Other)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Num, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Num::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Num, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Num::Other)
            }
        }
        d.deserialize_any(V)
    }
}

/// A process or thread id: a number, or text (Kineto's "Spans", the
/// `"stream 7"` of old traces).
#[derive(Clone, Debug, PartialEq)]
struct Id(String);

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Id, D::Error> {
        match Num::deserialize(d)? {
            Num::Value(v) if v.fract() == 0.0 && v.abs() < 9e15 => Ok(Id(format!("{}", v as i64))),
            Num::Value(v) => Ok(Id(v.to_string())),
            Num::Text(t) => Ok(Id(t)),
            Num::Other => Ok(Id(String::new())),
        }
    }
}

impl Id {
    /// The number it holds: `7` of `7`, `"7"` or `"stream 7"`.
    fn number(&self) -> Option<u64> {
        self.0.trim().trim_start_matches("stream").trim().parse().ok()
    }
}

/// Text where a trace may put anything (`args.name` of a metadata event).
#[derive(Clone, Debug, PartialEq)]
struct Text(Option<String>);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Text, D::Error> {
        Ok(Text(match Num::deserialize(d)? {
            Num::Text(t) => Some(t),
            Num::Value(v) => Some(v.to_string()),
            Num::Other => None,
        }))
    }
}

/// The `args` of an event, as far as reading needs them.
#[derive(Deserialize, Default)]
struct RawArgs {
    device: Option<Num>,
    /// A peer copy's device (Kineto writes `fromDevice`, `inDevice`, `toDevice`).
    #[serde(rename = "inDevice")]
    in_device: Option<Num>,
    stream: Option<Num>,
    correlation: Option<Num>,
    bytes: Option<Num>,
    /// A metadata event's name (`process_name`, `thread_name`).
    name: Option<Text>,
}

/// One entry of `traceEvents`, as far as reading needs it.
#[derive(Deserialize, Default)]
#[serde(expecting = "an event object")]
struct RawEvent {
    ph: Option<Text>,
    cat: Option<Text>,
    name: Option<Text>,
    pid: Option<Id>,
    tid: Option<Id>,
    ts: Option<Num>,
    dur: Option<Num>,
    args: Option<RawArgs>,
}

/// What kind of thing a complete event's category says it is.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Category {
    Kernel,
    Copy,
    Memset,
    Call,
    CpuOp,
    Annotation,
    /// Kineto's, but nothing the diagnosis reads (`gpu_user_annotation`,
    /// `cuda_sync`, `python_function`, ...).
    KinetoOther,
    /// Not Kineto's: maybe the course's own (its categories are its op
    /// kinds: "H2D", "kernel" is Kineto's too), maybe another tool's.
    Unknown,
}

fn category(cat: &str) -> Category {
    match cat {
        "kernel" | "Kernel" => Category::Kernel,
        "gpu_memcpy" | "Memcpy" => Category::Copy,
        "gpu_memset" | "Memset" => Category::Memset,
        "cuda_runtime" | "cuda_driver" | "Runtime" | "Driver" => Category::Call,
        "cpu_op" | "Operator" => Category::CpuOp,
        "user_annotation" => Category::Annotation,
        "gpu_user_annotation"
        | "cuda_sync"
        | "python_function"
        | "Trace"
        | "overhead"
        | "cpu_instant_event"
        | "external_correlation"
        | "cuda_profiler_range"
        | "ac2g"
        | "fwdbwd"
        | "Python"
        | "Memory"
        | "gpu_op" => Category::KinetoOther,
        _ => Category::Unknown,
    }
}

/// A complete event that is not Kineto's, kept until the end decides
/// whether the file is one of the course's.
struct CourseSpan {
    cat: String,
    name: String,
    pid: String,
    tid: String,
    start_us: f64,
    end_us: f64,
}

/// Collects what a trace holds as its events stream past.
#[derive(Default)]
struct Builder {
    trace: Trace,
    threads: HashMap<Thread, usize>,
    /// `traceEvents` entries seen so far.
    events: u64,
    in_events: bool,
    /// Top-level keys, in order (what an unknown format is told by).
    keys: Vec<String>,
    kineto_events: u64,
    course_spans: Vec<CourseSpan>,
    /// Categories of complete events that are not Kineto's (a few, for errors).
    other_categories: Vec<String>,
    process_names: HashMap<String, String>,
    thread_names: HashMap<(String, String), String>,
    /// GPU events with no correlation id: how many, and the first.
    uncorrelated: (u64, Option<String>),
    title: Option<String>,
    /// (GPU index, name) from Kineto's `deviceProperties`.
    device_names: Vec<(u32, String)>,
    /// Why reading stopped (a fault in the content, named in one line).
    error: Option<String>,
}

/// A name as a message quotes it: whole if short, else its start.
fn quoted(name: &str) -> String {
    if name.chars().count() <= 60 {
        format!("'{name}'")
    } else {
        format!("'{}...'", name.chars().take(57).collect::<String>())
    }
}

impl Builder {
    fn thread(&mut self, pid: &str, tid: &str) -> usize {
        let key = Thread { pid: pid.to_string(), tid: tid.to_string() };
        if let Some(&i) = self.threads.get(&key) {
            return i;
        }
        let i = self.trace.threads.len();
        self.trace.threads.push(key.clone());
        self.threads.insert(key, i);
        i
    }

    /// Takes one event of `traceEvents`; `Err` with why the trace is wrong.
    fn push(&mut self, ev: RawEvent) -> std::result::Result<(), String> {
        self.events += 1;
        let ph = ev.ph.as_ref().and_then(|t| t.0.as_deref()).unwrap_or("");
        let name = ev.name.and_then(|t| t.0).unwrap_or_default();
        let pid = ev.pid.map(|i| i.0).unwrap_or_default();
        let tid = ev.tid.map(|i| i.0).unwrap_or_default();
        if ph == "M" {
            let label = ev.args.and_then(|a| a.name).and_then(|t| t.0);
            match (name.as_str(), label) {
                ("process_name", Some(l)) => {
                    self.process_names.insert(pid, l);
                }
                ("thread_name", Some(l)) => {
                    self.thread_names.insert((pid, tid), l);
                }
                _ => {}
            }
            return Ok(());
        }
        if ph != "X" {
            return Ok(());
        }
        let cat_text = ev.cat.and_then(|t| t.0).unwrap_or_default();
        let mut cat = category(&cat_text);
        // The course's traces name their kernels' category "kernel" too,
        // but give them no device, stream or correlation.
        let bare = ev.args.as_ref().is_none_or(|a| a.device.is_none() && a.stream.is_none() && a.correlation.is_none());
        if cat == Category::Kernel && bare && cat_text == "kernel" {
            cat = Category::Unknown;
        }
        if cat == Category::KinetoOther {
            self.kineto_events += 1;
            return Ok(());
        }
        let event_no = self.events;
        let what = || {
            let about: Vec<String> =
                [(!cat_text.is_empty()).then(|| cat_text.clone()), (!name.is_empty()).then(|| quoted(&name))].into_iter().flatten().collect();
            if about.is_empty() {
                format!("event #{event_no}")
            } else {
                format!("event #{event_no} ({})", about.join(" "))
            }
        };
        let ts = match ev.ts.as_ref().map(|n| (n, n.value())) {
            None => return Err(format!("{} has no ts (start time)", what())),
            Some((_, Some(v))) if v.is_finite() => v,
            Some((n, _)) => return Err(format!("{} has a ts that is not a number ({n})", what())),
        };
        let dur = match ev.dur.as_ref().map(|n| (n, n.value())) {
            None => return Err(format!("{} at ts {ts} has no dur (duration)", what())),
            Some((_, Some(v))) if v.is_finite() => v,
            Some((n, _)) => return Err(format!("{} at ts {ts} has a dur that is not a number ({n})", what())),
        };
        if dur < 0.0 {
            return Err(format!("{} at ts {ts} has a negative duration ({dur} µs)", what()));
        }
        let args = ev.args.unwrap_or_default();
        let correlation = match args.correlation.as_ref().map(|n| n.value()) {
            None => None,
            Some(Some(c)) if c >= 0.0 && c.fract() == 0.0 => Some(c as u64),
            Some(_) => return Err(format!("{} at ts {ts} has a correlation id that is not a whole number", what())),
        };
        match cat {
            Category::Kernel | Category::Copy | Category::Memset => {
                self.kineto_events += 1;
                let kind = match cat {
                    Category::Kernel => GpuOpKind::Kernel,
                    Category::Memset => GpuOpKind::Memset,
                    _ => copy_kind_from_name(&name).unwrap_or(GpuOpKind::Copy { direction: Direction::Other, host: None }),
                };
                let pid_number = Id(pid.clone()).number();
                let gpu = match args.device.as_ref().or(args.in_device.as_ref()).map(|n| n.value()) {
                    Some(Some(d)) if d >= 0.0 && d.fract() == 0.0 && d < u32::MAX as f64 => d as u32,
                    Some(_) => return Err(format!("{} at ts {ts} has a device that is not a GPU index", what())),
                    None => match pid_number {
                        Some(p) if p < u32::MAX as u64 => p as u32,
                        _ => return Err(format!("{} at ts {ts} names no device (no args.device, and pid is not a GPU index)", what())),
                    },
                };
                let stream = match args.stream.as_ref().map(|n| n.value()) {
                    Some(Some(s)) if s >= 0.0 && s.fract() == 0.0 => s as u64,
                    Some(_) => return Err(format!("{} at ts {ts} has a stream that is not a stream number", what())),
                    None => match Id(tid.clone()).number() {
                        Some(s) => s,
                        None => return Err(format!("{} at ts {ts} names no stream (no args.stream, and tid is not a stream)", what())),
                    },
                };
                let bytes = match args.bytes.as_ref().map(|n| n.value()) {
                    None => None,
                    Some(Some(b)) if b >= 0.0 => Some(b as u64),
                    Some(_) => return Err(format!("{} at ts {ts} has bytes that are not a size", what())),
                };
                if correlation.is_none() {
                    self.uncorrelated.0 += 1;
                    if self.uncorrelated.1.is_none() {
                        self.uncorrelated.1 = Some(format!("{cat_text} {} at ts {ts}", quoted(&name)));
                    }
                }
                self.trace.gpu_ops.push(GpuOp { gpu, stream, kind, name, start_us: ts, end_us: ts + dur, correlation, bytes });
            }
            Category::Call => {
                self.kineto_events += 1;
                let thread = self.thread(&pid, &tid);
                self.trace.calls.push(Call { name, thread, start_us: ts, end_us: ts + dur, correlation });
            }
            Category::CpuOp | Category::Annotation => {
                self.kineto_events += 1;
                let thread = self.thread(&pid, &tid);
                // Older traces file the profiler's steps as CPU ops.
                let annotation = cat == Category::Annotation || name.starts_with("ProfilerStep#");
                self.trace.cpu_ops.push(CpuOp { name, thread, start_us: ts, end_us: ts + dur, annotation });
            }
            Category::KinetoOther => {}
            Category::Unknown => {
                if self.other_categories.len() < 6 && !self.other_categories.contains(&cat_text) {
                    self.other_categories.push(cat_text.clone());
                }
                self.course_spans.push(CourseSpan { cat: cat_text, name, pid, tid, start_us: ts, end_us: ts + dur });
            }
        }
        Ok(())
    }

    /// Decides what the file was and checks it is whole.
    fn finish(mut self) -> std::result::Result<Trace, String> {
        let kineto_keys = ["schemaVersion", "deviceProperties", "baseTimeNanoseconds", "traceName"];
        let kineto = self.kineto_events > 0 || self.keys.iter().any(|k| kineto_keys.contains(&k.as_str()));
        if kineto {
            self.trace.format = Some(TraceFormat::Kineto);
            let bare: Vec<&CourseSpan> = self.course_spans.iter().filter(|s| s.cat == "kernel").collect();
            if let Some(first) = bare.first() {
                return Err(format!(
                    "{} kernel events have no args (no device, stream or correlation; the first: {} at ts {})",
                    bare.len(),
                    quoted(&first.name),
                    first.start_us
                ));
            }
            self.check_kineto()?;
        } else if self.course_spans.is_empty() && self.events == 0 {
            return Err(if self.keys.iter().any(|k| k == "traceEvents") {
                "traceEvents is empty: the trace holds no events".into()
            } else {
                format!("JSON, but not a Chrome trace: it has no traceEvents (its keys: {})", self.keys.iter().take(8).cloned().collect::<Vec<_>>().join(", "))
            });
        } else {
            self.read_course_spans()?;
            self.trace.format = Some(TraceFormat::Course);
        }
        if self.trace.gpu_ops.is_empty() {
            return Err(match self.trace.format {
                Some(TraceFormat::Kineto) => format!(
                    "no GPU activity: {} events but no kernel, gpu_memcpy or gpu_memset (record with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])",
                    self.events
                ),
                _ => "no GPU activity: no span on a GPU stream".into(),
            });
        }
        self.trace.sort();
        Ok(self.trace)
    }

    /// A torch.profiler trace must tie every GPU op to the call that issued
    /// it, and hold the GPU work of every call that issued some.
    fn check_kineto(&mut self) -> std::result::Result<(), String> {
        if self.trace.gpu_ops.is_empty() {
            return Ok(());
        }
        let (n, first) = &self.uncorrelated;
        if *n > 0 {
            return Err(format!(
                "{n} of {} GPU events have no correlation id (the first: {}): their CUDA calls cannot be found",
                self.trace.gpu_ops.len(),
                first.as_deref().unwrap_or("?")
            ));
        }
        let with_work: HashSet<u64> = self.trace.gpu_ops.iter().filter_map(|o| o.correlation).collect();
        let launches = || self.trace.calls.iter().filter(|c| issues_gpu_work(&c.name) && c.correlation.is_some());
        // The last call whose work is in the trace: launches after it may
        // have been cut off by the end of the profiled window.
        let last_seen = launches().filter(|c| with_work.contains(&c.correlation.unwrap_or(0))).map(|c| c.start_us).fold(f64::NEG_INFINITY, f64::max);
        let missing: Vec<&Call> = launches().filter(|c| !with_work.contains(&c.correlation.unwrap_or(0)) && c.start_us < last_seen).collect();
        if let Some(c) = missing.iter().min_by(|a, b| a.start_us.total_cmp(&b.start_us)) {
            return Err(format!(
                "GPU work is missing: {} at ts {} (correlation {}) issued no GPU event, though later calls' work is there ({} like it; the profiler lost events: a full CUPTI buffer?)",
                c.name,
                c.start_us,
                c.correlation.unwrap_or(0),
                if missing.len() == 1 { "the only call".to_string() } else { format!("{} calls", missing.len()) }
            ));
        }
        for (id, name) in self.device_names.drain(..) {
            self.trace.gpu_names.push((id, name));
        }
        Ok(())
    }

    /// The course's own trace: spans on "stream N" lanes (after "GPU g · "
    /// where it spans several GPUs) are GPU work; its categories are its op
    /// kinds.
    fn read_course_spans(&mut self) -> std::result::Result<(), String> {
        let mut on_streams = 0;
        for s in std::mem::take(&mut self.course_spans) {
            let lane = self.thread_names.get(&(s.pid.clone(), s.tid.clone())).cloned().unwrap_or_default();
            let Some((gpu, stream)) = course_lane(&lane) else { continue };
            let kind = match copy_kind_from_name(&s.name) {
                Some(k) => k,
                None => match s.cat.as_str() {
                    "kernel" | "all-reduce" => GpuOpKind::Kernel,
                    "H2D" => GpuOpKind::Copy { direction: Direction::H2d, host: None },
                    "D2H" => GpuOpKind::Copy { direction: Direction::D2h, host: None },
                    "D2D" => GpuOpKind::Copy { direction: Direction::D2d, host: None },
                    "peer" => GpuOpKind::Copy { direction: Direction::Peer, host: None },
                    // Host functions, stream-ordered allocations: on a
                    // stream, but not work of the GPU's engines.
                    _ => continue,
                },
            };
            on_streams += 1;
            self.trace.gpu_ops.push(GpuOp { gpu, stream, kind, name: s.name, start_us: s.start_us, end_us: s.end_us, correlation: None, bytes: None });
        }
        if on_streams == 0 {
            let lanes: HashSet<&String> = self.thread_names.values().collect();
            let is_course = self.title.is_some() && !lanes.is_empty();
            return Err(if is_course {
                let mut l: Vec<&&String> = lanes.iter().collect();
                l.sort();
                format!(
                    "no GPU activity on streams: an overlap-lab timeline whose lanes are {} (a timeline inside one kernel?)",
                    l.iter().take(4).map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                )
            } else if self.other_categories.is_empty() {
                format!("not a torch.profiler or overlap-lab trace: {} events, none of them GPU work this reads", self.events)
            } else {
                format!(
                    "not a torch.profiler or overlap-lab trace (another profiler's?): no kernel, gpu_memcpy or cuda_runtime events; its categories: {}",
                    self.other_categories.join(", ")
                )
            });
        }
        // "GPU 0 (NVIDIA H200)": the GPU's name in parentheses.
        for name in self.process_names.values() {
            if let Some(inner) = name.split_once('(').and_then(|(_, r)| r.rsplit_once(')')).map(|(n, _)| n.trim().to_string()) {
                for gpu in self.trace.gpus() {
                    self.trace.gpu_names.push((gpu, inner.clone()));
                }
                break;
            }
        }
        Ok(())
    }
}

/// Whether a CUDA call issues GPU work (a kernel, a copy or a memset) that
/// the trace records under its correlation id.
pub fn issues_gpu_work(call: &str) -> bool {
    [
        "cudaLaunchKernel",
        "cuLaunchKernel",
        "cudaLaunchCooperativeKernel",
        "cudaMemcpy",
        "cudaMemset",
        "cuMemcpy",
        "cuMemset",
        "cudaGraphLaunch",
        "cuGraphLaunch",
    ]
    .iter()
    .any(|p| call.starts_with(p))
}

/// A course lane's GPU and stream: "stream 2", "stream 1: copy",
/// "GPU 1 · stream 0"; `None` for CPU threads and warps.
fn course_lane(lane: &str) -> Option<(u32, u64)> {
    let (gpu, rest) = match lane.strip_prefix("GPU ") {
        Some(r) => {
            let (g, rest) = r.split_once(" · ")?;
            (g.trim().parse().ok()?, rest)
        }
        None => (0, lane),
    };
    let number = rest.strip_prefix("stream ")?;
    let digits: String = number.chars().take_while(|c| c.is_ascii_digit()).collect();
    Some((gpu, digits.parse().ok()?))
}

/// The top-level JSON value of a trace: an object with `traceEvents`, or
/// (Chrome's array form) the events themselves.
struct TopLevel<'b> {
    builder: &'b mut Builder,
}

impl<'de> DeserializeSeed<'de> for TopLevel<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TopLevel<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a trace object with traceEvents, or a list of events")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "traceEvents" => {
                    self.builder.in_events = true;
                    map.next_value_seed(Events { builder: &mut *self.builder })?;
                    self.builder.in_events = false;
                }
                "deviceProperties" => {
                    let v: serde_json::Value = map.next_value()?;
                    for d in v.as_array().into_iter().flatten() {
                        if let (Some(id), Some(name)) = (d.get("id").and_then(|i| i.as_u64()), d.get("name").and_then(|n| n.as_str())) {
                            self.builder.device_names.push((id as u32, name.to_string()));
                        }
                    }
                }
                "otherData" => {
                    let v: serde_json::Value = map.next_value()?;
                    self.builder.title = v.get("title").and_then(|t| t.as_str()).map(String::from);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            self.builder.keys.push(key);
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<(), A::Error> {
        self.builder.in_events = true;
        self.builder.keys.push("traceEvents".into());
        Events { builder: &mut *self.builder }.visit_seq(seq)?;
        self.builder.in_events = false;
        Ok(())
    }
}

/// The `traceEvents` list, each event taken by the builder as it is read.
struct Events<'b> {
    builder: &'b mut Builder,
}

impl<'de> DeserializeSeed<'de> for Events<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Events<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("traceEvents to be a list of events")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        while let Some(ev) = seq.next_element::<RawEvent>()? {
            if let Err(why) = self.builder.push(ev) {
                self.builder.error = Some(why);
                return Err(de::Error::custom("stopped"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::events::{HostMemory, Thread};

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

    #[test]
    fn course_lanes_name_their_gpu_and_stream() {
        assert_eq!(course_lane("stream 2"), Some((0, 2)));
        assert_eq!(course_lane("stream 1: copy"), Some((0, 1)));
        assert_eq!(course_lane("GPU 1 · stream 10: compute"), Some((1, 10)));
        assert_eq!(course_lane("CPU main"), None);
        assert_eq!(course_lane("warp 3"), None);
    }

    #[test]
    fn numbers_and_ids_read_as_traces_write_them() {
        assert_eq!(Id("stream 7".into()).number(), Some(7));
        assert_eq!(Id("7".into()).number(), Some(7));
        assert_eq!(Id("Spans".into()).number(), None);
        assert_eq!(serde_json::from_str::<Num>("\"N/A\"").unwrap().value(), None);
        assert_eq!(serde_json::from_str::<Num>("12.5").unwrap().value(), Some(12.5));
        assert_eq!(serde_json::from_str::<Num>("[1, 2]").unwrap(), Num::Other);
    }

    #[test]
    fn calls_that_issue_gpu_work_are_known_by_name() {
        for c in ["cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaMemcpyAsync", "cudaMemcpy", "cudaMemsetAsync", "cudaGraphLaunch"] {
            assert!(issues_gpu_work(c), "{c}");
        }
        for c in ["cudaStreamSynchronize", "cudaEventRecord", "cudaStreamWaitEvent", "cudaMalloc", "cudaFree"] {
            assert!(!issues_gpu_work(c), "{c}");
        }
    }
}
