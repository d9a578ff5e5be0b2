//! The documents (README.md, LABS.md, MAINTAINERS.md) and the notebooks
//! agree with the code: headline tables match the
//! recordings, every command line they show parses with the options it
//! names, every method a notebook's text names exists, and nothing they hold
//! names a folder of the machine that made them.

use overlap_lab::measure::record::{default_data_dir, repo_root};
use overlap_lab::report::Headlines;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

fn bin() -> String {
    std::env::var("OVERLAP_LAB_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_overlap-lab").to_string())
}

fn readme() -> String {
    doc("README.md")
}

/// A document at the repository's top (README.md for learners, LABS.md
/// for each lab, MAINTAINERS.md for the rest).
fn doc(name: &str) -> String {
    std::fs::read_to_string(repo_root().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The three documents, by name.
const DOCS: [&str; 3] = ["README.md", "LABS.md", "MAINTAINERS.md"];

fn notebooks() -> Vec<(PathBuf, serde_json::Value)> {
    let mut v: Vec<_> = std::fs::read_dir(repo_root().join("notebooks"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "ipynb"))
        .map(|p| {
            let nb = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            (p, nb)
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn cell_text(cell: &serde_json::Value, key: &str) -> String {
    match &cell[key] {
        serde_json::Value::Array(a) => a.iter().filter_map(|l| l.as_str()).collect(),
        serde_json::Value::String(s) => s.clone(),
        _ => String::new(),
    }
}

#[test]
fn readme_headline_tables_are_the_recordings() {
    if std::env::var_os("OVERLAP_LAB_DATA").is_some() {
        eprintln!("SKIPPED readme_headline_tables_are_the_recordings: OVERLAP_LAB_DATA points at other recordings than the README's");
        return;
    }
    let table = Headlines::from_data(&default_data_dir()).unwrap();
    let text = doc("LABS.md");
    assert!(table.gpus.len() >= 2, "data/ holds recordings of two GPUs: {:?}", table.gpus);
    for lab in overlap_lab::labs::ALL.iter().map(|l| l.name()) {
        let open = format!("<!-- headline:{lab} -->\n");
        let at = text.find(&open).unwrap_or_else(|| panic!("LABS.md has no {open:?} section"));
        let rest = &text[at + open.len()..];
        let shown = &rest[..rest.find("<!-- /headline -->").expect("closing marker")];
        assert_eq!(
            shown,
            table.markdown(Some(lab)),
            "LABS.md's {lab} table differs from data/: run `overlap-lab report` and copy that lab's rows of target/report/headline.md"
        );
    }
}

/// The README's lab table lists the lab table's labs, in order, with the
/// same line and notebook (and only planned labs beyond them).
#[test]
fn readme_lab_table_is_the_lab_table() {
    let text = readme();
    let rows: Vec<Vec<String>> = text
        .lines()
        .skip_while(|l| !l.starts_with("| lab | what it teaches |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.trim_matches('|').split(" | ").map(|c| c.trim().to_string()).collect())
        .collect();
    // "done", or "done" and what is still short of its target.
    let done: Vec<&Vec<String>> = rows.iter().filter(|r| r.get(3).is_some_and(|s| s == "done" || s.starts_with("done "))).collect();
    assert_eq!(done.len(), overlap_lab::labs::ALL.len(), "README's done labs: {rows:?}");
    for (row, lab) in done.iter().zip(overlap_lab::labs::ALL.iter()) {
        assert_eq!(row[0], lab.number().to_string(), "{row:?}");
        assert_eq!(row[1], lab.teaches(), "README says what lab {} teaches differently from the lab table", lab.number());
        assert_eq!(row[2], format!("`{}`", lab.notebook()), "{row:?}");
    }
    assert!(rows.iter().filter(|r| !done.contains(r)).all(|r| r.get(3).is_some_and(|s| s == "planned")), "{rows:?}");
}

#[test]
fn readme_names_every_notebook_and_the_docs_only_files_that_exist() {
    let text = readme();
    for (path, _) in notebooks() {
        let rel = format!("notebooks/{}", path.file_name().unwrap().to_string_lossy());
        assert!(text.contains(&rel), "README does not name {rel}");
    }
    for name in DOCS {
        let text = doc(name);
        for word in text.split(['`', ' ', '(', ')', ',', '\n']) {
            let w = word.trim_end_matches(['.', ':', ';']);
            let looks_like_path =
                ["notebooks/", "kernels/", "crate/reference/", ".ci/"].iter().any(|p| w.starts_with(p)) && !w.contains('*') && !w.ends_with('/');
            if looks_like_path {
                assert!(repo_root().join(w).exists(), "{name} names {w}, which does not exist");
            }
        }
        for outside in ["../", "/root/", "/work/", "$OUT", ".gpu/", "shared/"] {
            assert!(!text.contains(outside), "{name} points outside the repository: {outside}");
        }
    }
}

/// README is for learners: at most 1,500 words, the rest in LABS.md and MAINTAINERS.md.
#[test]
fn readme_is_short_enough_to_read_first() {
    let words = readme().split_whitespace().count();
    assert!(words <= 1500, "README.md has {words} words: move what learners do not need first to LABS.md or MAINTAINERS.md");
}

/// Every `overlap-lab SUB --flag …` line of the documents' shell blocks:
/// SUB exists and its `--help` (or the global one) lists each flag.
#[test]
fn readme_command_lines_use_real_subcommands_and_options() {
    let help = |args: &[&str]| String::from_utf8(Command::new(bin()).args(args).output().unwrap().stdout).unwrap();
    let global = help(&["--help"]);
    let text: String = DOCS.iter().map(|n| doc(n)).collect::<Vec<_>>().join("\n");
    let mut checked = 0;
    for block in text.split("```sh").skip(1) {
        let block = &block[..block.find("```").unwrap()];
        for line in block.lines() {
            let line = line.split('#').next().unwrap();
            let Some(at) = line.find("overlap-lab ") else { continue };
            let words: Vec<&str> = line[at..].split_whitespace().skip(1).collect();
            let Some(sub) = words.iter().find(|w| !w.starts_with('-')) else { continue };
            let sub_help = help(&[sub, "--help"]);
            assert!(sub_help.contains(&format!("Usage: overlap-lab {sub}")), "the docs run `overlap-lab {sub}`, which is no subcommand");
            for flag in words.iter().filter(|w| w.starts_with("--")) {
                let flag = flag.split('=').next().unwrap();
                assert!(sub_help.contains(flag) || global.contains(flag), "the docs pass {flag} to `overlap-lab {sub}`, which has no such option");
            }
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} command lines found");
}

/// Method names a notebook's text shows in code (`run.summary()`,
/// `p.record(e, s)`, `Type::quick()`) are functions of the crate.
#[test]
fn notebook_text_names_only_functions_that_exist() {
    let mut fns = BTreeSet::new();
    let mut stack = vec![repo_root().join("crate/src")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let src = std::fs::read_to_string(&p).unwrap();
                for part in src.split("fn ").skip(1) {
                    let name: String = part.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    fns.insert(name);
                }
            }
        }
    }
    // Methods of std and of the standard library types the notebooks use.
    let std_methods = ["unwrap", "iter", "find", "new", "max", "min", "to_string", "len", "clone", "join"];
    let mut checked = 0;
    for (path, nb) in notebooks() {
        for cell in nb["cells"].as_array().unwrap().iter().filter(|c| c["cell_type"] == "markdown") {
            let text = cell_text(cell, "source");
            for (i, span) in text.split('`').enumerate() {
                if i % 2 == 0 || !span.contains('(') {
                    continue;
                }
                // `name(` right after `.` or `::`.
                for (j, _) in span.match_indices('(') {
                    let before = &span[..j];
                    let name: String = before.chars().rev().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<Vec<_>>().into_iter().rev().collect();
                    let prefix = &before[..before.len() - name.len()];
                    if name.is_empty() || !(prefix.ends_with('.') || prefix.ends_with("::")) || std_methods.contains(&name.as_str()) {
                        continue;
                    }
                    assert!(fns.contains(&name), "{}: the text names `{name}(…)` in `{span}`, but the crate has no such function", path.display());
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 10, "only {checked} calls found in the notebooks' text");
}

#[test]
fn committed_notebooks_name_no_machine_folders() {
    // The recordings, their READMEs and the report: in the recorded-data
    // tests, which render the report once.
    let machine = overlap_lab::testing::MACHINE_FOLDERS;
    for (path, nb) in notebooks() {
        for cell in nb["cells"].as_array().unwrap() {
            for out in cell["outputs"].as_array().into_iter().flatten() {
                let text = cell_text(out, "text") + &cell_text(&out["data"], "text/plain");
                for m in machine {
                    assert!(!text.contains(m), "{}: an output names {m}: {}", path.display(), text.lines().find(|l| l.contains(m)).unwrap_or(""));
                }
            }
        }
    }
}

/// A figure a sentence states: a number followed by a unit measurements
/// have (ms, µs, ns, GB/s, %, or x for a ratio), with its decimals as
/// written. Sizes (MiB) and counts are settings the text may state.
fn prose_figures(text: &str) -> Vec<(f64, usize, String)> {
    const UNITS: [&str; 7] = ["ms", "µs", "us", "ns", "GB/s", "%", "x"];
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts = chars[i].is_ascii_digit() && (i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '.' || chars[i - 1] == '_'));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < chars.len() && (chars[j].is_ascii_digit() || (chars[j] == '.' && j + 1 < chars.len() && chars[j + 1].is_ascii_digit())) {
            j += 1;
        }
        let number: String = chars[i..j].iter().collect();
        let mut k = j;
        if k < chars.len() && chars[k] == ' ' {
            k += 1;
        }
        let rest: String = chars[k..chars.len().min(k + 5)].iter().collect();
        if let Some(unit) = UNITS.iter().find(|u| rest.starts_with(*u)) {
            let after = chars.get(k + unit.chars().count());
            if !after.is_some_and(|c| c.is_alphanumeric()) {
                let decimals = number.split('.').nth(1).map_or(0, |d| d.len());
                out.push((number.parse().unwrap(), decimals, format!("{number} {unit}")));
            }
        }
        i = j;
    }
    out
}

/// Every number an output of the notebook prints.
fn printed_numbers(nb: &serde_json::Value) -> Vec<f64> {
    let mut text = String::new();
    for cell in nb["cells"].as_array().unwrap() {
        for o in cell["outputs"].as_array().into_iter().flatten() {
            text += &cell_text(o, "text");
            text += &cell_text(&o["data"], "text/plain");
        }
    }
    text.split(|c: char| !(c.is_ascii_digit() || c == '.')).filter_map(|w| w.trim_matches('.').parse().ok()).collect()
}

/// Prose holds no figure the recording holds: every figure a notebook's
/// markdown states is printed by one of its cells (to the decimals the text
/// gives), or its paragraph names the file under `data/` it comes from, or
/// it is one of the constants the text may state (a lab's target, a whole).
#[test]
fn notebook_prose_states_only_figures_its_cells_print_or_name_the_file_of() {
    let constants = [0.0, 100.0];
    let mut wrong = Vec::new();
    for (path, nb) in notebooks() {
        let printed = printed_numbers(&nb);
        for cell in nb["cells"].as_array().unwrap().iter().filter(|c| c["cell_type"] == "markdown") {
            for paragraph in cell_text(cell, "source").split("\n\n") {
                let names_a_recording = paragraph.split('`').any(|w| w.starts_with("data/") && repo_root().join(w).is_file());
                if names_a_recording || paragraph.starts_with("```") {
                    continue;
                }
                for (value, decimals, written) in prose_figures(paragraph) {
                    let half = 0.5 * 10f64.powi(-(decimals as i32)) + 1e-9;
                    if constants.contains(&value) || printed.iter().any(|y| (y - value).abs() <= half) {
                        continue;
                    }
                    wrong.push(format!(
                        "{}: \"{written}\" in: {}",
                        path.file_name().unwrap().to_string_lossy(),
                        paragraph.chars().take(160).collect::<String>()
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "figures in notebook prose that no cell prints (print them from the record, or name the GPU and the data/ file):\n{}",
        wrong.join("\n")
    );
}

/// Every lab's notebook ends with what to take away and a link to the
/// next lab's notebook (the last one to the report).
#[test]
fn every_notebook_ends_with_what_to_take_away_and_the_next_lab() {
    let labs = overlap_lab::labs::ALL;
    for (i, lab) in labs.iter().enumerate() {
        let path = repo_root().join(lab.notebook());
        let nb: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let last = nb["cells"].as_array().unwrap().last().unwrap();
        let text = cell_text(last, "source");
        assert!(last["cell_type"] == "markdown" && text.starts_with("## What to take away"), "{}: the last cell is not what to take away", lab.notebook());
        assert!(text.matches("\n* ").count() >= 2, "{}: what to take away lists fewer than two points", lab.notebook());
        match labs.get(i + 1) {
            Some(next) => {
                let file = next.notebook().trim_start_matches("notebooks/").to_string();
                assert!(text.contains("**Next:**") && text.contains(&format!("]({file})")), "{}: no link to the next lab, {file}", lab.notebook());
            }
            None => assert!(text.contains("**Next:**") && text.contains("report.html"), "{}: the last lab points to the report", lab.notebook()),
        }
    }
}

#[test]
fn prose_figures_are_numbers_with_a_unit_of_measurement() {
    let f = prose_figures("On the H100 a 1 GiB pair took 2.1 ms at threshold 0, 64 MiB at 2.49x, 93% and 54 GB/s; lab 8, sm_90, 1.5.");
    let written: Vec<_> = f.iter().map(|x| x.2.as_str()).collect();
    assert_eq!(written, ["2.1 ms", "2.49 x", "93 %", "54 GB/s"]);
    assert_eq!((f[0].0, f[0].1), (2.1, 1));
}

/// Solutions are kept back: each solution's explanation and its code are
/// collapsed (JupyterLab and Notebook 7 read `jupyter.source_hidden` and
/// `outputs_hidden`; the classic notebook `collapsed`), tagged `solution`,
/// and a visible cell before them says where they are.
#[test]
fn every_solution_is_kept_back_behind_a_collapsed_cell() {
    let mut solutions = 0;
    for (path, nb) in notebooks() {
        let cells = nb["cells"].as_array().expect("cells");
        let tags = |c: &serde_json::Value| {
            c["metadata"]["tags"].as_array().map(|t| t.iter().filter_map(|x| x.as_str().map(str::to_string)).collect::<Vec<_>>()).unwrap_or_default()
        };
        let hidden = |c: &serde_json::Value| c["metadata"]["jupyter"]["source_hidden"] == true;
        for (i, c) in cells.iter().enumerate() {
            let text = cell_text(c, "source");
            let at = format!("{} cell {i}", path.display());
            if c["cell_type"] == "markdown" && (text.starts_with("**Solution.**") || text.starts_with("## Solution")) {
                solutions += 1;
                assert!(hidden(c) && tags(c).contains(&"solution".to_string()), "{at}: a solution's explanation in plain sight");
                let code = &cells[i + 1];
                assert!(code["cell_type"] == "code" && hidden(code), "{at}: the solution's code is not collapsed");
                assert!(
                    code["metadata"]["jupyter"]["outputs_hidden"] == true && code["metadata"]["collapsed"] == true,
                    "{at}: the solution's output (its PASSED) shows"
                );
                let before = &cells[i - 1];
                assert!(
                    tags(before).contains(&"solution-kept-back".to_string()) && !hidden(before) && cell_text(before, "source").contains("kept back"),
                    "{at}: no visible cell before the solution says where it is"
                );
            }
            if tags(c).contains(&"solution".to_string()) {
                assert!(hidden(c), "{at}: tagged a solution but shown");
            }
        }
    }
    // One solution per exercise of the lab table.
    let exercises = overlap_lab::labs::ALL.iter().map(|l| l.exercises().len()).sum::<usize>();
    assert_eq!(solutions, exercises, "{solutions} solutions kept back for the lab table's {exercises} exercises");
}

/// Each exercise of the lab table offers hints one at a time in its
/// notebook, right after its cell, through its own lab's `hint` function
/// (`labN::exercise::hint…(1)`, then `(2)`); and each hint function has
/// at least two hints.
#[test]
fn every_exercise_offers_hints_one_at_a_time() {
    use overlap_lab::labs;
    let nbs = notebooks();
    for lab in labs::ALL {
        for ex in lab.exercises() {
            let (_, nb) = nbs.iter().find(|(p, _)| p.file_name().unwrap().to_str() == Some(ex.notebook().as_str())).unwrap();
            let cells = nb["cells"].as_array().unwrap();
            let at = cells.iter().position(|c| c["metadata"]["overlap_lab"]["exercise"].as_str() == Some(ex.id)).unwrap();
            // The first mention of a hint after the exercise's cell is this lab's.
            let call = format!("lab{}::exercise::hint", lab.number());
            let offer = cells[at + 1..].iter().map(|c| cell_text(c, "source")).find(|t| t.contains("::exercise::hint")).unwrap_or_default();
            let name: String =
                offer.split(&call).nth(1).map(|rest| rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()).unwrap_or_default();
            assert!(offer.contains(&format!("{call}{name}(1)")), "{}: no offer of {call}…(1) after its cell", ex.id);
            assert!(offer.contains(&format!("hint{name}(2)")), "{}: the offer does not say hint{name}(2) comes next", ex.id);
        }
    }
    // The hints themselves, from the lab table: at least two an exercise.
    for ex in labs::ALL.iter().flat_map(|l| l.exercises()) {
        assert!(ex.hints.len() >= 2, "{}: {} hints", ex.id, ex.hints.len());
    }
    assert!(labs::overlap::exercise::hint(1).starts_with("Hint 1 of 3"));
}

/// Every exercise of the lab table has one cell in its notebook that names
/// it in its metadata, holds the code it was given (or, for a file answer,
/// the file as given), and saves its verdict; on the committed notebooks
/// the progress says every exercise is not started.
#[test]
fn every_exercise_cell_is_named_given_and_saves_its_verdict() {
    use overlap_lab::lab_kit::progress::{default_notebooks_dir, Standing};
    let nbs = notebooks();
    let dir = default_notebooks_dir();
    let mut ids = Vec::new();
    for lab in overlap_lab::labs::ALL {
        for ex in lab.exercises() {
            ids.push(ex.id);
            let (path, nb) = nbs
                .iter()
                .find(|(p, _)| p.file_name().unwrap().to_str() == Some(ex.notebook().as_str()))
                .unwrap_or_else(|| panic!("{}: no {}", ex.id, ex.notebook()));
            let cells: Vec<&serde_json::Value> =
                nb["cells"].as_array().unwrap().iter().filter(|c| c["metadata"]["overlap_lab"]["exercise"].as_str() == Some(ex.id)).collect();
            assert_eq!(cells.len(), 1, "{}: cells naming {} in {}", lab.name(), ex.id, path.display());
            let (src, given) = (cell_text(cells[0], "source"), cells[0]["metadata"]["overlap_lab"]["given"].as_str().unwrap().to_string());
            assert!(src.contains(".save_progress()"), "{}: the cell does not save its verdict:\n{src}", ex.id);
            let committed = match &ex.file {
                Some(f) => std::fs::read_to_string(dir.join(f.path)).unwrap(),
                None => src.clone(),
            };
            assert_eq!(committed, given, "{}: the given code in the metadata is not what the notebook hands out", ex.id);
        }
    }
    let unique: BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "one id per exercise: {ids:?}");
    // As a new learner finds them: no verdict saved yet.
    let p = overlap_lab::course::progress_in(&overlap_lab::testing::notebooks_copy("docs-progress")).unwrap();
    assert_eq!(p.lines.len(), ids.len());
    for l in &p.lines {
        assert_eq!(l.standing, Standing::NotStarted, "{}", l.exercise.id);
    }
}

/// Notebook 00 is the lab table's: its text counts no labs (the course
/// map's cell does), and its saved outputs hold every lab of the table
/// in the map, every lab under the glossary and every exercise in the
/// progress, each not started (the notebooks run headless save no verdict
/// where it reads them).
#[test]
fn notebook_00_shows_every_lab_of_the_table() {
    let (_, nb) = notebooks().into_iter().find(|(p, _)| p.ends_with("00-start-here.ipynb")).expect("notebook 00");
    let cells = nb["cells"].as_array().unwrap();
    let counts = ["two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"];
    for c in cells.iter().filter(|c| c["cell_type"] == "markdown") {
        let text = cell_text(c, "source").to_lowercase();
        for word in text.split(|ch: char| !ch.is_alphanumeric()).collect::<Vec<_>>().windows(2) {
            let counted = counts.contains(&word[0]) || word[0].parse::<u32>().is_ok();
            assert!(!(counted && word[1] == "labs"), "notebook 00 counts the labs in its text: \"{} {}\"", word[0], word[1]);
        }
    }
    let output = |call: &str| -> String {
        let cell = cells.iter().find(|c| c["cell_type"] == "code" && cell_text(c, "source").contains(call)).unwrap_or_else(|| panic!("no cell calls {call}"));
        cell["outputs"].as_array().into_iter().flatten().map(|o| cell_text(o, "text")).collect()
    };
    let map = output("course::course_map()");
    let glossary = output("course::glossary()");
    let progress = output("course::progress()");
    assert!(map.starts_with(&format!("{} labs, in order:", overlap_lab::labs::ALL.len())), "{map}");
    for lab in overlap_lab::labs::ALL {
        assert!(map.contains(&lab.notebook()), "notebook 00's saved map lacks {}: run it again", lab.notebook());
        assert!(glossary.contains(&format!("lab {} ({}):", lab.number(), lab.name())), "notebook 00's saved glossary lacks lab {}", lab.number());
        for ex in lab.exercises() {
            let line = progress.lines().find(|l| l.split_whitespace().nth(2) == Some(ex.id));
            assert!(line.is_some_and(|l| l.ends_with(": not started")), "notebook 00's saved progress on {}: {line:?}", ex.id);
        }
    }
    let setup = output("course::setup_report()");
    assert!(!setup.lines().any(|l| l.starts_with("[ ok ]") && l.contains("not found")), "{setup}");
}

/// MAINTAINERS' "Adding a lab" names every field of the lab table's entry
/// (what a lab gives the tools), and LABS.md has each lab's section, in
/// course order, with its command, its notebook and its headline table:
/// the docs are held to the table.
#[test]
fn adding_a_lab_and_labs_md_are_held_to_the_table() {
    let maintainers = doc("MAINTAINERS.md");
    let adding = maintainers.split("## Adding a lab").nth(1).and_then(|s| s.split("\n## ").next()).expect("MAINTAINERS.md has \"## Adding a lab\"");
    let table = std::fs::read_to_string(repo_root().join("crate/src/lab_kit/table.rs")).unwrap();
    let entry = table.split("pub struct Entry<").nth(1).and_then(|s| s.split("\n}").next()).expect("lab_kit::Entry");
    let fields: Vec<&str> =
        entry.lines().filter_map(|l| l.trim().strip_prefix("pub ")).filter_map(|l| l.split(':').next()).filter(|f| !f.contains(' ')).collect();
    assert!(fields.len() >= 15, "{fields:?}");
    for f in &fields {
        assert!(adding.contains(&format!("`{f}`")), "MAINTAINERS' \"Adding a lab\" does not name the entry's `{f}`");
    }
    let labs = doc("LABS.md");
    let mut at = 0;
    for lab in overlap_lab::labs::ALL.iter() {
        let heading = format!("\n## Lab {}: ", lab.number());
        let start = labs[at..].find(&heading).map(|i| at + i).unwrap_or_else(|| panic!("LABS.md has no section {heading:?} after the lab before it"));
        let section = labs[start + 1..].split("\n## ").next().unwrap();
        for must in [format!("`overlap-lab {}`", lab.name()), format!("`{}`", lab.notebook()), format!("<!-- headline:{} -->", lab.name())] {
            assert!(section.contains(&must), "LABS.md's lab {} section lacks {must}", lab.number());
        }
        at = start + 1;
    }
}

/// Every key path of `v`, arrays written `[]` ("gpus[].streams[].busy_us").
fn key_paths(v: &serde_json::Value, at: &str, out: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, child) in m {
                let path = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
                key_paths(child, &path, out);
                out.insert(path);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|child| key_paths(child, &format!("{at}[]"), out)),
        _ => {}
    }
}

/// The fields MAINTAINERS.md documents for `diagnose --json`: each list
/// item between the schema's markers opens with one or more paths in
/// backticks, then a colon ("- `a`, `b`: what they are").
fn documented_diagnosis_fields() -> BTreeSet<String> {
    let text = doc("MAINTAINERS.md");
    let (_, rest) = text.split_once("<!-- diagnosis-schema -->").expect("MAINTAINERS.md marks the diagnosis schema");
    let (list, _) = rest.split_once("<!-- /diagnosis-schema -->").expect("the schema's list is closed");
    list.lines()
        .filter_map(|l| l.trim_start().strip_prefix("- ")?.split_once("`:").map(|(paths, _)| paths.to_string()))
        .flat_map(|paths| paths.split('`').skip(1).step_by(2).map(str::to_string).collect::<Vec<_>>())
        .collect()
}

/// `diagnose --json`'s schema as MAINTAINERS.md documents it is the one
/// the code writes: on synthetic traces (pageable copies set beside a
/// recording of their GPU, a stranger's GPU priced by assumption, and a
/// diagnosis whose what-if failed), every key written is documented, and
/// every documented key is written by one of them.
#[test]
fn diagnose_json_writes_its_schema_version_and_exactly_the_documented_fields() {
    use overlap_lab::diagnose::events::{Direction, HostMemory};
    use overlap_lab::diagnose::{read_trace_text, LinkPoint, LinkRates, DIAGNOSIS_SCHEMA};
    use overlap_lab::labs::pytorch_trace::{fixture, prices::Prices};
    let point = |host, direction, gbps| LinkPoint { host, direction, bytes: fixture::BATCH_BYTES, gbps };
    let mut recorded = Prices::default();
    recorded.links = vec![LinkRates {
        gpu_name: fixture::GPU_NAME.into(),
        source: "data/x/bandwidth.json".into(),
        points: vec![point(HostMemory::Pageable, Direction::H2d, 20.0), point(HostMemory::Pinned, Direction::H2d, 53.0)],
    }];
    let diagnosed = |prices: &Prices, trace: serde_json::Value| {
        let trace = read_trace_text("synthetic.json", &trace.to_string()).unwrap();
        prices.diagnose(&trace, "synthetic.json", None)
    };
    let course = diagnosed(&recorded, fixture::pageable_to_then_compute(6).trace);
    let stranger = diagnosed(&Prices::default(), fixture::on_stranger_gpu(6, 2));
    let mut failed = diagnosed(&Prices::default(), fixture::host_prepared_batches(6).trace);
    (failed.what_if, failed.what_if_error) = (None, Some("the reason it failed".into()));

    let mut written = BTreeSet::new();
    for d in [&course, &stranger, &failed] {
        let json = serde_json::to_value(d).unwrap();
        assert_eq!(json["schema"], DIAGNOSIS_SCHEMA);
        key_paths(&json, "", &mut written);
    }
    assert_eq!(DIAGNOSIS_SCHEMA, "overlap-lab.diagnosis/3");
    // By hand: the pageable loop's 6 copies of 64 MiB, H2D pageable, one group.
    let json = serde_json::to_value(&course).unwrap();
    assert_eq!(json["gpus"][0]["copies"][0]["bytes"], 6 * (64u64 << 20));
    assert_eq!(json["gpus"][0]["copies"][0]["recorded_pinned"]["gbps"], 53.0);
    let documented = documented_diagnosis_fields();
    let undocumented: Vec<_> = written.difference(&documented).collect();
    let never_written: Vec<_> = documented.difference(&written).collect();
    assert!(undocumented.is_empty(), "fields --json writes that MAINTAINERS.md does not document: {undocumented:?}");
    assert!(never_written.is_empty(), "fields MAINTAINERS.md documents that --json never writes: {never_written:?}");
    assert!(documented.contains("gpus[].idle_causes[].cause") && documented.contains("what_if.predictions[].as_written"));
    assert!(doc("MAINTAINERS.md").contains(&format!("`{DIAGNOSIS_SCHEMA}`")));
}
