//! Tracing any CUDA program, in any language: `overlap-lab trace -- COMMAND`
//! runs the command with the course's CUPTI injection library
//! (`overlap-lab-inject`, found beside this binary) loaded into each of its
//! CUDA processes, then turns each process's records into a Chrome trace in
//! Kineto's schema (the `overlap-lab-tracefile` crate), which [`crate::diagnose`]
//! reads as it reads `torch.profiler`'s. No CUDA here: the library does the
//! recording inside the traced program.
//!
//! May use: [`crate::error`], [`crate::measure`] (paths as outputs show
//! them), and the tracefile crate.

use crate::error::{LabError, Result};
use overlap_lab_tracefile::kineto::Summary;
use overlap_lab_tracefile::raw::{pid_of, refused_pid_of};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The injection library's file name.
pub const LIBRARY: &str = "liboverlap_lab_inject.so";

/// What to trace, and where the traces go.
#[derive(Clone, Debug)]
pub struct Request {
    /// The program and its arguments.
    pub command: Vec<OsString>,
    /// The trace of the command's own process (`.json.gz` or `.json`);
    /// other CUDA processes it starts go beside it, named by their pids.
    pub output: PathBuf,
    /// The injection library (default: `$OVERLAP_LAB_INJECT`, else
    /// [`LIBRARY`] beside this program, else in this repository's
    /// `target/release`: [`find_library`]).
    pub library: Option<PathBuf>,
    /// Keep each process's raw records (`.jsonl`) beside the traces.
    pub keep_raw: bool,
    /// Record which GPU each copy between two went from and to (CUPTI's
    /// peer-copy records, with which the device-to-device copies measured
    /// on an H200 read a third longer: off unless asked; without them each
    /// such copy is still recorded, on the GPU that ran it).
    pub peer_copies: bool,
    /// Record each synchronization and event record (which stream each
    /// event wait joins), as torch.profiler's `enable_cuda_sync_events`:
    /// off unless asked, as tracing a loop of tiny ops cost more with them;
    /// without them the diagnosis infers the joins from the calls' order.
    pub sync_events: bool,
}

impl Request {
    /// The record kinds to ask the library for on top of its own
    /// (`OVERLAP_LAB_TRACE_ADD`): those the user's environment already
    /// names (`from_env`), and those this request's flags name.
    fn kinds_added(&self, from_env: Option<&str>) -> Option<String> {
        use overlap_lab_tracefile::records::{EVENTS, PEER_COPIES, SYNCS};
        let mut kinds: Vec<String> = from_env.unwrap_or_default().split(',').map(|k| k.trim().to_string()).filter(|k| !k.is_empty()).collect();
        let flagged = [(self.sync_events, SYNCS), (self.sync_events, EVENTS), (self.peer_copies, PEER_COPIES)];
        for (_, kind) in flagged.iter().filter(|(on, _)| *on) {
            if !kinds.iter().any(|k| k == kind) {
                kinds.push(kind.to_string());
            }
        }
        (!kinds.is_empty()).then(|| kinds.join(","))
    }
}

/// One CUDA process's trace, written.
#[derive(Clone, Debug)]
pub struct ProcessTrace {
    pub path: PathBuf,
    pub summary: Summary,
}

/// What a traced run left.
#[derive(Debug)]
pub struct Traced {
    /// The command's exit code (128 + the signal where a signal ended it).
    pub exit_code: i32,
    /// The command's wall time, from start to exit, on this host's clock.
    pub wall: Duration,
    /// Each CUDA process's trace, the command's own first, then by pid.
    pub traces: Vec<ProcessTrace>,
    /// Processes the library could not attach to, and why.
    pub refused: Vec<(u32, String)>,
}

/// The injection library: `explicit`, else `$OVERLAP_LAB_INJECT`, else
/// [`LIBRARY`] beside the running program (or in its parent folder, where
/// it is a test binary in `target/*/deps`), else in this repository's
/// release build (`target/release`, where set-up builds it: a notebook's
/// process runs from a folder of evcxr's).
pub fn find_library(explicit: Option<&Path>) -> Result<PathBuf> {
    let from_env = std::env::var_os("OVERLAP_LAB_INJECT").map(PathBuf::from);
    if let Some(p) = explicit.map(Path::to_path_buf).or(from_env) {
        return std::fs::canonicalize(&p).map_err(|e| LabError::config(format!("--inject: {}: {e}", p.display())));
    }
    let exe = std::env::current_exe().map_err(|e| LabError::io("finding this program's folder", e))?;
    let release = crate::measure::record::repo_root().join("target/release");
    for d in exe.ancestors().skip(1).take(2).chain([release.as_path()]) {
        let candidate = d.join(LIBRARY);
        if candidate.is_file() {
            return std::fs::canonicalize(&candidate).map_err(|e| LabError::io(candidate.display().to_string(), e));
        }
    }
    Err(LabError::config(format!(
        "the injection library {LIBRARY} is not beside {} (build it: `cargo build --release --workspace`, or name it with --inject)",
        exe.display()
    )))
}

/// The trace file of a process that is not the command's own:
/// `trace.json.gz` → `trace.<pid>.json.gz`.
pub fn sibling_path(output: &Path, pid: u32) -> PathBuf {
    let name = output.file_name().and_then(|n| n.to_str()).unwrap_or("trace.json.gz");
    let (stem, ext) = match name.find('.') {
        Some(i) => (&name[..i], &name[i..]),
        None => (name, ""),
    };
    output.with_file_name(format!("{stem}.{pid}{ext}"))
}

/// A folder of its own for the raw files, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the command with the library injected (its output and input are
/// the command's own), then converts each CUDA process's records.
pub fn run(req: &Request) -> Result<Traced> {
    let Some(program) = req.command.first() else {
        return Err(LabError::config("trace: no command given (overlap-lab trace -- COMMAND ARGS...)"));
    };
    let library = find_library(req.library.as_deref())?;
    // Another tool's injection (compute-sanitizer, Nsight) holds CUPTI in
    // the command's processes: the command runs as it would, untraced.
    let conflict = std::env::var_os("CUDA_INJECTION64_PATH").filter(|o| Path::new(o) != library).map(|other| {
        format!(
            "CUDA_INJECTION64_PATH already names another tool's library ({}), which holds CUPTI there (compute-sanitizer, Nsight): it ran untraced",
            Path::new(&other).display()
        )
    });
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let scratch = Scratch(std::env::temp_dir().join(format!("overlap-lab-trace-{}-{stamp}", std::process::id())));
    std::fs::create_dir_all(&scratch.0).map_err(|e| LabError::io(scratch.0.display().to_string(), e))?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(&req.command[1..]);
    if conflict.is_none() {
        cmd.env("CUDA_INJECTION64_PATH", &library)
            .env("NVTX_INJECTION64_PATH", &library)
            .env("OVERLAP_LAB_TRACE_DIR", &scratch.0)
            .env("OVERLAP_LAB_TRACE_RAW", "1")
            // The course's own labs, traced, time with events: CUPTI is ours.
            .env("OVERLAP_LAB_TIMELINE", "events");
    }
    let from_env = std::env::var("OVERLAP_LAB_TRACE_ADD").ok();
    if let (None, Some(kinds)) = (&conflict, req.kinds_added(from_env.as_deref())) {
        cmd.env("OVERLAP_LAB_TRACE_ADD", kinds);
    }
    let shown = Path::new(program).display().to_string();
    let t0 = Instant::now();
    let mut child = cmd.spawn().map_err(|e| LabError::Script(format!("trace: cannot run {shown}: {e}")))?;
    let own_pid = child.id();
    let status = child.wait().map_err(|e| LabError::io(format!("waiting for {shown}"), e))?;
    let wall = t0.elapsed();
    let exit_code = status.code().unwrap_or_else(|| {
        use std::os::unix::process::ExitStatusExt;
        128 + status.signal().unwrap_or(0)
    });
    // Each process's raw file, and the reasons of those it could not trace.
    let mut raws: Vec<(u32, PathBuf)> = Vec::new();
    let mut refused = Vec::new();
    for p in std::fs::read_dir(&scratch.0).map_err(|e| LabError::io(scratch.0.display().to_string(), e))?.flatten().map(|e| e.path()) {
        if let Some(pid) = pid_of(&p) {
            raws.push((pid, p));
        } else if let Some(pid) = refused_pid_of(&p) {
            refused.push((pid, std::fs::read_to_string(&p).unwrap_or_default().trim().to_string()));
        }
    }
    // The command's own process first, then the others by pid.
    raws.sort_by_key(|(pid, _)| (*pid != own_pid, *pid));
    refused.sort();
    if let Some(why) = conflict {
        refused.push((own_pid, why));
    }
    let mut traces = Vec::new();
    for (pid, raw) in &raws {
        let out = if *pid == own_pid || raws.len() == 1 { req.output.clone() } else { sibling_path(&req.output, *pid) };
        let summary = overlap_lab_tracefile::convert_file(raw, &out).map_err(|e| LabError::BadData { path: raw.display().to_string(), reason: e })?;
        if req.keep_raw {
            let kept = out.with_file_name(raw.file_name().unwrap_or_default());
            std::fs::copy(raw, &kept).map_err(|e| LabError::io(kept.display().to_string(), e))?;
        }
        traces.push(ProcessTrace { path: out, summary });
    }
    Ok(Traced { exit_code, wall, traces, refused })
}

impl Traced {
    /// Why there is nothing to diagnose, where there is nothing: the
    /// library attached nowhere, or saw no GPU work.
    pub fn nothing_traced(&self, command: &str) -> Option<String> {
        if let Some((pid, why)) = self.refused.first().filter(|_| self.traces.is_empty()) {
            return Some(format!("could not trace {command} (process {pid}): {why}"));
        }
        if self.traces.is_empty() {
            return Some(format!(
                "{command} did no CUDA work the library saw: no process of it initialized CUDA (it is not a CUDA program, or it failed before its first CUDA call){}",
                if self.exit_code != 0 { format!("; it exited with {}", self.exit_code) } else { String::new() }
            ));
        }
        if self.traces.iter().all(|t| t.summary.gpu_ops() == 0) {
            return Some(format!("{command} initialized CUDA but ran no kernel, copy or memset"));
        }
        None
    }
}

/// One line for a written trace: what it holds, and what it lacks.
pub fn describe(t: &ProcessTrace) -> String {
    let s = &t.summary;
    let name = Path::new(&s.exe).file_name().and_then(|n| n.to_str()).unwrap_or("?");
    let mut line = format!(
        "{}: process {} ({name}): {} kernels, {} copies, {} memsets, {} CUDA calls{}",
        crate::measure::record::display_path(&t.path),
        s.pid,
        s.kernels,
        s.copies,
        s.memsets,
        s.calls,
        if s.nvtx_ranges > 0 { format!(", {} NVTX ranges", s.nvtx_ranges) } else { String::new() }
    );
    if let Some(sig) = s.signal {
        line.push_str(&format!("; signal {sig} ended the process (its records up to then are in)"));
    } else if !s.complete {
        line.push_str(
            "; the process did not flush as it ended (SIGKILL, or _exit): its last flush period (200 ms unless OVERLAP_LAB_TRACE_FLUSH_MS says) may be missing",
        );
    }
    if s.ends_clamped > 0 {
        line.push_str(&format!("; {} GPU ops ended where the next op on their stream began (CUPTI put their ends past that op's end)", s.ends_clamped));
    }
    if s.dropped > 0 {
        line.push_str(&format!("; CUPTI dropped {} records", s.dropped));
    }
    if !s.calls_left_out.is_empty() {
        let left: Vec<String> = s.calls_left_out.iter().map(|(n, k)| format!("{k}x {n}")).collect();
        line.push_str(&format!("; left out, their GPU work never ran (captured into a graph, failed, or still queued at exit): {}", left.join(", ")));
    }
    if s.peer_copies_not_recorded > 0 {
        line.push_str(&format!(
            "; {} copies between GPUs have no record (failed or never ran; or a CUPTI that records them only as peer copies, which --peer-copies takes)",
            s.peer_copies_not_recorded
        ));
    }
    if !s.refused_kinds.is_empty() {
        line.push_str(&format!("; CUPTI refused: {}", s.refused_kinds.join(", ")));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_flag_asks_for_its_kinds_on_top_of_the_environments() {
        let req = |peer_copies, sync_events| Request { command: vec![], output: PathBuf::new(), library: None, keep_raw: false, peer_copies, sync_events };
        assert_eq!(req(false, false).kinds_added(None), None);
        assert_eq!(req(false, false).kinds_added(Some(" peer ")).as_deref(), Some("peer"));
        assert_eq!(req(false, true).kinds_added(None).as_deref(), Some("sync,event"));
        assert_eq!(req(true, false).kinds_added(None).as_deref(), Some("peer"));
        assert_eq!(req(true, true).kinds_added(Some("sync")).as_deref(), Some("sync,event,peer"));
    }

    #[test]
    fn other_processes_traces_are_named_by_pid_beside_the_output() {
        assert_eq!(sibling_path(Path::new("out/trace.json.gz"), 42), PathBuf::from("out/trace.42.json.gz"));
        assert_eq!(sibling_path(Path::new("t"), 7), PathBuf::from("t.7"));
    }

    #[test]
    fn a_library_named_that_is_not_there_is_a_one_line_error_naming_the_option() {
        let e = find_library(Some(Path::new("/nonexistent/lib.so"))).unwrap_err().to_string();
        assert!(e.contains("--inject") && e.contains("/nonexistent/lib.so"), "{e}");
    }
}
