//! `overlap-lab trace`'s files read the way `torch.profiler`'s are: raw
//! records as the injection library writes them, converted to Kineto's
//! schema, then read by the diagnosis' own reader and diagnosed. No GPU:
//! the records are made here, as CUPTI would hand them over.

use overlap_lab::diagnose::events::{Direction, GpuOpKind, HostMemory};
use overlap_lab::diagnose::{diagnose, read_trace_text, Trace};
use overlap_lab_tracefile::fixture::*;
use overlap_lab_tracefile::kineto::{convert, unversioned};
use overlap_lab_tracefile::raw::{parse, write_record};
use overlap_lab_tracefile::records::*;
use std::process::Command;

fn converted() -> (serde_json::Value, overlap_lab_tracefile::kineto::Summary, Trace) {
    let raw = parse(&program()).unwrap();
    let k = convert(&raw, "patterns.json.gz");
    let trace = read_trace_text("patterns.json.gz", &k.json.to_string()).unwrap_or_else(|e| panic!("our trace does not read: {e}"));
    (k.json, k.summary, trace)
}

#[test]
fn each_gpu_op_reads_back_with_its_kind_memory_stream_and_call() {
    let (_, summary, t) = converted();
    assert_eq!((summary.kernels, summary.copies, summary.memsets), (4, 6, 0));
    let kinds: Vec<GpuOpKind> = t.gpu_ops.iter().take(3).map(|o| o.kind).collect();
    assert_eq!(
        kinds,
        vec![
            GpuOpKind::Copy { direction: Direction::H2d, host: Some(HostMemory::Pageable) },
            GpuOpKind::Kernel,
            GpuOpKind::Copy { direction: Direction::D2h, host: Some(HostMemory::Pinned) },
        ]
    );
    assert!(t.gpu_ops.iter().take(3).all(|o| o.stream == 13 && o.gpu == 0 && o.bytes.is_some() == o.kind.is_copy()));
    // Kernel names demangled, as Kineto writes them.
    assert_eq!(t.gpu_ops[1].name, "work(float const*, float*, unsigned long, int, float, float)");
    // Each op's call found by correlation, named without CUPTI's version suffix.
    let names: Vec<&str> = t.calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(&names[..4], ["cudaMemcpyAsync", "cudaLaunchKernel", "cuMemcpyDtoHAsync_v2", "cudaStreamSynchronize"]);
    assert_eq!(t.gpu_names, vec![(0, "NVIDIA H200".to_string())]);
    // Times in µs from the first record (the NVTX range's start).
    assert_eq!((t.gpu_ops[0].start_us, t.gpu_ops[1].start_us, t.gpu_ops[1].end_us), (15.0, 1230.0, 1830.0));
}

#[test]
fn a_wait_names_the_stream_and_call_that_recorded_its_event() {
    let (_, _, t) = converted();
    assert_eq!(t.stream_waits.len(), 1);
    let w = &t.stream_waits[0];
    assert_eq!((w.stream, w.recorded_stream, w.event_id), (14, Some(13), Some(5)));
    let record = t.calls.iter().find(|c| c.name == "cudaEventRecord").unwrap();
    assert_eq!(w.record_correlation, record.correlation);
    // Event records go into the waits; they are not drawn (no time of their own).
    assert!(t.event_records.is_empty());
    assert_eq!(t.sync_events, 4);
}

#[test]
fn a_failed_launch_is_left_out_and_counted_and_nvtx_ranges_are_annotations() {
    let (json, summary, t) = converted();
    assert_eq!(summary.calls_left_out.get("cudaLaunchKernel"), Some(&1));
    assert_eq!(t.calls.iter().filter(|c| c.name == "cudaLaunchKernel").count(), 4);
    assert_eq!(json["overlap_lab"]["calls_left_out"]["cudaLaunchKernel"], 1);
    assert_eq!(json["overlap_lab"]["without_timestamps"], 2);
    assert!(summary.complete);
    let range: Vec<_> = t.cpu_ops.iter().filter(|o| o.annotation).collect();
    assert_eq!(range.len(), 1);
    assert_eq!(range[0].name, "loop");
    assert_eq!(summary.nvtx_ranges, 1);
}

/// A peer copy's call with no copy under it: where peer-copy records were
/// not asked for (the library's default), counted as such and said in the
/// line `overlap-lab trace` prints; where they were, a copy that never ran.
/// A plain copy call with no copy is one that failed or never ran (CUPTI 13
/// records a copy between two GPUs' addresses as a plain copy).
#[test]
fn peer_copies_left_unrecorded_by_default_are_counted_and_said_apart_from_failed_calls() {
    let records = |not_asked: Vec<String>, plain_copy_left_out: bool| {
        let mut r = vec![
            Record::Process(Process {
                pid: 7,
                parent_pid: 1,
                exe: "/tmp/p".into(),
                argv: vec![],
                cupti_version: 130001,
                refused_kinds: vec![],
                kinds_not_asked: not_asked,
            }),
            call(Api::Runtime, "cudaMemcpyPeerAsync_v4000", 10, 12, 40),
            call(Api::Runtime, "cudaMemcpyAsync_v3020", 20, 21, 41),
            copy(8, 3, 3, 13, 30, 40, 41),
        ];
        if plain_copy_left_out {
            r.push(call(Api::Runtime, "cudaMemcpyAsync_v3020", 50, 51, 42));
        }
        r.push(Record::End(End { at_ns: 1_000_000, signal: None }));
        let mut out = Vec::new();
        for rec in &r {
            write_record(&mut out, rec).unwrap();
        }
        convert(&parse(&String::from_utf8(out).unwrap()).unwrap(), "p.json.gz").summary
    };
    let described = |summary| overlap_lab::trace::describe(&overlap_lab::trace::ProcessTrace { path: "p.json.gz".into(), summary });
    let default = records(vec!["peer".into(), "sync".into(), "event".into()], false);
    assert_eq!(default.peer_copies_not_recorded, 1);
    assert!(default.calls_left_out.is_empty(), "{:?}", default.calls_left_out);
    let line = described(default.clone());
    assert!(line.contains("1 copies between GPUs have no record") && line.contains("--peer-copies"), "{line}");
    let asked = records(vec![], false);
    assert_eq!(asked.peer_copies_not_recorded, 0);
    assert_eq!(asked.calls_left_out.get("cudaMemcpyPeerAsync"), Some(&1));
    assert!(!described(asked).contains("--peer-copies"));
    // A plain copy call with no copy is left out as a call whose work never ran.
    let plain = described(records(vec!["peer".into()], true));
    assert!(plain.contains("1x cudaMemcpyAsync") && plain.contains("never ran"), "{plain}");
}

#[test]
fn the_diagnosis_reads_our_trace_and_finds_its_host_syncs_and_pageable_copies() {
    let (_, _, t) = converted();
    let d = diagnose(&t, "patterns.json.gz", &[]);
    let text = d.to_string();
    assert!(d.syncs.calls >= 3, "{text}");
    assert!(text.contains("pageable"), "{text}");
    assert!(text.contains("cudaStreamSynchronize"), "{text}");
}

/// A program of ours traced is named as what wrote it, and its fixes are
/// said in the words of the API it calls: CUDA's for a program whose
/// kernels are its own, PyTorch's where its kernels are PyTorch's.
#[test]
fn our_traces_fixes_are_said_in_cudas_words_unless_its_kernels_are_pytorchs() {
    use overlap_lab::diagnose::events::TraceFormat;
    use overlap_lab::diagnose::fixes::ProgramApi;
    let (_, _, t) = converted();
    assert_eq!(t.format, Some(TraceFormat::OverlapLabTrace));
    let d = diagnose(&t, "patterns.json.gz", &[]);
    let text = d.to_string();
    assert_eq!(d.api, ProgramApi::Cuda);
    assert!(text.contains("overlap-lab trace (CUPTI") && !text.contains("torch.profiler"), "{text}");
    assert!(text.contains("fix in CUDA: host buffers in page-locked memory (`cudaMallocHost`"), "{text}");
    assert!(text.contains("fix in CUDA: no `cudaStreamSynchronize`"), "{text}");
    assert!(!text.contains("torch") && !text.contains("pin_memory"), "{text}");
    let json = serde_json::to_value(&d).unwrap();
    assert_eq!((json["format"].as_str(), json["api"].as_str()), (Some("overlap-lab-trace"), Some("cuda")));
    // The same program's kernels renamed as PyTorch's own.
    let mut t = t;
    for o in t.gpu_ops.iter_mut().filter(|o| o.kind == GpuOpKind::Kernel) {
        o.name = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int, float*)".into();
    }
    let d = diagnose(&t, "patterns.json.gz", &[]);
    assert_eq!(d.api, ProgramApi::PyTorch);
    assert!(d.to_string().contains("fix in PyTorch: host tensors in pinned memory"), "{d}");
}

#[test]
fn an_end_past_the_next_ops_end_on_its_stream_is_moved_to_its_start_but_overlaps_that_can_be_stay() {
    let mut text = program();
    let mut extra = Vec::new();
    // A copy CUPTI ended 160 ms late, then the next call's kernel on its stream.
    write_record(&mut extra, &call(Api::Runtime, "cudaMemcpyAsync_v3020", 20_000, 20_010, 900)).unwrap();
    write_record(&mut extra, &copy(8, 3, 3, 21, 20_020, 180_000, 900)).unwrap();
    write_record(&mut extra, &call(Api::Runtime, "cudaLaunchKernel_v7000", 20_011, 20_015, 901)).unwrap();
    write_record(&mut extra, &kernel("_Z4workPKfPfmiff", 21, 20_030, 20_400, 901)).unwrap();
    // Two nodes of one graph launch, overlapping on their launch's stream.
    write_record(&mut extra, &call(Api::Runtime, "cudaGraphLaunch_v10000", 21_000, 21_010, 902)).unwrap();
    write_record(&mut extra, &kernel("_Z4workPKfPfmiff", 22, 21_020, 21_500, 902)).unwrap();
    write_record(&mut extra, &kernel("_Z4workPKfPfmiff", 22, 21_030, 21_400, 902)).unwrap();
    // A kernel launched dependent on the one before it: it starts 10 µs
    // before that one ends, and ends after it.
    write_record(&mut extra, &call(Api::Runtime, "cudaLaunchKernel_v7000", 22_000, 22_005, 903)).unwrap();
    write_record(&mut extra, &kernel("_Z4workPKfPfmiff", 23, 22_010, 22_410, 903)).unwrap();
    write_record(&mut extra, &call(Api::Runtime, "cudaLaunchKernel_v7000", 22_006, 22_009, 904)).unwrap();
    write_record(&mut extra, &kernel("_Z4workPKfPfmiff", 23, 22_400, 22_800, 904)).unwrap();
    // Before the End line.
    let end = text.rfind("{\"record\":\"end\"").unwrap();
    text.insert_str(end, std::str::from_utf8(&extra).unwrap());
    let k = convert(&parse(&text).unwrap(), "t.json.gz");
    assert_eq!(k.summary.ends_clamped, 1);
    let t = read_trace_text("t.json.gz", &k.json.to_string()).unwrap();
    let late = t.gpu_ops.iter().find(|o| o.stream == 21 && o.kind.is_copy()).unwrap();
    assert_eq!((late.start_us, late.end_us), (20_020.0, 20_030.0));
    let graph: Vec<_> = t.gpu_ops.iter().filter(|o| o.stream == 22).collect();
    assert_eq!(graph.iter().map(|o| o.end_us).collect::<Vec<_>>(), [21_500.0, 21_400.0]);
    let dependent: Vec<_> = t.gpu_ops.iter().filter(|o| o.stream == 23).map(|o| o.end_us).collect();
    assert_eq!(dependent, [22_410.0, 22_800.0]);
}

#[test]
fn kernels_that_ran_side_by_side_on_several_streams_are_replayed_so() {
    let k = convert(&parse(&chunks_on_four_streams()).unwrap(), "chunks.json.gz");
    let t = read_trace_text("chunks.json.gz", &k.json.to_string()).unwrap();
    let share = overlap_lab::diagnose::queries::kernels_side_by_side(&t);
    assert!(share > 0.5, "{share}");
    use overlap_lab::diagnose::replay::{predict, schedule, Pricing};
    let replayed = predict(&schedule(&t, &[], &Pricing::default()).unwrap());
    let traced = t.window_us().1 - t.window_us().0;
    // One at a time its twenty kernels alone would take 10 ms; as they
    // ran, the window took under 5.
    assert!((replayed / traced - 1.0).abs() < 0.01, "replayed {replayed} µs against {traced} traced");
    assert!(overlap_lab::diagnose::queries::kernels_side_by_side(&converted().2) < 0.01);
}

#[test]
fn cupti_names_lose_only_a_four_digit_version() {
    assert_eq!(unversioned("cudaLaunchKernel_v7000"), "cudaLaunchKernel");
    assert_eq!(unversioned("cudaMemcpyAsync_ptsz_v7000"), "cudaMemcpyAsync_ptsz");
    assert_eq!(unversioned("cuMemcpyHtoDAsync_v2"), "cuMemcpyHtoDAsync_v2");
    assert_eq!(unversioned("cuCtxSynchronize"), "cuCtxSynchronize");
}

fn bin() -> String {
    std::env::var("OVERLAP_LAB_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_overlap-lab").to_string())
}

/// `trace` with a stand-in library (the driver never loads it here: there
/// is no GPU, and these commands run no CUDA).
fn trace(args: &[&str]) -> (i32, String, String) {
    let stand_in = std::env::temp_dir().join("overlap-lab-test-inject.so");
    std::fs::write(&stand_in, b"not a library").unwrap();
    let out = Command::new(bin()).arg("trace").arg("--inject").arg(&stand_in).args(args).env_remove("CUDA_INJECTION64_PATH").output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_command_that_runs_no_cuda_gets_one_line_and_keeps_its_exit_code() {
    let (code, out, err) = trace(&["--", "sh", "-c", "echo from the program; exit 3"]);
    assert_eq!(code, 3, "{err}");
    assert_eq!(out, "from the program\n");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("did no CUDA work") && err.contains("exited with 3"), "{err}");
    let (code, _, err) = trace(&["--", "true"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no process of it initialized CUDA"), "{err}");
}

#[test]
fn a_missing_command_or_library_is_one_line_naming_it() {
    let (code, _, err) = trace(&["--", "/nonexistent/program"]);
    assert_ne!(code, 0);
    assert!(err.contains("cannot run /nonexistent/program") && err.lines().count() == 1, "{err}");
    let out = Command::new(bin()).args(["trace", "--inject", "/nonexistent/lib.so", "--", "true"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("--inject") && err.contains("/nonexistent/lib.so") && err.lines().count() == 1, "{err}");
    let out = Command::new(bin()).args(["trace"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn another_tools_injection_leaves_the_command_running_untraced_and_says_so() {
    let stand_in = std::env::temp_dir().join("overlap-lab-test-inject2.so");
    std::fs::write(&stand_in, b"not a library").unwrap();
    let out = Command::new(bin())
        .args(["trace", "--inject"])
        .arg(&stand_in)
        .args(["--", "sh", "-c", "echo $CUDA_INJECTION64_PATH"])
        .env("CUDA_INJECTION64_PATH", "/opt/sanitizer/libinject.so")
        .output()
        .unwrap();
    let (stdout, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // The command saw the other tool's library, not ours.
    assert_eq!(stdout, "/opt/sanitizer/libinject.so\n");
    assert!(err.contains("another tool") && err.contains("untraced") && err.lines().count() == 1, "{err}");
}

/// `patterns.cu` (the CUDA C++ reference program) built with nvcc into a
/// scratch folder, beside the GPU held by this test; None (skipped) where
/// there is no GPU or no nvcc, a failure where a GPU is required.
fn patterns_or_skip(test: &str) -> Option<(overlap_lab::testing::TestGpu, std::path::PathBuf)> {
    let gpu = overlap_lab::testing::gpu_or_skip(test)?;
    let nvcc = ["nvcc", "/usr/local/cuda/bin/nvcc"].into_iter().find(|n| Command::new(n).arg("--version").output().is_ok_and(|o| o.status.success()));
    let Some(nvcc) = nvcc else {
        overlap_lab::testing::skip_unless_required(test, "no nvcc to build patterns.cu");
        return None;
    };
    let source = [concat!(env!("CARGO_MANIFEST_DIR"), "/reference/trace/patterns.cu"), "crate/reference/trace/patterns.cu", "reference/trace/patterns.cu"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("patterns.cu is in crate/reference/trace");
    let dir = std::env::temp_dir().join(format!("overlap-lab-trace-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("patterns");
    let built = Command::new(nvcc).args(["-O2", "-o"]).arg(&exe).arg(source).output().unwrap();
    assert!(built.status.success(), "nvcc: {}", String::from_utf8_lossy(&built.stderr));
    Some((gpu, exe))
}

/// The library never harms what it traces: a program that aborts after its
/// CUDA work began, one that calls `exit` with work still queued, one that
/// forks (each process its own file) and one that launches from four
/// threads each keep their own exit code and output, and leave a trace
/// that reads, holding what ran. Under compute-sanitizer (which holds
/// CUPTI) it says so in one line and the program runs unchanged.
#[test]
fn traced_programs_that_crash_exit_fork_or_use_threads_keep_their_exit_code_and_leave_a_trace() {
    let test = "traced_programs_that_crash_exit_fork_or_use_threads_keep_their_exit_code_and_leave_a_trace";
    let Some((_gpu, exe)) = patterns_or_skip(test) else {
        return;
    };
    let dir = exe.parent().unwrap().to_path_buf();
    let exe = exe.to_str().unwrap();
    // mode, its exit code (abort: 128 + SIGABRT), how many CUDA processes, whether all of its kernels ran
    for (mode, code, processes, kernels_ran) in [("crash", 134, 1, true), ("exit", 3, 1, false), ("fork", 0, 2, true), ("threads", 0, 1, true)] {
        let file = dir.join(format!("{mode}.json.gz"));
        let out = Command::new(bin()).args(["trace", "--no-diagnose", "-o"]).arg(&file).args(["--", exe, mode, "8", "4"]).output().unwrap();
        let (stdout, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(code), "{mode}: {stdout}{err}");
        if mode != "exit" {
            assert!(stdout.contains("values checked"), "{mode}: the program's own output is kept: {stdout}");
        }
        let files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with(&format!("{mode}.")) && p.to_str().unwrap().ends_with(".json.gz"))
            .collect();
        assert_eq!(files.len(), processes, "{mode}: one file per CUDA process: {files:?}\n{err}");
        for f in &files {
            let t = overlap_lab::diagnose::read_trace(f, &mut |_, _| {}).unwrap_or_else(|e| panic!("{mode}: {} does not read: {e}", f.display()));
            let kernels = t.gpu_ops.iter().filter(|o| o.kind == GpuOpKind::Kernel).count();
            // `exit` leaves with its work queued: the calls whose GPU work
            // never ran are left out (and counted), the others stay.
            assert!(!t.calls.is_empty(), "{mode}: {} holds no CUDA call", f.display());
            if kernels_ran {
                let per_process = if mode == "threads" { 4 * 8 } else { 8 };
                assert_eq!(kernels, per_process, "{mode}: {} holds every kernel that ran", f.display());
            }
        }
    }
    let sanitizer = ["compute-sanitizer", "/usr/local/cuda/bin/compute-sanitizer"]
        .into_iter()
        .find(|n| Command::new(n).arg("--version").output().is_ok_and(|o| o.status.success()));
    let Some(sanitizer) = sanitizer else {
        overlap_lab::testing::skip_unless_required(test, "no compute-sanitizer for the part that runs under it");
        return;
    };
    let out = Command::new(sanitizer)
        .args(["--target-processes", "all", &bin(), "trace", "--no-diagnose", "-o"])
        .arg(dir.join("sanitized.json.gz"))
        .args(["--", exe, "serial", "2", "4"])
        .output()
        .unwrap();
    let (stdout, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("2 batches of 4 MiB") && stdout.contains("values checked"), "the program runs unchanged: {stdout}{err}");
    let said: Vec<&str> = err.lines().chain(stdout.lines()).filter(|l| l.contains("CUPTI is held by another tool")).collect();
    assert_eq!(said.len(), 1, "one line says why it cannot trace: {stdout}{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The reference programs `overlap-lab trace` traced on a GPU
/// (`data/*/trace-programs/`, written by `crate/reference/trace/record.py`),
/// the same patterns in CUDA C++, Rust on cudarc and CuPy: each fix a
/// program's diagnosis offers, predicted from its trace, against the
/// untraced runs of the program that applies it, by lab 10's rule (within
/// the smaller of 10% and a third of the measured gain); a program that
/// already overlaps is offered no fix that gains. Each trace's GPU busy,
/// idle and copy totals are held to HTA's in `tests/hta.rs`.
///
/// Every fix agrees: CuPy's loops build each batch's fresh values in well
/// under the GPU's time over it (data/nvidia-h200/README.md tells how the
/// miss of their copy stream, when NumPy took about the GPU's time, went).
#[test]
fn every_reference_programs_fix_is_predicted_within_its_tolerance_of_the_program_that_applies_it() {
    use overlap_lab::labs::pytorch_trace::{any_program::ReferenceRecording, fixes_table};
    let data = overlap_lab::measure::record::repo_root().join("data");
    let recordings = ReferenceRecording::find(&data).unwrap();
    assert!(!recordings.is_empty(), "no data/*/trace-programs/programs.json");
    for rec in &recordings {
        let checks = rec.fix_checks().unwrap();
        println!("{}\n{}\n{}\n{}", rec.origin(), fixes_table(&checks), rec.cost_table().unwrap(), rec.comparison_table());
        assert!(checks.not_compared.is_empty(), "{:?}", checks.not_compared);
        let language = |program: &str| -> &'static str {
            match program.split_once('-') {
                Some(("cudarc", _)) => "cudarc",
                Some(("cupy", _)) => "cupy",
                _ => "CUDA C++",
            }
        };
        for l in ["CUDA C++", "cudarc", "cupy"] {
            let of_it = checks.checks.iter().filter(|c| language(&c.before) == l).count();
            assert!(of_it >= 3, "{}: only {of_it} fixes of the {l} programs", rec.dir.display());
        }
        for c in &checks.checks {
            let off = c.off_judged();
            assert!(c.agrees(), "{}: {} + {}: {:+.1}%, beyond {:.1}%", rec.dir.display(), c.before, c.fix, 100.0 * off, 100.0 * c.tolerance());
        }
        // Programs that overlap already: nothing offered gains a tenth.
        for (name, p) in &rec.recorded.programs {
            if !p.fixes.is_empty() {
                continue;
            }
            let d = rec.diagnosis(name).unwrap();
            let best = d.what_if.as_ref().and_then(|w| w.predictions.first()).map_or(1.0, |p| p.gain);
            assert!(best < 1.1, "{name}: a fix offered gains {best:.2}x on a program that overlaps\n{d}");
        }
    }
}

/// Our traces and torch.profiler's of the same PyTorch loops, as the
/// recordings compared them op by op (separate runs): every op holding 1%
/// of the GPU time within 2% of torch.profiler's, each pageable copy set
/// over its own run's CUDA events (its total moves with the host's
/// staging from one process to the next: data/nvidia-h200/README.md;
/// the tiny-op loop's few-KiB ones, untimed, agree as totals), and every
/// copy's memory kind and count the same. Recordings made before the
/// copies were timed by events are left out.
#[test]
fn our_traces_and_torch_profilers_agree_op_by_op_within_two_percent() {
    use overlap_lab::labs::pytorch_trace::any_program::ReferenceRecording;
    let data = overlap_lab::measure::record::repo_root().join("data");
    let mut judged = 0;
    for rec in ReferenceRecording::find(&data).unwrap() {
        for (name, c) in &rec.recorded.torch_traces_compared {
            assert!(c.copies_agree, "{}: {name}: the copies' memory kinds or counts differ", rec.dir.display());
            // Recordings from before the pageable copies were timed by events have none.
            if !c.rows.iter().any(|r| r.off_by_events.is_some()) {
                continue;
            }
            let worst = c.worst_judged.unwrap_or_else(|| panic!("{}: {name}: an op holding 1% of the GPU time is in our traces only", rec.dir.display()));
            assert!(worst <= 0.02, "{}: {name}: {:.2}% apart\n{}", rec.dir.display(), 100.0 * worst, rec.comparison_table());
            judged += c.rows.iter().filter(|r| r.counted && r.off_by_events.is_some()).count();
        }
    }
    // The loop with a sync each step times its pageable uploads and downloads.
    assert!(judged >= 2, "only {judged} pageable copies set over their runs' CUDA events");
}
