//! The command line as a user meets it: help, clear one-line errors with
//! non-zero exits, and the report from recorded data with no GPU.

use overlap_lab::lab_kit::progress::verdicts_in;
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
    let tools = ["device", "topology", "diagnose", "progress", "report", "all"];
    for c in tools.into_iter().chain(overlap_lab::labs::ALL.iter().map(|l| l.name())) {
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
    want.extend(["diagnose".to_string(), "trace".to_string(), "progress".to_string(), "report".to_string(), "all".to_string()]);
    assert_eq!(subs, want, "{subs:?}");
    for sub in &subs {
        let (code, out, err) = cli(&[sub, "--help"]);
        assert_eq!(code, 0, "{sub} --help: {err}");
        assert!(out.contains(&format!("Usage: overlap-lab {sub}")), "{sub} --help: {out}");
        assert!(out.contains("--data") && out.contains("--quiet"), "{sub} --help lacks the global options: {out}");
        if !matches!(sub.as_str(), "device" | "topology" | "diagnose" | "trace" | "report" | "progress") {
            assert!(out.contains("--device"), "{sub} --help lacks --device: {out}");
        }
    }
    let (_, out, _) = cli(&["all", "--help"]);
    assert!(out.contains("--preset") && out.contains("small") && out.contains("compute-sanitizer") && out.contains("[default: headline]"), "{out}");
    let (code, _, err) = cli(&["all", "--preset", "tiny"]);
    assert_eq!(code, 2);
    assert!(err.contains("invalid value 'tiny'") && err.contains("headline, full, quick, small"), "{err}");
}

/// The bad command lines a new user types: negative numbers, sizes with
/// units the option does not take or a unit wrong, zero sizes, empty and
/// missing folders, a file that is no notebook, unknown labs, kinds and
/// presets. Each exits non-zero with one line on stderr that names the
/// option or file (each `needles`) and what it expects, with no panic, and
/// writes nothing. Every lab of the table gets the lines every lab takes.
#[test]
fn every_bad_command_line_is_one_line_naming_the_option_or_file() {
    let data = overlap_lab::testing::temp_dir("cli-bad");
    let d = data.to_str().unwrap().to_string();
    let empty = overlap_lab::testing::temp_dir("cli-bad-empty");
    let empty = empty.to_str().unwrap().to_string();
    // The course's notebooks, the last lab's replaced by text that is no
    // notebook; and a copy whose saved verdicts are cut short.
    let last = overlap_lab::labs::ALL.last().unwrap().notebook().trim_start_matches("notebooks/").to_string();
    let not_json = overlap_lab::testing::notebooks_copy("cli-bad-not-json");
    std::fs::write(not_json.join(&last), "print('a Python script, saved as .ipynb')\n").unwrap();
    let not_json = not_json.to_str().unwrap().to_string();
    let cut = overlap_lab::testing::notebooks_copy("cli-bad-verdicts");
    std::fs::write(verdicts_in(&cut), "{\"verdicts\": {").unwrap();
    let cut = cut.to_str().unwrap().to_string();
    let first = overlap_lab::labs::ALL[0].exercises()[0].notebook();
    let negative = "not a negative one";
    let mut lines: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    let mut add = |args: &[&str], needles: &[&str]| {
        lines.push((args.iter().map(|a| a.to_string()).collect(), needles.iter().map(|n| n.to_string()).collect()));
    };
    // Sizes: negative, zero, a unit wrong, part of a byte or a MiB.
    add(&["bandwidth", "--min", "-1"], &["'--min <SIZE>'", "is negative: expected a size"]);
    add(&["bandwidth", "--min", "-4KiB"], &["'--min <SIZE>'", "is negative"]);
    add(&["bandwidth", "--min", "0"], &["'--min <SIZE>'", "expected more than 0 bytes"]);
    add(&["bandwidth", "--max", "0GiB"], &["'--max <SIZE>'", "expected more than 0 bytes"]);
    add(&["bandwidth", "--min", "4XB"], &["'--min <SIZE>'", "unknown size unit 'xb'", "KiB"]);
    add(&["bandwidth", "--max", "1,5GiB"], &["'--max <SIZE>'", "unknown size unit ',5gib'"]);
    add(&["bandwidth", "--min", "0.1KiB"], &["'--min <SIZE>'", "not a whole number of bytes"]);
    add(&["bandwidth", "--max", "lots"], &["'--max <SIZE>'", "is not a size", "e.g. 4096, 4KiB"]);
    add(&["bandwidth", "--min", "1MiB", "--max", "4KiB"], &["--min 1 MiB exceeds --max 4 KiB"]);
    add(&["bandwidth", "--size-factor", "1"], &["--size-factor 1", "2 to 16"]);
    add(&["offload", "--gpu-budget", "-1"], &["'--gpu-budget <MIB>'", "is negative"]);
    add(&["offload", "--gpu-budget", "100KiB"], &["'--gpu-budget <MIB>'", "expected a whole number of MiB"]);
    add(&["offload", "--gpu-budget", "1.5XB"], &["'--gpu-budget <MIB>'", "unknown size unit"]);
    add(&["offload", "--gpu-budget", "0"], &["--gpu-budget 0 MiB"]);
    add(&["offload", "--gpu-budget", "64MiB"], &["--gpu-budget 64 MiB"]);
    add(&["memory", "--sizes-mib", "1,-4"], &["'--sizes-mib <MIB>'", "is negative"]);
    add(&["memory", "--sizes-mib", "0"], &["--sizes-mib [0]", "1 to 16384 MiB"]);
    add(&["memory", "--trace-base-mib", "0.5"], &["'--trace-base-mib <MIB>'", "512 KiB: expected a whole number of MiB"]);
    add(&["multi-gpu", "--grad-mib", "1.5MiB"], &["'--grad-mib <MIB>'", "expected a whole number of MiB"]);
    add(&["multi-gpu", "--buckets-mib", "3"], &["--buckets-mib", "divide --grad-mib"]);
    add(&["multi-gpu", "--gpus", "1"], &["--gpus must be 2-64 (got 1)"]);
    add(&["multi-gpu", "--gpus", "two"], &["'--gpus <GPUS>'", "expected a whole number"]);
    add(&["kernel-pipeline", "--mib", "0"], &["--mib must be 1-16384 (got 0)"]);
    // Counts and ratios.
    add(&["kernel-pipeline", "--threads", "-32"], &["'--threads <THREADS>'", negative]);
    add(&["kernel-pipeline", "--stages", "1,two"], &["'--stages <STAGES>'", "expected a whole number"]);
    add(&["overlap", "--chunks", "1,-4"], &["'--chunks <CHUNKS>'", negative]);
    add(&["streams", "--issue-chunks", "1"], &["--issue-chunks 1", "give counts from 2"]);
    add(&["double-buffer", "--kernel-over-copy", "fast"], &["'--kernel-over-copy <KERNEL_OVER_COPY>'", "expected a number"]);
    add(&["callback", "--cpu-over-gpu", "1/4"], &["'--cpu-over-gpu <CPU_OVER_GPU>'", "expected a number"]);
    add(&["offload", "--layers", "1"], &["--layers must be 2-10000"]);
    add(&["offload", "--d-model", "100"], &["--d-model must be a multiple of 64"]);
    add(&["memory", "--elements", "3"], &["--elements 3", "an even number"]);
    add(&["callback", "--repeats", "99999999999999999999999"], &["'--repeats <REPEATS>'", "a smaller whole number"]);
    // Kinds, presets, commands and options that do not exist.
    add(&["bandwidth", "--kinds", "cached"], &["'--kinds <KINDS>'", "possible values: pageable, pinned"]);
    add(&["bandwidth", "--directions", "up"], &["'--directions <DIRECTIONS>'", "possible values: h2d"]);
    add(&["overlap", "--intensities", "extreme"], &["'--intensities <INTENSITIES>'", "possible values"]);
    add(&["all", "--preset", "tiny"], &["'--preset <PRESET>'", "possible values: headline, full, quick, small"]);
    add(&["all", "--device", "-1"], &["'--device <DEVICE>'", negative]);
    add(&["device", "--device", "-1"], &["'--device <DEVICE>'", negative]);
    add(&["bandwidth", "--sizes", "4KiB"], &["unexpected argument '--sizes'"]);
    add(&["report", "--out"], &["'--out <DIR>'", "a value is required"]);
    add(&["reports"], &["unrecognized subcommand 'reports'", "'report'"]);
    // Folders and files.
    add(&["--data", &empty, "report", "--out", &empty], &[&format!("{empty}/<gpu folder>/<lab>.json")]);
    add(&["--data", "/nonexistent/data", "report"], &["/nonexistent/data does not exist"]);
    add(&["progress", "--notebooks", "/nonexistent/notebooks"], &["the notebooks folder /nonexistent/notebooks", "No such file"]);
    add(&["progress", "--notebooks", &empty], &[&format!("{empty} holds no notebook {first}"), "NN-name.ipynb"]);
    add(&["progress", "--notebooks", &not_json], &[&format!("{not_json}/{last} is not a Jupyter notebook")]);
    add(&["progress", "--notebooks", &cut], &[&format!("{cut}/progress.json are not the verdicts the exercises save")]);
    // What every lab of the table takes: a misspelt name, --device and --repeats.
    for lab in overlap_lab::labs::ALL.iter() {
        let typo = &lab.name()[..lab.name().len() - 1];
        add(&[typo], &[&format!("unrecognized subcommand '{typo}'"), &format!("'{}'", lab.name())]);
        add(&[lab.name(), "--device", "-1"], &["'--device <DEVICE>'", negative]);
        add(&[lab.name(), "--repeats", "-3"], &["'--repeats <REPEATS>'", negative]);
    }
    assert!(lines.len() >= 40, "{} bad command lines", lines.len());
    for (args, needles) in &lines {
        // Into the scratch data folder, unless the line names its own.
        let mut full = if args.contains(&"--data".to_string()) { vec![] } else { vec!["--data", d.as_str()] };
        full.extend(args.iter().map(String::as_str));
        let (code, out, err) = cli(&full);
        let said = format!("overlap-lab {}: exit {code}, stdout {out:?}, stderr {err:?}", args.join(" "));
        assert!(code != 0 && code != -1, "{said}: should fail");
        assert!(!err.contains("panicked"), "{said}");
        assert_eq!(err.lines().count(), 1, "{said}: one line");
        assert!(err.starts_with("overlap-lab: error: "), "{said}");
        for n in needles {
            assert!(err.contains(n.as_str()), "{said}: should name {n:?}");
        }
        for fix in ["run `overlap-lab all`", "recorded data"] {
            assert!(!(args.contains(&"progress".to_string()) && err.contains(fix)), "{said}: a notebook is no recording");
        }
    }
    assert_eq!(std::fs::read_dir(&data).unwrap().count(), 0, "a failed run wrote something");
}

/// Sizes take units wherever a size is asked for, and each size option's
/// help says what a bare number is. The lines fail on another option's
/// value, after the sizes parsed (so no GPU runs).
#[test]
fn every_size_option_takes_units_and_says_what_a_bare_number_is() {
    for (args, fails_on) in [
        (&["offload", "--gpu-budget", "1.5GB", "--layers", "1"][..], "--layers"),
        (&["offload", "--gpu-budget", "1536MiB", "--layers", "1"], "--layers"),
        (&["offload", "--gpu-budget", "1536", "--layers", "1"], "--layers"),
        (&["bandwidth", "--min", "4KiB", "--max", "1.5GiB", "--size-factor", "1"], "--size-factor"),
        (&["bandwidth", "--min", "4096", "--max", "1 GiB", "--size-factor", "1"], "--size-factor"),
        (&["memory", "--sizes-mib", "1,1GiB", "--trace-base-mib", "16MiB", "--elements", "3"], "--elements"),
        (&["multi-gpu", "--sizes-mib", "4,0.25GiB", "--grad-mib", "0.5GiB", "--buckets-mib", "4MiB,256MiB", "--copies", "1"], "--copies"),
        (&["kernel-pipeline", "--mib", "64MiB", "--ceiling-max-mib", "2GiB", "--threads", "1"], "--threads"),
        // The unit as a word of its own (the shell splits `12 MiB`), or after a space in one word.
        (&["offload", "--gpu-budget", "1536", "MiB", "--layers", "1"], "--layers"),
        (&["offload", "--gpu-budget=1.5", "GiB", "--layers", "1"], "--layers"),
        (&["offload", "--gpu-budget", "1536 MiB", "--layers", "1"], "--layers"),
        (&["bandwidth", "--min", "4", "KiB", "--max", "1", "GiB", "--size-factor", "1"], "--size-factor"),
        (&["kernel-pipeline", "--mib", "64", "mib", "--threads", "1"], "--threads"),
        // A fraction within 0.1% of a whole size is rounded to it: 0.7G is 716.8 MiB.
        (&["offload", "--gpu-budget", "0.7G", "--layers", "1"], "--layers"),
    ] {
        let (code, _, err) = cli(args);
        assert!(code != 0 && err.lines().count() == 1 && err.contains(fails_on), "{args:?}: {err}");
    }
    // What a size was read as shows in the labs' own errors: GB counts
    // 10^9 bytes (2GB is 1.9 GiB, 20GB 19073 MiB), G and GiB 2^30.
    for (args, says) in [
        (&["bandwidth", "--min", "2GB", "--max", "1KiB"][..], "--min 1.9 GiB exceeds --max 1 KiB"),
        (&["bandwidth", "--min", "2", "GB", "--max", "1KiB"], "--min 1.9 GiB exceeds --max 1 KiB"),
        (&["bandwidth", "--min", "2G", "--max", "1KiB"], "--min 2 GiB exceeds --max 1 KiB"),
        (&["bandwidth", "--min", "0.7G"], "--min 716.8 MiB must be a multiple of 8 bytes"),
        (&["memory", "--sizes-mib", "1,20GB"], "--sizes-mib [1, 19073]"),
        (&["memory", "--sizes-mib", "20", "GiB"], "--sizes-mib [20480]"),
    ] {
        let (code, _, err) = cli(args);
        assert!(code == 2 && err.lines().count() == 1 && err.contains(says), "{args:?}: {err}");
    }
    // A fraction that is no whole size, a unit after a list, a second unit:
    // one line that names the option, and what to write instead.
    for (args, says) in [
        (
            &["offload", "--gpu-budget", "1.3"][..],
            &["'--gpu-budget <MIB>'", "'1.3' is 1.3 MiB: expected a whole number of MiB; the nearest are 1MiB and 2MiB"][..],
        ),
        (&["bandwidth", "--min", "100.5"], &["'--min <SIZE>'", "'100.5' is 100.5 bytes, not a whole number of bytes; the nearest are 100 and 101"]),
        (&["bandwidth", "--max", "0.1", "KiB"], &["'--max <SIZE>'", "'0.1 KiB' is 102.4 bytes"]),
        (&["memory", "--sizes-mib", "1,16", "GiB"], &["'--sizes-mib'", "give each size its unit"]),
        (&["offload", "--gpu-budget", "12MiB", "MiB"], &["unexpected argument 'MiB'", "'MiB' is a unit", "12MiB or \"12 MiB\""]),
        (&["bandwidth", "--repeats", "3", "GB"], &["unexpected argument 'GB'", "'GB' is a unit"]),
    ] {
        let (code, _, err) = cli(args);
        assert!(code == 2 && err.lines().count() == 1, "{args:?}: {err}");
        for s in says {
            assert!(err.contains(s) && !err.contains("panicked"), "{args:?} should say {s:?}: {err}");
        }
    }
    // Every option of a size in MiB (named -mib or a budget) shows <MIB>
    // and says a bare number is MiB; every size in bytes shows <SIZE>.
    let mut sizes = Vec::new();
    for lab in overlap_lab::labs::ALL.iter() {
        let (code, help, _) = cli(&[lab.name(), "--help"]);
        assert_eq!(code, 0);
        // Each option: its line ("  --name <VALUE>  help...") and the
        // indented lines after it, as one line.
        let mut options: Vec<String> = Vec::new();
        for line in help.lines() {
            let indent = line.len() - line.trim_start().len();
            if line.trim_start().starts_with('-') && indent <= 6 {
                options.push(line.trim().to_string());
            } else if let (Some(o), true) = (options.last_mut(), indent > 6) {
                *o = format!("{o} {}", line.trim());
            }
        }
        for option in &options {
            let name = option.split([' ', ',']).find(|w| w.starts_with("--")).unwrap_or("").trim_start_matches("--");
            if name.ends_with("-mib") || name.contains("budget") || option.contains("<MIB>") {
                assert!(option.contains("<MIB>") && option.contains("MiB if no unit is given"), "{}: {option}", lab.name());
                sizes.push(name.to_string());
            }
            if option.contains("<SIZE>") {
                assert!(option.contains("bytes, or with a unit"), "{}: {option}", lab.name());
                sizes.push(name.to_string());
            }
        }
    }
    for seen in ["min", "max", "gpu-budget", "sizes-mib", "buckets-mib", "mib"] {
        assert!(sizes.iter().any(|s| s == seen), "--{seen} not read from the help: {sizes:?}");
    }
    // A lab with sizes says under its options how they read; one without says nothing of them.
    for lab in overlap_lab::labs::ALL.iter() {
        let (_, help, _) = cli(&[lab.name(), "--help"]);
        let takes_sizes = help.contains("<MIB>") || help.contains("<SIZE>");
        let says = help.contains("Sizes: KiB, MiB, GiB, TiB and the letters K, M, G, T are powers of 1024")
            && help.contains("MB, GB, TB are powers of 1000")
            && help.contains("12 MiB");
        assert_eq!(says, takes_sizes, "{}: {help}", lab.name());
    }
}

/// A data folder with two of the H100's recordings: what the command
/// line's own tests render (the recorded-data tests and the test
/// command's report stage render all of data/).
fn two_recordings(tag: &str) -> String {
    let from = std::path::Path::new(&repo_data()).join("nvidia-h100-80gb-hbm3");
    let data = overlap_lab::testing::temp_dir(tag);
    let dev = data.join("nvidia-h100-80gb-hbm3");
    std::fs::create_dir_all(&dev).unwrap();
    for lab in ["bandwidth", "double-buffer"] {
        std::fs::copy(from.join(format!("{lab}.json")), dev.join(format!("{lab}.json"))).unwrap();
    }
    data.to_string_lossy().into_owned()
}

#[test]
fn report_renders_recorded_data_and_missing_data_is_an_error() {
    let out = overlap_lab::testing::temp_dir("cli-report");
    let data = two_recordings("cli-report-data");
    let (code, stdout, err) = cli(&["--data", &data, "report", "--out", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("bandwidth-by-size.png") && stdout.contains("double-buffer-") && stdout.contains("report.html"), "{stdout}");
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
    let data = two_recordings("cli-all-data");
    let (code, stdout, err) = cli(&["--data", &data, "all", "--out", out.to_str().unwrap()]);
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
    for lab in overlap_lab::labs::ALL.iter() {
        assert!(stdout.contains(&format!("{} took ", lab.name())), "no run of {} in {stdout}", lab.name());
    }
    // Each lab's time, and nothing else.
    let written: Vec<_> = std::fs::read_dir(&data).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(written, ["run-times.json"], "a small run wrote a record");
    let times = overlap_lab::lab_kit::headline::RunTimes::load(&data).unwrap();
    let names: Vec<&str> = overlap_lab::labs::ALL.iter().map(|l| l.name()).collect();
    let (_, each) = times.estimate("", "small", &names).expect("every lab's time noted");
    // Every lab's time, but a lab's that measured nothing here (lab 10 with
    // no PyTorch): it says so, and leaves no time.
    for (name, t) in names.iter().zip(&each) {
        let measured_nothing = stdout.contains(&format!("{name}: nothing measured here"));
        assert!(t.is_some_and(|s| s > 0.0) || (measured_nothing && t.is_none()), "{name}: {t:?}\n{stdout}");
    }
    assert!(stdout.contains("agree with this GPU's recordings") && stdout.contains("took"), "{stdout}");
}

use overlap_lab::testing::notebooks_copy;

/// Writes `answer` into the cell of exercise `id` in the notebooks at `dir`.
fn answer_cell(dir: &std::path::Path, id: &str, answer: &str) {
    let ex = overlap_lab::labs::ALL.iter().flat_map(|l| l.exercises()).find(|e| e.id == id).unwrap();
    let path = dir.join(ex.notebook());
    let mut nb: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let cell = nb["cells"].as_array_mut().unwrap().iter_mut().find(|c| c["metadata"]["overlap_lab"]["exercise"].as_str() == Some(id)).unwrap();
    cell["source"] = serde_json::json!(answer);
    std::fs::write(&path, nb.to_string()).unwrap();
}

/// Every exercise of the lab table answered rightly (`right`) or with its
/// usual mistake, as its entry's examples say: an answer in a cell is
/// judged by its lab's checker on every GPU's recording that has what it
/// needs (each must judge it so) and the first verdict is saved as its
/// cell saves it; an answer in a file is written there, and the right one
/// saved with the verdict a check on a GPU gives it.
fn answer_everything(dir: &std::path::Path, right: bool) {
    use overlap_lab::lab_kit::check::CheckReport;
    use overlap_lab::lab_kit::progress::{save, Examples};
    let dir_verdicts = verdicts_in(dir);
    let data = overlap_lab::measure::record::default_data_dir();
    let mut gpus: Vec<std::path::PathBuf> = std::fs::read_dir(&data).unwrap().flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    gpus.sort();
    for ex in overlap_lab::labs::ALL.iter().flat_map(|l| l.exercises()) {
        match &ex.examples {
            Examples::Cell { verdict, .. } => {
                let verdicts: Vec<CheckReport> = gpus.iter().filter_map(|dev| verdict(dev, right).unwrap_or_else(|e| panic!("{}: {e}", ex.id))).collect();
                assert!(!verdicts.is_empty(), "{}: no recording in {} to answer on", ex.id, data.display());
                for rep in &verdicts {
                    assert_eq!(rep.passed, right, "{}: {rep}", ex.id);
                    for p in rep.problems() {
                        assert_eq!(overlap_lab::lab_kit::check::dictated_fix(p), None, "{}: a problem tells the fix: {p}", ex.id);
                    }
                }
                answer_cell(dir, ex.id, &format!("// my answer to {}\n", ex.id));
                save(&verdicts[0].clone().answering(ex.id), &dir_verdicts).unwrap();
            }
            Examples::File { right: solution, wrong, .. } => {
                let path = dir.join(ex.file.as_ref().expect("a file answer names its file").path);
                if right {
                    std::fs::write(&path, solution()).unwrap();
                    let mut live = CheckReport::new(&format!("{} (live)", ex.asks));
                    live.note("every output matches the CPU reference, on two fresh random inputs");
                    save(&live.answering(ex.id), &dir_verdicts).unwrap();
                } else {
                    let given = std::fs::read_to_string(&path).unwrap();
                    std::fs::write(&path, wrong(&given)).unwrap();
                }
            }
        }
    }
}

/// `overlap-lab progress` on answers made up for every exercise of every
/// lab: none answered, all wrong, all right.
#[test]
fn progress_says_for_every_exercise_not_started_not_yet_or_passed() {
    if !overlap_lab::testing::nvrtc_or_skip("progress_says_for_every_exercise_not_started_not_yet_or_passed") {
        return;
    }
    let ids: Vec<&str> = overlap_lab::labs::ALL.iter().flat_map(|l| l.exercises()).map(|e| e.id).collect();
    assert!(ids.len() >= overlap_lab::labs::ALL.len(), "every lab has an exercise: {ids:?}");
    let progress = |dir: &std::path::Path| {
        let (code, out, err) = cli(&["progress", "--notebooks", dir.to_str().unwrap()]);
        assert_eq!(code, 0, "{err}");
        out
    };
    let line =
        |out: &str, id: &str| out.lines().find(|l| l.split_whitespace().nth(2) == Some(id)).unwrap_or_else(|| panic!("no line for {id}:\n{out}")).to_string();
    let fresh = notebooks_copy("progress-fresh");
    let out = progress(&fresh);
    for id in &ids {
        assert!(line(&out, id).ends_with(": not started"), "{}", line(&out, id));
    }
    assert!(out.contains(&format!("0 of {} exercises passed", ids.len())), "{out}");
    let wrong = notebooks_copy("progress-wrong");
    answer_everything(&wrong, false);
    let out = progress(&wrong);
    for id in &ids {
        assert!(line(&out, id).contains(": not yet: "), "{}", line(&out, id));
    }
    let reasons: Vec<(&str, &str)> = overlap_lab::labs::ALL.iter().flat_map(|l| l.exercises()).map(|e| (e.id, e.examples.mistake())).collect();
    for (id, why) in reasons {
        assert!(line(&out, id).contains(why), "{id}: the reason should name {why:?}: {}", line(&out, id));
    }
    let right = notebooks_copy("progress-right");
    answer_everything(&right, true);
    let out = progress(&right);
    for id in &ids {
        assert!(line(&out, id).contains(": passed ("), "{}", line(&out, id));
    }
    assert!(out.contains(&format!("{n} of {n} exercises passed", n = ids.len())), "{out}");
    // An answer changed after its check, with no verdict saved since: the
    // command says so rather than trusting an old verdict of another cell.
    std::fs::remove_file(right.join("progress.json")).unwrap();
    let out = progress(&right);
    assert!(line(&out, "02-overlap").ends_with("answered, not checked yet: run the exercise's cell"), "{out}");
    let (code, _, err) = cli(&["progress", "--notebooks", "/nonexistent/notebooks"]);
    assert!(code != 0 && err.lines().count() == 1 && err.contains("/nonexistent/notebooks"), "{err}");
}
