//! Running lab 10: the course's PyTorch programs traced on the GPU by
//! `crate/reference/lab10_trace.py` (carried inside the binary), into a
//! folder of the system's temporary files that becomes the run's
//! [`Recording`].
//!
//! Two machines cannot run them, and each says so in a line: one whose
//! Python has no PyTorch (within `overlap-lab all` the lab is then
//! skipped), and a process that a sanitizer or profiler watches (it holds
//! CUPTI, which the programs' traces need; and the programs' own
//! correctness is PyTorch's, not this course's). Under such a tool the lab
//! still diagnoses and prices the recorded traces of this GPU, so all of
//! the lab's own code runs under it.
//!
//! May use: what the lab may (see its module).

use super::recording::Recording;
use super::{recorded_for, scratch_folder, TraceSettings, LAB};
use crate::error::{LabError, Result};
use crate::gpu::Gpu;
use crate::lab_kit::RunContext;
use crate::present::progress::ProgressMode;
use std::path::Path;

/// The scripts the lab runs, carried inside the binary (the second is the
/// first's import).
pub const SCRIPTS: [(&str, &str); 2] =
    [("lab10_trace.py", include_str!("../../../reference/lab10_trace.py")), ("lab10_programs.py", include_str!("../../../reference/lab10_programs.py"))];

/// The lab's run on `gpu` with `s`: the programs traced, or, where a tool
/// holds CUPTI, the recorded traces diagnosed instead.
pub fn measure(gpu: &Gpu, s: &TraceSettings, cx: &RunContext) -> Result<Recording> {
    if let Some(held) = crate::gpu::cupti_held_by_another_tool() {
        let why = format!("CUPTI is held by another tool here ({held}), and the traces need it");
        let rec = match recorded_for(cx.data, gpu.name()) {
            Ok(rec) => rec,
            Err(LabError::MissingData { path }) => return Err(LabError::Skipped(format!("{why}, and there is no recording to show instead ({path})"))),
            Err(e) => return Err(e),
        };
        println!(
            "{LAB}: the PyTorch programs are skipped: {why}; their correctness is PyTorch's. Diagnosing and pricing the recorded traces of {} instead.",
            rec.gpu()
        );
        return Ok(rec.shown_instead(why));
    }
    if let Some(why) = no_pytorch(&s.python) {
        return Err(LabError::Skipped(why));
    }
    let command = [vec!["overlap-lab".to_string(), LAB.into()], script_options(s)].concat();
    trace_programs(s, gpu.ordinal(), &scratch_folder("run"), cx.data, &command.join(" "), cx.progress == ProgressMode::Quiet)
}

/// Runs the course's programs on GPU `device` (PyTorch's view of it is
/// that GPU alone) with `s`, their traces and `programs.json` written to
/// the temporary folder `out` (emptied first, removed with the recording),
/// priced by the data folder `data`; the script's progress passed on
/// unless `quiet`.
pub(super) fn trace_programs(s: &TraceSettings, device: usize, out: &Path, data: &Path, command: &str, quiet: bool) -> Result<Recording> {
    s.validate()?;
    // A folder of its own (`scratch_folder`): one that is there already is
    // someone else's, never emptied here.
    if out.exists() {
        return Err(LabError::config(format!("{}: the run's folder is there already", crate::measure::record::display_path(out))));
    }
    let args = [vec!["--out".to_string(), out.display().to_string(), "--command".into(), command.into()], script_options(s)].concat();
    let env = [("CUDA_VISIBLE_DEVICES", device.to_string())];
    // A PyTorch that is installed but does not import is no PyTorch: the
    // script says so in its one line (lab10_trace.py's `fail`).
    let ran = crate::lab_kit::reference::run_files(&s.python, &SCRIPTS, &args, &env, !quiet)
        .map_err(|e| if e.contains("PyTorch is needed and could not be imported") { LabError::Skipped(e) } else { LabError::Script(e) });
    // The folder goes with the recording, or now if the run failed.
    match ran.and_then(|_| Recording::ran(out, data, !s.programs.is_empty())) {
        Ok(r) => Ok(r),
        Err(e) => {
            let _ = std::fs::remove_dir_all(out);
            Err(e)
        }
    }
}

/// The options of `s` as both the script and `overlap-lab pytorch-trace`
/// spell them: `--repeats`, and `--programs` and `--untraced-fixes` where set.
fn script_options(s: &TraceSettings) -> Vec<String> {
    let mut options = vec!["--repeats".to_string(), s.repeats.to_string()];
    if !s.programs.is_empty() {
        options.extend(["--programs".to_string(), s.programs.join(",")]);
    }
    if s.untraced_fixes {
        options.push("--untraced-fixes".into());
    }
    options
}

/// Why `python` cannot run the programs (no such Python, no PyTorch in
/// it), or `None` when it can. PyTorch is looked for, not imported: an
/// import takes seconds, and the script imports it anyway.
pub fn no_pytorch(python: &str) -> Option<String> {
    let find = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('torch') else 1)";
    match std::process::Command::new(python).args(["-c", find]).output() {
        Err(e) => Some(format!("`{python}` could not be started: {e}")),
        Ok(out) if !out.status.success() => Some(format!("`{python}` has no PyTorch (no module `torch` on its path)")),
        Ok(_) => None,
    }
}
