//! `overlap-lab diagnose` held to a well-known trace-analysis library:
//! Meta's HolisticTraceAnalysis (HTA), run by `crate/reference/hta_compare.py`
//! on every synthetic trace of lab 10's five programs (`synthetic_traces`) and
//! every committed trace of its real programs (`data/*/pytorch-trace/`),
//! must agree within 1% on the traced window, GPU busy and idle time, and
//! each copy kind's count, bytes and time. Skips, saying so, where HTA is
//! not importable (`.ci/setup --notebooks` installs it into the venv).

use overlap_lab::labs::pytorch_trace::fixture as synthetic_traces;

use overlap_lab::diagnose::events::copy_kind_from_name;
use overlap_lab::diagnose::{diagnose, read_trace};
use std::path::PathBuf;
use std::process::Command;

/// The project's Python: the venv `.ci/setup` makes, else `python3`.
fn python() -> String {
    let venv =
        std::env::var_os("OVERLAP_LAB_VENV").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/overlap-lab/venv")));
    venv.map(|v| v.join("bin/python")).filter(|p| p.is_file()).map_or("python3".into(), |p| p.to_string_lossy().into_owned())
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

#[test]
fn diagnose_agrees_with_holistic_trace_analysis_on_every_synthetic_and_committed_trace() {
    let python = python();
    let importable = Command::new(&python).args(["-c", "import hta"]).output().is_ok_and(|o| o.status.success());
    if !importable {
        println!("SKIPPED: HolisticTraceAnalysis is not importable by {python} (`.ci/setup --notebooks` installs it into the venv)");
        return;
    }
    let script = overlap_lab::measure::record::repo_root().join("crate/reference/hta_compare.py");
    let dir = overlap_lab::testing::temp_dir("diagnose-hta");
    // The synthetic traces, then every committed trace of lab 10's real
    // programs (unpacked: the comparison reads plain JSON).
    let mut traces: Vec<(String, std::path::PathBuf)> = synthetic_traces::all().iter().map(|s| (s.file.to_string(), s.write(&dir))).collect();
    let data = overlap_lab::measure::record::repo_root().join("data");
    let mut committed: Vec<std::path::PathBuf> = std::fs::read_dir(&data)
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_dir(e.path().join(overlap_lab::labs::pytorch_trace::LAB)).ok())
        .flat_map(|d| d.flatten().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".json.gz"))
        .collect();
    committed.sort();
    assert!(!committed.is_empty(), "no committed lab 10 trace in {}", data.display());
    for gz in committed {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(std::fs::File::open(&gz).unwrap()), &mut text).unwrap();
        let name = gz.strip_prefix(&data).unwrap().to_string_lossy().trim_end_matches(".gz").replace('/', "-");
        let path = dir.join(&name);
        std::fs::write(&path, text).unwrap();
        traces.push((format!("data/{}", gz.strip_prefix(&data).unwrap().display()), path));
    }
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
}
