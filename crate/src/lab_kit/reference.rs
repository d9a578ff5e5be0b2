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
    last_json_line(&run_files(python, &[(name, script)], args, &[], false)?)
}

/// Writes `files` ((name, text) each; the first is the script, the others
/// the modules it imports from beside it) to a temporary folder and runs
/// the script with `python`, `args` and `env` (NVLink multicast kept off,
/// as in the lab's own process); returns its standard output. With
/// `echo`, each line it writes to standard error is passed on to ours as
/// it comes (its progress). `Err` in a line: no Python, or a script that
/// failed, with its last line of errors.
pub fn run_files(python: &str, files: &[(&str, &str)], args: &[String], env: &[(&str, String)], echo: bool) -> Result<String, String> {
    use std::io::BufRead;
    let name = files.first().map(|f| f.0).ok_or("no script to run")?;
    let dir = std::env::temp_dir().join(format!("overlap-lab-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (file, text) in files {
        let path = dir.join(file);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let child = std::process::Command::new(python)
        .arg(dir.join(name))
        .args(args)
        .envs(crate::gpu::nccl::multicast_off_env())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("`{python}` could not be started: {e}"));
    let out = child.and_then(|mut child| {
        // Its errors read as they come (passed on with `echo`), its output
        // beside them, so neither pipe fills while the other is read.
        let stderr = child.stderr.take().expect("stderr is piped");
        let reader = std::thread::spawn(move || {
            let mut last = String::new();
            for line in std::io::BufReader::new(stderr).lines().map_while(std::result::Result::ok) {
                if echo {
                    eprintln!("{line}");
                }
                if !line.trim().is_empty() {
                    last = line;
                }
            }
            last
        });
        let mut stdout = String::new();
        std::io::Read::read_to_string(child.stdout.as_mut().expect("stdout is piped"), &mut stdout).map_err(|e| format!("reading {name}'s output: {e}"))?;
        let status = child.wait().map_err(|e| format!("waiting for {name}: {e}"))?;
        let last = reader.join().unwrap_or_default();
        if status.success() {
            Ok(stdout)
        } else {
            Err(format!("`{python} {name}` failed: {}", if last.is_empty() { "no message" } else { &last }))
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
    out
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
