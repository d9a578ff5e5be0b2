//! torch.profiler's format, as its events stream past: each event of
//! `traceEvents` is taken as it is read ([`Builder::push`]), kept if it is
//! GPU work, a CUDA call or a CPU op, and dropped otherwise; at the end
//! ([`Builder::finish`]) the file is told a torch.profiler trace or one of
//! the course's (whose events `course` reads), and a torch.profiler trace
//! is checked whole: every GPU op tied to its call, and no call's GPU work
//! lost.
//!
//! Kineto's format, as `libkineto/src/output_json.cpp` and
//! `CuptiActivity.cpp` write it: a JSON object with `schemaVersion`,
//! `deviceProperties` (each GPU's `id` and `name`), `distributedInfo` (a
//! distributed run's `rank` and `world_size`), `displayTimeUnit`,
//! `baseTimeNanoseconds` and `traceEvents`. Each complete event (`"ph":
//! "X"`) has `cat`, `name`, `pid`, `tid`, `ts` and `dur` in µs, and `args`:
//! a kernel's, copy's or memset's hold `device`, `stream` and
//! `correlation` (a copy's also `bytes` and `memory bandwidth (GB/s)`, an
//! NCCL kernel's its message: `In msg nelems` and `dtype`), a
//! `cuda_runtime` or `cuda_driver` call's `cbid` and `correlation`. GPU
//! events sit on `pid` = device, `tid` = stream. Traces of PyTorch 1.8-1.10
//! name the categories `Kernel`, `Memcpy`, `Memset`, `Runtime` and
//! `Operator`; they read the same.
//!
//! A trace recorded with `enable_cuda_sync_events=True` also holds CUPTI's
//! synchronizations (`"cat": "cuda_sync"`, named "Stream Wait Event",
//! "Event Sync", "Stream Sync", "Context Sync") on the GPU's lanes, with a
//! duration: they are counted and their stream waits kept
//! ([`super::events::StreamWait`]: args `stream`, `correlation`,
//! `wait_on_stream`, `wait_on_cuda_event_record_corr_id`,
//! `wait_on_cuda_event_id`), never taken as
//! GPU work. Some Kineto versions write each event record too (`"cat":
//! "cuda_event"`, args `stream` and `correlation`). Their values are read
//! leniently: a value missing, not a whole number, or -1 (unknown) leaves
//! the wait (or the record) out, and never fails the trace.
//!
//! May use: `events`, `queries` (which calls issue GPU work), `raw` (an
//! event as the JSON writes it), `course` (the events that are not
//! Kineto's).

use super::course::{CourseParts, CourseSpan};
use super::events::{copy_kind_from_name, Call, CpuOp, Direction, EventRecord, GpuOp, GpuOpKind, StreamWait, Thread, Trace, TraceFormat};
use super::queries::issues_gpu_work;
use super::raw::{Id, Num, RawArgs, RawEvent};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::collections::{HashMap, HashSet};
use std::fmt;

/// What kind of thing a complete event's category says it is.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Category {
    Kernel,
    Copy,
    Memset,
    Call,
    CpuOp,
    Annotation,
    /// A CUDA synchronization CUPTI recorded (`cuda_sync`): not GPU work.
    Sync,
    /// An event recorded on a stream (`cuda_event`): not GPU work.
    EventRecord,
    /// Kineto's, but nothing the diagnosis reads (`gpu_user_annotation`,
    /// `python_function`, ...).
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
        "cuda_sync" => Category::Sync,
        "cuda_event" => Category::EventRecord,
        "gpu_user_annotation"
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

/// Collects what a trace holds as its events stream past.
#[derive(Default)]
pub(super) struct Builder {
    trace: Trace,
    threads: HashMap<Thread, usize>,
    /// `traceEvents` entries seen so far.
    pub(super) events: u64,
    /// Whether reading is inside `traceEvents` (for where an error is).
    pub(super) in_events: bool,
    /// Top-level keys, in order (what an unknown format is told by).
    keys: Vec<String>,
    kineto_events: u64,
    /// The events that are not Kineto's, with what tells a course timeline.
    course: CourseParts,
    /// GPU events with no correlation id: how many, and the first.
    uncorrelated: (u64, Option<String>),
    /// (GPU index, name) from Kineto's `deviceProperties`.
    device_names: Vec<(u32, String)>,
    /// Why reading stopped (a fault in the content, named in one line).
    pub(super) error: Option<String>,
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
                    self.course.process_names.insert(pid, l);
                }
                ("thread_name", Some(l)) => {
                    self.course.thread_names.insert((pid, tid), l);
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
        if matches!(cat, Category::Sync | Category::EventRecord) {
            self.kineto_events += 1;
            self.sync_event(cat, &name, &pid, &tid, ev.args.unwrap_or_default());
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
                    // An NCCL kernel's message: its elements times their size.
                    None => {
                        let elements = args.in_msg_nelems.as_ref().and_then(|n| n.value()).filter(|n| *n >= 0.0);
                        elements.zip(args.dtype.as_ref().and_then(|d| element_bytes(d.0.as_deref()?))).map(|(n, b)| n as u64 * b)
                    }
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
            Category::KinetoOther | Category::Sync | Category::EventRecord => {}
            Category::Unknown => {
                if self.course.other_categories.len() < 6 && !self.course.other_categories.contains(&cat_text) {
                    self.course.other_categories.push(cat_text.clone());
                }
                self.course.spans.push(CourseSpan { cat: cat_text, name, pid, tid, start_us: ts, end_us: ts + dur });
            }
        }
        Ok(())
    }

    /// Keeps what a CUDA sync event (`cuda_sync`) or an event record
    /// (`cuda_event`) says of the streams: a "Stream Wait Event" whose GPU,
    /// waiting stream and call are known becomes a [`StreamWait`], a record
    /// whose GPU, stream and call are known an [`EventRecord`]. Anything
    /// else they hold is left out, never an error: they are not GPU work,
    /// and the trace reads whole without them.
    fn sync_event(&mut self, cat: Category, name: &str, pid: &str, tid: &str, args: RawArgs) {
        if cat == Category::Sync {
            self.trace.sync_events += 1;
        }
        let gpu = match args.device.as_ref() {
            Some(d) => known(Some(d)),
            None => Id(pid.to_string()).number(),
        }
        .and_then(|g| u32::try_from(g).ok());
        let stream = match args.stream.as_ref() {
            Some(s) => known(Some(s)),
            None => Id(tid.to_string()).number(),
        };
        let (Some(gpu), Some(stream), Some(correlation)) = (gpu, stream, known(args.correlation.as_ref())) else { return };
        if cat == Category::EventRecord {
            self.trace.event_records.push(EventRecord { gpu, stream, correlation });
        } else if name == "Stream Wait Event" {
            self.trace.stream_waits.push(StreamWait {
                gpu,
                stream,
                call_correlation: correlation,
                recorded_stream: known(args.wait_on_stream.as_ref()),
                record_correlation: known(args.wait_on_cuda_event_record_corr_id.as_ref()),
                event_id: known(args.wait_on_cuda_event_id.as_ref()),
            });
        }
    }

    /// Decides what the file was and checks it is whole.
    pub(super) fn finish(mut self) -> std::result::Result<Trace, String> {
        let kineto_keys = ["schemaVersion", "deviceProperties", "baseTimeNanoseconds", "traceName"];
        let kineto = self.kineto_events > 0 || self.keys.iter().any(|k| kineto_keys.contains(&k.as_str()));
        if kineto {
            let ours = self.keys.iter().any(|k| k == "overlap_lab");
            self.trace.format = Some(if ours { TraceFormat::OverlapLabTrace } else { TraceFormat::Kineto });
            let bare: Vec<&CourseSpan> = self.course.spans.iter().filter(|s| s.cat == "kernel").collect();
            if let Some(first) = bare.first() {
                return Err(format!(
                    "{} kernel events have no args (no device, stream or correlation; the first: {} at ts {})",
                    bare.len(),
                    quoted(&first.name),
                    first.start_us
                ));
            }
            self.check_kineto()?;
        } else if self.course.spans.is_empty() && self.events == 0 {
            return Err(if self.keys.iter().any(|k| k == "traceEvents") {
                "traceEvents is empty: the trace holds no events".into()
            } else {
                format!("JSON, but not a Chrome trace: it has no traceEvents (its keys: {})", self.keys.iter().take(8).cloned().collect::<Vec<_>>().join(", "))
            });
        } else {
            self.course.read_into(&mut self.trace, self.events)?;
            self.trace.format = Some(TraceFormat::Course);
        }
        if self.trace.gpu_ops.is_empty() {
            return Err(match self.trace.format {
                Some(TraceFormat::OverlapLabTrace) => {
                    format!("no GPU activity: {} events but no kernel, copy or memset (the traced program ran no GPU work)", self.events)
                }
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
        // A known fault of the profiler (pytorch/pytorch#188481): after
        // several profiler sessions in one process, Kineto can write a
        // session's CUDA events with no time at all ("ts": 0, "dur": 0)
        // while its CPU ops keep theirs. Such a trace has no timeline to read.
        let unstamped = |start: f64, end: f64| start == 0.0 && end == 0.0;
        let gpu_unstamped = self.trace.gpu_ops.iter().filter(|o| unstamped(o.start_us, o.end_us)).count();
        if gpu_unstamped > 0 {
            let calls = self.trace.calls.iter().filter(|c| unstamped(c.start_us, c.end_us)).count();
            return Err(format!(
                "{gpu_unstamped} of {} GPU events (and {calls} of {} CUDA calls) have no time (\"ts\": 0, \"dur\": 0): the profiler lost their times \
                 (a known fault after several profiler sessions in one process, pytorch/pytorch#188481): trace the program again, in a fresh process",
                self.trace.gpu_ops.len(),
                self.trace.calls.len()
            ));
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
        // A launch into a stream being captured (between a
        // `cudaStreamBeginCapture` and its `cudaStreamEndCapture`) makes a
        // graph's node, not GPU work: the graph's launch runs it. Any
        // thread of the process may launch into it (autograd's backward
        // thread, in a captured training step).
        let capturing = capture_windows(&self.trace);
        let process = |c: &Call| self.trace.threads.get(c.thread).map(|t| t.pid.as_str());
        let captured = |c: &Call| capturing.iter().any(|(pid, from, to)| process(c) == Some(pid.as_str()) && c.start_us >= *from && c.start_us <= *to);
        let launches = || self.trace.calls.iter().filter(|c| issues_gpu_work(&c.name) && c.correlation.is_some() && !captured(c));
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
}

/// Each stretch in which a process captured a stream into a CUDA graph:
/// (its pid, from a thread's `cudaStreamBeginCapture`'s start to that
/// thread's `cudaStreamEndCapture`'s end), µs. A capture the trace does not
/// see end lasts to the trace's end.
fn capture_windows(trace: &Trace) -> Vec<(String, f64, f64)> {
    let mut in_order: Vec<&Call> = trace.calls.iter().collect();
    in_order.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
    let pid = |thread: usize| trace.threads.get(thread).map_or(String::new(), |t| t.pid.clone());
    let mut open: Vec<(usize, f64)> = Vec::new();
    let mut windows = Vec::new();
    for c in in_order {
        if c.name.starts_with("cudaStreamBeginCapture") || c.name.starts_with("cuStreamBeginCapture") {
            open.push((c.thread, c.start_us));
        } else if c.name.starts_with("cudaStreamEndCapture") || c.name.starts_with("cuStreamEndCapture") {
            if let Some(i) = open.iter().position(|&(t, _)| t == c.thread) {
                let (_, from) = open.remove(i);
                windows.push((pid(c.thread), from, c.end_us));
            }
        }
    }
    windows.extend(open.into_iter().map(|(thread, from)| (pid(thread), from, f64::INFINITY)));
    windows
}

/// A sync event's id (a stream, a correlation id, a device) where it is
/// one: a whole number, not negative (-1 is Kineto's "unknown"), written as
/// a number or as text.
fn known(n: Option<&Num>) -> Option<u64> {
    n.and_then(Num::value).filter(|v| v.is_finite() && *v >= 0.0 && v.fract() == 0.0 && *v < 9e15).map(|v| v as u64)
}

/// The top-level JSON value of a trace: an object with `traceEvents`, or
/// (Chrome's array form) the events themselves.
pub(super) struct TopLevel<'b> {
    pub(super) builder: &'b mut Builder,
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
                "distributedInfo" => {
                    let v: serde_json::Value = map.next_value()?;
                    let field = |k: &str| v.get(k).and_then(|x| x.as_u64()).and_then(|x| u32::try_from(x).ok());
                    if let (Some(rank), Some(world_size)) = (field("rank"), field("world_size")) {
                        self.builder.trace.distributed = Some(super::events::Distributed { rank, world_size });
                    }
                }
                "otherData" => {
                    let v: serde_json::Value = map.next_value()?;
                    self.builder.course.title = v.get("title").and_then(|t| t.as_str()).map(String::from);
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

/// The size of one element of a collective's type as PyTorch names it in
/// an NCCL kernel's `dtype`; none for a type not listed.
fn element_bytes(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "Double" | "Long" | "ComplexFloat" => 8,
        "Float" | "Int" | "ComplexHalf" => 4,
        "Half" | "BFloat16" | "Short" => 2,
        "Byte" | "Char" | "Bool" | "Float8_e4m3fn" | "Float8_e5m2" => 1,
        _ => return None,
    })
}
