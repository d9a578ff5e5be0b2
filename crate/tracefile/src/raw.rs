//! The raw trace file: a [`Record`] per line, the [`Process`] first.
//!
//! The injection library appends lines as CUPTI hands records over, so a
//! process that crashes leaves every line written before; reading stops at
//! a line cut short and says so.

use crate::records::{Process, Record};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The raw trace file of process `pid` in `dir`.
pub fn raw_path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("overlap-lab-trace.{pid}.jsonl"))
}

/// The file in `dir` where the library says why it could not attach to
/// process `pid` (one line of text).
pub fn refused_path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("overlap-lab-trace.{pid}.refused"))
}

/// The process id a raw trace file's name carries.
pub fn pid_of(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    name.strip_prefix("overlap-lab-trace.")?.strip_suffix(".jsonl")?.parse().ok()
}

/// The process id a `.refused` file's name carries.
pub fn refused_pid_of(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    name.strip_prefix("overlap-lab-trace.")?.strip_suffix(".refused")?.parse().ok()
}

/// Appends one record as a line.
pub fn write_record(out: &mut impl Write, record: &Record) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, record)?;
    out.write_all(b"\n")
}

/// A raw trace file, read.
#[derive(Clone, Debug)]
pub struct RawTrace {
    pub process: Process,
    /// Every record after the first line, in file order.
    pub records: Vec<Record>,
    /// Whether the process flushed CUPTI as it ended ([`Record::End`]).
    pub complete: bool,
    /// The signal it was ending by, where a signal ended it.
    pub signal: Option<i32>,
    /// A last line cut short (the process died while writing it).
    pub cut_short: bool,
}

/// Reads a raw trace file's text. A last line cut short is left out (and
/// said); any other line that is not a record is an error naming it.
pub fn parse(text: &str) -> Result<RawTrace, String> {
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()).peekable();
    let process = match lines.next() {
        Some((_, l)) => match serde_json::from_str::<Record>(l) {
            Ok(Record::Process(p)) => p,
            Ok(_) => return Err("its first line is not the process record".into()),
            Err(e) => return Err(format!("its first line is not a record: {e}")),
        },
        None => return Err("it is empty".into()),
    };
    let ends_with_newline = text.ends_with('\n');
    let mut trace = RawTrace { process, records: Vec::new(), complete: false, signal: None, cut_short: false };
    while let Some((i, line)) = lines.next() {
        match serde_json::from_str::<Record>(line) {
            Ok(Record::End(e)) => {
                trace.complete = true;
                trace.signal = e.signal;
            }
            Ok(r) => trace.records.push(r),
            Err(_) if lines.peek().is_none() && !ends_with_newline => trace.cut_short = true,
            Err(e) => return Err(format!("line {} is not a record: {e}", i + 1)),
        }
    }
    Ok(trace)
}

/// Reads a raw trace file; errors name the file.
pub fn read(path: &Path) -> Result<RawTrace, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{End, Lost};

    fn process() -> Record {
        Record::Process(Process {
            pid: 42,
            parent_pid: 1,
            exe: "/bin/prog".into(),
            argv: vec!["prog".into()],
            cupti_version: 130001,
            refused_kinds: vec![],
            kinds_not_asked: vec![],
        })
    }

    fn text(records: &[Record]) -> String {
        let mut out = Vec::new();
        for r in records {
            write_record(&mut out, r).unwrap();
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn records_read_back_and_the_end_line_marks_it_complete() {
        let lost = Record::Lost(Lost { dropped: 3, without_timestamps: 1 });
        let t = parse(&text(&[process(), lost.clone(), Record::End(End { at_ns: 9, signal: None })])).unwrap();
        assert_eq!(t.process.pid, 42);
        assert_eq!(t.records, vec![lost]);
        assert!(t.complete && !t.cut_short);
    }

    #[test]
    fn a_last_line_cut_short_is_left_out_and_said() {
        let mut s = text(&[process(), Record::Lost(Lost { dropped: 0, without_timestamps: 0 })]);
        s.push_str("{\"record\":\"kernel\",\"na");
        let t = parse(&s).unwrap();
        assert!(t.cut_short && !t.complete);
        assert_eq!(t.records.len(), 1);
    }

    #[test]
    fn a_bad_line_in_the_middle_or_no_process_line_is_an_error() {
        let mut s = text(&[process()]);
        s.push_str("not json\n");
        s.push_str(&text(&[Record::End(End { at_ns: 1, signal: None })]));
        assert!(parse(&s).unwrap_err().contains("line 2"));
        assert!(parse(&text(&[Record::End(End { at_ns: 1, signal: None })])).unwrap_err().contains("first line"));
        assert!(parse("").unwrap_err().contains("empty"));
    }

    #[test]
    fn file_names_carry_the_pid() {
        let p = raw_path(Path::new("/tmp/x"), 1234);
        assert_eq!(pid_of(&p), Some(1234));
        assert_eq!(pid_of(&refused_path(Path::new("/tmp/x"), 1234)), None);
        assert_eq!(refused_pid_of(&refused_path(Path::new("/tmp/x"), 1234)), Some(1234));
    }
}
