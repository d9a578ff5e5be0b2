//! Progress for long sweeps: a bar on a terminal, plain lines in a notebook or
//! a log, nothing when asked to be quiet.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressMode {
    /// A bar on stderr when it is a terminal, else lines.
    Auto,
    /// One line per step on stdout (notebooks show stdout).
    Lines,
    Quiet,
}

/// About 20 lines for a whole sweep: enough to see it move in a notebook or
/// a log without drowning the results.
fn worth_a_line(done: u64, total: u64) -> bool {
    done == total || done % total.div_ceil(20).max(1) == 0
}

pub struct Progress {
    bar: Option<ProgressBar>,
    lines: bool,
    total: u64,
    done: u64,
    label: String,
    started: std::time::Instant,
}

/// "12 s in, about 30 s left": the time since the start, and what is left
/// at the pace so far (steps are taken to cost alike; nothing left to
/// estimate before the first step or after the last).
fn elapsed_and_left(elapsed_s: f64, done: u64, total: u64) -> String {
    if done == 0 || done >= total {
        return format!("{elapsed_s:.0} s in");
    }
    let left = elapsed_s / done as f64 * (total - done) as f64;
    format!("{elapsed_s:.0} s in, about {left:.0} s left")
}

impl Progress {
    pub fn new(mode: ProgressMode, total: u64, label: &str) -> Progress {
        let bar = (mode == ProgressMode::Auto && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::new(total);
            b.set_style(
                ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {elapsed_precise}, ~{eta} left {msg}")
                    .expect("static template")
                    .progress_chars("=> "),
            );
            b.set_prefix(label.to_string());
            b
        });
        let lines = bar.is_none() && mode != ProgressMode::Quiet;
        Progress { bar, lines, total, done: 0, label: label.to_string(), started: std::time::Instant::now() }
    }

    /// Marks one step finished, with what it was.
    pub fn step(&mut self, what: &str) {
        self.done += 1;
        if let Some(b) = &self.bar {
            b.set_message(what.to_string());
            b.inc(1);
        } else if self.lines && worth_a_line(self.done, self.total) {
            let time = elapsed_and_left(self.started.elapsed().as_secs_f64(), self.done, self.total);
            println!("[{} {}/{}, {time}] {what}", self.label, self.done, self.total);
        }
    }

    /// Says something about the current step without finishing it (always
    /// shown: it explains why a step takes longer).
    pub fn step_note(&mut self, what: &str) {
        if let Some(b) = &self.bar {
            b.set_message(what.to_string());
        } else if self.lines {
            println!("[{} {}/{}] {what}", self.label, self.done, self.total);
        }
    }

    pub fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{elapsed_and_left, worth_a_line};

    #[test]
    fn a_line_says_how_long_so_far_and_about_how_long_is_left() {
        assert_eq!(elapsed_and_left(12.4, 3, 10), "12 s in, about 29 s left");
        assert_eq!(elapsed_and_left(0.2, 0, 10), "0 s in", "no pace before the first step");
        assert_eq!(elapsed_and_left(95.0, 10, 10), "95 s in", "nothing left at the end");
    }

    #[test]
    fn line_mode_prints_about_twenty_lines() {
        for total in [1u64, 7, 20, 213, 1000] {
            let lines = (1..=total).filter(|&d| worth_a_line(d, total)).count() as u64;
            assert!(lines <= 21 && lines >= total.min(20), "{total}: {lines}");
            assert!(worth_a_line(total, total), "the last step always prints");
        }
    }
}
