//! Running a lab's reference script (`crate/reference/*.py`, carried inside
//! the binary) with the Python that has PyTorch, in the same run as the
//! lab's own measurement, and reading the JSON line it prints last. Its
//! absence is a reason in a line, never a failed lab.

/// Writes `script` (named `name`) to a temporary folder, runs it with
/// `python` and `args` (NVLink multicast kept off in the child, as in the
/// lab's own process), and returns the last line of its output that opens
/// with `{`. `Err` says, in a line, why there is none: no Python, a script
/// that failed (with its last line of errors), no result printed.
pub fn run_script(python: &str, name: &str, script: &str, args: &[String]) -> Result<String, String> {
    let dir = std::env::temp_dir().join(format!("overlap-lab-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(name);
    std::fs::write(&path, script).map_err(|e| format!("{}: {e}", path.display()))?;
    let out = std::process::Command::new(python)
        .arg(&path)
        .args(args)
        .envs(crate::gpu::nccl::multicast_off_env())
        .output()
        .map_err(|e| format!("`{python}` could not be started: {e}"));
    let _ = std::fs::remove_dir_all(&dir);
    let out = out?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message");
        return Err(format!("`{python} {name}` failed: {last}"));
    }
    last_json_line(&String::from_utf8_lossy(&out.stdout))
}

/// The last line of `stdout` that opens with `{`.
pub fn last_json_line(stdout: &str) -> Result<String, String> {
    stdout.lines().rev().find(|l| l.trim_start().starts_with('{')).map(str::to_string).ok_or_else(|| "the script printed no result".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_json_line_is_the_result_and_a_missing_python_is_a_reason() {
        assert_eq!(last_json_line("warming up\n{\"a\": 1}\n{\"b\": 2}\ndone\n").unwrap(), "{\"b\": 2}");
        assert!(last_json_line("nothing").is_err());
        let e = run_script("/no/such/python", "x.py", "print(1)", &[]).unwrap_err();
        assert!(e.contains("could not be started"), "{e}");
    }
}
