//! What moving copies off the kernels' stream does: the fix "a copy stream"
//! for uploads and for downloads, worked out on a trace once, for the
//! replay ([`super::replay`]) to schedule.
//!
//! A copy that shares a stream with kernels waits for the kernel before it
//! and holds back the one after. Moved to a stream of its own (a side
//! `torch.cuda.Stream`, ordered by events each way), it keeps only the
//! orders its data needs, double-buffered (two buffers, used in turn):
//!
//! - an upload must follow the op whose end frees its buffer: the last op
//!   before the previous upload (the readers of the batch two uploads back
//!   are done), and the first op after it on its old stream reads it;
//! - a download must follow the op that produced what it reads (the last op
//!   before it on its old stream), and the first op after the next
//!   download writes its buffer again, so it must follow this download.
//!
//! Both are one rule ([`MovedCopies`]): each moved copy has an op of its
//! old stream it must follow (`after`) and one that must follow it
//! (`before`).
//!
//! May use: `events`.

use super::events::{Direction, GpuOpKind, Trace};
use std::collections::HashMap;

/// The copies one direction's copy stream moves, and the orders each keeps
/// with its old stream (indices into the trace's `gpu_ops`).
pub struct MovedCopies {
    /// Which of the trace's GPU ops move.
    pub moved: Vec<bool>,
    /// For a moved copy: the op of its old stream it must still follow.
    pub after: Vec<Option<usize>>,
    /// For a moved copy: the op of its old stream that must follow it.
    pub before: Vec<Option<usize>>,
}

impl MovedCopies {
    /// Nothing moved, for a trace of `n` GPU ops.
    pub fn none(n: usize) -> MovedCopies {
        MovedCopies { moved: vec![false; n], after: vec![None; n], before: vec![None; n] }
    }

    /// The copies that go `direction` (H2D or D2H) on a stream that runs
    /// kernels, with the orders each keeps once moved (see the module's doc).
    pub fn of(trace: &Trace, direction: Direction) -> MovedCopies {
        let mut m = MovedCopies::none(trace.gpu_ops.len());
        let mut on_stream: HashMap<(u32, u64), Vec<usize>> = HashMap::new();
        for (i, o) in trace.gpu_ops.iter().enumerate() {
            on_stream.entry((o.gpu, o.stream)).or_default().push(i);
        }
        let is_moved_kind = |i: usize| matches!(trace.gpu_ops[i].kind, GpuOpKind::Copy { direction: d, .. } if d == direction);
        for ops in on_stream.values() {
            if !ops.iter().any(|&i| trace.gpu_ops[i].kind == GpuOpKind::Kernel) {
                continue;
            }
            // Positions in `ops` of each copy moved, in stream order.
            let copies: Vec<usize> = (0..ops.len()).filter(|&p| is_moved_kind(ops[p])).collect();
            // The last op of the stream that stays, before position `p`; the first from `p` on.
            let stays_before = |p: usize| ops[..p].iter().rev().copied().find(|&i| !is_moved_kind(i));
            let stays_from = |p: usize| ops[p..].iter().copied().find(|&i| !is_moved_kind(i));
            for (k, &p) in copies.iter().enumerate() {
                let op = ops[p];
                m.moved[op] = true;
                if direction == Direction::D2h {
                    m.after[op] = stays_before(p);
                    m.before[op] = copies.get(k + 1).and_then(|&next| stays_from(next + 1));
                } else {
                    m.after[op] = k.checked_sub(1).and_then(|prev| stays_before(copies[prev]));
                    m.before[op] = stays_from(p + 1);
                }
            }
        }
        m
    }

    /// How many copies move.
    pub fn count(&self) -> usize {
        self.moved.iter().filter(|&&m| m).count()
    }

    /// Both directions' moves as one (a copy goes one way, so none is in both).
    pub fn merged(mut self, other: MovedCopies) -> MovedCopies {
        for i in 0..self.moved.len() {
            if other.moved[i] {
                self.moved[i] = true;
                self.after[i] = other.after[i];
                self.before[i] = other.before[i];
            }
        }
        self
    }
}

/// The stream a copy moved by a copy stream goes to: one per stream it
/// left and direction, numbered where no traced stream is (from the top
/// of the numbers down: uploads' first, downloads' below them).
pub fn side_stream_of(stream: u64, direction: Direction) -> u64 {
    match direction {
        Direction::D2h => DOWNLOAD_STREAMS - stream,
        _ => u64::MAX - stream,
    }
}

/// Where the downloads' side streams are numbered from (down).
const DOWNLOAD_STREAMS: u64 = u64::MAX - (1 << 48);

/// A replayed stream as a timeline names it: "stream 7" as traced, "copy
/// stream for stream 7" or "download stream for stream 7" where a copy
/// stream made it.
pub fn stream_label(stream: u64) -> String {
    if stream > DOWNLOAD_STREAMS {
        format!("copy stream for stream {}", u64::MAX - stream)
    } else if stream > u64::MAX / 2 {
        format!("download stream for stream {}", DOWNLOAD_STREAMS - stream)
    } else {
        format!("stream {stream}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::events::{GpuOp, HostMemory};

    fn op(stream: u64, kind: GpuOpKind, start: f64) -> GpuOp {
        GpuOp { gpu: 0, stream, kind, name: kind.label(), start_us: start, end_us: start + 1.0, correlation: None, bytes: Some(4) }
    }

    /// On one stream: U0 K0 D0 U1 K1 D1 U2 K2 D2 (upload, kernel, download
    /// per step).
    fn steps() -> Trace {
        let up = GpuOpKind::Copy { direction: Direction::H2d, host: Some(HostMemory::Pinned) };
        let down = GpuOpKind::Copy { direction: Direction::D2h, host: Some(HostMemory::Pinned) };
        let mut t = Trace::default();
        for s in 0..3 {
            for (j, k) in [up, GpuOpKind::Kernel, down].into_iter().enumerate() {
                t.gpu_ops.push(op(7, k, (10 * s + 2 * j) as f64));
            }
        }
        t
    }

    #[test]
    fn an_upload_follows_the_readers_two_back_and_a_download_its_producer() {
        let t = steps();
        let up = MovedCopies::of(&t, Direction::H2d);
        // Uploads 0, 3, 6: each read by the kernel after it; each after the
        // first follows the op before the previous upload: none before U0
        // for U1, D0 (index 2) before U1 for U2.
        assert_eq!((up.count(), up.before[0], up.before[3], up.before[6]), (3, Some(1), Some(4), Some(7)));
        assert_eq!((up.after[0], up.after[3], up.after[6]), (None, None, Some(2)));
        let down = MovedCopies::of(&t, Direction::D2h);
        // Downloads 2, 5, 8: each after its kernel; the op after the next
        // download (U2, index 6) must follow D0, and none after the last.
        assert_eq!((down.count(), down.after[2], down.after[5], down.after[8]), (3, Some(1), Some(4), Some(7)));
        assert_eq!((down.before[2], down.before[5], down.before[8]), (Some(6), None, None));
        let both = up.merged(down);
        assert_eq!(both.count(), 6);
        assert_eq!((both.after[6], both.after[8]), (Some(2), Some(7)));
    }

    #[test]
    fn side_streams_are_named_by_the_stream_they_left() {
        assert_eq!(stream_label(7), "stream 7");
        assert_eq!(stream_label(side_stream_of(7, Direction::H2d)), "copy stream for stream 7");
        assert_eq!(stream_label(side_stream_of(7, Direction::D2h)), "download stream for stream 7");
        assert_ne!(side_stream_of(7, Direction::H2d), side_stream_of(7, Direction::D2h));
    }
}
