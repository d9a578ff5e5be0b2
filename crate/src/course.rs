//! The course around the labs, for `notebooks/00-start-here.ipynb`: what
//! this machine can do (a GPU or the recordings, the driver, NVRTC,
//! CUPTI), the course map from the lab table with each notebook's measured
//! time (`data/notebook-times.json`), a glossary of what the labs
//! print (the course's words, then each lab's of the table), and the primer's picture (one stream against three, from the
//! queue model), and the learner's progress through the exercises.
//!
//! May use everything below it: `labs` (the lab table), `lab_kit`, `gpu`,
//! `pipeline`, `present`, `measure`.

use crate::error::Result;
use crate::gpu::{driver, kernels, Availability, Gpu};
use crate::lab_kit::progress::{self, Exercise, Progress};
use crate::lab_kit::Word;
use crate::measure::record::{default_data_dir, read_json};
use crate::pipeline::machine::Machine;
use crate::pipeline::op::{OpKind, StreamKind};
use crate::pipeline::plan::{chunk, stage_streams, Plan, StreamSpec, WaitBy};
use crate::pipeline::predict::predict;
use crate::pipeline::timeline::Timeline;
use crate::present::gantt::Gantt;
use serde::Deserialize;
use std::collections::BTreeMap;

/// Every exercise of the course and where the learner stands on it (one
/// line each: passed, not yet with the first problem, not started), read
/// from the notebooks in `dir` and the verdicts their cells saved there.
pub fn progress_in(dir: &std::path::Path) -> Result<Progress> {
    read_progress(dir, &progress::verdicts_in(dir))
}

/// The course's notebooks and the verdicts their cells saved (in
/// `notebooks/progress.json`, or where `$OVERLAP_LAB_PROGRESS` points):
/// what notebook 00 and `overlap-lab progress` print.
pub fn progress() -> Result<Progress> {
    read_progress(&progress::default_notebooks_dir(), &progress::default_verdicts())
}

fn read_progress(dir: &std::path::Path, verdicts: &std::path::Path) -> Result<Progress> {
    let labs: Vec<(u8, &'static [Exercise])> = crate::labs::ALL.iter().map(|l| (l.number(), l.exercises())).collect();
    progress::read(dir, verdicts, &labs)
}

/// Where one thing the course uses stands on this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Here and working.
    Ready,
    /// Not here, and the course does without it: no GPU (the notebooks
    /// show the recordings), no CUPTI (CUDA events time the timelines).
    DoesWithout,
    /// Missing or broken, and part of the course cannot work without it.
    Missing,
}

impl Readiness {
    /// Its tag in the set-up check: `[ ok ]`, `[ -- ]`, `[MISS]`.
    pub fn tag(self) -> &'static str {
        match self {
            Readiness::Ready => "[ ok ]",
            Readiness::DoesWithout => "[ -- ]",
            Readiness::Missing => "[MISS]",
        }
    }
}

/// One line of the set-up check.
#[derive(Clone, Debug, PartialEq)]
pub struct SetupLine {
    pub what: &'static str,
    pub readiness: Readiness,
    pub detail: String,
}

/// What this machine can do for the course, a line each.
pub fn setup() -> Vec<SetupLine> {
    use Readiness::*;
    let line = |what, readiness, detail: String| SetupLine { what, readiness, detail };
    let mut lines = Vec::new();
    let avail = Availability::probe();
    lines.push(match &avail {
        Availability::Ready { devices } => match Gpu::open(0) {
            Ok(g) => line("GPU", Ready, format!("{} GPU(s); GPU 0: {}", devices, g.label())),
            Err(e) => line("GPU", Missing, format!("the driver sees {devices} GPU(s) but GPU 0 does not open: {e}")),
        },
        _ => line("GPU", DoesWithout, format!("none here ({}): the notebooks show the recordings", avail.reason())),
    });
    lines.push(match crate::lab_kit::live_here() {
        Ok(()) => line("notebooks", Ready, "LIVE: each lab runs on this GPU".into()),
        Err(why) => line("notebooks", Ready, format!("RECORDED: each lab shows its newest recording ({why})")),
    });
    lines.push(if !kernels::nvrtc_present() {
        line("NVRTC", Missing, "not found: the labs' kernels cannot be compiled (install the CUDA toolkit, or `pip install nvidia-cuda-nvrtc`)".into())
    } else {
        match kernels::compile_ptx(&kernels::COMPUTE, "sm_90") {
            Ok(ptx) => line("NVRTC", Ready, format!("compiles the labs' kernels ({}: {} lines of PTX)", kernels::COMPUTE.file, ptx.lines().count())),
            Err(e) => line("NVRTC", Missing, format!("present, but a kernel does not compile: {e}")),
        }
    });
    lines.push(if driver::activity::available() {
        line("CUPTI", Ready, "found: pure-GPU timelines use the hardware's own timestamps".into())
    } else {
        line("CUPTI", DoesWithout, "not found: timelines use CUDA events (each chart says which)".into())
    });
    lines.push(match crate::report::Headlines::from_data(&default_data_dir()) {
        Ok(h) if !h.gpus.is_empty() => line("recordings", Ready, format!("data/ holds runs of: {}", h.gpus.join(", "))),
        Ok(_) => line("recordings", Missing, "data/ holds no recording: with no GPU the notebooks have nothing to show".into()),
        Err(e) => line("recordings", Missing, format!("data/ could not be read: {e}")),
    });
    lines
}

/// [`setup`] as the notebook prints it.
pub fn setup_report() -> String {
    setup().iter().map(|l| format!("{} {:<11} {}\n", l.readiness.tag(), l.what, l.detail)).collect()
}

/// How long each notebook takes, measured (`data/notebook-times.json`).
#[derive(Clone, Debug, Deserialize)]
pub struct NotebookTimes {
    pub about: String,
    pub runs: Vec<NotebookRun>,
}

/// One measured run of every notebook: live on a GPU, or with the recordings.
#[derive(Clone, Debug, Deserialize)]
pub struct NotebookRun {
    /// "live" or "recorded".
    pub mode: String,
    /// The GPU and host, or "no GPU" and the host.
    pub machine: String,
    pub date: String,
    /// The commit the notebooks were run at.
    pub code: String,
    pub command: String,
    /// Seconds per notebook, by its file name without `.ipynb`.
    pub seconds: BTreeMap<String, f64>,
}

/// The file that holds them.
pub const NOTEBOOK_TIMES: &str = "notebook-times.json";

/// The measured notebook times from the data directory.
pub fn notebook_times() -> Result<NotebookTimes> {
    read_json(&default_data_dir().join(NOTEBOOK_TIMES))
}

/// Every lab in order: its notebook, its question, what it builds on and
/// how long its notebook took, live and with the recordings (when the
/// times are there).
pub fn course_map() -> String {
    let times = notebook_times().ok();
    let mut out = format!("{} labs, in order:\n\n", crate::labs::ALL.len());
    for lab in crate::labs::ALL.iter() {
        out += &format!("{}. {}\n   {}\n", lab.number(), lab.teaches(), lab.notebook());
        let needs: Vec<String> = lab.builds_on().iter().map(|(n, what)| format!("lab {n} ({what})")).collect();
        out += &format!("   builds on: {}\n", if needs.is_empty() { "nothing: start here".to_string() } else { needs.join("; ") });
        let stem = format!("{:02}-{}", lab.number(), lab.name());
        let took: Vec<String> =
            times.iter().flat_map(|t| &t.runs).filter_map(|r| r.seconds.get(&stem).map(|s| format!("{s:.0} s {} ({})", r.mode, r.machine))).collect();
        if !took.is_empty() {
            out += &format!("   took: {}\n", took.join("; "));
        }
    }
    if let Some(t) = &times {
        let whence: Vec<String> = t.runs.iter().map(|r| format!("{}: {}, {} at {}", r.mode, r.command, r.date, r.code)).collect();
        out += &format!("\nTimes: {} ({}; {})\n", t.about, NOTEBOOK_TIMES, whence.join("; "));
    }
    out
}

/// A word or abbreviation the whole course prints, and what it means
/// (each lab's own are in its table entry: [`crate::lab_kit::Lab::glossary`]).
const fn course(term: &'static str, meaning: &'static str) -> Word {
    Word::new(term, meaning)
}

/// The whole course's words and abbreviations, as the labs print them
/// (every lab of the table brings its own too: a test holds it to that).
pub const GLOSSARY: &[Word] = &[
    course("H2D, D2H, D2D", "a copy host to device, device to host, device to device (within one GPU or between two)"),
    course("stream", "a queue of GPU work that runs in order; work on different streams may overlap"),
    course("event", "a marker recorded on a stream; another stream (or the CPU) can wait until the GPU passes it"),
    course("bound", "the fastest a pipeline could be from its parts timed alone (the slowest stage every item, the rest once)"),
    course("ceiling", "the fastest the hardware does it: lab 2's best bound, lab 7's fastest device copy"),
    course("eff.", "efficiency: the bound over the measured time (100% = as fast as the parts allow)"),
    course("it/s", "iterations per second"),
    course("queue model, model", "the dry run's schedule timed on modelled streams, copy engines and CPU threads with the parts' measured times"),
    course("dry run", "a loop run with no GPU: it records the schedule and where every element's data came from"),
    course("plan, rig", "a loop with its streams and buffers / what runs plans on a GPU on fresh, verified data"),
    course("start gate", "a wait that holds every stream until the loop is issued, so device time excludes issuing"),
    course("makespan", "from a timeline's first op's start to its last op's end"),
    course("spread", "the middle half of the runs (25% to 75%): a difference smaller than it is not shown"),
];

/// The width of the glossary's column of terms (each term is shorter).
const TERM_COLUMN: usize = 36;

/// The glossary as the notebook prints it: the course's words
/// ([`GLOSSARY`]), then each lab's under its number and name, in the lab
/// table's order.
pub fn glossary() -> String {
    let words = |ws: &[Word]| -> String { ws.iter().map(|w| format!("{:<TERM_COLUMN$} {}\n", w.term, w.meaning)).collect() };
    let mut out = words(GLOSSARY);
    for lab in crate::labs::ALL.iter() {
        out += &format!("\nlab {} ({}):\n{}", lab.number(), lab.name(), words(lab.glossary()));
    }
    out
}

/// The primer's picture: four chunks (an H2D, a kernel and a D2H each, 1 ms
/// apiece) on one stream, then on a stream per stage, as the queue model
/// runs them with two copy engines. A model, not a measurement: the labs
/// measure it on your GPU.
pub fn primer_timelines() -> Result<Gantt> {
    const CHUNKS: usize = 4;
    const ELEMENTS: usize = 1 << 20;
    let one = Plan::new("one stream", vec![StreamSpec::new("s0", StreamKind::NonBlocking, 0)], ELEMENTS, 2, |p, r| {
        for c in 0..CHUNKS {
            let (at, n) = chunk(r.elements, CHUNKS, c);
            p.h2d(r.streams[0], r.devices[0], at, r.input, at, n, &format!("H2D {c}"))?;
            p.compute(r.streams[0], r.devices[0], at, r.devices[1], at, n, &format!("kernel {c}"))?;
            p.d2h(r.streams[0], r.output, at, r.devices[1], at, n, &format!("D2H {c}"))?;
        }
        Ok(())
    });
    let three = stage_streams("a stream per stage", ELEMENTS, CHUNKS, WaitBy::StreamWaitEvent);
    let mut panels = Vec::new();
    for (plan, title) in [(&one, "one stream: each op waits for the one before"), (&three, "a stream per stage, ordered by events: copies overlap kernels")] {
        let m = plan.dry_run()?;
        let times = predict(&m.schedule, Machine::engines(2), |op| if op.kind.is_device_work() { 1000.0 } else { 0.0 });
        let mut t = Timeline::from_schedule(title, "queue model", &m.schedule, &times, &m.stream_names());
        t.spans.retain(|s| matches!(s.kind, OpKind::H2d | OpKind::Kernel | OpKind::D2h));
        t.source = "model".into();
        panels.push(t);
    }
    Ok(Gantt::new(
        "start-here-primer",
        "Why streams: four chunks, each op 1 ms (the queue model, not a measurement)",
        "a model of two copy engines and the SMs",
        panels,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setup_check_answers_every_line_with_no_gpu_too() {
        let lines = setup();
        let whats: Vec<&str> = lines.iter().map(|l| l.what).collect();
        assert_eq!(whats, ["GPU", "notebooks", "NVRTC", "CUPTI", "recordings"]);
        let report = setup_report();
        assert!(report.lines().count() == 5 && report.contains("recordings"), "{report}");
        // The repository's data/ holds the recordings the notebooks show.
        assert!(lines[4].readiness == Readiness::Ready && lines[4].detail.contains("H100"), "{:?}", lines[4]);
        // What is not here says so, never "ok": no GPU and no CUPTI are
        // done without, not faults.
        for l in report.lines() {
            assert!(!(l.starts_with("[ ok ]") && (l.contains("not found") || l.contains("none here"))), "{l}");
        }
        if !Availability::probe().is_ready() {
            assert!(report.lines().next().is_some_and(|l| l.starts_with("[ -- ] GPU         none here")), "{report}");
        }
        if !driver::activity::available() {
            assert!(report.contains("[ -- ] CUPTI       not found: timelines use CUDA events"), "{report}");
        }
    }

    #[test]
    fn the_course_map_has_every_lab_and_what_it_builds_on() {
        let map = course_map();
        for lab in crate::labs::ALL.iter() {
            assert!(map.contains(&lab.notebook()) && map.contains(lab.teaches()), "{map}");
            for (n, _) in lab.builds_on() {
                assert!(*n < lab.number(), "lab {} builds on lab {n}, which comes after it", lab.number());
            }
        }
        assert!(map.contains("builds on: nothing: start here"), "{map}");
        // The count comes from the lab table, as every line does.
        assert!(map.starts_with(&format!("{} labs, in order:\n", crate::labs::ALL.len())), "{map}");
        // Every notebook's time, live and with the recordings, measured.
        let times = notebook_times().unwrap();
        let modes: Vec<&str> = times.runs.iter().map(|r| r.mode.as_str()).collect();
        assert_eq!(modes, ["live", "recorded"]);
        for run in &times.runs {
            let stems: Vec<String> =
                std::iter::once("00-start-here".to_string()).chain(crate::labs::ALL.iter().map(|l| format!("{:02}-{}", l.number(), l.name()))).collect();
            for stem in &stems {
                let s = run.seconds.get(stem).unwrap_or_else(|| panic!("{}: no time for {stem}", run.mode));
                assert!(*s > 0.0 && *s < 600.0, "{}: {stem} took {s} s", run.mode);
                let nb = crate::measure::record::repo_root().join("notebooks").join(format!("{stem}.ipynb"));
                assert!(nb.is_file(), "{}", nb.display());
            }
            assert_eq!(run.seconds.len(), stems.len(), "{}: a time for a notebook that is not there", run.mode);
            assert!(!run.machine.is_empty() && !run.command.is_empty() && run.code.len() >= 7);
        }
        assert_eq!(map.matches("   took: ").count(), crate::labs::ALL.len(), "{map}");
        assert!(map.contains("live (NVIDIA H100 80GB HBM3") && map.contains("recorded (no GPU"), "{map}");
    }

    #[test]
    fn the_glossary_explains_what_the_tables_abbreviate() {
        let every: Vec<&Word> = GLOSSARY.iter().chain(crate::labs::ALL.iter().flat_map(|l| l.glossary())).collect();
        let terms: String = every.iter().map(|w| w.term).collect::<Vec<_>>().join(" ");
        for w in &every {
            assert!(w.term.chars().count() < TERM_COLUMN, "{:?} does not fit the glossary's column of terms", w.term);
        }
        for abbr in [
            "H|D",
            "DF",
            "BF",
            "SS",
            "C/G",
            "eff.",
            "it/s",
            "regs",
            "smem",
            "occ",
            "bps",
            "lcl",
            "TMA",
            "makespan",
            "spread",
            "start gate",
            "queue model",
            "tokens/s",
            "ring",
            "GEMM",
        ] {
            assert!(terms.contains(abbr), "the glossary lacks {abbr}");
        }
    }

    /// Every lab of the table brings its own words, printed under it.
    #[test]
    fn every_lab_brings_its_words_to_the_glossary() {
        let text = glossary();
        for lab in crate::labs::ALL.iter() {
            let first = lab.glossary().first().unwrap_or_else(|| panic!("lab {} ({}) brings no word to the glossary", lab.number(), lab.name()));
            let heading = format!("lab {} ({}):\n", lab.number(), lab.name());
            let at = text.find(&heading).unwrap_or_else(|| panic!("no {heading:?} in {text}"));
            assert!(text[at + heading.len()..].starts_with(first.term), "{text}");
        }
    }

    #[test]
    fn the_primer_overlaps_on_three_streams_and_not_on_one() {
        let g = primer_timelines().unwrap();
        let ends: Vec<f64> = g.timelines.iter().map(|t| t.end_us()).collect();
        // One stream: 4 chunks x 3 ops x 1 ms back to back; three streams: the pipeline fills, 6 ms.
        assert!((ends[0] - 12_000.0).abs() < 1.0 && (ends[1] - 6_000.0).abs() < 1.0, "{ends:?}");
    }
}
