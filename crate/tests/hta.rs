//! `overlap-lab diagnose` held to a well-known trace-analysis library:
//! Meta's HolisticTraceAnalysis (HTA), run by `crate/reference/hta_compare.py`
//! on every synthetic trace (`synthetic_traces`: lab 10's five programs and
//! a loop whose CPU builds each batch), every committed trace of its
//! real programs (`data/*/pytorch-trace/`) and every committed trace
//! `overlap-lab trace` wrote of its reference programs in CUDA C++, Rust
//! and CuPy, and of two PyTorch loops beside torch.profiler's
//! (`data/*/trace-programs/`), must agree within 1% on the traced window, GPU busy and idle time, and
//! each copy kind's count, bytes and time; and each stream's idle time split
//! HTA's way (host wait, kernel wait, other) within 2% of that stream's idle
//! time. Skips, saying so, where HTA is not importable (`.ci/setup
//! --notebooks` installs it into the venv).

use overlap_lab::labs::pytorch_trace::fixture as synthetic_traces;

use overlap_lab::diagnose::events::copy_kind_from_name;
use overlap_lab::diagnose::{diagnose, read_trace, Diagnosis};
use std::path::PathBuf;
use std::process::Command;

/// The project's Python: the venv `.ci/setup` makes, else `python3`.
fn python() -> String {
    let venv =
        std::env::var_os("OVERLAP_LAB_VENV").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/overlap-lab/venv")));
    venv.map(|v| v.join("bin/python")).filter(|p| p.is_file()).map_or("python3".into(), |p| p.to_string_lossy().into_owned())
}

/// The project's Python where it can import HTA, else None (the caller
/// skips, saying so: `.ci/setup --notebooks` installs it into the venv).
fn python_with_hta() -> Option<String> {
    let python = python();
    let importable = Command::new(&python).args(["-c", "import hta"]).output().is_ok_and(|o| o.status.success());
    if !importable {
        println!("SKIPPED: HolisticTraceAnalysis is not importable by {python} (`.ci/setup --notebooks` installs it into the venv)");
    }
    importable.then_some(python)
}

/// Within 1% (and a ns of rounding for figures near zero).
fn agrees(ours: f64, theirs: f64) -> bool {
    (ours - theirs).abs() <= 0.01 * theirs.abs() + 1e-3
}

/// How far apart, as a share of HTA's figure.
fn apart(ours: f64, theirs: f64) -> f64 {
    if theirs == 0.0 {
        (ours - theirs).abs()
    } else {
        ((ours - theirs) / theirs).abs()
    }
}

/// How far one stream's idle split may be from HTA's: 2% of the stream's
/// idle time as HTA counts it, and the 0.01 µs HTA rounds each figure to.
const IDLE_KINDS_WITHIN: f64 = 0.02;

/// The widest disagreement with HTA's idle split so far: (its share of the
/// stream's idle time, where: trace, stream and kind, ours, HTA's).
type Widest = (f64, String);

/// Checks each stream's idle split (`StreamSummary::idle_kinds`) against
/// HTA's (`hta["idle_kinds"]`, by stream); prints them side by side and
/// keeps the widest disagreement in `widest`.
fn assert_idle_kinds_agree(file: &str, d: &Diagnosis, hta: &serde_json::Value, widest: &mut Widest) {
    let theirs = hta["idle_kinds"].as_object().unwrap_or_else(|| panic!("{file}: HTA gave no idle_kinds"));
    let streams = &d.gpus[0].streams;
    assert_eq!(theirs.len(), streams.len(), "{file}: HTA's streams {:?}", theirs.keys().collect::<Vec<_>>());
    for s in streams {
        let t = &theirs.get(&s.stream.to_string()).unwrap_or_else(|| panic!("{file}: HTA has no stream {}", s.stream));
        let kinds = [
            ("host wait", s.idle_kinds.host_wait_us, "host_wait_us"),
            ("kernel wait", s.idle_kinds.kernel_wait_us, "kernel_wait_us"),
            ("other", s.idle_kinds.other_us, "other_us"),
        ];
        let theirs_of = |k: &str| t[k].as_f64().unwrap_or_else(|| panic!("{file}: stream {}: no {k}", s.stream));
        let total: f64 = kinds.iter().map(|k| theirs_of(k.2)).sum();
        let mut line = Vec::new();
        for (what, ours, key) in kinds {
            let theirs = theirs_of(key);
            let off = (ours - theirs).abs();
            assert!(
                off <= IDLE_KINDS_WITHIN * total + 0.01,
                "{file}: stream {}: {what} {ours:.2} µs, HTA {theirs:.2} µs: apart by more than 2% of its idle {total:.2} µs",
                s.stream
            );
            let share = if total > 0.0 { off / total } else { 0.0 };
            if share >= widest.0 {
                *widest = (share, format!("{file} stream {} {what}: ours {ours:.2} µs, HTA {theirs:.2} µs", s.stream));
            }
            line.push(format!("{what} {ours:.2}/{theirs:.2}"));
        }
        println!("{file}: stream {} idle (ours/HTA, µs): {}", s.stream, line.join(", "));
    }
}

#[test]
fn diagnose_agrees_with_holistic_trace_analysis_on_every_synthetic_and_committed_trace() {
    let Some(python) = python_with_hta() else { return };
    let script = overlap_lab::measure::record::repo_root().join("crate/reference/hta_compare.py");
    let dir = overlap_lab::testing::temp_dir("diagnose-hta");
    // The synthetic traces, then every committed trace of lab 10's real
    // programs (unpacked: the comparison reads plain JSON).
    let mut traces: Vec<(String, std::path::PathBuf)> = synthetic_traces::all().iter().map(|s| (s.file.to_string(), s.write(&dir))).collect();
    // The traces `overlap-lab trace` writes (Kineto's schema, its sync
    // events kept: none carries a stream HTA would take for GPU work), of
    // two made-up programs' records.
    use overlap_lab_tracefile::{fixture, kineto, raw};
    for (name, records) in [("overlap-lab-trace-serial.json", fixture::program()), ("overlap-lab-trace-chunks.json", fixture::chunks_on_four_streams())] {
        let path = dir.join(name);
        std::fs::write(&path, kineto::convert(&raw::parse(&records).unwrap(), name).json.to_string()).unwrap();
        traces.push((name.to_string(), path));
    }
    let data = overlap_lab::measure::record::repo_root().join("data");
    let mut committed: Vec<std::path::PathBuf> = std::fs::read_dir(&data)
        .unwrap()
        .flatten()
        .flat_map(|e| [e.path().join(overlap_lab::labs::pytorch_trace::LAB), e.path().join(overlap_lab::labs::pytorch_trace::any_program::FOLDER)])
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|d| d.flatten().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".json.gz"))
        .collect();
    committed.sort();
    assert!(!committed.is_empty(), "no committed lab 10 trace in {}", data.display());
    for gz in committed {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(std::fs::File::open(&gz).unwrap()), &mut text).unwrap();
        // A trace recorded with CUDA sync events holds them on the GPU's
        // lanes; HTA takes them for the GPU's work (its busy time grows by
        // the waits), ours never does: HTA reads the trace without them.
        if text.contains("\"cuda_sync\"") {
            let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
            v["traceEvents"].as_array_mut().unwrap().retain(|e| e["cat"] != "cuda_sync");
            text = serde_json::to_string(&v).unwrap();
        }
        let name = gz.strip_prefix(&data).unwrap().to_string_lossy().trim_end_matches(".gz").replace('/', "-");
        let path = dir.join(&name);
        std::fs::write(&path, text).unwrap();
        traces.push((format!("data/{}", gz.strip_prefix(&data).unwrap().display()), path));
    }
    let mut widest_idle: Widest = (0.0, "no stream".into());
    for (file, path) in &traces {
        let out = Command::new(&python).arg(&script).arg(path).output().expect("python runs");
        assert!(out.status.success(), "{}: hta_compare.py failed: {}", file, String::from_utf8_lossy(&out.stderr));
        let hta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{}: {e}", file));
        let d = diagnose(&read_trace(path, &mut |_, _| {}).unwrap(), file, &[]);
        let g = &d.gpus[0];
        let mut widest: f64 = 0.0;
        let figure = |k: &str| hta[k].as_f64().unwrap_or_else(|| panic!("{}: HTA gave no {k}", file));
        for (what, ours, theirs) in
            [("window", d.window.duration_us(), figure("window_us")), ("busy", g.busy_us, figure("busy_us")), ("idle", g.idle_us, figure("idle_us"))]
        {
            assert!(agrees(ours, theirs), "{}: {what} {ours} µs, HTA {theirs} µs", file);
            widest = widest.max(apart(ours, theirs));
        }
        assert_idle_kinds_agree(file, &d, &hta, &mut widest_idle);
        let theirs = hta["copies"].as_object().unwrap();
        assert_eq!(theirs.len(), g.copies.len(), "{}: copy kinds {theirs:?}", file);
        for (name, c) in theirs {
            let label = copy_kind_from_name(name).unwrap_or_else(|| panic!("{name}")).label();
            let ours = g.copies.iter().find(|o| o.label() == label).unwrap_or_else(|| panic!("{}: no {label} copies", file));
            assert_eq!(ours.count as u64, c["count"].as_u64().unwrap(), "{}: {label} count", file);
            assert_eq!(ours.bytes, c["bytes"].as_u64(), "{}: {label} bytes", file);
            let t = c["time_us"].as_f64().unwrap();
            assert!(agrees(ours.time_us, t), "{}: {label} time {} µs, HTA {t} µs", file, ours.time_us);
            widest = widest.max(apart(ours.time_us, t));
        }
        println!(
            "{}: window, busy, idle and {} copy kinds agree with HTA {} (the widest apart by {:.1e} of HTA's figure)",
            file,
            g.copies.len(),
            hta["version"],
            widest
        );
    }
    println!("idle split per stream, the widest apart from HTA's: {:.2e} of the stream's idle time ({})", widest_idle.0, widest_idle.1);
}

/// `overlap-lab diagnose` on several ranks held to HTA: on every committed
/// data-parallel recording (`data/*/ddp-trace/`, a trace per rank of each
/// program), each rank's window and idle time agree with HTA's temporal
/// breakdown within 1% of the window, and the communication it hid under
/// computation, as a share of its communication, with HTA's
/// communication/computation overlap within 2 points; and where we name a
/// straggler, HTA's one potential straggler (its analysis of the marked
/// steps) is that rank. Skips, saying so, where HTA is not importable.
#[test]
fn several_ranks_agree_with_holistic_trace_analysis() {
    use overlap_lab::diagnose::ranks::read_ranks;
    let Some(python) = python_with_hta() else { return };
    let root = overlap_lab::measure::record::repo_root();
    let script = root.join("crate/reference/hta_compare.py");
    let (mut compared, mut stragglers) = (0, 0);
    for gpu in std::fs::read_dir(root.join("data")).unwrap().flatten() {
        let dir = gpu.path().join("ddp-trace");
        let Ok(text) = std::fs::read_to_string(dir.join("programs.json")) else { continue };
        let record: serde_json::Value = serde_json::from_str(&text).unwrap();
        for (name, p) in record["programs"].as_object().unwrap() {
            let files: Vec<std::path::PathBuf> = p["traces"].as_array().unwrap().iter().map(|t| dir.join(t.as_str().unwrap())).collect();
            let traces: Vec<(String, overlap_lab::diagnose::Trace)> =
                files.iter().map(|f| (f.display().to_string(), read_trace(f, &mut |_, _| {}).unwrap())).collect();
            let ours = read_ranks(&traces).unwrap_or_else(|e| panic!("{name}: {e}"));
            let out = Command::new(&python).arg(&script).args(&files).output().expect("python runs");
            assert!(out.status.success(), "{name}: hta_compare.py failed: {}", String::from_utf8_lossy(&out.stderr));
            let hta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{name}: {e}"));
            for r in &ours.ranks {
                let theirs = &hta["ranks"][r.rank.to_string()];
                let (window, idle, overlap) =
                    (theirs["window_us"].as_f64().unwrap(), theirs["idle_us"].as_f64().unwrap(), theirs["overlap_pctg"].as_f64().unwrap());
                println!(
                    "{name} rank {}: window {:.1} / {window:.1} µs, idle {:.1} / {idle:.1} µs, hidden {:.2}% / {overlap:.2}% (ours / HTA's)",
                    r.rank,
                    r.window_us,
                    r.idle_us(),
                    100.0 * r.hidden_share()
                );
                assert!((r.window_us - window).abs() <= 0.01 * window, "{name} rank {}: window", r.rank);
                assert!((r.idle_us() - idle).abs() <= 0.01 * window, "{name} rank {}: idle", r.rank);
                assert!((100.0 * r.hidden_share() - overlap).abs() <= 2.0, "{name} rank {}: hidden", r.rank);
                compared += 1;
            }
            if let Some(s) = &ours.straggler {
                let theirs: Option<Vec<u64>> = hta["potential_stragglers"].as_array().map(|a| a.iter().filter_map(|r| r.as_u64()).collect());
                println!("{name}: straggler rank {} (ours), {theirs:?} (HTA's)", s.rank);
                assert_eq!(theirs, Some(vec![u64::from(s.rank)]), "{name}: HTA's potential straggler");
                stragglers += 1;
            }
        }
    }
    assert!(compared >= 14 && stragglers >= 1, "only {compared} ranks and {stragglers} stragglers compared");
}
