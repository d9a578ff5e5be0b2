//! The command line as a user meets it: help, clear one-line errors with
//! non-zero exits, and the report from recorded data with no GPU.

use std::process::Command;

/// The binary under test: $OVERLAP_LAB_BIN (for test binaries carried to
/// another machine), else the one cargo built.
fn bin() -> String {
    std::env::var("OVERLAP_LAB_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_overlap-lab").to_string())
}

fn repo_data() -> String {
    overlap_lab::measure::record::default_data_dir().to_string_lossy().into_owned()
}

fn cli(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin()).args(args).output().expect("binary runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn help_lists_every_command() {
    let (code, out, _) = cli(&["--help"]);
    assert_eq!(code, 0);
    for c in ["device", "topology", "bandwidth", "report", "all"] {
        assert!(out.contains(c), "help lacks {c}: {out}");
    }
    let (code, out, _) = cli(&["bandwidth", "--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("--min") && out.contains("write-combined"), "{out}");
}

/// The subcommands `--help` lists (the lines under "Commands:").
fn subcommands() -> Vec<String> {
    let (code, out, _) = cli(&["--help"]);
    assert_eq!(code, 0);
    let list = out.split("Commands:").nth(1).expect("help lists commands").split("\n\n").next().unwrap_or("");
    list.lines().filter_map(|l| l.split_whitespace().next()).filter(|c| *c != "help").map(String::from).collect()
}

#[test]
fn every_subcommand_has_help_that_names_its_options() {
    let subs = subcommands();
    // The tools around the labs, and one subcommand per entry of the lab table.
    let mut want = vec!["device".to_string(), "topology".to_string()];
    want.extend(overlap_lab::labs::ALL.iter().map(|l| l.name().to_string()));
    want.extend(["report".to_string(), "all".to_string()]);
    assert_eq!(subs, want, "{subs:?}");
    for sub in &subs {
        let (code, out, err) = cli(&[sub, "--help"]);
        assert_eq!(code, 0, "{sub} --help: {err}");
        assert!(out.contains(&format!("Usage: overlap-lab {sub}")), "{sub} --help: {out}");
        assert!(out.contains("--data") && out.contains("--quiet"), "{sub} --help lacks the global options: {out}");
        if !matches!(sub.as_str(), "device" | "topology" | "report") {
            assert!(out.contains("--device"), "{sub} --help lacks --device: {out}");
        }
    }
    let (_, out, _) = cli(&["all", "--help"]);
    assert!(out.contains("--preset") && out.contains("small") && out.contains("compute-sanitizer"), "{out}");
    let (code, _, err) = cli(&["all", "--preset", "tiny"]);
    assert_eq!(code, 2);
    assert!(err.contains("invalid value 'tiny'") && err.contains("full, quick, small"), "{err}");
}

#[test]
fn bad_input_is_one_clear_line_and_nothing_written() {
    let data = overlap_lab::testing::temp_dir("cli-bad");
    let d = data.to_str().unwrap();
    for (args, needle) in [
        (vec!["--data", d, "bandwidth", "--min", "0"], "minimum size 0 B"),
        (vec!["--data", d, "bandwidth", "--max", "100GiB"], "over the 64 GiB limit"),
        (vec!["--data", d, "bandwidth", "--min", "1MiB", "--max", "4KiB"], "exceeds maximum"),
        (vec!["--data", d, "bandwidth", "--repeats", "0"], "repeats"),
        (vec!["--data", d, "bandwidth", "--kinds", "cached"], "invalid value 'cached'"),
        (vec!["--data", d, "bandwidth", "--min", "4XB"], "unknown size unit"),
    ] {
        let (code, _, err) = cli(&args);
        assert_ne!(code, 0, "{args:?} should fail");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    assert_eq!(std::fs::read_dir(&data).unwrap().count(), 0, "a failed run wrote something");
}

#[test]
fn report_renders_recorded_data_and_missing_data_is_an_error() {
    let out = overlap_lab::testing::temp_dir("cli-report");
    let repo_data = repo_data();
    let (code, stdout, err) = cli(&["--data", &repo_data, "report", "--out", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("bandwidth-by-size.png"), "{stdout}");
    let (code, _, err) = cli(&["--data", "/nonexistent/data", "report", "--out", out.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("no recorded data"), "{err}");
}

#[test]
fn all_without_gpu_says_so_and_renders_recorded_data() {
    if overlap_lab::gpu::Availability::probe().is_ready() {
        eprintln!("SKIPPED all_without_gpu_says_so_and_renders_recorded_data: a GPU is present (the GPU path runs the full sweep)");
        return;
    }
    let out = overlap_lab::testing::temp_dir("cli-all");
    let repo_data = repo_data();
    let (code, stdout, err) = cli(&["--data", &repo_data, "all", "--out", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("no GPU") && stdout.contains("report:"), "{stdout}");
}

/// `topology` lists the GPUs (as text or JSON) or, with no driver, says so
/// in one line.
#[test]
fn topology_lists_the_gpus_or_says_there_are_none() {
    let (code, out, err) = cli(&["topology"]);
    if overlap_lab::gpu::Availability::probe().is_ready() {
        assert_eq!(code, 0, "{err}");
        assert!(out.starts_with("GPU 0: "), "{out}");
        let (code, json, err) = cli(&["topology", "--json"]);
        assert_eq!(code, 0, "{err}");
        let t: overlap_lab::gpu::topology::Topology = serde_json::from_str(&json).unwrap();
        assert!(!t.gpus.is_empty());
    } else {
        assert_ne!(code, 0);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("no CUDA driver found"), "{err}");
    }
}

/// On a GPU: every lab at the small preset (the sanitizer preset) runs
/// end to end through the CLI, and nothing is recorded.
#[test]
fn all_small_runs_every_lab_and_records_nothing() {
    let avail = overlap_lab::gpu::Availability::probe();
    if !avail.is_ready() {
        overlap_lab::testing::skip_unless_required("all_small_runs_every_lab_and_records_nothing", &avail.reason());
        return;
    }
    let data = overlap_lab::testing::temp_dir("cli-all-small");
    let out = overlap_lab::testing::temp_dir("cli-all-small-report");
    let (code, stdout, err) = cli(&["--data", data.to_str().unwrap(), "-q", "all", "--preset", "small", "--out", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{stdout}\n{err}");
    assert!(stdout.contains("not recording: only --preset full is recorded"), "{stdout}");
    for table in ["Break-even", "speed-up", "double-buffered", "hands off to worker"] {
        assert!(stdout.contains(table), "no {table} in {stdout}");
    }
    assert_eq!(std::fs::read_dir(&data).unwrap().count(), 0, "a small run wrote a record");
}
