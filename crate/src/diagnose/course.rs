//! The course's own timelines, read as traces: a lab's timeline saved as a
//! Chrome trace (`pipeline::timeline::Timeline::chrome_trace`) has no
//! CUDA calls and no correlation ids; its GPU work is the spans on
//! "stream N" lanes (after "GPU g · " where it spans several GPUs), and
//! its categories are its op kinds ("H2D", "kernel"). Reading keeps every
//! complete event that is not Kineto's ([`CourseSpan`]) with the names of
//! the lanes and processes ([`CourseParts`]); where the file turns out not
//! to be Kineto's, [`CourseParts::read_into`] makes the trace of them, or
//! says in one line why the file is neither.
//!
//! May use: `events` only.

use super::events::{copy_kind_from_name, Direction, GpuOp, GpuOpKind, Trace};
use std::collections::{HashMap, HashSet};

/// A complete event that is not Kineto's, kept until the end decides
/// whether the file is one of the course's.
pub(super) struct CourseSpan {
    pub(super) cat: String,
    pub(super) name: String,
    pub(super) pid: String,
    pub(super) tid: String,
    pub(super) start_us: f64,
    pub(super) end_us: f64,
}

/// What a course timeline is told by, kept as the events stream past: its
/// spans, the names its metadata gives lanes and processes, its title.
#[derive(Default)]
pub(super) struct CourseParts {
    pub(super) spans: Vec<CourseSpan>,
    /// Categories of complete events that are not Kineto's (a few, for errors).
    pub(super) other_categories: Vec<String>,
    pub(super) process_names: HashMap<String, String>,
    pub(super) thread_names: HashMap<(String, String), String>,
    pub(super) title: Option<String>,
}

impl CourseParts {
    /// The course's own trace: spans on "stream N" lanes (after "GPU g · "
    /// where it spans several GPUs) are GPU work; its categories are its op
    /// kinds. Its GPU ops go into `trace`; `events` is how many events the
    /// file held, for the error of a file that is neither kind.
    pub(super) fn read_into(&mut self, trace: &mut Trace, events: u64) -> std::result::Result<(), String> {
        let mut on_streams = 0;
        for s in std::mem::take(&mut self.spans) {
            let lane = self.thread_names.get(&(s.pid.clone(), s.tid.clone())).cloned().unwrap_or_default();
            let Some((gpu, stream)) = course_lane(&lane) else { continue };
            let kind = match copy_kind_from_name(&s.name) {
                Some(k) => k,
                None => match s.cat.as_str() {
                    "kernel" | "all-reduce" => GpuOpKind::Kernel,
                    "H2D" => GpuOpKind::Copy { direction: Direction::H2d, host: None },
                    "D2H" => GpuOpKind::Copy { direction: Direction::D2h, host: None },
                    "D2D" => GpuOpKind::Copy { direction: Direction::D2d, host: None },
                    "peer" => GpuOpKind::Copy { direction: Direction::Peer, host: None },
                    // Host functions, stream-ordered allocations: on a
                    // stream, but not work of the GPU's engines.
                    _ => continue,
                },
            };
            on_streams += 1;
            trace.gpu_ops.push(GpuOp { gpu, stream, kind, name: s.name, start_us: s.start_us, end_us: s.end_us, correlation: None, bytes: None });
        }
        if on_streams == 0 {
            let lanes: HashSet<&String> = self.thread_names.values().collect();
            let is_course = self.title.is_some() && !lanes.is_empty();
            return Err(if is_course {
                let mut l: Vec<&&String> = lanes.iter().collect();
                l.sort();
                format!(
                    "no GPU activity on streams: an overlap-lab timeline whose lanes are {} (a timeline inside one kernel?)",
                    l.iter().take(4).map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                )
            } else if self.other_categories.is_empty() {
                format!("not a torch.profiler or overlap-lab trace: {events} events, none of them GPU work this reads")
            } else {
                format!(
                    "not a torch.profiler or overlap-lab trace (another profiler's?): no kernel, gpu_memcpy or cuda_runtime events; its categories: {}",
                    self.other_categories.join(", ")
                )
            });
        }
        // "GPU 0 (NVIDIA H200)": the GPU's name in parentheses.
        for name in self.process_names.values() {
            if let Some(inner) = name.split_once('(').and_then(|(_, r)| r.rsplit_once(')')).map(|(n, _)| n.trim().to_string()) {
                for gpu in trace.gpus() {
                    trace.gpu_names.push((gpu, inner.clone()));
                }
                break;
            }
        }
        Ok(())
    }
}

/// A course lane's GPU and stream: "stream 2", "stream 1: copy",
/// "GPU 1 · stream 0"; `None` for CPU threads and warps.
fn course_lane(lane: &str) -> Option<(u32, u64)> {
    let (gpu, rest) = match lane.strip_prefix("GPU ") {
        Some(r) => {
            let (g, rest) = r.split_once(" · ")?;
            (g.trim().parse().ok()?, rest)
        }
        None => (0, lane),
    };
    let number = rest.strip_prefix("stream ")?;
    let digits: String = number.chars().take_while(|c| c.is_ascii_digit()).collect();
    Some((gpu, digits.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn course_lanes_name_their_gpu_and_stream() {
        assert_eq!(course_lane("stream 2"), Some((0, 2)));
        assert_eq!(course_lane("stream 1: copy"), Some((0, 1)));
        assert_eq!(course_lane("GPU 1 · stream 10: compute"), Some((1, 10)));
        assert_eq!(course_lane("CPU main"), None);
        assert_eq!(course_lane("warp 3"), None);
    }
}
