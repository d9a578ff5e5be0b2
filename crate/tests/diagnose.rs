//! `overlap-lab diagnose` on SYNTHETIC torch.profiler traces of the five
//! programs of lab 10 and of a loop whose CPU builds each batch (built by
//! `synthetic_traces`, with known answers; no GPU ran them), on a lab's own
//! timeline, on the committed traces, and on malformed traces: every
//! figure, finding and idle cause the diagnosis reports, and one line for
//! each bad file.

use overlap_lab::labs::pytorch_trace::fixture as synthetic_traces;

use overlap_lab::diagnose::{diagnose, read_trace};
use overlap_lab::diagnose::{Cause, Diagnosis, IdleCause};
use std::path::{Path, PathBuf};
use std::process::Command;
use synthetic_traces::Synthetic;

fn bin() -> String {
    std::env::var("OVERLAP_LAB_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_overlap-lab").to_string())
}

fn cli(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin()).args(args).output().expect("binary runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// The diagnosis of a synthetic trace, its known figures checked
/// (`assert_known_figures`).
fn diagnosed(s: &Synthetic) -> Diagnosis {
    let dir = overlap_lab::testing::temp_dir("diagnose-synthetic");
    let path = s.write(&dir);
    let trace = read_trace(&path, &mut |_, _| {}).unwrap_or_else(|e| panic!("{}: {e}", s.file));
    let d = diagnose(&trace, s.file, &[]);
    assert_known_figures(s, &d);
    d
}

/// Equal up to the ns the trace's times are written in, over a sum of many.
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1.0) + 1e-3
}

/// The figures every synthetic trace knows: window, busy and idle, each
/// copy kind, the sync calls and what they cost.
fn assert_known_figures(s: &Synthetic, d: &Diagnosis) {
    let k = &s.known;
    assert!(close(d.window.start_us, k.window.0) && close(d.window.end_us, k.window.1), "{}: window {:?} against {:?}", s.file, d.window, k.window);
    assert_eq!(d.gpus.len(), 1, "{}", s.file);
    let g = &d.gpus[0];
    assert_eq!(g.name.as_deref(), Some(synthetic_traces::GPU_NAME));
    assert!(close(g.busy_us, k.busy_us), "{}: busy {} against {}", s.file, g.busy_us, k.busy_us);
    assert!(close(g.idle_us, k.window.1 - k.window.0 - k.busy_us), "{}: idle {}", s.file, g.idle_us);
    let mut copies: Vec<(String, usize, u64, f64, f64)> =
        g.copies.iter().map(|c| (c.label(), c.count, c.bytes.unwrap_or(0), c.time_us, c.exposed_us)).collect();
    copies.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(copies.len(), k.copies.len(), "{}: {copies:?} against {:?}", s.file, k.copies);
    for (got, want) in copies.iter().zip(&k.copies) {
        assert_eq!((&got.0, got.1, got.2), (&want.0, want.1, want.2), "{}", s.file);
        assert!(close(got.3, want.3) && close(got.4, want.4), "{}: {got:?} against {want:?}", s.file);
    }
    assert_eq!(d.syncs.calls, k.sync_calls, "{}", s.file);
    assert!(close(d.syncs.cost_us, k.sync_idle_us), "{}: syncs cost {} against {}", s.file, d.syncs.cost_us, k.sync_idle_us);
    let issue: f64 = d.findings.iter().filter(|f| f.cause == Cause::IssueBound).map(|f| f.cost_us).sum();
    assert!(close(issue, k.issue_idle_us), "{}: issue-bound {issue} against {}", s.file, k.issue_idle_us);
    assert_idle_adds_up(s.file, d);
    let host: f64 = g.idle_causes.iter().filter(|c| c.cause == IdleCause::HostWork).map(|c| c.idle_us).sum();
    assert!(close(host, k.host_work_idle_us), "{}: host work {host} against {}", s.file, k.host_work_idle_us);
    for f in &d.findings {
        assert!(f.cost_us > 0.0 && !f.text.is_empty(), "{}: {f:?}", s.file);
    }
    assert!(d.findings.windows(2).all(|w| w[0].cost_us >= w[1].cost_us), "{}: findings largest first", s.file);
    assert!(!d.findings.iter().any(|f| f.call.name.ends_with("cudaDeviceSynchronize")), "{}: the final sync costs nothing", s.file);
}

/// Each GPU's idle time put down to causes: every share at least 0, the
/// unattributed one there and last, and all of them adding up to the idle
/// time (to the float rounding of a sum of many).
fn assert_idle_adds_up(file: &str, d: &Diagnosis) {
    for g in &d.gpus {
        let shares = &g.idle_causes;
        assert_eq!(shares.last().map(|s| s.cause), Some(IdleCause::Unattributed), "{file}: {shares:?}");
        assert!(shares.iter().all(|s| s.idle_us >= 0.0), "{file}: {shares:?}");
        let sum: f64 = shares.iter().map(|s| s.idle_us).sum();
        assert!((sum - g.idle_us).abs() <= 1e-9 * d.window.duration_us().max(1.0), "{file}: the causes add up to {sum} µs, the idle time is {} µs", g.idle_us);
    }
}

#[test]
fn synthetic_host_prepared_batches_name_the_hosts_own_work_with_its_cpu_ops() {
    let s = synthetic_traces::host_prepared_batches(20);
    let d = diagnosed(&s);
    let g = &d.gpus[0];
    let largest = &g.idle_causes[0];
    assert_eq!(largest.cause, IdleCause::HostWork, "{:?}", g.idle_causes);
    // 19 stretches from a kernel's end (448.138 µs into a step: a 79.138 µs
    // copy of 4 MiB at 53 GB/s from 1468, 1 µs, a 400 µs kernel, as the
    // trace writes them) to the next copy (1468 µs into the next step):
    // 1019.862 µs each.
    assert_eq!(largest.stretches, 19);
    assert!(close(largest.idle_us, 19.0 * 1019.862) && close(largest.idle_us, s.known.host_work_idle_us), "{}", largest.idle_us);
    assert!(largest.idle_us > 0.9 * g.idle_us, "{:?}", g.idle_causes);
    // Behind it, the CPU's time in each op of the batch while the GPU idled:
    // aten::randn from the kernel's end to its own (1000 - 448.138 µs), all
    // of aten::mul's 450 µs.
    let behind: Vec<(&str, f64)> = largest.behind.iter().map(|b| (b.name.as_str(), b.idle_us)).collect();
    assert_eq!(behind.len(), 2, "{behind:?}");
    assert!(behind[0].0 == "aten::randn" && close(behind[0].1, 19.0 * 551.862), "{behind:?}");
    assert!(behind[1].0 == "aten::mul" && close(behind[1].1, 19.0 * 450.0), "{behind:?}");
    // The largest finding too, named by the upload the GPU waited for.
    let f = &d.findings[0];
    assert_eq!((f.cause, f.count, f.call.name.as_str()), (Cause::HostWork, 19, "aten::to > cudaMemcpyAsync"));
    assert!(close(f.cost_us, largest.idle_us), "{f:?}");
    assert!(f.text.contains("while the CPU ran the program's own work") && f.text.contains("aten::randn 10.49 ms, aten::mul 8.55 ms"), "{}", f.text);
    // The copy-to-kernel gaps are the only others: 1 µs each.
    let rest: Vec<(IdleCause, usize)> = g.idle_causes[1..].iter().map(|c| (c.cause, c.stretches)).collect();
    assert_eq!(rest, [(IdleCause::KernelGaps, 20), (IdleCause::Unattributed, 0)]);
}

#[test]
fn the_idle_attribution_prints_as_a_table_and_serializes() {
    let dir = overlap_lab::testing::temp_dir("diagnose-idle-cli");
    let path = synthetic_traces::host_prepared_batches(5).write(&dir);
    let (code, out, err) = cli(&["diagnose", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let table: Vec<&str> = out.lines().skip_while(|l| !l.contains("idle, each stretch put down to one cause")).take(5).collect();
    assert_eq!(table.len(), 5, "no idle table:\n{out}");
    // 4 stretches of 1019.862 µs, of 4084.448 µs idle; 5 gaps of 1 µs.
    assert!(table[2].starts_with("  the host's own work") && table[2].contains("4.08 ms  99.9%  aten::randn (2.21 ms); aten::mul (1.80 ms)"), "{}", table[2]);
    assert!(table[3].starts_with("  gaps between ops") && table[3].contains("5.0 µs   0.1%  back-to-back ops on stream 7 (5.0 µs)"), "{}", table[3]);
    assert!(table[4].starts_with("  unattributed") && table[4].ends_with("0.0%  -"), "{}", table[4]);
    let (code, out, err) = cli(&["diagnose", "--json", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON alone");
    let first = &v["gpus"][0]["idle_causes"][0];
    assert_eq!((first["cause"].as_str(), first["stretches"].as_u64(), first["behind"][0]["name"].as_str()), (Some("host-work"), Some(4), Some("aten::randn")));
    assert_eq!(v["gpus"][0]["idle_causes"][2]["cause"], "unattributed");
    let kinds = &v["gpus"][0]["streams"][0]["idle_kinds"];
    assert!((kinds["host_wait_us"].as_f64().unwrap() - 4.0 * 1019.862).abs() < 1e-6 && kinds["kernel_wait_us"].as_f64() == Some(5.0), "{kinds}");
}

/// Every committed trace and every synthetic one: the idle causes add up
/// to each GPU's idle time, with at most 5% of it left unattributed on the
/// committed programs; each program's largest cause is the one it earns.
#[test]
fn every_idle_stretch_of_every_trace_is_put_down_to_one_cause() {
    for s in synthetic_traces::all() {
        assert_idle_adds_up(s.file, &diagnosed(&s));
    }
    let recordings = overlap_lab::labs::pytorch_trace::Recording::find(&overlap_lab::measure::record::repo_root().join("data")).unwrap();
    assert!(!recordings.is_empty(), "no data/*/pytorch-trace/programs.json");
    for rec in &recordings {
        for name in rec.names() {
            let path = rec.trace_path(name).unwrap();
            let file = path.display().to_string();
            let d = diagnose(&read_trace(&path, &mut |_, _| {}).unwrap(), &file, &[]);
            assert_idle_adds_up(&file, &d);
            let g = &d.gpus[0];
            let share = |c: IdleCause| g.idle_causes.iter().find(|s| s.cause == c).map_or(0.0, |s| s.idle_us) / g.idle_us;
            println!(
                "{file}: idle {:.1} µs: {}",
                g.idle_us,
                g.idle_causes.iter().map(|s| format!("{:?} {:.1}%", s.cause, 100.0 * s.idle_us / g.idle_us)).collect::<Vec<_>>().join(", ")
            );
            assert!(share(IdleCause::Unattributed) <= 0.05, "{file}: {:?}", g.idle_causes);
            let largest = g.idle_causes[0].cause;
            let window = d.window.end_us - d.window.start_us;
            // After a blocking copy or a read, the GPU waits for the CPU: in
            // the sync where it began before the GPU drained, else in the
            // ops that launch the next step. Where the CPU builds the
            // batches or reads the results, on its own work.
            let earned: &[IdleCause] = match name {
                "pageable_then_compute" => &[IdleCause::Sync, IdleCause::WaitingForLaunches],
                "sync_read_in_loop" => &[IdleCause::Sync],
                "tiny_ops" | "tiny_ops_streams" | "training_loop_workers_pinned" => &[IdleCause::WaitingForLaunches],
                "cpu_prepared_batches" | "training_loop" | "results_cpu_each_step" => &[IdleCause::HostWork],
                // Reading each result a step late while the next step
                // runs, the loop is bound by its GPU (its step sized to
                // outlast the read and the launches): only the gaps
                // between back-to-back kernels are left.
                // Fed by four workers, the loop is bound by its own thread on
                // one host and by the GPU on another (its step back to back).
                "dataloader_workers_pinned" => &[IdleCause::HostWork, IdleCause::KernelGaps],
                // A graph's kernels run back to back, unless the traced
                // graph launch takes longer than its work (above).
                n if n.ends_with("_graph") => &[IdleCause::KernelGaps, IdleCause::WaitingForLaunches],
                _ => &[IdleCause::KernelGaps],
            };
            assert!(earned.contains(&largest), "{file}: the largest cause is not one of {earned:?}: {:?}", g.idle_causes);
            let host_work_us = share(IdleCause::HostWork) * g.idle_us;
            if ["cpu_prepared_batches", "training_loop"].contains(&name) {
                assert!(host_work_us > 0.5 * window, "{file}: the GPU waits on the batches' building most of the window: {:?}", g.idle_causes);
            } else if name != "results_cpu_each_step" && !["training_loop_workers_pinned", "dataloader_workers_pinned"].contains(&name) {
                // Reading each result as it comes, or a loop fed by workers (its own
                // thread takes each batch over from the loader, untraced
                // code, and bounds it on a host where that is slow),
                // leaves some; no other program waits on its host long
                // enough for a fix to be suggested.
                assert!(host_work_us < 0.1 * window, "{file}: {:?}", g.idle_causes);
            }
        }
    }
}

#[test]
fn synthetic_pageable_to_names_the_pageable_copies_and_the_sync_inside_to() {
    let s = synthetic_traces::pageable_to_then_compute(20);
    let d = diagnosed(&s);
    let first = &d.findings[0];
    assert_eq!(first.cause, Cause::PageableCopies);
    assert_eq!(first.call.name, "aten::to > aten::_to_copy > aten::copy_ > cudaMemcpyAsync");
    assert!(first.call.correlation.is_some() && first.count == 20);
    assert!(close(first.cost_us, s.known.copies[0].4), "every pageable copy is exposed: {}", first.cost_us);
    assert!(first.text.contains("20 H2D copies from pageable memory, 1.2 GiB, at 20.0 GB/s"), "{}", first.text);
    let sync = d.findings.iter().find(|f| f.cause == Cause::Sync).expect("the sync inside .to() is named");
    assert_eq!(sync.call.name, "aten::to > aten::_to_copy > aten::copy_ > cudaStreamSynchronize");
    // 18 µs a step, to the ns each op's time is written in.
    assert!(close(sync.cost_us, s.known.sync_idle_us) && (sync.cost_us - 18.0 * 20.0).abs() < 20.0 * 1e-3, "{}", sync.cost_us);
    let stream = &d.gpus[0].streams[0];
    assert!(stream.stream == 7 && stream.legacy_default, "{stream:?}");
    assert!(d.findings.iter().all(|f| f.cause != Cause::IssueBound));
}

#[test]
fn synthetic_pinned_one_stream_blames_the_shared_stream_and_no_sync() {
    let s = synthetic_traces::pinned_one_stream(20);
    let d = diagnosed(&s);
    let f = &d.findings[0];
    assert_eq!(f.cause, Cause::CopiesShareStreamWithKernels);
    assert!(f.text.contains("20 of 20 copies on stream 7 (the legacy default stream)"), "{}", f.text);
    assert!(close(f.cost_us, s.known.copies[0].3), "a copy on the kernels' stream hides nothing: {}", f.cost_us);
    assert_eq!((d.syncs.calls, d.syncs.costly), (1, 0));
    assert!(d.findings.iter().all(|f| !matches!(f.cause, Cause::Sync | Cause::PageableCopies)), "{:?}", d.findings);
}

#[test]
fn synthetic_double_buffered_copies_hide_and_its_waits_cost_nothing() {
    let s = synthetic_traces::double_buffered(20, false);
    let d = diagnosed(&s);
    let c = &d.gpus[0].copies[0];
    // Only the first batch's copy, with no kernel yet to hide under, shows.
    assert!(close(c.hidden_us, c.time_us * 19.0 / 20.0), "{c:?}");
    assert_eq!((d.syncs.calls, d.syncs.costly), (20, 0), "the event waits run while the compute stream is busy");
    assert!(d.findings.iter().all(|f| f.cause != Cause::Sync), "{:?}", d.findings);
    let f = &d.findings[0];
    assert!(f.cause == Cause::ExposedCopies && f.count == 1 && close(f.cost_us, c.time_us / 20.0), "{f:?}");
    assert!(f.text.contains("1 of 20 copies on stream 13") && f.text.contains("the pipeline's fill"), "{}", f.text);
    let streams: Vec<(u64, bool)> = d.gpus[0].streams.iter().map(|s| (s.stream, s.legacy_default)).collect();
    assert_eq!(streams, [(7, true), (13, false)]);
}

#[test]
fn synthetic_sync_read_in_the_loop_is_named_with_what_it_costs() {
    let s = synthetic_traces::double_buffered(20, true);
    let d = diagnosed(&s);
    let f = &d.findings[0];
    assert_eq!(f.cause, Cause::Sync, "{:?}", d.findings);
    assert_eq!(f.call.name, "aten::item > aten::_local_scalar_dense > cudaStreamSynchronize");
    assert!(close(f.cost_us, s.known.sync_idle_us) && s.known.sync_idle_us > 19.0 * 150.0, "{} against {}", f.cost_us, s.known.sync_idle_us);
    assert_eq!(f.count, 20);
    assert!(f.text.contains(".item()-style") && f.text.contains("4 B copied back") && f.text.contains("19 of 20 calls"), "{}", f.text);
    // The event waits, with the GPU already drained, are not blamed.
    assert!(!d.findings.iter().any(|f| f.call.name.contains("cudaEventSynchronize")), "{:?}", d.findings);
}

#[test]
fn synthetic_tiny_ops_are_one_issue_bound_stretch() {
    let s = synthetic_traces::tiny_ops(5000);
    let d = diagnosed(&s);
    let f = &d.findings[0];
    assert_eq!((f.cause, f.count), (Cause::IssueBound, 5000));
    assert_eq!(f.call.name, "aten::add > cudaLaunchKernel");
    assert!(f.text.contains("5000 ops of 2.0 µs on average, launched every 10.0 µs"), "{}", f.text);
    assert_eq!(d.findings.len(), 1, "{:?}", d.findings);
}

/// `bytes` gzipped.
fn gz(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

#[test]
fn synthetic_traces_read_the_same_gzipped_and_print_as_text_and_json() {
    let dir = overlap_lab::testing::temp_dir("diagnose-cli");
    let s = synthetic_traces::pageable_to_then_compute(4);
    let path = dir.join("synthetic-pageable-to-then-compute.json.gz");
    std::fs::write(&path, gz(serde_json::to_string(&s.trace).unwrap().as_bytes())).unwrap();
    let data = overlap_lab::measure::record::default_data_dir();
    let (code, out, err) = cli(&["--data", data.to_str().unwrap(), "diagnose", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    for needle in [
        "torch.profiler (Kineto) trace",
        "GPU 0 (NVIDIA H100 80GB HBM3)",
        "7 (legacy default)",
        "H2D pageable",
        "recorded rates from data/nvidia-h100-80gb-hbm3/bandwidth.json",
        "pageable copies (GPU 0)",
        "call: aten::to > aten::_to_copy > aten::copy_ > cudaMemcpyAsync at ts",
        "synchronizing calls: 5; 4 left a GPU idle",
    ] {
        assert!(out.contains(needle), "lacks {needle:?}:\n{out}");
    }
    let (code, out, err) = cli(&["--data", data.to_str().unwrap(), "diagnose", "--json", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON alone");
    assert_eq!(v["findings"][0]["cause"], "pageable-copies");
    assert_eq!(v["gpus"][0]["copies"][0]["recorded_pinned"]["host"], "pinned");
    assert!(v["gpus"][0]["copies"][0]["recorded"]["gbps"].as_f64().unwrap() > 1.0);
}

#[test]
fn a_labs_own_timeline_reads_and_is_diagnosed() {
    use overlap_lab::pipeline::op::OpKind;
    use overlap_lab::pipeline::timeline::{Span, Timeline};
    let span =
        |lane: &str, kind, label: &str, start_us, end_us| Span { lane: lane.into(), kind, label: label.into(), start_us, end_us, class: None, index: None };
    // Two chunks: chunk 1's copy hides under chunk 0's kernel.
    let tl = Timeline {
        title: "lab 2, two streams".into(),
        device: "GPU 0 (NVIDIA H200)".into(),
        spans: vec![
            span("stream 0", OpKind::H2d, "H2D chunk 0", 0.0, 100.0),
            span("stream 0", OpKind::Kernel, "compute chunk 0", 100.0, 300.0),
            span("stream 1", OpKind::H2d, "H2D chunk 1", 100.0, 200.0),
            span("stream 1", OpKind::Kernel, "compute chunk 1", 300.0, 500.0),
            span("CPU main", OpKind::Host, "check", 500.0, 510.0),
        ],
        ..Timeline::default()
    };
    let dir = overlap_lab::testing::temp_dir("diagnose-course");
    let path = dir.join("overlap-two-streams.trace.json");
    tl.save_chrome_trace(&path).unwrap();
    let (code, out, err) = cli(&["diagnose", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("overlap-lab timeline") && out.contains("GPU 0 (NVIDIA H200): busy 500.0 µs (100.0% of the window)"), "{out}");
    let d = diagnose(&read_trace(&path, &mut |_, _| {}).unwrap(), "t", &[]);
    let c = &d.gpus[0].copies[0];
    assert_eq!((c.count, c.hidden_us, c.exposed_us), (2, 100.0, 100.0));
}

/// Bad trace files, each with words its one-line error must hold.
fn malformed(dir: &Path) -> Vec<(String, PathBuf, Vec<&'static str>)> {
    let good = serde_json::to_string(&synthetic_traces::pinned_one_stream(3).trace).unwrap();
    let mut v: Vec<(String, PathBuf, Vec<&'static str>)> = Vec::new();
    let mut add = |name: &str, bytes: &[u8], needles: Vec<&'static str>| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        v.push((name.to_string(), p, needles));
    };
    let edit = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut t = synthetic_traces::pinned_one_stream(3).trace;
        f(&mut t);
        serde_json::to_vec(&t).unwrap()
    };
    let events_where = |cat: &'static str, f: &'static dyn Fn(&mut serde_json::Value)| {
        edit(&|t| {
            for e in t["traceEvents"].as_array_mut().unwrap().iter_mut().filter(|e| e["cat"] == cat) {
                f(e);
            }
        })
    };
    add("empty.json", b"", vec!["the file is empty"]);
    add("blank.json", b"  \n\t\n", vec!["only whitespace"]);
    add("truncated.json", &good.as_bytes()[..good.len() / 2], vec!["cut short", "truncated"]);
    add("text.json", b"Traceback (most recent call last):\n", vec!["not JSON", "Traceback"]);
    add("binary.json", &[0x0a, 0x8c, 0x01, 0x12, 0x05, 0x00, 0x00, 0xff, 0x10], vec!["binary data, not JSON"]);
    add("nsys.json", b"SQLite format 3\0\x10\x00\x01\x01", vec!["SQLite database"]);
    add("no-events.json", br#"{"schema": 2, "samples": []}"#, vec!["no traceEvents", "schema, samples"]);
    add("numbers.json", b"[1, 2, 3]", vec!["expected an event object"]);
    add("number.json", b"42", vec!["expected a trace object with traceEvents"]);
    add("events-not-a-list.json", br#"{"traceEvents": {"ph": "X"}}"#, vec!["expected traceEvents to be a list of events"]);
    add("no-events-at-all.json", br#"{"traceEvents": []}"#, vec!["traceEvents is empty"]);
    add(
        "tensorflow.json",
        br#"{"displayTimeUnit": "ns", "traceEvents": [{"ph": "X", "cat": "Op", "name": "MatMul", "pid": 1, "tid": 2, "ts": 1.0, "dur": 2.0}]}"#,
        vec!["not a torch.profiler or overlap-lab trace", "another profiler", "Op"],
    );
    add(
        "cpu-only.json",
        &edit(&|t| t["traceEvents"].as_array_mut().unwrap().retain(|e| !matches!(e["cat"].as_str(), Some("kernel" | "gpu_memcpy")))),
        vec!["no GPU activity", "ProfilerActivity.CUDA"],
    );
    add(
        "no-correlation.json",
        &events_where("kernel", &|e| {
            e["args"].as_object_mut().unwrap().remove("correlation");
        }),
        vec!["have no correlation id", "GPU events"],
    );
    add(
        "lost-kernel.json",
        &edit(&|t| {
            let ev = t["traceEvents"].as_array_mut().unwrap();
            let first = ev.iter().position(|e| e["cat"] == "kernel").unwrap();
            ev.remove(first);
        }),
        vec!["GPU work is missing", "cudaLaunchKernel", "correlation"],
    );
    add(
        "unstamped.json",
        &edit(&|t| {
            for e in t["traceEvents"].as_array_mut().unwrap().iter_mut().filter(|e| matches!(e["cat"].as_str(), Some("kernel" | "gpu_memcpy" | "cuda_runtime")))
            {
                e["ts"] = serde_json::json!(0.0);
                e["dur"] = serde_json::json!(0.0);
            }
        }),
        vec!["have no time", "pytorch/pytorch#188481", "fresh process"],
    );
    add("negative.json", &events_where("kernel", &|e| e["dur"] = serde_json::json!(-3.5)), vec!["negative duration", "-3.5"]);
    add(
        "no-ts.json",
        &events_where("gpu_memcpy", &|e| {
            e.as_object_mut().unwrap().remove("ts");
        }),
        vec!["has no ts", "Memcpy HtoD"],
    );
    add(
        "no-dur.json",
        &events_where("cuda_runtime", &|e| {
            e.as_object_mut().unwrap().remove("dur");
        }),
        vec!["has no dur"],
    );
    add("text-ts.json", &events_where("kernel", &|e| e["ts"] = serde_json::json!("soon")), vec!["ts that is not a number (\"soon\")"]);
    add("text-stream.json", &events_where("kernel", &|e| e["args"]["stream"] = serde_json::json!("x7")), vec!["not a stream number"]);
    add("negative-bytes.json", &events_where("gpu_memcpy", &|e| e["args"]["bytes"] = serde_json::json!(-1)), vec!["bytes that are not a size"]);
    add(
        "bare-kernels.json",
        &events_where("kernel", &|e| {
            e.as_object_mut().unwrap().remove("args");
        }),
        vec!["kernel events have no args"],
    );
    add("trailing.json", format!("{good} and then some").as_bytes(), vec!["trailing characters"]);
    add("huge-number.json", good.replacen("\"ts\":2000000.0", "\"ts\":1e400", 1).as_bytes(), vec!["malformed JSON", "number out of range"]);
    // Nesting deeper than the parser follows, where it reads the value
    // (nesting inside args it skips is read without recursion).
    let deep = format!("{{\"deviceProperties\": {}{}, \"traceEvents\": []}}", "[".repeat(400), "]".repeat(400));
    add("deep.json", deep.as_bytes(), vec!["malformed JSON", "recursion limit"]);
    add("cut.json.gz", &gz(good.as_bytes())[..200], vec!["gzip data is corrupt or cut short"]);
    add("text.json.gz", &gz(b"hello, world"), vec!["the gzip file holds text that is not JSON"]);
    add(
        "kernel-timeline.json",
        br#"{"traceEvents": [{"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "warp 0"}}, {"name": "copy", "cat": "copy", "ph": "X", "pid": 0, "tid": 0, "ts": 0.0, "dur": 1.0}], "otherData": {"title": "lab 7"}}"#,
        vec!["no GPU activity on streams", "warp 0"],
    );
    v
}

#[test]
fn every_malformed_trace_is_one_line_naming_the_file_and_the_fault() {
    let dir = overlap_lab::testing::temp_dir("diagnose-bad");
    let cases = malformed(&dir);
    assert!(cases.len() >= 20, "{}", cases.len());
    // The same faults through the library: an error, never a panic.
    for (name, path, _) in &cases {
        let got = std::panic::catch_unwind(|| read_trace(path, &mut |_, _| {}));
        assert!(matches!(got, Ok(Err(_))), "{name}: {:?}", got.map(|r| r.map(|t| t.gpu_ops.len())));
    }
    for (name, path, needles) in cases.iter().map(|(n, p, w)| (n.as_str(), p.clone(), w.clone())).chain([
        ("absent.json", dir.join("absent.json"), vec!["reading trace", "No such file"]),
        ("a folder (its traces read as ranks: the first bad one named)", dir.clone(), vec!["reading trace"]),
    ]) {
        let (code, out, err) = cli(&["diagnose", path.to_str().unwrap()]);
        assert!(code != 0 && out.is_empty(), "{name}: exit {code}, stdout {out}");
        let lines: Vec<&str> = err.trim_end().lines().collect();
        assert_eq!(lines.len(), 1, "{name}: {err}");
        let line = lines[0];
        assert!(line.starts_with("overlap-lab: error: ") && !line.contains("panicked"), "{name}: {line}");
        let shown = path.file_name().unwrap().to_str().unwrap();
        assert!(line.contains(shown), "{name}: the error names the file: {line}");
        for n in needles {
            assert!(line.contains(n), "{name}: lacks {n:?}: {line}");
        }
        println!("{line}");
    }
}

/// A torch.profiler trace of some 200 MB (200,000 tiny ops) read through
/// the command line: how long it takes is printed, and what was read is
/// checked. `cargo test --release --test diagnose -- --ignored --nocapture`.
#[test]
#[ignore = "writes a 200 MB trace; run by hand to time reading it"]
fn a_200_mb_trace_reads_in_seconds_with_progress() {
    let dir = overlap_lab::testing::temp_dir("diagnose-big");
    let path = dir.join("synthetic-tiny-ops-200mb.json");
    let ops = 200_000;
    synthetic_traces::write_tiny_ops(&path, ops).unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    let started = std::time::Instant::now();
    let (code, out, err) = cli(&["diagnose", "--json", path.to_str().unwrap()]);
    let took = started.elapsed().as_secs_f64();
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["findings"][0]["cause"], "issue-bound");
    assert_eq!(v["findings"][0]["count"], ops);
    println!("read and diagnosed {:.0} MB in {took:.1} s ({:.0} MB/s)", size as f64 / 1e6, size as f64 / 1e6 / took);
    let started = std::time::Instant::now();
    let mut reports = 0;
    let t = read_trace(&path, &mut |read, total| {
        reports += 1;
        assert!(read <= total);
    })
    .unwrap();
    println!("read alone: {:.1} s, {} progress reports, {} GPU ops", started.elapsed().as_secs_f64(), reports, t.gpu_ops.len());
    assert!(reports as u64 >= size >> 20, "progress every MiB");
    assert_eq!(t.gpu_ops.len(), ops);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn synthetic_traces_replay_on_the_queue_model_as_traced() {
    use overlap_lab::diagnose::replay::{predict, schedule, Pricing};
    use overlap_lab::diagnose::waits::Waited;
    let dir = overlap_lab::testing::temp_dir("diagnose-replay");
    for s in synthetic_traces::all() {
        let t = read_trace(&s.write(&dir), &mut |_, _| {}).unwrap();
        // The run: the window, from the host's own work before it where the CPU did some (a first batch built).
        let run_start = overlap_lab::diagnose::replay::Replay::new(&t).unwrap().run_start.map_or(t.window_us().0, |r| r.0.min(t.window_us().0));
        let traced = t.window_us().1 - run_start;
        let ts = schedule(&t, &[], &Pricing::default()).unwrap_or_else(|e| panic!("{}: {e}", s.file));
        let replayed = predict(&ts);
        assert!((replayed / traced - 1.0).abs() < 0.01, "{}: replayed {replayed} µs against {traced} traced", s.file);
        println!("{}: replayed {replayed:.1} µs, traced {traced:.1} µs ({:+.3}%)", s.file, 100.0 * (replayed / traced - 1.0));
        assert_eq!(ts.traced_op.iter().flatten().count(), t.gpu_ops.len(), "{}: every GPU op is in the schedule once", s.file);
        if s.file == "synthetic-pinned-double-buffered.json" {
            // The first kernel waited for its batch's copy on the copy stream;
            // each later copy, for the kernel that last read its slot.
            let first_kernel = t.gpu_ops.iter().position(|o| o.stream == synthetic_traces::DEFAULT_STREAM).unwrap();
            assert_eq!(ts.waited[first_kernel], Waited::OtherStream { op: 0 }, "{:?}", &ts.waited[..6]);
            let across = ts.waited.iter().filter(|w| matches!(w, Waited::OtherStream { .. })).count();
            assert_eq!(across, 1 + 18, "{:?}", ts.waited);
        }
    }
}

/// Every committed trace of lab 10's programs replays as traced (no fix)
/// close to its own run: a wait the replay missed would shift every fix's
/// prediction by the time it cost. A trace with CUDA sync events of a
/// program that waits for events replays within 1.5% (each wait read from
/// them, though the GPU took longer than the times' slack to pass it: the
/// double-buffered loops' first step), a plain trace within 3%. What the
/// 1.5% leaves: spacing the replay takes from the trace's medians, not
/// op by op (`sync_read_in_loop`'s sync-events trace on the 2026-12-02
/// H200 recording: -1.1%, 0.73 ms ahead over its 40 steps a few µs at a
/// time, kernels queued back to back further apart than the median queued
/// gap, copies later after their launch; a missed wait would cost a whole
/// op, milliseconds).
#[test]
fn each_committed_trace_replays_as_traced_close_to_its_run() {
    use overlap_lab::diagnose::event_joins::JoinsKnown;
    use overlap_lab::diagnose::replay::{predict, schedule, Pricing, Replay};
    use overlap_lab::labs::pytorch_trace::Recording;
    let data = overlap_lab::measure::record::repo_root().join("data");
    let mut read_exactly = 0;
    for rec in Recording::find(&data).unwrap() {
        for name in rec.names() {
            let plain = rec.trace(name).unwrap();
            let synced = rec.sync_events_trace(name).unwrap();
            let waits_for_events = JoinsKnown::of(&plain).is_some();
            for (t, bound) in [(Some(plain), 0.03), (synced, if waits_for_events { 0.015 } else { 0.03 })] {
                let Some(t) = t else { continue };
                let run_start = Replay::new(&t).unwrap().run_start.map_or(t.window_us().0, |r| r.0.min(t.window_us().0));
                let traced = t.window_us().1 - run_start;
                let replayed = predict(&schedule(&t, &[], &Pricing::default()).unwrap());
                let off = replayed / traced - 1.0;
                assert!(off.abs() < bound, "{}: {name}: replayed {:+.2}% off its run", rec.dir.display(), 100.0 * off);
                read_exactly += usize::from(bound < 0.03 && t.carries_sync_events());
            }
        }
    }
    assert!(read_exactly >= 4, "only {read_exactly} sync-events traces of programs that wait for events");
}

/// The synthetic programs' pinned rate, one direction at one size, as a
/// lab 1 recording would hand it in.
fn synthetic_pinned_rate(direction: overlap_lab::diagnose::events::Direction, bytes: u64) -> overlap_lab::diagnose::LinkRates {
    use overlap_lab::diagnose::events::HostMemory;
    use overlap_lab::diagnose::{LinkPoint, LinkRates};
    LinkRates {
        gpu_name: synthetic_traces::GPU_NAME.into(),
        source: "(the synthetic pinned rate)".into(),
        points: vec![LinkPoint { host: HostMemory::Pinned, direction, bytes, gbps: synthetic_traces::PINNED_GBPS }],
    }
}

#[test]
fn synthetic_pageable_program_with_pinned_copies_is_predicted() {
    use overlap_lab::diagnose::events::Direction;
    use overlap_lab::diagnose::replay::{predict, schedule, Change, Pricing};
    let s = synthetic_traces::pageable_to_then_compute(20);
    let dir = overlap_lab::testing::temp_dir("diagnose-pinned");
    let t = read_trace(&s.write(&dir), &mut |_, _| {}).unwrap();
    let rates = synthetic_pinned_rate(Direction::H2d, synthetic_traces::BATCH_BYTES);
    let predicted = predict(&schedule(&t, &[Change::Pinned], &Pricing { rates: Some(rates), ..Pricing::default() }).unwrap());
    // Each step: the copy at the pinned rate, issued without holding the
    // CPU, and PyTorch's wait after it gone (pinned memory, non_blocking):
    // the CPU runs ahead, so the GPU runs copy then kernel, back to back,
    // each followed by the gap the trace shows between queued ops.
    let gap = overlap_lab::diagnose::replay::Replay::new(&t).unwrap().queued_gap_us();
    assert!((0.0..10.0).contains(&gap), "a queued gap of {gap} µs");
    let copy = synthetic_traces::BATCH_BYTES as f64 / (synthetic_traces::PINNED_GBPS * 1e3);
    let want = 20.0 * (copy + synthetic_traces::KERNEL_US + 2.0 * gap);
    assert!((predicted / want - 1.0).abs() < 1e-3, "predicted {predicted} µs, expected {want}");
    // The synthetic program that makes that fix ran as long.
    let fixed = synthetic_traces::pinned_one_stream(20);
    let f = read_trace(&fixed.write(&dir), &mut |_, _| {}).unwrap();
    let ran = f.window_us().1 - f.window_us().0;
    assert!((predicted / ran - 1.0).abs() < 0.01, "predicted {predicted} µs, the pinned program ran {ran}");
}

/// Each fix predicted on a synthetic program's trace against the synthetic
/// program that makes it: a copy stream on the one-stream program against
/// the double-buffered one, the syncs removed from the loop that reads
/// each step against the same loop without, a CUDA graph of the tiny ops
/// against their kernels back to back with the graph's gap.
#[test]
fn each_fix_on_a_synthetic_program_predicts_the_program_that_makes_it() {
    use overlap_lab::diagnose::replay::{predict, schedule, Change, GraphPrice, Pricing};
    let dir = overlap_lab::testing::temp_dir("diagnose-fixes");
    let window = |s: &Synthetic| {
        let t = read_trace(&s.write(&dir), &mut |_, _| {}).unwrap();
        (t.window_us().1 - t.window_us().0, t)
    };
    let pricing = Pricing {
        rates: None,
        graph: Some(GraphPrice { gap_us: 0.5, least_kernel_us: None, branch_spacing_us: Vec::new(), from: "(a synthetic gap)".into() }),
        ..Pricing::default()
    };
    let cases: [(Synthetic, Change, f64, f64); 3] = [
        (synthetic_traces::pinned_one_stream(20), Change::CopyStream, window(&synthetic_traces::double_buffered(20, false)).0, 0.02),
        (synthetic_traces::double_buffered(20, true), Change::SyncRemoved, window(&synthetic_traces::double_buffered(20, false)).0, 0.02),
        (synthetic_traces::tiny_ops(500), Change::CudaGraph, 500.0 * (2.0 + 0.5), 1e-3),
    ];
    for (before, change, want, tolerance) in cases {
        let (traced, t) = window(&before);
        let predicted = predict(&schedule(&t, &[change], &pricing).unwrap());
        println!("{} + {}: predicted {predicted:.1} µs (traced {traced:.1}), the fixed program {want:.1}", before.file, change.label());
        assert!((predicted / want - 1.0).abs() < tolerance, "{} + {}: predicted {predicted} µs, expected {want}", before.file, change.label());
        assert!(predicted < traced, "{}: the fix gains", before.file);
    }
}

/// `overlap-lab diagnose --json` of a committed trace, against the
/// repository's recordings (its link rates, its graph gap).
fn diagnosed_committed(trace: &Path) -> serde_json::Value {
    let data = overlap_lab::measure::record::repo_root().join("data");
    let (code, out, err) = cli(&["--data", data.to_str().unwrap(), "diagnose", "--json", trace.to_str().unwrap()]);
    assert_eq!(code, 0, "{}: {err}", trace.display());
    serde_json::from_str(&out).expect("--json prints JSON")
}

/// The causes of a diagnosis's findings, and their costs (µs), as its JSON names them.
fn causes(d: &serde_json::Value) -> Vec<(String, f64, String)> {
    d["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["cause"].as_str().unwrap().to_string(), f["cost_us"].as_f64().unwrap(), f["call"]["name"].as_str().unwrap().to_string()))
        .collect()
}

/// Lab 10's committed traces of real PyTorch programs: each finding is the
/// one its program earns. The pageable program's copies are named pageable
/// and no pinned program's batches are; the loop that reads its loss each
/// iteration has its `.item()` syncs named with what they cost, while the
/// programs whose syncs cost nothing (the reads once at the end, the waits
/// at the window's end) are not blamed; the eager tiny ops (on one stream
/// or four) are issue-bound, and their graphs are not (beyond their few
/// launches); the loops whose CPU builds each batch find the host's own
/// work first, with the CPU ops behind it; the results brought back with
/// `.cpu()` have their pageable downloads named.
#[test]
fn every_finding_on_the_committed_traces_is_the_one_its_program_earns() {
    let recordings = overlap_lab::labs::pytorch_trace::Recording::find(&overlap_lab::measure::record::repo_root().join("data")).unwrap();
    assert!(!recordings.is_empty(), "no data/*/pytorch-trace/programs.json");
    for rec in &recordings {
        let dir = &rec.dir;
        for name in rec.names() {
            let d = diagnosed_committed(&rec.trace_path(name).unwrap());
            let found = causes(&d);
            let cost = |cause: &str| found.iter().filter(|f| f.0 == cause).map(|f| f.1).sum::<f64>();
            let window = d["window"]["end_us"].as_f64().unwrap() - d["window"]["start_us"].as_f64().unwrap();
            println!("{}/{name}: {:?}", dir.display(), found.iter().map(|f| format!("{} {:.1} µs", f.0, f.1)).collect::<Vec<_>>());
            // Pageable batches: the pageable programs' alone (a final read
            // of a few losses into a Python list is pageable too, and tiny).
            // A figure of the pageable copies one way, summed.
            let pageable = |direction: &str, figure: &str| -> f64 {
                d["gpus"][0]["copies"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|c| c["host"].as_str() == Some("pageable") && c["direction"].as_str() == Some(direction))
                    .map(|c| c[figure].as_f64().unwrap_or(0.0))
                    .sum()
            };
            let pageable_bytes = pageable("h2d", "bytes");
            let uploads_pageable = ["pageable_then_compute", "cpu_prepared_batches", "training_loop"].contains(&name);
            if uploads_pageable {
                let batch = rec.program(name).unwrap().sizes.batch_bytes.unwrap() as f64;
                assert_eq!(pageable_bytes, 40.0 * batch, "{name}: every batch named pageable");
                assert!(cost("pageable-copies") > 0.0, "{name}: {found:?}");
            } else {
                assert_eq!(pageable_bytes, 0.0, "{name}: no batch is pageable");
            }
            if name == "pageable_then_compute" {
                assert!(cost("pageable-copies") > 0.5 * window, "{name}: the pageable copies cost most of the window: {found:?}");
            } else if name == "results_cpu_each_step" {
                // Every download exposed (nothing runs beside a pageable
                // copy), a tenth of the window or more.
                let d2h_us = pageable("d2h", "time_us");
                let named = cost("pageable-copies");
                assert!((named / d2h_us - 1.0).abs() < 0.01 && named > 0.1 * window, "{name}: the pageable downloads named ({d2h_us} µs of them): {found:?}");
            } else if !uploads_pageable {
                assert!(cost("pageable-copies") < 10.0, "{name}: {found:?}");
            }
            // Syncs: blamed only where the loop reads each iteration, or
            // waits after each blocking upload.
            let syncs: Vec<&(String, f64, String)> = found.iter().filter(|f| f.0 == "sync").collect();
            match name {
                "sync_read_in_loop" => {
                    assert!(
                        syncs.iter().any(|f| f.2.starts_with("aten::item") && f.1 > 0.02 * window),
                        "{name}: the .item() syncs named with their cost: {found:?}"
                    );
                }
                "pageable_then_compute" | "cpu_prepared_batches" | "training_loop" | "results_cpu_each_step" => {
                    // PyTorch's wait after each blocking copy: the GPU idles until the CPU launches the step.
                    assert!(syncs.iter().all(|f| f.2.contains("aten::to")), "{name}: {found:?}");
                }
                _ => assert!(syncs.is_empty(), "{name}: a sync that costs nothing is blamed: {found:?}"),
            }
            let issue_bound = cost("issue-bound");
            if name == "tiny_ops" || name == "tiny_ops_streams" {
                assert!(issue_bound > 0.5 * window, "{name}: issue-bound most of the window: {found:?}");
            } else if name.ends_with("_graph") {
                // A graph's own launches, one a step: a sliver of the window,
                // or, where the profiler slows them more than the graph's
                // work takes (it records each of a graph's nodes: the
                // multi-stream graph's launch took 2.9 ms traced on one H200
                // host, its step 0.95 ms untraced), only they: no eager launch.
                let eager: Vec<_> = found.iter().filter(|f| f.0 == "issue-bound" && !f.2.ends_with("cudaGraphLaunch")).collect();
                assert!(eager.is_empty() && issue_bound < 0.2 * window, "{name}: not issue-bound on eager launches: {found:?}");
            } else if name == "training_loop_workers_pinned" {
                // Its batches ready, its GPU step waits at times for the
                // backward's launches on autograd's thread (1.7% of the
                // window on the 2026-11-30 03:03 recording): a sliver.
                assert!(issue_bound < 0.05 * window, "{name}: issue-bound a sliver of the window: {found:?}");
            } else {
                assert!(issue_bound < 0.01 * window, "{name}: not issue-bound: {found:?}");
            }
            // The loops whose CPU builds the batches: the host's own work
            // is the largest finding, with the CPU ops behind it named.
            if name == "cpu_prepared_batches" || name == "training_loop" {
                assert_eq!(found[0].0, "host-work", "{name}: {found:?}");
                let text = d["findings"][0]["text"].as_str().unwrap();
                assert!(text.contains("aten::"), "{name}: the CPU ops behind it: {text}");
                assert!(found[0].1 > 0.5 * window, "{name}: {found:?}");
            }
        }
    }
}

/// For each fix on the committed programs, the time the queue model
/// predicts from the "before" trace against the measured (untraced) time
/// of the program that applies the fix (`pytorch_trace::Recording::
/// fix_checks`, what the lab prints): within the smaller of 10% and a
/// third of the fix's measured gain, from the run traced with CUDA sync
/// events where the recording has one (which names each event wait's
/// stream: the multi-stream step's fork is read, not guessed). A CUDA
/// graph is priced with the GPU's gap between a graph's kernels from the
/// recording; where the recording has none, the prediction is a lower
/// bound, and must hold.
///
/// Where the recording has its GPU's busy-clock calibration
/// (`busy_clock.json`), each fix's kernels are priced at the clock of a
/// GPU as busy as the fix keeps it (`diagnose::busy_clock`): without it,
/// on the H200, the downloads read a step late were predicted 10.3% fast
/// and the copy stream 3.7% (data/nvidia-h200/README.md, "A GPU kept
/// busy clocks down").
#[test]
fn every_fix_predicted_from_a_committed_trace_is_within_its_tolerance_of_the_fixed_programs_run() {
    use overlap_lab::labs::pytorch_trace::Recording;
    let data = overlap_lab::measure::record::repo_root().join("data");
    let recordings = Recording::find(&data).unwrap();
    assert!(!recordings.is_empty(), "no data/*/pytorch-trace/programs.json");
    let mut compared = 0;
    for rec in &recordings {
        let all = rec.fix_checks().unwrap();
        assert!(all.not_compared.is_empty(), "{}: {:?}", rec.dir.display(), all.not_compared);
        println!("{}\n{}", rec.dir.display(), overlap_lab::labs::pytorch_trace::fixes_table(all));
        let checks = &all.checks;
        let fixes: Vec<&str> = checks.iter().map(|c| c.fix.as_str()).collect();
        for want in ["pinned", "pinned + copy stream", "copy stream", "sync removed", "CUDA graph"] {
            assert!(fixes.contains(&want), "{}: no '{want}' among {fixes:?}", rec.dir.display());
        }
        if rec.gpu() == "NVIDIA H200" {
            // Both ways of judging a recording with two traced runs of each program are used.
            let by_events = checks.iter().filter(|c| c.judged_from() == "traced with CUDA sync events").count();
            let by_mean = checks.iter().filter(|c| c.judged_from() == "the mean of its two traced runs").count();
            assert!(by_events >= 2 && by_mean >= 4, "{by_events} fixes judged by their sync-events trace, {by_mean} by the mean of both");
        }
        for c in checks {
            let off = c.off_judged();
            if rec.graph_gap_us().is_none() && c.fix == "CUDA graph" {
                assert!(off <= 0.0, "{} + {}: a lower bound above the run", c.before, c.fix);
            } else {
                assert!(c.agrees(), "{}: {} + {}: {:+.1}%, beyond {:.1}%", rec.dir.display(), c.before, c.fix, 100.0 * off, 100.0 * c.tolerance());
                compared += 1;
            }
        }
    }
    assert!(compared >= 4, "only {compared} fixes compared");
}

/// A synthetic trace read and diagnosed, its what-if priced by `pricing`
/// (its window checked against how it was built).
fn what_if_of(s: &Synthetic, pricing: &overlap_lab::diagnose::replay::Pricing) -> (overlap_lab::diagnose::Trace, Diagnosis) {
    let dir = overlap_lab::testing::temp_dir("diagnose-whatif");
    let trace = read_trace(&s.write(&dir), &mut |_, _| {}).unwrap_or_else(|e| panic!("{}: {e}", s.file));
    let d = overlap_lab::labs::pytorch_trace::prices::diagnosis_priced(&trace, s.file, &[], pricing);
    assert!(close(d.window.start_us, s.known.window.0) && close(d.window.end_us, s.known.window.1), "{}: window {:?}", s.file, d.window);
    assert!(close(d.gpus[0].busy_us, s.known.busy_us), "{}: busy {} against {}", s.file, d.gpus[0].busy_us, s.known.busy_us);
    (trace, d)
}

/// Every call of `t`, in order, and the GPU ops each issued (by correlation id).
fn calls_and_their_ops(t: &overlap_lab::diagnose::Trace) -> (Vec<usize>, std::collections::HashMap<usize, Vec<usize>>) {
    let mut ops_of_call: std::collections::HashMap<usize, Vec<usize>> = std::collections::HashMap::new();
    let by_correlation: std::collections::HashMap<u64, usize> = t.calls.iter().enumerate().filter_map(|(i, c)| c.correlation.map(|k| (k, i))).collect();
    for (i, o) in t.gpu_ops.iter().enumerate() {
        ops_of_call.entry(by_correlation[&o.correlation.unwrap()]).or_default().push(i);
    }
    ((0..t.calls.len()).collect(), ops_of_call)
}

/// A launch-bound step over four streams, forked and joined by events
/// (issue 61's 2048 tiny kernels in small): as a CUDA graph, each stream
/// keeps its lane and the four run side by side, so a step takes its
/// longest branch plus the fork's and the join's kernels, each kernel
/// followed by the graph's gap; not the sum of the branches.
#[test]
fn a_cuda_graph_of_a_multi_stream_step_keeps_its_branches() {
    use overlap_lab::diagnose::event_joins::event_joins;
    use overlap_lab::diagnose::replay::{predict, schedule, Change, GraphPrice, Pricing};
    let (steps, per_stream) = (2, 128);
    let s = synthetic_traces::multi_stream_tiny_ops(steps, per_stream);
    let pricing = Pricing {
        rates: None,
        graph: Some(GraphPrice { gap_us: 0.5, least_kernel_us: None, branch_spacing_us: Vec::new(), from: "(a synthetic gap)".into() }),
        ..Pricing::default()
    };
    let (t, d) = what_if_of(&s, &pricing);
    let traced = d.window.duration_us();
    // Launch-bound: each kernel issued 10 µs after the one before, plus the events' calls.
    assert!(d.findings.iter().any(|f| f.cause == Cause::IssueBound && f.cost_us > 0.5 * traced), "{:?}", d.findings);
    let w = d.what_if.as_ref().expect("a what-if");
    let graph = w.predictions.iter().find(|p| p.changes == [Change::CudaGraph]).unwrap_or_else(|| panic!("no graph offered: {w}"));
    // Each step: the fork's kernel, 128 kernels on each side stream at once,
    // the join's kernel: (1 + 128 + 1) kernels of 2 µs and the 0.5 µs gap.
    let kernel = 2.0 + 0.5;
    let want = steps as f64 * (1.0 + per_stream as f64 + 1.0) * kernel;
    let sum = steps as f64 * (2.0 + 4.0 * per_stream as f64) * kernel;
    println!("graph: predicted {:.1} µs; longest branch per step {want:.1} µs; all end to end {sum:.1} µs; traced {traced:.1} µs", graph.predicted_us);
    assert!((graph.predicted_us / want - 1.0).abs() < 1e-3, "predicted {} µs, want {want}", graph.predicted_us);
    assert!(graph.predicted_us < 0.3 * sum);
    assert!(graph.priced_by.as_deref().is_some_and(|b| b.contains("5 captured streams run side by side")), "{:?}", graph.priced_by);
    assert!(graph.priced_by.as_deref().is_some_and(|b| b.contains("(inferred from the calls' order")), "{:?}", graph.priced_by);
    assert_eq!(w.event_joins, Some(overlap_lab::diagnose::event_joins::JoinsKnown::CallsOrder));
    assert!(graph.as_written.contains("torch.cuda.graphs"), "{}", graph.as_written);
    // The as-traced replay is the window; the joins come from the calls.
    assert!((w.replayed_us / traced - 1.0).abs() < 0.01, "replayed {} against {traced}", w.replayed_us);
    let (calls, ops_of_call) = calls_and_their_ops(&t);
    let joins = event_joins(&t, &calls, &ops_of_call);
    assert_eq!(joins.len(), steps * (4 + 4), "a fork to each side stream and a join back from each, per step: {joins:?}");
    // The same graph with one kernel at a time (what the what-if did before
    // the branches ran side by side): every kernel end to end.
    let mut one_at_a_time = schedule(&t, &[Change::CudaGraph], &pricing).unwrap();
    assert!(one_at_a_time.kernels_side_by_side);
    one_at_a_time.kernels_side_by_side = false;
    let serial = predict(&one_at_a_time);
    assert!((serial / sum - 1.0).abs() < 1e-3, "one at a time: {serial} µs, want {sum}");
}

/// The multi-stream step as torch.profiler records it with
/// `enable_cuda_sync_events=True`: each `cudaStreamWaitEvent` named by a
/// "Stream Wait Event" on the waiting stream's lane (50 µs long, over the
/// lane's idle time), the fork's with the recorded stream, the join's with
/// -1 (unknown) there and each side record's stream in a `cuda_event`.
fn with_sync_events(mut s: Synthetic) -> Synthetic {
    use serde_json::json;
    use synthetic_traces::{DEFAULT_STREAM, SIDE_STREAMS};
    let events = s.trace["traceEvents"].as_array_mut().unwrap();
    let (mut records, mut waits, mut added) = (Vec::new(), 0, Vec::new());
    for e in events.iter().filter(|e| e["cat"] == "cuda_runtime") {
        let (corr, ts) = (e["args"]["correlation"].as_u64().unwrap(), e["ts"].as_f64().unwrap());
        if e["name"] == "cudaEventRecord" {
            if waits > 0 {
                (records, waits) = (Vec::new(), 0);
            }
            records.push(corr);
        } else if e["name"] == "cudaStreamWaitEvent" {
            let fork = records.len() == 1;
            let (stream, recorded, record) =
                if fork { (SIDE_STREAMS[waits], DEFAULT_STREAM, records[0]) } else { (DEFAULT_STREAM, SIDE_STREAMS[waits], records[waits]) };
            let args = json!({"device": 0, "context": 1, "stream": stream, "correlation": corr,
                "wait_on_stream": if fork { recorded as i64 } else { -1 }, "wait_on_cuda_event_record_corr_id": record, "wait_on_cuda_event_id": record});
            added.push(json!({"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": stream, "ts": ts + 1.0, "dur": 50.0, "args": args}));
            if !fork {
                let args = json!({"device": 0, "stream": recorded, "correlation": record, "cuda_event_id": record});
                added.push(json!({"ph": "X", "cat": "cuda_event", "name": "cudaEventRecord", "pid": 0, "tid": recorded, "ts": ts, "dur": 0.0, "args": args}));
            }
            waits += 1;
        }
    }
    events.extend(added);
    s.file = "synthetic-multi-stream-tiny-ops-sync-events.json";
    s
}

/// Read from the trace's CUDA sync events, the multi-stream step's joins
/// are the ones the calls' order gave (its program is the order's usual
/// one), and its graph is priced the same, saying so; the sync events
/// add no GPU op and no busy time, and change no idle figure or finding.
#[test]
fn a_multi_stream_steps_joins_are_read_from_its_cuda_sync_events() {
    use overlap_lab::diagnose::event_joins::{event_joins, joins_read_from_sync_events, JoinsKnown};
    use overlap_lab::diagnose::replay::{Change, GraphPrice, Pricing};
    let (steps, per_stream) = (2, 16);
    let pricing = Pricing {
        rates: None,
        graph: Some(GraphPrice { gap_us: 0.5, least_kernel_us: None, branch_spacing_us: Vec::new(), from: "(a synthetic gap)".into() }),
        ..Pricing::default()
    };
    let (plain, d_plain) = what_if_of(&synthetic_traces::multi_stream_tiny_ops(steps, per_stream), &pricing);
    let (synced, d_synced) = what_if_of(&with_sync_events(synthetic_traces::multi_stream_tiny_ops(steps, per_stream)), &pricing);
    assert_eq!((synced.sync_events, synced.stream_waits.len(), synced.event_records.len()), (8 * steps, 8 * steps, 4 * steps));
    assert!(!plain.carries_sync_events());
    assert_eq!(synced.gpu_ops, plain.gpu_ops);
    assert_eq!((&d_synced.window, &d_synced.gpus, &d_synced.syncs, &d_synced.findings), (&d_plain.window, &d_plain.gpus, &d_plain.syncs, &d_plain.findings));
    let (w_plain, w_synced) = (d_plain.what_if.as_ref().unwrap(), d_synced.what_if.as_ref().unwrap());
    assert_eq!((w_plain.event_joins, w_synced.event_joins), (Some(JoinsKnown::CallsOrder), Some(JoinsKnown::SyncEvents)));
    // Every join read, and the same as the calls' order gave.
    let (calls, ops_of_call) = calls_and_their_ops(&synced);
    let (read, waits_read) = joins_read_from_sync_events(&synced, &calls, &ops_of_call);
    assert_eq!(waits_read.len(), 8 * steps);
    let (calls, ops_of_call) = calls_and_their_ops(&plain);
    assert_eq!(read, event_joins(&plain, &calls, &ops_of_call));
    let times = |w: &overlap_lab::diagnose::whatif::WhatIf| w.predictions.iter().map(|p| (p.fix.clone(), p.predicted_us)).collect::<Vec<_>>();
    assert_eq!(times(w_synced), times(w_plain));
    let graph = w_synced.predictions.iter().find(|p| p.changes == [Change::CudaGraph]).expect("a graph priced");
    assert!(
        graph.priced_by.as_deref().is_some_and(|b| b.contains("joined where their events joined them (read from the trace's CUDA sync events)")),
        "{:?}",
        graph.priced_by
    );
    let json = serde_json::to_value(&d_synced).unwrap();
    assert_eq!(json["what_if"]["event_joins"], "sync-events");
}

/// Results brought back each step with `y.cpu()` into pageable memory:
/// the what-if offers what uploads get, pinned memory, a stream of their
/// own, reading them a step late, and the combinations, fastest first.
#[test]
fn results_brought_back_each_step_get_every_fix_uploads_get() {
    use overlap_lab::diagnose::events::Direction;
    use overlap_lab::diagnose::replay::{Change, Pricing};
    let iters = 20;
    let s = synthetic_traces::cpu_results_each_step(iters);
    let rates = synthetic_pinned_rate(Direction::D2h, synthetic_traces::RESULT_BYTES);
    let (_, d) = what_if_of(&s, &Pricing { rates: Some(rates), ..Pricing::default() });
    assert!(d.findings.iter().any(|f| f.cause == Cause::PageableCopies), "{:?}", d.findings);
    let w = d.what_if.as_ref().expect("a what-if");
    println!("{w}");
    let traced = d.window.duration_us();
    // The CPU does none of its own work before the first GPU op: the run is the window.
    assert_eq!((w.run_from.as_deref(), w.traced_us), (None, traced));
    let gap = synthetic_gap(&s);
    assert!((w.replayed_us / traced - 1.0).abs() < 0.01, "replayed {} against {traced}", w.replayed_us);
    let fixes: Vec<&str> = w.predictions.iter().map(|p| p.fix.as_str()).collect();
    for want in ["pinned", "pinned + read a step late", "pinned + download stream", "pinned + download stream + read a step late"] {
        assert!(fixes.contains(&want), "no '{want}' among {fixes:?}");
    }
    assert_eq!(fixes[..2], ["pinned + download stream + read a step late", "pinned + read a step late"], "{w}");
    let predicted = |fix: &str| w.predictions.iter().find(|p| p.fix == fix).unwrap().predicted_us;
    // Hand-checked: 8 MiB at 53 GB/s is 158.3 µs a download, and each
    // kernel is followed by the trace's gap between queued ops (its
    // download was queued behind it; the next kernel, launched after the
    // CPU's wait, was not behind the download). On a stream of
    // their own and read a step late, the kernels run back to back and
    // each download under the next kernel: 20 kernels of 2000 µs and the
    // last download after them.
    let download = synthetic_traces::RESULT_BYTES as f64 / (synthetic_traces::PINNED_GBPS * 1e3);
    let all_three = iters as f64 * (synthetic_traces::KERNEL_US + gap) + download;
    assert!((predicted("pinned + download stream + read a step late") / all_three - 1.0).abs() < 1e-4, "{w}");
    // Read late on the one stream: kernel then download, back to back.
    let one_stream = iters as f64 * (synthetic_traces::KERNEL_US + gap + download);
    assert!((predicted("pinned + read a step late") / one_stream - 1.0).abs() < 1e-4, "{w}");
    // Pinned alone: the CPU still waits for each download before it
    // launches the next kernel (the wait in `.cpu()` stays: it reads the
    // result), so each step adds the CPU's round trip (9 µs as traced);
    // a stream of their own gains nothing while the CPU waits so.
    assert!((predicted("pinned") - one_stream - (iters - 1) as f64 * 9.0).abs() < 1.0, "{w}");
    assert!(predicted("pinned + download stream") >= predicted("pinned") - 1.0, "{w}");
    assert!(predicted("pinned") < 0.35 * traced, "pinned downloads are 35x faster than pageable ones: {w}");
    // In the program's own words, in the text and in --json.
    let best = &w.predictions[0];
    assert_eq!(best.changes, [Change::Pinned, Change::DownloadStream, Change::ReadLate]);
    for words in ["pin_memory()", "non_blocking=True", "torch.cuda.Stream", "a step late"] {
        assert!(best.as_written.contains(words), "{words}: {}", best.as_written);
    }
    assert!(w.to_string().contains(&format!("in PyTorch: {}", best.as_written)), "{w}");
    let json = serde_json::to_value(w).unwrap();
    assert_eq!(json["predictions"][0]["changes"], serde_json::json!(["pinned", "download-stream", "read-late"]));
    assert_eq!(json["predictions"][0]["as_written"].as_str(), Some(best.as_written.as_str()));
    // A scalar read each step (`.item()`: 4 bytes and a sync, on the
    // committed traces of the loop that reads each step) is priced by
    // removing the sync, not offered the results' fixes.
    let recordings = overlap_lab::labs::pytorch_trace::Recording::find(&overlap_lab::measure::record::repo_root().join("data")).unwrap();
    for rec in &recordings {
        let d = diagnosed_committed(&rec.trace_path("sync_read_in_loop").unwrap());
        let fixes: Vec<&str> = d["what_if"]["predictions"].as_array().unwrap().iter().map(|p| p["fix"].as_str().unwrap()).collect();
        assert!(fixes.contains(&"sync removed") && !fixes.iter().any(|f| f.contains("download stream") || f.contains("read a step late")), "{fixes:?}");
    }
}

/// The gap the replay puts after each op of the synthetic trace `s`: the
/// one its queued ops show, µs.
fn synthetic_gap(s: &Synthetic) -> f64 {
    let trace = read_trace(&s.write(&overlap_lab::testing::temp_dir("diagnose-gap")), &mut |_, _| {}).unwrap();
    overlap_lab::diagnose::replay::Replay::new(&trace).unwrap().queued_gap_us()
}

/// The what-if of the host-prepared loop (20 steps) with `workers`
/// preparing its batches ahead, the profiler's cost per recorded CPU op
/// `profiler`.
fn prepared_ahead(workers: usize, profiler: Option<f64>) -> overlap_lab::diagnose::whatif::WhatIf {
    use overlap_lab::diagnose::replay::Pricing;
    let s = synthetic_traces::host_prepared_batches(20);
    let d = diagnosed(&s);
    let dir = overlap_lab::testing::temp_dir("diagnose-prepare-ahead");
    let trace = read_trace(&s.write(&dir), &mut |_, _| {}).unwrap();
    let pricing = Pricing { workers: Some(workers), profiler_us_per_cpu_op: profiler.map(|c| (c, "(a synthetic cost)".into())), ..Pricing::default() };
    overlap_lab::diagnose::whatif::what_if(&trace, &d, &pricing).unwrap()
}

#[test]
fn preparing_the_next_batch_ahead_on_four_workers_is_the_host_prepared_loops_top_fix() {
    let w = prepared_ahead(4, None);
    let top = &w.predictions[0];
    assert_eq!(top.fix, "prepare the next batch ahead (4 workers)", "{w}");
    assert!(top.as_written.contains("num_workers=4, pin_memory=True"), "{}", top.as_written);
    // The run starts at its first step's annotation, with the first batch
    // built, so all 20 batches are prepared ahead: each the CPU's whole
    // time from the call before to its upload's, the program's own work
    // (aten::randn 1000 µs, aten::mul 450) and the interpreter's around it
    // (a worker runs both): 1460 µs from the run's start for the first,
    // 1471 µs from the step before's last launch for each other. The four
    // workers have batches 1-4 ready at about 1460 µs, 5-8 at 2930, ...,
    // ahead of a GPU that runs each batch's 79.138 µs upload and 400 µs
    // kernel back to back from the first batch ready on, each upload
    // followed by the trace's gap between queued ops (its kernel was
    // queued behind it): 1460 + 20 x (479.138 + a gap) µs, give or take
    // the first upload's call (a few µs).
    let gap = synthetic_gap(&synthetic_traces::host_prepared_batches(20));
    assert_eq!(w.run_from.as_deref(), Some("ProfilerStep#0"), "{w}");
    let want = 1460.0 + 20.0 * (479.138 + gap);
    assert!((top.predicted_us - want).abs() < 15.0, "predicted {} µs, expected {want}", top.predicted_us);
    let by = top.priced_by.as_deref().unwrap();
    // (1460 + 19 x 1471) / 4 µs.
    assert!(by.contains("the GPU is the bound: 4 workers take 7.35 ms for 20 batches of the host's own work (1.47 ms each), within the GPU's 8.00 ms"), "{by}");
    assert!(by.contains("the prediction includes the profiler's slowdown"), "{by}");
}

#[test]
fn with_one_worker_the_host_stays_the_bound_and_the_profilers_cost_comes_out_first() {
    let w = prepared_ahead(1, None);
    let p = w.predictions.iter().find(|p| p.fix == "prepare the next batch ahead (1 worker)").expect("priced");
    // One worker prepares the 20 batches one after another (the first
    // too: the run starts at its step's annotation): the first 1460 µs,
    // each other 1471 (aten::randn's 1000 and aten::mul's 450, and the
    // program's time around them up to the upload's call, 2 µs between
    // them and 19 after: its batch's work too), then the last batch's upload and kernel, 479.138 µs, and
    // the gap after the upload.
    let gap = synthetic_gap(&synthetic_traces::host_prepared_batches(20));
    let want = 1460.0 + 19.0 * 1471.0 + 479.138 + gap;
    assert!((p.predicted_us - want).abs() < 15.0, "predicted {} µs, expected {want}", p.predicted_us);
    let by = p.priced_by.as_deref().unwrap();
    assert!(by.contains("the host is the bound: 1 worker takes 29.41 ms") && by.contains("the GPU cannot go faster than the CPU feeds it"), "{by}");
    // 50 µs a recorded op taken out of each: 100 µs of the batch's own
    // work (aten::randn and aten::mul, one op each, nothing nested), and
    // the 50 of aten::to, recorded before the upload's call, out of the
    // program's time around them (all of it): 1352 µs a batch.
    let w = prepared_ahead(1, Some(50.0));
    let p = w.predictions.iter().find(|p| p.fix == "prepare the next batch ahead (1 worker)").expect("priced");
    let want = 20.0 * 1352.0 + 479.138 + gap;
    assert!((p.predicted_us - want).abs() < 15.0, "predicted {} µs, expected {want}", p.predicted_us);
    let by = p.priced_by.as_deref().unwrap();
    assert!(by.contains("less the profiler's 50.00 µs a recorded CPU op, from (a synthetic cost)") && by.contains("the host is the bound"), "{by}");
}

#[test]
fn the_diagnose_command_takes_its_workers_and_refuses_a_bad_count_in_a_line() {
    let dir = overlap_lab::testing::temp_dir("diagnose-workers-cli");
    let path = synthetic_traces::host_prepared_batches(5).write(&dir);
    let (code, out, err) = cli(&["diagnose", "--workers", "2", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("prepare the next batch ahead (2 workers)"), "{out}");
    for bad in ["0", "many", "-3"] {
        let (code, _, err) = cli(&["diagnose", "--workers", bad, path.to_str().unwrap()]);
        assert_ne!(code, 0, "--workers {bad}");
        assert!(err.contains("--workers"), "--workers {bad}: {err}");
    }
    let (code, out, _) = cli(&["diagnose", "--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("--workers <N>") && out.contains("[default: 4]"), "{out}");
}

/// The training step of `op_us` a kernel's op (10 steps), diagnosed and
/// priced with the synthetic pinned rate.
fn training_what_if(op_us: f64) -> (overlap_lab::diagnose::Trace, Diagnosis) {
    use overlap_lab::diagnose::events::Direction;
    use overlap_lab::diagnose::replay::Pricing;
    let rates = synthetic_pinned_rate(Direction::H2d, synthetic_traces::BATCH_BYTES);
    what_if_of(&synthetic_traces::training_step(10, op_us), &Pricing { rates: Some(rates), ..Pricing::default() })
}

#[test]
fn a_training_step_with_its_backward_launched_from_autograds_thread_is_predicted() {
    use overlap_lab::diagnose::replay::Change;
    let (trace, d) = training_what_if(10.0);
    let threads: std::collections::BTreeSet<usize> = trace.calls.iter().filter(|c| c.name == "cudaLaunchKernel").map(|c| c.thread).collect();
    assert_eq!(threads.len(), 2, "the backward's launches are on a thread of their own");
    assert_eq!(d.what_if_error, None);
    let w = d.what_if.as_ref().expect("predicted, not refused");
    // As traced, replayed: each step's upload waits for the step before
    // (stream order) and holds the CPU, so the window is the GPU's work back
    // to back, give or take a µs between an upload and the kernels.
    assert!((w.replayed_us / w.traced_us - 1.0).abs() < 0.005, "{w}");
    // Pinned: each 64 MiB upload at 53 GB/s (1266.205 µs) no longer holds
    // the CPU, which runs ahead on both threads; the GPU runs each step's
    // upload and its 2200 µs of kernels back to back: 10 x 3466.205 µs.
    let p = w.predictions.iter().find(|p| p.changes == [Change::Pinned]).unwrap_or_else(|| panic!("{w}"));
    let want = 10.0 * (67108864.0 / 53e3 + 2200.0);
    assert!((p.predicted_us - want).abs() < 1e-3 * want, "predicted {} µs, expected {want}", p.predicted_us);
    let by = p.priced_by.as_deref().unwrap();
    assert!(
        by.contains("pinned rate from (the synthetic pinned rate)")
            && by.contains("launched from 2 CPU threads")
            && by.contains("inferred from the calls' order"),
        "{by}"
    );
}

#[test]
fn the_threads_of_a_training_step_hand_over_to_each_other_rather_than_run_at_once() {
    use overlap_lab::diagnose::replay::Change;
    // Each op costs the CPU 1 ms: with pinned uploads the CPU is the bound,
    // its two threads taking turns (the main thread waits while autograd's
    // runs the backward). A step's CPU, from one upload's call to the next:
    // the call (4 µs, the median launch, as it no longer holds the CPU),
    // 998 µs to the first launch's start, four more ops of 1000 µs, and 8
    // µs from the last op's end to the next step's call: 5 x 1000 + 10 µs.
    // The last step's sgd_step is launched 5002 µs after its upload's call
    // and runs 200 µs: 9 x 5010 + 5002 + 200 = 50292 µs. Threads that ran
    // at once would give the GPU's 10 x 3466.2 µs instead.
    let (_, d) = training_what_if(1000.0);
    let w = d.what_if.as_ref().expect("predicted");
    let p = w.predictions.iter().find(|p| p.changes == [Change::Pinned]).unwrap_or_else(|| panic!("{w}"));
    assert!((p.predicted_us - 50292.0).abs() < 5.0, "predicted {} µs, expected 50292", p.predicted_us);
}

#[test]
fn the_committed_recordings_hand_in_the_profilers_cost_per_cpu_op() {
    use overlap_lab::labs::pytorch_trace::prices::Prices;
    let prices = Prices::read(&overlap_lab::measure::record::repo_root().join("data"));
    // H200: the thirteen programs whose traces count CPU ops (the graphs'
    // count none), their traced host times less their untraced medians,
    // 484.9 ms in all, over their traces' 273,218 CPU ops: 1.7748 µs. The CPU-bound programs
    // weigh most: training_loop (141.4 ms over 104,824 ops),
    // cpu_prepared_batches (141.0 ms over 94,760).
    let (cost, from) = prices.for_gpu(Some("NVIDIA H200")).profiler_us_per_cpu_op.expect("the H200's recording has it");
    assert!((cost - 1.7748).abs() < 1e-3, "{cost}");
    assert!(from.ends_with("nvidia-h200/pytorch-trace/programs.json"), "{from}");
    assert_eq!(prices.for_gpu(Some("A GPU never recorded")).profiler_us_per_cpu_op, None);
}

/// A training loop whose CPU builds each batch (1000 µs of `aten::randn`)
/// before uploading it from pinned memory: the forward's kernel launched
/// from the main thread, then 600 µs of autograd's thread (its backward
/// op, ending in its kernel's launch) while the main thread waits in
/// `backward()`, then the optimizer's kernel from the main thread, one
/// step every 1900 µs; the GPU's work (a 79 µs upload, 250 µs of kernels)
/// never holds it up. With `small_op_us`, the main thread also runs a CPU
/// op that long (the optimizer's step counter) before the optimizer's
/// kernel, in the time it has.
fn host_prepared_training(steps: usize, small_op_us: f64) -> Synthetic {
    use synthetic_traces::{Builder, BACKWARD_TID, DEFAULT_STREAM, HOST_BATCH_BYTES, PINNED_GBPS};
    let mut b = Builder::new();
    let copy_us = HOST_BATCH_BYTES as f64 / (PINNED_GBPS * 1e3);
    let mut cpu = 2_000_000.0;
    let main = b.tid;
    for step in 0..steps {
        b.cpu_op("aten::randn", cpu, 1000.0);
        b.cpu_op("aten::to", cpu + 1005.0, 25.0);
        b.copy("HtoD (Pinned -> Device)", HOST_BATCH_BYTES, (cpu + 1010.0, cpu + 1016.0), DEFAULT_STREAM, (cpu + 1018.0, cpu + 1018.0 + copy_us));
        b.kernel("forward", (cpu + 1040.0, cpu + 1044.0), DEFAULT_STREAM, (cpu + 1100.0, cpu + 1200.0));
        b.tid = BACKWARD_TID;
        b.cpu_op("autograd::engine::evaluate_function: MmBackward0", cpu + 1045.0, 600.0);
        b.kernel("backward", (cpu + 1640.0, cpu + 1644.0), DEFAULT_STREAM, (cpu + 1646.0, cpu + 1746.0));
        b.tid = main;
        if small_op_us > 0.0 {
            b.cpu_op("aten::add_", cpu + 1650.0, small_op_us);
        }
        let sgd = cpu + 1655.0 + small_op_us;
        b.kernel("sgd_step", (sgd, sgd + 4.0), DEFAULT_STREAM, (sgd + 100.0, sgd + 150.0));
        b.annotation(&format!("ProfilerStep#{step}"), cpu, 1899.0);
        cpu += 1900.0;
    }
    b.runtime("cudaDeviceSynchronize", cpu, 100.0);
    let known = b.known();
    Synthetic { file: "synthetic-host-prepared-training.json", trace: b.finish(cpu + 120.0), known }
}

/// A DataLoader's batch is taken over by its pinning thread, which holds
/// the interpreter: the loop's own thread runs its own work slower beside
/// it (the calibration's loss per µs of a loop's own work), and loses
/// nothing while it waits (in `backward()` for autograd's thread, which
/// releases the interpreter). The loop above is its CPU's bound once its
/// batches are prepared ahead (four workers take 250 µs a batch, its
/// threads 620 µs a step): each µs the loop loses is a µs later. Own work
/// too short to be a batch stays on the loop's thread.
#[test]
fn a_batch_is_taken_over_in_proportion_to_the_loops_own_work_not_its_waits() {
    use overlap_lab::diagnose::replay::{BatchHandover, Change, Pricing};
    let read = |s: &Synthetic| read_trace(&s.write(&overlap_lab::testing::temp_dir("diagnose-taken-over")), &mut |_, _| {}).unwrap();
    let predicted_of = |trace: &overlap_lab::diagnose::Trace, taken_over_us: f64, busy_loop_us: f64| {
        let handover = BatchHandover { taken_over_us, busy_loop_us, from: "(a synthetic cost)".into(), ..BatchHandover::default() };
        let pricing = Pricing { batch_handover: Some(handover), ..Pricing::default() };
        overlap_lab::diagnose::replay::predict(&overlap_lab::diagnose::replay::schedule(trace, &[Change::PrepareAhead], &pricing).unwrap())
    };
    let plain = read(&host_prepared_training(20, 0.0));
    let with_small_op = read(&host_prepared_training(20, 50.0));
    let free = predicted_of(&plain, 0.0, 0.0);
    // The loss not measured against a loop's work: all of it, each batch.
    let lost = predicted_of(&plain, 500.0, 0.0) - free;
    assert!((lost - 20.0 * 500.0).abs() < 5.0, "a 500 µs takeover cost {lost} µs, not 20 x 500");
    // Against a loop's work: the 600 µs the loop waits a step for autograd's
    // thread cost nothing, so a loss of 500 µs over 1000 µs of a loop's
    // work costs far less than 500 a batch...
    let lost = predicted_of(&plain, 500.0, 1000.0) - free;
    assert!(lost > 0.0 && lost < 20.0 * 100.0, "a takeover over a loop's work cost {lost} µs");
    // ...and each µs of the loop's own work costs half a µs more, charged
    // at the next batch: a 50 µs op a step (too short to be a batch: it
    // stays on the loop's thread) is 20 x 50 µs, and half of the 19 before
    // a batch again (the last step's comes after the last batch).
    let added = predicted_of(&with_small_op, 500.0, 1000.0) - predicted_of(&plain, 500.0, 1000.0);
    assert!((added - (1000.0 + 19.0 * 25.0)).abs() < 5.0, "a 50 µs op a step cost {added} µs, not 1475");
    let added_free = predicted_of(&with_small_op, 0.0, 0.0) - free;
    assert!((added_free - 1000.0).abs() < 5.0, "a 50 µs op a step cost {added_free} µs without a takeover, not 1000");
}

/// Where the loop's time a batch was measured against its own work (as
/// lab 10's recordings from 2026-12-01 have it), what the loop loses at a
/// batch is that time less its work, less what it waited since the batch
/// before for its other threads (600 µs a step for autograd's thread in
/// the loop above): a loss of 500 µs hides in that wait; one of 1000
/// costs 400 µs a batch. The first batch loses nothing more than its wait
/// (that measure starts with the first batch in hand).
#[test]
fn a_loss_read_from_the_loops_time_a_batch_hides_in_its_waits_for_its_other_threads() {
    use overlap_lab::diagnose::replay::{BatchHandover, Change, Pricing};
    let trace = read_trace(&host_prepared_training(20, 0.0).write(&overlap_lab::testing::temp_dir("diagnose-hidden-loss")), &mut |_, _| {}).unwrap();
    let predicted_of = |per_batch_by_loop_work: Vec<(f64, f64)>| {
        let handover = BatchHandover { per_batch_by_loop_work, from: "(a synthetic cost)".into(), ..BatchHandover::default() };
        let pricing = Pricing { batch_handover: Some(handover), ..Pricing::default() };
        overlap_lab::diagnose::replay::predict(&overlap_lab::diagnose::replay::schedule(&trace, &[Change::PrepareAhead], &pricing).unwrap())
    };
    let free = predicted_of(Vec::new());
    // A loss the same whatever the loop's work: 500 µs, then 1000.
    let hidden = predicted_of(vec![(0.0, 500.0), (1e5, 1e5 + 500.0)]) - free;
    assert!(hidden.abs() < 5.0, "a 500 µs loss cost {hidden} µs, not nothing");
    let shown = predicted_of(vec![(0.0, 1000.0), (1e5, 1e5 + 1000.0)]) - free;
    assert!((shown - 19.0 * 400.0).abs() < 5.0, "a 1000 µs loss cost {shown} µs, not 19 x 400");
}

/// Issue 63's data-parallel recording (`crate/reference/ddp_trace.py` on
/// two GPUs): every program traced once per rank, each trace read by
/// `diagnose`'s reader with NCCL's all-reduce kernels on a stream of their
/// own beside the compute stream, as many on every rank; the record's
/// pairs name recorded programs, and its run found no problem.
#[test]
fn the_data_parallel_recording_holds_a_readable_trace_per_rank() {
    let dir = overlap_lab::measure::record::repo_root().join("data/nvidia-h200/ddp-trace");
    let record: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("programs.json")).unwrap()).unwrap();
    let ranks = record["ranks"].as_u64().unwrap() as usize;
    assert!(ranks >= 2, "{ranks} ranks");
    assert_eq!(record["problems"].as_array().unwrap().len(), 0, "{}", record["problems"]);
    let programs = record["programs"].as_object().unwrap();
    assert!(programs.len() >= 7, "{} programs", programs.len());
    for pair in record["pairs"].as_array().unwrap() {
        for side in ["before", "after"] {
            assert!(programs.contains_key(pair[side].as_str().unwrap()), "{pair}");
        }
    }
    for (name, p) in programs {
        let traces = p["traces"].as_array().unwrap();
        assert_eq!(traces.len(), ranks, "{name}: a trace per rank");
        assert_eq!(p["untraced"]["per_rank_ms"].as_array().unwrap().len(), ranks, "{name}");
        assert!(p["largest_update"].as_f64().unwrap() > 0.0 && p["weights_differ_across_ranks"].as_f64().unwrap() == 0.0, "{name}");
        // Each rank's trace, read once for the checks below and the ranks' reading.
        let traces: Vec<(String, overlap_lab::diagnose::Trace)> =
            traces.iter().map(|t| (t.as_str().unwrap().to_string(), read_trace(&dir.join(t.as_str().unwrap()), &mut |_, _| {}).unwrap())).collect();
        let mut sums = Vec::new();
        for (t, trace) in &traces {
            let nccl: Vec<_> = trace.gpu_ops.iter().filter(|o| o.name.starts_with("ncclDevKernel_AllReduce")).collect();
            let streams: std::collections::BTreeSet<u64> = nccl.iter().map(|o| o.stream).collect();
            let compute: std::collections::BTreeSet<u64> =
                trace.gpu_ops.iter().filter(|o| o.name.starts_with("nvjet") || o.name.contains("gemm")).map(|o| o.stream).collect();
            assert!(
                !nccl.is_empty() && !compute.is_empty() && streams.len() == 1 && streams.is_disjoint(&compute),
                "{name} {t}: NCCL on {streams:?}, GEMMs on {compute:?}"
            );
            sums.push(nccl.len());
        }
        assert!(sums.windows(2).all(|w| w[0] == w[1]), "{name}: all-reduces per rank {sums:?}");
        // The straggler program's extra work is named, on its rank; no rank in the balanced ones.
        let read = overlap_lab::diagnose::ranks::read_ranks(&traces).unwrap();
        assert_eq!(read.straggler.map(|s| s.rank), (name == "ddp_straggler").then_some(1), "{name}");
        // Every step sums every gradient once (under no_sync, once a step
        // too): the collectives' messages add up to the traced steps' float32
        // gradients, read from NCCL's kernels.
        let (layers, width) = (p["sizes"]["layers"].as_u64().unwrap(), p["sizes"]["width"].as_u64().unwrap());
        let micro = p["micro_batches"].as_u64().unwrap();
        let sums_a_step = if p["no_sync"].as_bool().unwrap() { 1 } else { micro };
        let steps = record["traced_steps"].as_u64().unwrap();
        let bytes: u64 = read.collectives_by_size.iter().map(|c| c.bytes * c.count as u64).sum();
        assert_eq!(bytes, steps * sums_a_step * layers * width * width * 4, "{name}: {:?}", read.collectives_by_size);
        assert!(read.collectives_by_size.iter().all(|c| c.operation == "AllReduce" && c.bus_gbps > 0.0), "{name}");
    }
}

/// `overlap-lab diagnose` given several ranks' traces, or a folder of
/// them: the ranks side by side (text and `--json`); a folder that is not
/// one step's ranks, or holds no trace, is a one-line error naming it.
#[test]
fn diagnose_sets_several_ranks_traces_side_by_side_from_files_or_a_folder() {
    let data = overlap_lab::measure::record::repo_root().join("data/nvidia-h200/ddp-trace");
    let (r0, r1) = (data.join("ddp_straggler.rank0.json.gz"), data.join("ddp_straggler.rank1.json.gz"));
    let (code, out, err) = cli(&["diagnose", r1.to_str().unwrap(), r0.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("2 ranks, their clocks lined up by their collectives") && out.contains("ddp_straggler.rank1.json.gz"), "{out}");
    let (code, out, err) = cli(&["diagnose", "--json", r0.to_str().unwrap(), r1.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((v["schema"].as_str(), v["ranks"].as_array().unwrap().len()), (Some(overlap_lab::diagnose::ranks::RANKS_SCHEMA), 2));
    assert!(v["ranks"][1]["started_last"].as_u64().unwrap() > 0 && v["ranks"][0]["hidden_us"].as_f64().unwrap() > 0.0, "{out}");
    // A folder: its traces are one step's ranks, or a one-line error.
    let one_step = overlap_lab::testing::temp_dir("diagnose-ranks");
    for f in [&r0, &r1] {
        std::fs::copy(f, one_step.join(f.file_name().unwrap())).unwrap();
    }
    let (code, out, _) = cli(&["diagnose", one_step.to_str().unwrap()]);
    assert!(code == 0 && out.starts_with("2 ranks"), "{out}");
    // Its collectives beside lab 8's recording of the same GPU.
    assert!(out.contains("AllReduce of 64 MiB") && out.contains("lab 8 recorded") && out.contains("data/nvidia-h200/multi-gpu.json"), "{out}");
    let (code, _, err) = cli(&["diagnose", data.to_str().unwrap()]);
    assert!(code != 0 && err.trim().lines().count() == 1 && err.contains("programs.json: JSON, but not a Chrome trace"), "{err}");
    let twice = overlap_lab::testing::temp_dir("diagnose-ranks-twice");
    for name in ["a.json.gz", "b.json.gz"] {
        std::fs::copy(&r0, twice.join(name)).unwrap();
    }
    let (code, _, err) = cli(&["diagnose", twice.to_str().unwrap()]);
    assert!(code != 0 && err.trim().lines().count() == 1 && err.contains("are both rank 0"), "{err}");
    let empty = overlap_lab::testing::temp_dir("diagnose-ranks-empty");
    let (code, _, err) = cli(&["diagnose", empty.to_str().unwrap()]);
    assert!(code != 0 && err.trim().lines().count() == 1 && err.contains("0 trace(s)"), "{err}");
}
