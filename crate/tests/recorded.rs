//! The committed reference recordings, over every lab of the table: each
//! GPU holds every lab's recording, the report renders and names no
//! machine folder, every drawn timeline agrees with its table, every chart
//! draws its variants on one clock in their table's order, and every
//! exercise's check on a recording answers in under a second. A lab's own
//! recorded-data tests (what its recordings must show, its exercise judged
//! on them) live in its folder (`crate/src/labs/<lab>/recorded_tests.rs`,
//! run with the crate's unit tests).

use overlap_lab::measure::record::{default_data_dir, find_recordings, Record};
use overlap_lab::testing::{alone, busy};

/// Every recording in data/ of the table's first lab (lab 1), read as plain
/// JSON: the GPUs the report shows.
fn recordings() -> Vec<(std::path::PathBuf, Record<serde_json::Value>)> {
    let first = overlap_lab::labs::ALL[0].name();
    find_recordings(&default_data_dir(), first).unwrap_or_else(|e| panic!("data/ holds no {first} recording: {e}"))
}

/// The whole report from data/, rendered once for every test that reads
/// it: where it went, each lab's recording on each GPU with the figures it
/// wrote, and every file. It goes to $OVERLAP_LAB_REPORT_DIR where that is
/// set (the test command's `target/report`, which its browser test opens:
/// the report is rendered once in all), else to a folder of its own.
fn rendered() -> &'static (std::path::PathBuf, Vec<overlap_lab::lab_kit::table::Visited>, Vec<std::path::PathBuf>) {
    static REPORT: std::sync::OnceLock<(std::path::PathBuf, Vec<overlap_lab::lab_kit::table::Visited>, Vec<std::path::PathBuf>)> = std::sync::OnceLock::new();
    REPORT.get_or_init(|| {
        let out = match std::env::var_os("OVERLAP_LAB_REPORT_DIR") {
            Some(d) => std::path::PathBuf::from(d),
            None => overlap_lab::testing::temp_dir("recorded-report"),
        };
        let (visited, files) = overlap_lab::report::generate_by_lab(&default_data_dir(), &out).unwrap();
        (out, visited, files)
    })
}

/// The report rendered from data/ and the recordings with their READMEs
/// and traces name no folder of the machine that made them: a record
/// names files as the repository does.
#[test]
fn the_report_and_the_recordings_name_no_machine_folders() {
    let out = {
        let _busy = busy();
        rendered().0.clone()
    };
    let mut stack = vec![out, default_data_dir()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.to_string_lossy().ends_with(".json.gz")
                || p.extension().is_some_and(|x| x == "txt" || x == "md" || x == "svg" || x == "json" || x == "html" || x == "csv")
            {
                // Traces are kept gzipped: read what they hold.
                let text = if p.to_string_lossy().ends_with(".gz") {
                    let mut text = String::new();
                    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(std::fs::File::open(&p).unwrap()), &mut text).unwrap();
                    text
                } else {
                    std::fs::read_to_string(&p).unwrap()
                };
                for m in overlap_lab::testing::MACHINE_FOLDERS {
                    assert!(!text.contains(m), "{}: names {m}", p.display());
                }
            }
        }
    }
}

/// Every device directory in data/ holds a recording of every lab in the
/// lab table, and each one loads and yields its headline rows.
#[test]
fn every_lab_of_the_table_is_recorded_on_every_gpu() {
    let data = default_data_dir();
    let mut devices: Vec<_> = std::fs::read_dir(&data).unwrap().flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    devices.sort();
    assert!(devices.len() >= 2, "{devices:?}");
    for dev in &devices {
        for lab in overlap_lab::labs::ALL {
            let v = lab.visit(dev, None).unwrap().unwrap_or_else(|| panic!("{} has no {}.json", dev.display(), lab.name()));
            assert!(!v.headline.is_empty() && v.files.is_empty(), "{}: {}", dev.display(), lab.name());
        }
    }
    // Every figure and file a lab renders carries the lab's one name.
    let (_, visited) = {
        let _busy = busy();
        let (out, visited, _) = rendered();
        (out, visited)
    };
    assert_eq!(visited.len(), devices.len() * overlap_lab::labs::ALL.len());
    for v in visited {
        let lab = overlap_lab::labs::find(v.lab).unwrap();
        assert!(!v.files.is_empty(), "{} renders files", lab.name());
        for f in &v.files {
            let file = f.file_name().unwrap().to_string_lossy();
            assert!(file.starts_with(&format!("{}-", lab.name())), "{} wrote {file}", lab.name());
        }
        // No figure is written over another's file.
        let mut names: Vec<_> = v.files.iter().map(|f| f.file_name().unwrap().to_owned()).collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "{} writes a file name twice: {:?}", lab.name(), v.files);
    }
}

/// A number right after `key` in `text` ("makespan 1.234 ms" -> 1.234 ms).
fn ms_after(text: &str, key: &str) -> Option<f64> {
    let rest = &text[text.find(key)? + key.len()..];
    let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    let v: f64 = rest[..end].parse().ok()?;
    Some(if rest[end..].trim_start().starts_with("µs") { v / 1e3 } else { v })
}

/// Every timeline a lab draws from a run is a measurement: each measured
/// panel of every chart in the report is drawn beside the untraced runs'
/// time, and where the two differ by more than 10% its caption says so.
/// Prints every panel (the closing notes' list).
#[test]
fn every_drawn_timeline_agrees_with_its_table_or_says_by_how_much() {
    let (out, _, files) = {
        let _busy = busy();
        rendered()
    };
    let mut panels = 0;
    for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "svg")) {
        let dev = f.parent().unwrap();
        let svg = std::fs::read_to_string(f).unwrap();
        for caption in svg.split("<text").filter_map(|t| t.split_once('>').map(|(_, rest)| rest.split("</text>").next().unwrap_or(""))) {
            // Measured panels: timed by the GPU's clocks. A kernel's
            // warps come from a traced build and say so.
            if !caption.contains("makespan") || !(caption.contains(", cupti") || caption.contains(", cuda events")) {
                continue;
            }
            let at = format!("{} {}: {caption}", dev.file_name().unwrap().to_string_lossy(), f.file_name().unwrap().to_string_lossy());
            let drawn = ms_after(caption, "makespan ").unwrap_or_else(|| panic!("{at}: no makespan"));
            let untraced = ms_after(caption, "untraced ").unwrap_or_else(|| panic!("{at}: drawn with no untraced time beside it"));
            let off = drawn / untraced - 1.0;
            let says = (caption.contains("tracing") && caption.contains("slowed this run")) || caption.contains("faster (runs vary)");
            println!("{:+7.1}%  {}", 100.0 * off, at);
            // The caption's figures are rounded: a margin either side of 10%.
            assert!(off.abs() < 0.11 || says, "{at}: {:.1}% off and says nothing", 100.0 * off);
            assert!(off.abs() > 0.09 || !says, "{at}: within 10% but excuses itself");
            panels += 1;
        }
    }
    assert!(panels >= 20, "only {panels} measured panels found in the reports");
    // The one page holds every lab, every GPU and every figure.
    let page = std::fs::read_to_string(out.join("report.html")).unwrap();
    for lab in overlap_lab::labs::ALL {
        assert!(page.contains(&format!("<section class=\"lab\" id=\"{}\">", lab.name())), "report.html lacks lab {}", lab.name());
    }
    for (_, r) in recordings() {
        assert!(page.contains(&format!("<h3>{}</h3>", r.fingerprint.gpu_name)), "report.html lacks {}", r.fingerprint.gpu_name);
    }
    let svgs = files.iter().filter(|f| f.extension().is_some_and(|e| e == "svg")).count();
    assert_eq!(page.matches("<svg").count(), svgs, "every figure drawn is on the page once");
}

/// Every exercise's check with no GPU (the queue model on a recording)
/// answers in under a second, on every GPU's recording: a learner's right
/// answer, a wrong one, and lab 2's longest loop (800 chunks: 2,400 ops).
/// Lab 1's checks are arithmetic on the recording; lab 7's compiles the
/// learner's kernel (NVRTC), not a model. Timed as notebooks run them:
/// unoptimized, as evcxr builds the crate.
#[test]
fn every_model_check_answers_in_under_a_second() {
    use overlap_lab::lab_kit::check::CheckReport;
    use overlap_lab::labs::{callback, double_buffer, memory, multi_gpu, overlap, streams};
    use std::sync::Arc;
    use std::time::Instant;
    let _alone = alone();
    let data = default_data_dir();
    // The fastest of three: a busy machine only ever slows a check.
    let timed = |what: &str, check: &dyn Fn() -> CheckReport| {
        let mut s = f64::INFINITY;
        let mut rep = None;
        for _ in 0..3 {
            let t = Instant::now();
            rep = Some(check());
            s = s.min(t.elapsed().as_secs_f64());
        }
        let rep = rep.unwrap();
        eprintln!("{what}: {s:.3} s, {}", if rep.passed { "passed" } else { "not yet" });
        assert!(s < 1.0, "{what} took {s:.2} s (a check answers in under a second):\n{rep}");
        rep
    };
    for (path, rec) in find_recordings::<overlap::OverlapResults>(&data, overlap::LAB).unwrap() {
        let r = &rec.results;
        let at = |what: &str| format!("lab 2 {what} ({})", path.display());
        assert!(
            timed(&at("solution, 16 chunks"), &|| overlap::exercise::check_on_model(r, overlap::Intensity::Balanced, 16, 4, overlap::exercise::solution))
                .passed
        );
        timed(&at("solution, 800 chunks"), &|| overlap::exercise::check_on_model(r, overlap::Intensity::Balanced, 800, 4, overlap::exercise::solution));
        assert!(
            !timed(&at("wrong buffer"), &|| overlap::exercise::check_on_model(r, overlap::Intensity::Balanced, 16, 4, overlap::exercise::downloads_the_input))
                .passed
        );
    }
    for (path, rec) in find_recordings::<double_buffer::DoubleBufferResults>(&data, double_buffer::LAB).unwrap() {
        let r = &rec.results;
        let at = |what: &str| format!("lab 3 {what} ({})", path.display());
        assert!(timed(&at("solution"), &|| double_buffer::exercise::check_on_model(r, r.config.batches, double_buffer::pipelined)).passed);
        assert!(!timed(&at("no overlap"), &|| double_buffer::exercise::check_on_model(r, r.config.batches, double_buffer::no_overlap)).passed);
    }
    for (path, rec) in find_recordings::<callback::CallbackResults>(&data, callback::LAB).unwrap() {
        let r = &rec.results;
        let at = |what: &str| format!("lab 4 {what} ({})", path.display());
        assert!(timed(&at("solution"), &|| callback::exercise::check_on_model(r, callback::hand_off_to_worker)).passed);
        assert!(!timed(&at("slots by index"), &|| callback::exercise::check_on_model(r, callback::exercise::reuses_slots_by_index)).passed);
    }
    for (path, rec) in find_recordings::<streams::StreamsResults>(&data, streams::LAB).unwrap() {
        let r = &rec.results;
        let at = |what: &str| format!("lab 5 {what} ({})", path.display());
        assert!(timed(&at("solution"), &|| streams::exercise::check_on_model(r, Arc::new(streams::exercise::solution))).passed);
        assert!(!timed(&at("given"), &|| streams::exercise::check_on_model(r, Arc::new(streams::exercise::given))).passed);
    }
    for (path, rec) in find_recordings::<memory::MemoryResults>(&data, memory::LAB).unwrap() {
        let r = &rec.results;
        let at = |what: &str| format!("lab 6 {what} ({})", path.display());
        assert!(timed(&at("solution"), &|| memory::exercise::check_on_model(r, Arc::new(memory::exercise::solution))).passed);
        assert!(!timed(&at("given"), &|| memory::exercise::check_on_model(r, Arc::new(memory::exercise::given))).passed);
    }
    for (path, rec) in find_recordings::<multi_gpu::MultiGpuResults>(&data, multi_gpu::LAB).unwrap() {
        let at = |what: &str| format!("lab 8 {what} ({})", path.display());
        let pp = multi_gpu::pipeline_parallel::events_only;
        assert!(timed(&at("solution"), &|| multi_gpu::exercise::check_recorded(&rec, Arc::new(pp))).passed);
        let given = multi_gpu::pipeline_parallel::host_synchronized;
        assert!(!timed(&at("given"), &|| multi_gpu::exercise::check_recorded(&rec, Arc::new(given))).passed);
    }
}

/// What a chart that draws several variants from runs gets wrong: its
/// variants drawn in another order than its table ranks them, or timed by
/// more than one clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DrawnWrong {
    Order,
    Clocks,
}

/// Charts of a recording made before its lab drew every variant on one
/// clock, each excused for what it gets wrong until it is recorded again:
/// (recording, chart, what is wrong, why). The only place such a chart is
/// excused; an entry whose chart is no longer wrong fails the test
/// below: take it off.
const STALE_CHARTS: &[(&str, &str, &[DrawnWrong], &str)] = &[];

/// Every timeline chart every lab of the table draws from every recording
/// in data/ (`Lab::timeline_charts`): (the recording as "device/lab.json",
/// the GPU's folder in the report, the chart).
fn timeline_charts() -> Vec<(String, String, overlap_lab::present::gantt::Gantt)> {
    let mut devs: Vec<_> = std::fs::read_dir(default_data_dir()).unwrap().flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    devs.sort();
    let mut out = Vec::new();
    for dev in &devs {
        let slug = dev.file_name().unwrap().to_string_lossy().to_string();
        for lab in overlap_lab::labs::ALL {
            let at = format!("{slug}/{}.json", lab.name());
            out.extend(lab.timeline_charts(dev).unwrap_or_else(|e| panic!("{at}: {e}")).into_iter().map(|g| (at.clone(), slug.clone(), g)));
        }
    }
    out
}

/// A drawn timeline is a measurement (issue 50): every chart that draws
/// several variants from runs draws them on one clock, and never draws a
/// variant slower than one its table ranks slower (its untraced runs'
/// middle half below the other's), beyond both spreads. Over every
/// recording of every lab; every chart the report draws from runs is
/// among those checked; charts recorded before the rule are excused only
/// as `STALE_CHARTS` lists them. Prints every chart (the closing notes' list).
#[test]
fn every_chart_draws_its_variants_on_one_clock_in_their_tables_order() {
    let charts = {
        let _busy = busy();
        timeline_charts()
    };
    let mut wrong = Vec::new();
    let mut several = 0;
    for (at, _, g) in &charts {
        let ranked = g.timelines.iter().filter(|t| t.untraced_ms.is_some_and(|u| u.middle_ms.is_some())).count();
        several += usize::from(ranked >= 2);
        let mut found: Vec<(DrawnWrong, String)> = g.order_faults().iter().map(|f| (DrawnWrong::Order, f.to_string())).collect();
        let clocks = g.clocks();
        if clocks.len() > 1 {
            found.push((DrawnWrong::Clocks, format!("its variants are drawn by {}, clocks that do not compare", clocks.join(" and "))));
        }
        let stale = STALE_CHARTS.iter().find(|(rec, stem, _, _)| rec == at && *stem == g.stem);
        let excused = |w: DrawnWrong| stale.is_some_and(|s| s.2.contains(&w));
        let drawn_by = if clocks.is_empty() { "no panel drawn beside its runs".to_string() } else { format!("drawn by {}", clocks.join(" and ")) };
        println!("{:<5} {at} {}: {ranked} variants ranked by their runs, {drawn_by}", if found.is_empty() { "ok" } else { "WRONG" }, g.stem);
        for (w, what) in &found {
            println!("        {}{what}", if excused(*w) { "(stale, excused) " } else { "" });
            if !excused(*w) {
                wrong.push(format!("{at}, chart {}: {what}", g.stem));
            }
        }
        if let Some((_, _, ws, why)) = stale {
            for w in ws.iter().filter(|w| !found.iter().any(|f| f.0 == **w)) {
                wrong.push(format!("{at}, chart {}: STALE_CHARTS excuses its {w:?} ({why}), but it is no longer wrong there: take it off the list", g.stem));
            }
        }
    }
    for (rec, stem, _, _) in STALE_CHARTS {
        assert!(charts.iter().any(|(at, _, g)| at == rec && g.stem == *stem), "STALE_CHARTS names {rec}, chart {stem}, which no lab draws");
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Labs 2 to 6 draw 3 + 1 + 1 + 5 + 2 charts of several variants on each GPU.
    assert!(several >= 24, "only {several} charts of several variants ranked by their runs");
    // Every chart the report draws from runs (a panel timed by a GPU clock
    // beside its untraced runs) is one checked here.
    let files = {
        let _busy = busy();
        &rendered().2
    };
    for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "svg")) {
        let svg = std::fs::read_to_string(f).unwrap();
        let from_runs = svg.split("<text").any(|t| t.contains("makespan") && (t.contains(", cupti") || t.contains(", cuda events")));
        let dev = f.parent().and_then(|d| d.file_name()).unwrap().to_string_lossy().to_string();
        let stem = f.file_stem().unwrap().to_string_lossy().to_string();
        assert!(
            !from_runs || charts.iter().any(|(_, slug, g)| *slug == dev && g.stem == stem),
            "{}: the report draws it from runs, but its lab's entry does not list it among its timelines: add it there",
            f.display()
        );
    }
}
