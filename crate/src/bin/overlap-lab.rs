//! The overlap-lab command line: run the labs on a GPU, record the results,
//! regenerate every report figure from the records. The lab subcommands come
//! from the lab table (`labs::ALL`): each takes its lab's settings as
//! options, plus the options every lab shares (defined once, below).

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use overlap_lab::gpu::{Availability, Gpu};
use overlap_lab::lab_kit::headline::run_times_path;
use overlap_lab::lab_kit::table::command_line_error;
use overlap_lab::lab_kit::{Preset, RunContext};
use overlap_lab::labs;
use overlap_lab::measure::record::{default_data_dir, display_path};
use overlap_lab::present::progress::ProgressMode;
use overlap_lab::report;
use overlap_lab::{LabError, Result};
use std::path::PathBuf;
use std::process::ExitCode;

/// The options of every command.
#[derive(Parser)]
#[command(name = "overlap-lab", version, about = "Measure how CUDA host<->device transfers work and how to hide them behind compute.", long_about = None)]
struct Cli {
    /// Directory of recorded results, one folder per GPU holding a <lab>.json
    /// each (default: the repository's data/, or $OVERLAP_LAB_DATA).
    #[arg(long, global = true, value_name = "DIR")]
    data: Option<PathBuf>,
    /// No progress output.
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Tool,
}

// The options every lab subcommand shares (a plain comment: a doc comment
// would become each lab subcommand's help line).
#[derive(Args)]
struct LabOptions {
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Do not write the record to the data directory.
    #[arg(long)]
    no_record: bool,
}

/// The commands around the labs.
#[derive(Subcommand)]
enum Tool {
    /// Print the device's fingerprint (what every record carries).
    Device {
        #[arg(long, default_value_t = 0)]
        device: usize,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// List every GPU and how each pair reaches the other (peer access,
    /// NVLink or PCIe): what lab 8 starts from.
    Topology {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Where you stand on every exercise: passed, not yet (and why), or not
    /// started. Reads the notebooks and the verdicts their exercise cells
    /// saved; lab 7's kernel file is checked again (as far as it can be
    /// without a GPU).
    Progress {
        /// The notebooks' folder, with the verdicts their cells saved in its
        /// progress.json (default: the repository's notebooks/, or
        /// $OVERLAP_LAB_NOTEBOOKS; the verdicts where $OVERLAP_LAB_PROGRESS points, if set).
        #[arg(long, value_name = "DIR")]
        notebooks: Option<PathBuf>,
    },
    /// Say where a traced program loses its overlap, from a profiler trace;
    /// no GPU needed.
    ///
    /// Reads a Chrome trace that torch.profiler exported (`prof.export_chrome_trace(...)`, Kineto's
    /// format, .json or .json.gz) or that a lab saved (`overlap-lab report`
    /// writes them), and reports for the traced window each GPU's and each
    /// stream's busy and idle time; each kind of copy (direction, pageable or
    /// pinned, bytes, GB/s beside this GPU's lab 1 recording in the data
    /// directory, time hidden under kernels and exposed); the CPU's
    /// synchronizing calls and the GPU idle each one caused; work on the
    /// legacy default stream; stretches where the GPU waited for launches.
    /// Each finding names the call behind it and its cost, largest first.
    ///
    /// Given several traces (or a folder of them), one per rank of a
    /// data-parallel step as torch.profiler writes them, it sets the ranks
    /// side by side instead: each rank's busy and idle time, NCCL's
    /// communication hidden under computation and exposed, and how long it
    /// kept the others waiting in the collectives it started last, their
    /// clocks lined up by their collectives.
    Diagnose {
        /// The trace: a .json or .json.gz Chrome trace; several (or a
        /// folder of them): one per rank of a data-parallel step.
        #[arg(value_name = "TRACE", required = true, num_args = 1..)]
        trace: Vec<PathBuf>,
        /// Print the diagnosis as JSON (for scripts).
        #[arg(long)]
        json: bool,
        /// Workers that prepare the next batch ahead in that fix's
        /// prediction (a DataLoader's num_workers, with pin_memory): the
        /// host's own work between launches runs on N workers of its own.
        #[arg(long, value_name = "N", default_value_t = overlap_lab::diagnose::replay::DEFAULT_WORKERS as u64, value_parser = clap::value_parser!(u64).range(1..=256))]
        workers: u64,
    },
    /// Trace any CUDA program, in any language, then diagnose it.
    ///
    /// Runs COMMAND with the course's CUPTI injection library loaded into
    /// each of its CUDA processes (CUDA_INJECTION64_PATH: no Nsight
    /// Systems, no code change): every kernel, copy, memset, CUDA call
    /// and NVTX range is recorded (each synchronization too with
    /// --sync-events). Its output and exit code
    /// are the command's own. Then each CUDA process's trace is written as
    /// a Chrome trace in Kineto's schema (what torch.profiler exports: it
    /// opens in Perfetto, chrome://tracing and HTA) and diagnosed as
    /// `overlap-lab diagnose` would, with each fix's time predicted. CUPTI
    /// takes one subscriber per process: under compute-sanitizer or another
    /// profiler the command runs untraced, and this says so.
    Trace {
        /// The trace of the command's own process (.json.gz or .json); other
        /// CUDA processes it starts write theirs beside it, named by pid
        /// (trace.<pid>.json.gz).
        #[arg(short, long, default_value = "trace.json.gz", value_name = "FILE")]
        output: PathBuf,
        /// The injection library (default: liboverlap_lab_inject.so beside
        /// this program, or $OVERLAP_LAB_INJECT).
        #[arg(long, value_name = "PATH")]
        inject: Option<PathBuf>,
        /// Keep each process's raw records (overlap-lab-trace.<pid>.jsonl)
        /// beside the traces.
        #[arg(long)]
        keep_raw: bool,
        /// Name both GPUs of each copy between two (CUPTI's peer-copy
        /// records). Without it each such copy is still recorded, on the
        /// GPU that ran it; with it the device-to-device copies measured on
        /// an H200 read a third longer, so it is off unless asked.
        #[arg(long)]
        peer_copies: bool,
        /// Record each synchronization and event record, so the diagnosis
        /// reads which stream each event wait joins instead of inferring it
        /// (as torch.profiler's enable_cuda_sync_events). Off unless asked,
        /// as torch.profiler's: tracing a loop of tiny ops cost more with it.
        #[arg(long)]
        sync_events: bool,
        /// Only write the traces: no diagnosis.
        #[arg(long)]
        no_diagnose: bool,
        /// Print each diagnosis as JSON (for scripts).
        #[arg(long)]
        json: bool,
        /// Workers that prepare the next batch ahead in that fix's
        /// prediction, as in `diagnose`.
        #[arg(long, value_name = "N", default_value_t = overlap_lab::diagnose::replay::DEFAULT_WORKERS as u64, value_parser = clap::value_parser!(u64).range(1..=256))]
        workers: u64,
        /// The program and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<std::ffi::OsString>,
    },
    /// Regenerate every report figure (SVG + PNG) from recorded data; no GPU needed.
    Report {
        /// Output directory.
        #[arg(long, default_value = "target/report", value_name = "DIR")]
        out: PathBuf,
    },
    /// Run every lab on the GPU: by default its headline figures, beside this
    /// GPU's recording; with --preset full the full sweep, recorded, then the
    /// report. With no GPU, say so and render the recorded data.
    All {
        #[arg(long, default_value_t = 0)]
        device: usize,
        #[arg(long, default_value = "target/report", value_name = "DIR")]
        out: PathBuf,
        /// How big each lab's run is. Only `full` is recorded and reported;
        /// each run says up front how long it should take here, and sets
        /// every lab's headline figures beside this GPU's recording.
        #[arg(long, value_enum, default_value_t = Preset::Headline)]
        preset: Preset,
        /// Do not write the records, or each lab's time, to the data directory.
        #[arg(long)]
        no_record: bool,
        /// Also write every lab's headline figures of this run (median,
        /// middle half, min, max, repeats) to FILE as JSON.
        #[arg(long, value_name = "FILE")]
        figures: Option<PathBuf>,
        /// Only these labs, comma-separated, by name (default: every lab
        /// of the table): a sanitizer or profiler run of a few.
        #[arg(long, value_delimiter = ',', value_name = "A,B")]
        labs: Vec<String>,
    },
}

/// The whole command line: `device`, then one subcommand per lab of the
/// table, then `report` and `all`.
fn command() -> clap::Command {
    // The tools keep their places around the labs: device first, report and all last.
    let mut cmd = Cli::command()
        .mut_subcommand("device", |t| t.display_order(0))
        .mut_subcommand("topology", |t| t.display_order(0))
        .mut_subcommand("progress", |t| t.display_order(99))
        .mut_subcommand("diagnose", |t| t.display_order(98))
        .mut_subcommand("trace", |t| t.display_order(98))
        .mut_subcommand("report", |t| t.display_order(100))
        .mut_subcommand("all", |t| t.display_order(101));
    for (i, lab) in labs::ALL.iter().enumerate() {
        let sub = LabOptions::augment_args(lab.command()).display_order(1 + i);
        // A lab that takes sizes says once, under its options, how they read.
        let sub = if sub.get_arguments().any(is_size_option) { sub.after_help(SIZES_HELP) } else { sub };
        cmd = cmd.subcommand(sub);
    }
    cmd.mut_subcommands(|sub| sub.mut_args(numbers_may_start_with_minus))
}

/// How a size option reads its value (`overlap_lab::units` says the same).
const SIZES_HELP: &str = "Sizes: KiB, MiB, GiB, TiB and the letters K, M, G, T are powers of 1024 (as in dd);
kB (or KB), MB, GB, TB are powers of 1000, so 1.5GB is 1430.5 MiB, not 1.5 GiB.
A space may stand before the unit: 12MiB, \"12 MiB\" and 12 MiB all read the same.
A fraction is rounded to a whole byte (or MiB) when that moves it by 0.1% or less.";

/// True if `arg` takes a size: its parser reads `1GiB` and refuses
/// `1 qq` (a number with a unit that is none), which no parser of plain
/// numbers, names or paths does. clap keeps an option's parser private,
/// so a one-option command asks it.
fn is_size_option(arg: &clap::Arg) -> bool {
    let parses = |value: &str| {
        let probe = clap::Arg::new("v").long("v").num_args(1).value_parser(arg.get_value_parser().clone());
        clap::Command::new("probe").arg(probe).try_get_matches_from(["probe", "--v", value]).is_ok()
    };
    arg.get_long().is_some() && arg.get_action().takes_values() && parses("1GiB") && !parses("1 qq")
}

/// The arguments with a size option's value joined to a unit word that
/// follows it as a word of its own: `--gpu-budget 12 MiB` (the shell
/// splits `12 MiB` in two) reads as `--gpu-budget "12 MiB"`, where clap
/// would take `MiB` for an unexpected argument. Only after options whose
/// parser reads sizes ([`is_size_option`]) and only a word that is a unit
/// of sizes alone (`MiB`, `GB`, `K`). A unit after a list of sizes
/// (`--sizes-mib 1,16 GiB`) is an error: it would belong to the last size
/// only.
fn join_size_units(root: &clap::Command, args: Vec<std::ffi::OsString>) -> std::result::Result<Vec<std::ffi::OsString>, String> {
    use overlap_lab::units::is_size_unit;
    let text = |i: usize| args.get(i).and_then(|a| a.to_str());
    let mut out = Vec::with_capacity(args.len());
    let mut cmd = root;
    let mut i = 0;
    // args[0] is the program.
    if let Some(first) = args.first() {
        out.push(first.clone());
        i = 1;
    }
    while i < args.len() {
        let Some(word) = text(i) else {
            out.push(args[i].clone());
            i += 1;
            continue;
        };
        if word == "--" {
            out.extend(args[i..].iter().cloned());
            break;
        }
        if let Some(long) = word.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (long, None),
            };
            let arg = cmd.get_arguments().chain(root.get_arguments()).find(|a| a.get_long() == Some(name));
            if let Some(arg) = arg.filter(|a| a.get_action().takes_values()) {
                // Where its value is, and the word after the value.
                let (value, after) = match inline {
                    Some(v) => (Some(v), i + 1),
                    None => (text(i + 1), i + 2),
                };
                let unit = text(after).filter(|u| is_size_unit(u));
                if let (Some(value), Some(unit)) = (value, unit) {
                    let number_last = value.ends_with(|c: char| c.is_ascii_digit() || c == '.');
                    if number_last && is_size_option(arg) {
                        if value.contains(',') {
                            return Err(format!(
                                "invalid value '{value} {unit}' for '--{name}': a unit after a list of sizes would belong to the last one only: give each size its unit, e.g. 1{unit},16{unit}"
                            ));
                        }
                        match inline {
                            Some(_) => out.push(format!("{word} {unit}").into()),
                            None => {
                                out.push(args[i].clone());
                                out.push(format!("{value} {unit}").into());
                            }
                        }
                        i = after + 1;
                        continue;
                    }
                }
                // Another option's value (or none): kept as it is.
                out.push(args[i].clone());
                if inline.is_none() && i + 1 < args.len() {
                    out.push(args[i + 1].clone());
                    i += 1;
                }
                i += 1;
                continue;
            }
        } else if !word.starts_with('-') {
            if let Some(sub) = cmd.find_subcommand(word) {
                cmd = sub;
            }
        }
        out.push(args[i].clone());
        i += 1;
    }
    Ok(out)
}

/// An option that takes a number or a size takes `-1` or `-4KiB` as its
/// value, so its parser can say it is negative, naming the option (clap
/// would read it as an unknown flag). Paths and text keep clap's rule: a
/// value after `--out` that starts with `-` is another option.
fn numbers_may_start_with_minus(arg: clap::Arg) -> clap::Arg {
    use std::any::TypeId;
    let parser = arg.get_value_parser().type_id();
    let text = [TypeId::of::<String>(), TypeId::of::<std::ffi::OsString>(), TypeId::of::<PathBuf>()].iter().any(|t| parser == *t);
    if arg.get_action().takes_values() && !text {
        arg.allow_hyphen_values(true)
    } else {
        arg
    }
}

/// What a unit word that clap found on its own (`--gpu-budget 12MiB MiB`,
/// `--repeats 3 MiB`: no size before it to join) is, after clap's words.
fn stray_unit_hint(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    match (e.kind(), e.get(ContextKind::InvalidArg)) {
        (ErrorKind::UnknownArgument, Some(ContextValue::String(word))) if overlap_lab::units::is_size_unit(word) => {
            format!(" ('{word}' is a unit: it goes with the size just before it, as in 12{word} or \"12 {word}\", after a size option)")
        }
        _ => String::new(),
    }
}

fn progress(quiet: bool) -> ProgressMode {
    if quiet {
        ProgressMode::Quiet
    } else {
        ProgressMode::Auto
    }
}

fn run_report(data: &std::path::Path, out: &std::path::Path) -> Result<()> {
    let files = report::generate(data, out)?;
    println!("report: {} files in {}", files.len(), overlap_lab::measure::record::display_path(out));
    for f in files {
        println!("  {}", overlap_lab::measure::record::display_path(&f));
    }
    Ok(())
}

/// `overlap-lab diagnose`: reads the trace (a bar on a terminal's stderr
/// for files of 8 MiB and more; lines on stdout where there is no
/// terminal, unless the output is JSON), then prints the diagnosis.
fn run_diagnose(trace: &std::path::Path, json: bool, workers: usize, data: &std::path::Path, quiet: bool) -> Result<()> {
    use overlap_lab::units::MIB;
    use std::io::IsTerminal;
    let size = std::fs::metadata(trace).map_or(0, |m| m.len());
    let mode = if quiet || size < 8 * MIB || (json && !std::io::stderr().is_terminal()) { ProgressMode::Quiet } else { ProgressMode::Auto };
    let shown = display_path(trace);
    let mut bar = overlap_lab::present::progress::Progress::new(mode, size.div_ceil(MIB), &format!("reading {shown} (MiB)"));
    let mut steps = 0;
    let read = overlap_lab::diagnose::read_trace(trace, &mut |read, total| {
        // A MiB a step; the last, part of one, when the whole file is read.
        let done = if read >= total { total.div_ceil(MIB) } else { read / MIB };
        while steps < done {
            steps += 1;
            bar.step(&format!("{steps} MiB"));
        }
    });
    bar.finish();
    let trace = read?;
    // Priced by this machine's recordings: lab 1's link rates, lab 10's graph gap.
    let diagnosis = overlap_lab::labs::pytorch_trace::prices::Prices::read(data).diagnose(&trace, &shown, Some(workers));
    if json {
        println!("{}", serde_json::to_string_pretty(&diagnosis).expect("a diagnosis serializes"));
    } else {
        println!("{diagnosis}");
    }
    Ok(())
}

/// The rank traces `diagnose` was given: several files, or a folder's
/// `.json` and `.json.gz` files (sorted by name); None for one trace file.
fn rank_traces(given: &[PathBuf]) -> Result<Option<Vec<PathBuf>>> {
    let [one] = given else { return Ok(Some(given.to_vec())) };
    if !one.is_dir() {
        return Ok(None);
    }
    let entries = std::fs::read_dir(one).map_err(|e| overlap_lab::error::LabError::config(format!("{}: {e}", display_path(one))))?;
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(".json") || n.ends_with(".json.gz")))
        .collect();
    files.sort();
    Ok(Some(files))
}

/// `overlap-lab diagnose` on several ranks' traces: each read, then the
/// ranks side by side ([`overlap_lab::diagnose::ranks`]).
fn run_diagnose_ranks(files: &[PathBuf], json: bool, data: &std::path::Path) -> Result<()> {
    let mut traces = Vec::with_capacity(files.len());
    for f in files {
        let shown = display_path(f);
        traces.push((shown, overlap_lab::diagnose::read_trace(f, &mut |_, _| {})?));
    }
    let mut ranks = overlap_lab::diagnose::ranks::read_ranks(&traces).map_err(overlap_lab::error::LabError::config)?;
    // Its collectives beside lab 8's all-reduces on the same GPU, where recorded.
    if let Some((_, gpu)) = traces.iter().find_map(|(_, t)| t.gpu_names.first().cloned()) {
        ranks = ranks.beside(&overlap_lab::labs::multi_gpu::results::recorded_all_reduce_rates(data)?, &gpu);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&ranks).expect("the ranks serialize"));
    } else {
        print!("{ranks}");
    }
    Ok(())
}

/// `overlap-lab trace`: runs the command traced, says what each CUDA
/// process's trace holds, then diagnoses each that ran GPU work (`workers`:
/// None, no diagnosis). Returns the exit code to leave with: the command's
/// own, or 1 where it succeeded but nothing could be traced.
fn run_trace(req: &overlap_lab::trace::Request, workers: Option<usize>, json: bool, data: &std::path::Path, quiet: bool) -> Result<i32> {
    let shown: Vec<String> = req.command.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    let shown = format!("`{}`", shown.join(" "));
    let traced = overlap_lab::trace::run(req)?;
    // What this command says goes to stderr where stdout carries JSON.
    let say = |line: String| if json { eprintln!("{line}") } else { println!("{line}") };
    for (pid, why) in traced.refused.iter().filter(|_| !traced.traces.is_empty()) {
        say(format!("trace: process {pid} ran untraced: {why}"));
    }
    if let Some(why) = traced.nothing_traced(&shown) {
        eprintln!("overlap-lab: error: trace: {why}");
        return Ok(if traced.exit_code != 0 { traced.exit_code } else { 1 });
    }
    say(format!("trace: {shown} exited with {} after {:.2} s (wall, traced)", traced.exit_code, traced.wall.as_secs_f64()));
    for t in &traced.traces {
        say(format!("trace: {}", overlap_lab::trace::describe(t)));
    }
    if let Some(workers) = workers {
        for t in traced.traces.iter().filter(|t| t.summary.gpu_ops() > 0) {
            run_diagnose(&t.path, json, workers, data, quiet)?;
        }
    }
    Ok(traced.exit_code)
}

/// Every lab at `preset`: before, how long it should take (from the
/// times of earlier runs, `data/run-times.json`); before each lab, the time
/// spent and what is left; after each, its headline figures beside this
/// GPU's recording (read before the run, so a full run that records is
/// set beside the one it replaces). `note_times`: keep each lab's time.
/// The labs `--labs` names, in course order (every lab where it names none);
/// a one-line error naming a name that is no lab's.
fn chosen_labs(names: &[String]) -> Result<Vec<&'static dyn overlap_lab::lab_kit::Lab>> {
    if let Some(bad) = names.iter().find(|n| labs::find(n).is_none()) {
        let known: Vec<&str> = labs::ALL.iter().map(|l| l.name()).collect();
        return Err(LabError::config(format!("--labs: no lab '{bad}'; the labs are {}", known.join(", "))));
    }
    Ok(labs::ALL.iter().copied().filter(|l| names.is_empty() || names.iter().any(|n| n == l.name())).collect())
}

#[allow(clippy::too_many_arguments)]
fn run_all(
    data: &std::path::Path,
    preset: Preset,
    cx: &RunContext,
    note_times: bool,
    quiet: bool,
    figures_to: Option<&std::path::Path>,
    chosen: &[&'static dyn overlap_lab::lab_kit::Lab],
) -> Result<()> {
    use overlap_lab::lab_kit::headline::{beside, fmt_duration, RunTimes};
    let fp = Gpu::open(cx.device)?.fingerprint()?;
    let dev_dir = data.join(fp.slug());
    let preset_name = preset.to_possible_value().map_or("?".to_string(), |v| v.get_name().to_string());
    let names: Vec<&str> = chosen.iter().map(|l| l.name()).collect();
    let mut times = RunTimes::load(data)?;
    let estimate = times.estimate(&fp.gpu_name, &preset_name, &names);
    let say = |s: String| {
        if !quiet {
            eprintln!("{s}");
        }
    };
    // A sum over labs, "at least" where some have no time yet.
    let about = |t: &[Option<f64>]| {
        let untimed = t.iter().filter(|x| x.is_none()).count();
        let sum = fmt_duration(t.iter().flatten().sum());
        if untimed == 0 {
            format!("about {sum}")
        } else {
            format!("at least {sum} ({untimed} lab(s) not yet timed)")
        }
    };
    match &estimate {
        Some((from, t)) => say(format!("all --preset {preset_name}: {} labs, {} (as timed on {from})", names.len(), about(t))),
        None => say(format!("all --preset {preset_name}: not yet timed on any GPU; each lab's time is noted as it ends")),
    }
    let started = std::time::Instant::now();
    let (mut agree, mut compared) = (0, 0);
    let mut all_figures = Vec::new();
    for (i, lab) in chosen.iter().enumerate() {
        say(format!(
            "[{}/{}] {}: elapsed {}{}",
            i + 1,
            names.len(),
            lab.name(),
            fmt_duration(started.elapsed().as_secs_f64()),
            match &estimate {
                Some((_, t)) =>
                    format!("; this lab {}, all left {}", t[i].map_or("not yet timed".to_string(), |s| format!("about {}", fmt_duration(s))), about(&t[i..])),
                None => String::new(),
            }
        ));
        // A recording that cannot be read costs the comparison, not the run.
        let recorded = lab.visit(&dev_dir, None).unwrap_or_else(|e| {
            eprintln!("overlap-lab: warning: this GPU's recording of {} is not set beside the run: {e}", lab.name());
            None
        });
        let t = std::time::Instant::now();
        let ran = lab.run(None, preset, cx)?;
        let took = t.elapsed().as_secs_f64();
        println!("{} took {}", lab.name(), fmt_duration(took));
        // A lab that measured nothing here (skipped, or a recording shown
        // instead of a run) leaves no time, no figures and no comparison.
        let Some(figures) = ran else {
            println!("  {}: nothing measured here, so nothing is set beside the recording or timed", lab.name());
            continue;
        };
        if note_times {
            // Written after each lab: a run stopped halfway keeps what it timed.
            times.note(&fp.gpu_name, &preset_name, lab.name(), took);
            times.store(data)?;
        }
        all_figures
            .extend(figures.iter().map(|f| serde_json::json!({"lab": lab.name(), "what": f.what, "unit": f.unit, "value": f.value, "model_tolerance": f.model_tolerance, "lab_seconds": took})));
        if let Some(path) = figures_to {
            let text = serde_json::to_string_pretty(&all_figures).expect("figures serialize") + "\n";
            overlap_lab::measure::record::write_atomic(path, &text)?;
        }
        match recorded {
            Some(r) => {
                let (a, c, text) = beside(&figures, &r.figures, &format!("the recording ({})", r.origin));
                agree += a;
                compared += c;
                println!("{text}");
            }
            None => println!("  no recording of {} on this GPU to set this run beside", lab.name()),
        }
    }
    println!(
        "all --preset {preset_name} took {}; {agree} of {compared} headline figures agree with this GPU's recordings",
        fmt_duration(started.elapsed().as_secs_f64())
    );
    Ok(())
}

fn run(matches: clap::ArgMatches) -> Result<()> {
    let data_arg = matches.get_one::<PathBuf>("data").cloned();
    let quiet = matches.get_flag("quiet");
    let data = data_arg.unwrap_or_else(default_data_dir);
    if let Some((name, sub)) = matches.subcommand() {
        if let Some(lab) = labs::find(name) {
            let opts = LabOptions::from_arg_matches(sub).map_err(|e| LabError::config(command_line_error(&e)))?;
            let cx = RunContext { device: opts.device, data: &data, record_to: (!opts.no_record).then_some(data.as_path()), progress: progress(quiet) };
            return lab.run(Some(sub), Preset::Full, &cx).map(|_| ());
        }
    }
    let cli = Cli::from_arg_matches(&matches).map_err(|e| LabError::config(command_line_error(&e)))?;
    match cli.command {
        Tool::Device { device, json } => {
            let fp = Gpu::open(device)?.fingerprint()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&fp).expect("fingerprint serializes"));
            } else {
                println!("{}", fp.describe());
            }
        }
        Tool::Topology { json } => {
            let t = overlap_lab::gpu::topology::Topology::discover()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&t).expect("topology serializes"));
            } else {
                print!("{}", t.describe());
            }
        }
        Tool::Progress { notebooks } => match notebooks {
            Some(dir) => println!("{}", overlap_lab::course::progress_in(&dir)?),
            None => println!("{}", overlap_lab::course::progress()?),
        },
        Tool::Diagnose { trace, json, workers } => match rank_traces(&trace)? {
            Some(ranks) => run_diagnose_ranks(&ranks, json, &data)?,
            None => run_diagnose(&trace[0], json, workers as usize, &data, quiet)?,
        },
        Tool::Trace { output, inject, keep_raw, peer_copies, sync_events, no_diagnose, json, workers, command } => {
            let req = overlap_lab::trace::Request { command, output, library: inject, keep_raw, peer_copies, sync_events };
            let code = run_trace(&req, (!no_diagnose).then_some(workers as usize), json, &data, quiet)?;
            if code != 0 {
                use std::io::Write;
                let _ = std::io::stdout().flush();
                std::process::exit(code);
            }
        }
        Tool::Report { out } => run_report(&data, &out)?,
        Tool::All { device, out, preset, no_record, figures, labs: only } => {
            let chosen = chosen_labs(&only)?;
            let avail = Availability::probe();
            if avail.is_ready() {
                // Only full runs are worth keeping: the others would replace real numbers.
                let keep = (preset == Preset::Full && !no_record).then_some(data.as_path());
                if keep.is_none() {
                    println!(
                        "not recording: {}; no report either (`overlap-lab report` draws data/)",
                        if no_record {
                            "--no-record".to_string()
                        } else {
                            format!("only --preset full is recorded (each lab's time is: {})", display_path(&run_times_path(&data)))
                        }
                    );
                }
                let cx = RunContext { device, data: &data, record_to: keep, progress: progress(quiet) };
                run_all(&data, preset, &cx, !no_record, quiet, figures.as_deref(), &chosen)?;
                if keep.is_some() {
                    run_report(&data, &out)?;
                }
            } else {
                println!("no GPU: {}; rendering the recorded data instead.", avail.reason());
                run_report(&data, &out)?;
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    // `overlap-lab report | head` should stop quietly when head does, as
    // other command-line tools do, not panic on the closed pipe.
    // SAFETY: restores the default action of one signal before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cmd = command();
    let args = match join_size_units(&cmd, std::env::args_os().collect()) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("overlap-lab: error: {e}");
            return ExitCode::from(2);
        }
    };
    let matches = match cmd.try_get_matches_from(args) {
        Ok(m) => m,
        // Help and the version are printed as clap prints them, and so is
        // the help that a bare `overlap-lab` gets.
        Err(e) if !e.use_stderr() || e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
        Err(e) => {
            eprintln!("overlap-lab: error: {}{}", command_line_error(&e), stray_unit_hint(&e));
            return ExitCode::from(2);
        }
    };
    match run(matches) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("overlap-lab: error: {e}");
            match e {
                LabError::Config(_) => ExitCode::from(2),
                _ => ExitCode::FAILURE,
            }
        }
    }
}
