//! The dry run: the vocabulary's executor with no GPU. It takes the same
//! calls as the GPU's executors (`gpu::GpuIssuer` and `gpu::LabRunner`,
//! over `gpu::Runner`), the vocabulary's ([`Issue`]) and a lab's own
//! operations ([`LabIssue`]), runs nothing,
//! records the schedule the loop issues, and tracks where every element of
//! the vocabulary's copies and kernels came from (as runs of elements,
//! [`Cells`]): so a checker can say which element is wrong and why, and the
//! queue model can time the schedule.

use super::cells::{summed, Cells, Provenance};
use super::issue::{check_alloc, check_ranks, d2d_link, same_gpu, unique_name, DevRef, EventRef, Holding, HostRef, Issue, Lanes, SignalRef, StreamRef};
use super::lab_op::{LabIssue, LabOp};
use super::op::{Access, Memory, OpId, OpKind, StreamDecl, StreamKind};
use super::schedule::{Schedule, WaitFor};
use crate::error::{LabError, Result};
use std::ops::Range;

/// A buffer of a dry run, and the GPU it lives on (device buffers).
struct TrackedBuffer {
    hold: Holding,
    cells: Cells,
    gpu: usize,
}

impl TrackedBuffer {
    fn new(hold: Holding, cells: Cells) -> TrackedBuffer {
        TrackedBuffer { hold, cells, gpu: 0 }
    }
    /// The whole buffer as one access (what an allocation or release touches).
    fn whole(&self) -> Access {
        Access::write(&self.hold.name, 0, self.cells.len() as u64 * 4)
    }
}

/// The vocabulary's executor with no GPU: records a schedule and tracks
/// every element's provenance (see the module docs).
pub struct DryRun {
    pub schedule: Schedule,
    /// Elements per producer batch (labs with a producer).
    pub batch_elements: usize,
    lanes: Lanes,
    events: usize,
    /// Each signal's host function op.
    signals: Vec<OpId>,
    hosts: Vec<TrackedBuffer>,
    devices: Vec<TrackedBuffer>,
}

impl DryRun {
    pub fn new() -> DryRun {
        DryRun { schedule: Schedule::new(), batch_elements: 0, lanes: Lanes::default(), events: 0, signals: vec![], hosts: vec![], devices: vec![] }
    }
    /// A non-blocking stream at the default priority on GPU 0.
    pub fn stream(&mut self) -> StreamRef {
        self.stream_of(StreamKind::NonBlocking, 0)
    }
    /// A stream of `kind` at `priority` (lower runs first) on GPU 0.
    pub fn stream_of(&mut self, kind: StreamKind, priority: i32) -> StreamRef {
        let name = format!("s{}", self.lanes.len());
        self.stream_named(StreamDecl::new(kind, priority, 0), &name)
    }
    /// A stream as `decl` says (kind, priority, GPU), named as timelines show it.
    pub fn stream_named(&mut self, decl: StreamDecl, name: &str) -> StreamRef {
        self.lanes.add(&mut self.schedule, decl, name)
    }
    /// Every stream's name by its index in the schedule, the per-thread
    /// streams of other CPU threads included.
    pub fn stream_names(&self) -> Vec<String> {
        self.lanes.names()
    }
    /// A host buffer of `n` elements holding inputs 0..n (`input`) or nothing.
    pub fn host(&mut self, name: &str, n: usize, input: bool) -> HostRef {
        let cells = Cells::run(n, if input { Provenance::Input(0) } else { Provenance::Unset });
        self.hosts.push(TrackedBuffer::new(Holding::lab(name), cells));
        HostRef(self.hosts.len() - 1)
    }
    /// A device buffer of `n` elements on GPU 0.
    pub fn device(&mut self, name: &str, n: usize) -> DevRef {
        self.device_on(name, n, 0)
    }
    /// A device buffer of `n` elements in GPU `gpu`'s memory.
    pub fn device_on(&mut self, name: &str, n: usize, gpu: usize) -> DevRef {
        self.devices.push(TrackedBuffer { gpu, ..TrackedBuffer::new(Holding::lab(name), Cells::run(n, Provenance::Unset)) });
        DevRef(self.devices.len() - 1)
    }
    pub fn host_cells(&self, h: HostRef) -> &Cells {
        &self.hosts[h.0].cells
    }
    pub fn device_cells(&self, d: DevRef) -> &Cells {
        &self.devices[d.0].cells
    }
    /// What the loop allocated and never released.
    pub fn unreleased(&self) -> Vec<String> {
        self.devices.iter().chain(&self.hosts).filter(|b| b.hold.leaked()).map(|b| b.hold.name.clone()).collect()
    }

    /// A host function on `s` reading and writing `accesses`
    /// (cuLaunchHostFunc): `s` waits for it. What [`Issue::signal`] and a
    /// lab's own host functions record.
    fn host_fn_op(&mut self, s: StreamRef, label: &str, accesses: Vec<Access>) -> Result<OpId> {
        self.lanes.on_loop_thread("a host function")?;
        let lane = self.lane(s)?;
        Ok(self.schedule.gpu_op(self.lanes.thread(), lane, OpKind::Host, label, accesses))
    }

    /// The schedule's stream for `s` called from the current thread (a
    /// per-thread stream is that thread's own: declared when first used).
    fn lane(&mut self, s: StreamRef) -> Result<usize> {
        Ok(self.lanes.resolve(&mut self.schedule, s)?.0)
    }
    fn range(b: &TrackedBuffer, at: usize, n: usize) -> Result<std::ops::Range<usize>> {
        b.hold.live()?;
        match at.checked_add(n) {
            Some(end) if n > 0 && end <= b.cells.len() => Ok(at..end),
            _ => Err(LabError::config(format!("{n} elements at {at} do not fit {} ({} elements)", b.hold.name, b.cells.len()))),
        }
    }
    /// Refuses `what` on a stream of one GPU touching a buffer in another's
    /// memory ([`same_gpu`]).
    fn on_gpu(&self, lane: usize, d: DevRef, what: &str) -> Result<()> {
        let b = &self.devices[d.0];
        same_gpu(what, (self.lanes.name(lane), self.lanes.gpu(lane)), (&b.hold.name, b.gpu))
    }
    fn access(b: &TrackedBuffer, r: &std::ops::Range<usize>, write: bool) -> Access {
        Access { buffer: b.hold.name.clone(), start: r.start as u64 * 4, end: r.end as u64 * 4, write }
    }
    /// Releases `b` by `how`'s call: the op's label and the access it makes.
    fn release(b: &mut TrackedBuffer, how: Memory) -> Result<(String, Access)> {
        let label = b.hold.release_label(how)?;
        b.hold.released_by(how);
        Ok((label, b.whole()))
    }
    /// A buffer of `n` elements the loop allocated as `memory`.
    /// What a new allocation named `name` is tracked by ([`unique_name`]).
    fn new_name(&self, name: &str) -> String {
        unique_name(self.devices.iter().chain(&self.hosts).map(|b| b.hold.name.as_str()), name)
    }
    /// A new buffer of `n` elements, not yet written, held by `memory`'s calls.
    fn allocation(name: &str, n: usize, memory: Memory) -> Result<TrackedBuffer> {
        check_alloc(name, n, "elements")?;
        Ok(TrackedBuffer::new(Holding::allocated(name, memory), Cells::run(n, Provenance::Unset)))
    }
    fn host_buffer(&mut self, h: HostRef) -> Result<&mut TrackedBuffer> {
        let n = self.hosts.len();
        self.hosts.get_mut(h.0).ok_or_else(|| LabError::config(format!("host buffer {} was never made ({n} exist)", h.0)))
    }
    /// Writes `f` of each element of `src`'s range `rs` into `dst`'s range
    /// `rd` (the same length): the pieces are taken before any is written,
    /// so a range copied onto itself reads what was there.
    fn device_cells_moved(&mut self, src: DevRef, rs: Range<usize>, dst: DevRef, rd: Range<usize>, f: impl Fn(Provenance) -> Provenance) {
        let pieces = self.devices[src.0].cells.mapped(rs, f);
        self.devices[dst.0].cells.write(rd.start, &pieces);
    }
    fn device_buffer(&mut self, d: DevRef) -> Result<&mut TrackedBuffer> {
        let n = self.devices.len();
        self.devices.get_mut(d.0).ok_or_else(|| LabError::config(format!("device buffer {} was never made ({n} exist)", d.0)))
    }
}

impl Default for DryRun {
    fn default() -> Self {
        Self::new()
    }
}

impl Issue for DryRun {
    fn h2d(&mut self, s: StreamRef, dst: DevRef, dst_at: usize, src: HostRef, src_at: usize, n: usize, label: &str) -> Result<()> {
        let lane = self.lane(s)?;
        let (rs, rd) = (Self::range(&self.hosts[src.0], src_at, n)?, Self::range(&self.devices[dst.0], dst_at, n)?);
        self.on_gpu(lane, dst, "an H2D")?;
        let acc = vec![Self::access(&self.hosts[src.0], &rs, false), Self::access(&self.devices[dst.0], &rd, true)];
        self.schedule.gpu_op(self.lanes.thread(), lane, OpKind::H2d, label, acc);
        let pieces = self.hosts[src.0].cells.pieces(rs);
        self.devices[dst.0].cells.write(rd.start, &pieces);
        Ok(())
    }
    fn d2h(&mut self, s: StreamRef, dst: HostRef, dst_at: usize, src: DevRef, src_at: usize, n: usize, label: &str) -> Result<()> {
        let lane = self.lane(s)?;
        let (rs, rd) = (Self::range(&self.devices[src.0], src_at, n)?, Self::range(&self.hosts[dst.0], dst_at, n)?);
        self.on_gpu(lane, src, "a D2H")?;
        let acc = vec![Self::access(&self.devices[src.0], &rs, false), Self::access(&self.hosts[dst.0], &rd, true)];
        self.schedule.gpu_op(self.lanes.thread(), lane, OpKind::D2h, label, acc);
        let pieces = self.devices[src.0].cells.pieces(rs);
        self.hosts[dst.0].cells.write(rd.start, &pieces);
        Ok(())
    }
    fn compute(&mut self, s: StreamRef, input: DevRef, in_at: usize, output: DevRef, out_at: usize, n: usize, label: &str) -> Result<()> {
        let lane = self.lane(s)?;
        let (ri, ro) = (Self::range(&self.devices[input.0], in_at, n)?, Self::range(&self.devices[output.0], out_at, n)?);
        self.on_gpu(lane, input, "a kernel")?;
        self.on_gpu(lane, output, "a kernel")?;
        let acc = vec![Self::access(&self.devices[input.0], &ri, false), Self::access(&self.devices[output.0], &ro, true)];
        self.schedule.gpu_op(self.lanes.thread(), lane, OpKind::Kernel, label, acc);
        self.device_cells_moved(input, ri, output, ro, Provenance::computed);
        Ok(())
    }
    fn d2d(&mut self, s: StreamRef, dst: DevRef, dst_at: usize, src: DevRef, src_at: usize, n: usize, label: &str) -> Result<()> {
        let lane = self.lane(s)?;
        let (rs, rd) = (Self::range(&self.devices[src.0], src_at, n)?, Self::range(&self.devices[dst.0], dst_at, n)?);
        let (sb, db) = (&self.devices[src.0], &self.devices[dst.0]);
        let link = d2d_link(self.lanes.gpu(lane), self.lanes.name(lane), (sb.gpu, &sb.hold.name), (db.gpu, &db.hold.name))?;
        if src == dst && rs.start < rd.end && rd.start < rs.end {
            return Err(LabError::config(format!(
                "a copy within {} from elements {}..{} onto {}..{}: the ranges overlap",
                self.devices[src.0].hold.name, rs.start, rs.end, rd.start, rd.end
            )));
        }
        let acc = vec![Self::access(&self.devices[src.0], &rs, false), Self::access(&self.devices[dst.0], &rd, true)];
        self.schedule.gpu_op(self.lanes.thread(), lane, OpKind::D2d(link), label, acc);
        self.device_cells_moved(src, rs, dst, rd, |p| p);
        Ok(())
    }
    fn all_reduce(&mut self, ranks: &[(StreamRef, DevRef)], at: usize, n: usize, label: &str) -> Result<()> {
        let mut lanes = Vec::with_capacity(ranks.len());
        for &(s, d) in ranks {
            let lane = self.lane(s)?;
            let b = self.devices.get(d.0).ok_or_else(|| LabError::config(format!("device buffer {} was never made ({} exist)", d.0, self.devices.len())))?;
            lanes.push((lane, d, Self::range(b, at, n)?));
        }
        let sides: Vec<(&str, usize, &str, usize)> = lanes
            .iter()
            .map(|(lane, d, _)| (self.lanes.name(*lane), self.lanes.gpu(*lane), self.devices[d.0].hold.name.as_str(), self.devices[d.0].gpu))
            .collect();
        let kind = OpKind::AllReduce(check_ranks(&sides)?);
        let accesses = lanes
            .iter()
            .map(|(lane, d, r)| (*lane, vec![Self::access(&self.devices[d.0], r, false), Self::access(&self.devices[d.0], r, true)]))
            .collect::<Vec<_>>();
        self.schedule.collective(self.lanes.thread(), &accesses, kind, label);
        let terms: Vec<_> = lanes.iter().map(|(_, d, r)| self.devices[d.0].cells.pieces(r.clone())).collect();
        let sums = summed(&terms);
        for (_, d, r) in &lanes {
            self.devices[d.0].cells.write(r.start, &sums);
        }
        Ok(())
    }
    fn event(&mut self) -> Result<EventRef> {
        self.events += 1;
        Ok(EventRef(self.events - 1))
    }
    fn record(&mut self, e: EventRef, s: StreamRef) -> Result<()> {
        let lane = self.lane(s)?;
        self.schedule.record_event(e.0, lane);
        Ok(())
    }
    fn wait(&mut self, s: StreamRef, e: EventRef) -> Result<()> {
        let lane = self.lane(s)?;
        self.schedule.stream_wait_event(lane, e.0);
        Ok(())
    }
    fn host_wait(&mut self, e: EventRef) -> Result<()> {
        self.schedule.host_wait_event(self.lanes.thread(), e.0);
        self.schedule.note_wait(self.lanes.thread(), WaitFor::Event(e.0));
        Ok(())
    }
    fn host_sync(&mut self, s: StreamRef) -> Result<()> {
        let lane = self.lane(s)?;
        self.schedule.host_wait_stream(self.lanes.thread(), lane);
        self.schedule.note_wait(self.lanes.thread(), WaitFor::Stream(s.0));
        Ok(())
    }
    fn signal(&mut self, s: StreamRef, label: &str) -> Result<SignalRef> {
        let op = self.host_fn_op(s, label, vec![])?;
        self.signals.push(op);
        Ok(SignalRef(self.signals.len() - 1))
    }
    fn host_wait_signal(&mut self, g: SignalRef) -> Result<()> {
        self.lanes.on_loop_thread("a wait for a host function")?;
        let op = *self.signals.get(g.0).ok_or_else(|| LabError::config(format!("signal {} was never made ({} exist)", g.0, self.signals.len())))?;
        self.schedule.host_learns(self.lanes.thread(), op);
        self.schedule.note_wait(self.lanes.thread(), WaitFor::Signal(g.0));
        Ok(())
    }
    fn produce(&mut self, h: HostRef, at: usize, n: usize, batch: usize, label: &str) -> Result<()> {
        self.lanes.on_loop_thread("CPU work")?;
        let r = Self::range(&self.hosts[h.0], at, n)?;
        let acc = vec![Self::access(&self.hosts[h.0], &r, true)];
        self.schedule.host_op(self.lanes.thread(), label, acc);
        let first = Provenance::Input((batch * self.batch_elements.max(n)) as u32);
        self.hosts[h.0].cells.write(r.start, &[(n, first)]);
        Ok(())
    }
    fn sync_device(&mut self) -> Result<()> {
        self.schedule.host_wait_all(self.lanes.thread());
        self.schedule.note_wait(self.lanes.thread(), WaitFor::Device);
        Ok(())
    }
    fn timed_from_here(&mut self) -> Result<()> {
        self.lanes.on_loop_thread("timed_from_here")?;
        self.schedule.host_wait_all(0);
        self.schedule.note_wait(0, WaitFor::Restart);
        Ok(())
    }
    fn alloc_async(&mut self, s: StreamRef, n: usize, name: &str) -> Result<DevRef> {
        self.lanes.on_loop_thread("a memory call")?;
        let lane = self.lane(s)?;
        let name = &self.new_name(name);
        // From the pool of the stream's GPU.
        let b = TrackedBuffer { gpu: self.lanes.gpu(lane), ..Self::allocation(name, n, Memory::Pool)? };
        self.schedule.gpu_op(self.lanes.thread(), lane, OpKind::Alloc(Memory::Pool), &Memory::Pool.label(true, name), vec![b.whole()]);
        self.devices.push(b);
        Ok(DevRef(self.devices.len() - 1))
    }
    fn free_async(&mut self, s: StreamRef, d: DevRef) -> Result<()> {
        self.lanes.on_loop_thread("a memory call")?;
        let lane = self.lane(s)?;
        let (label, access) = Self::release(self.device_buffer(d)?, Memory::Pool)?;
        self.schedule.gpu_op(self.lanes.thread(), lane, OpKind::Free(Memory::Pool), &label, vec![access]);
        Ok(())
    }
    fn alloc(&mut self, n: usize, name: &str) -> Result<DevRef> {
        self.lanes.on_loop_thread("a memory call")?;
        let name = &self.new_name(name);
        let b = Self::allocation(name, n, Memory::Device)?;
        self.schedule.host_call(self.lanes.thread(), OpKind::Alloc(Memory::Device), &Memory::Device.label(true, name), vec![b.whole()]);
        self.devices.push(b);
        Ok(DevRef(self.devices.len() - 1))
    }
    fn free(&mut self, d: DevRef) -> Result<()> {
        self.lanes.on_loop_thread("a memory call")?;
        let (label, access) = Self::release(self.device_buffer(d)?, Memory::Device)?;
        self.schedule.host_call(self.lanes.thread(), OpKind::Free(Memory::Device), &label, vec![access]);
        Ok(())
    }
    fn alloc_pinned(&mut self, n: usize, name: &str) -> Result<HostRef> {
        self.lanes.on_loop_thread("a memory call")?;
        let name = &self.new_name(name);
        let b = Self::allocation(name, n, Memory::Pinned)?;
        self.schedule.host_call(self.lanes.thread(), OpKind::Alloc(Memory::Pinned), &Memory::Pinned.label(true, name), vec![b.whole()]);
        self.hosts.push(b);
        Ok(HostRef(self.hosts.len() - 1))
    }
    fn free_pinned(&mut self, h: HostRef) -> Result<()> {
        self.lanes.on_loop_thread("a memory call")?;
        let (label, access) = Self::release(self.host_buffer(h)?, Memory::Pinned)?;
        self.schedule.host_call(self.lanes.thread(), OpKind::Free(Memory::Pinned), &label, vec![access]);
        Ok(())
    }
    fn pin(&mut self, h: HostRef) -> Result<()> {
        self.lanes.on_loop_thread("a memory call")?;
        let b = self.host_buffer(h)?;
        b.hold.live()?;
        if let Some(m) = b.hold.memory {
            return Err(LabError::config(format!("{} is already page-locked ({}): pin ordinary memory only", b.hold.name, m.call(true))));
        }
        b.hold.memory = Some(Memory::Registered);
        let label = Memory::Registered.label(true, &b.hold.name);
        self.schedule.host_call(self.lanes.thread(), OpKind::Alloc(Memory::Registered), &label, vec![]);
        Ok(())
    }
    fn unpin(&mut self, h: HostRef) -> Result<()> {
        self.lanes.on_loop_thread("a memory call")?;
        let (label, access) = Self::release(self.host_buffer(h)?, Memory::Registered)?;
        self.schedule.host_call(self.lanes.thread(), OpKind::Free(Memory::Registered), &label, vec![access]);
        Ok(())
    }
    fn issue_from(&mut self, thread: usize) -> Result<()> {
        self.lanes.issue_from(thread)
    }
}

/// A lab's own operations with no GPU: each is recorded as it describes
/// itself (its accesses enter the schedule, for the race check and the
/// queue model) and nothing runs. Its data is the lab's to follow: the
/// dry run tracks the elements of the vocabulary's own copies and kernels
/// only.
impl<O: LabOp, C> LabIssue<O, C> for DryRun {
    fn lab_op(&mut self, s: StreamRef, op: O) -> Result<OpId> {
        let lane = self.lane(s)?;
        Ok(self.schedule.gpu_op(self.lanes.thread(), lane, op.kind(), &op.label(), op.accesses()))
    }
    fn host_fn(&mut self, s: StreamRef, op: O) -> Result<OpId> {
        self.host_fn_op(s, &op.label(), op.accesses())
    }
    fn on_thread(&mut self, thread: usize, op: O) -> Result<OpId> {
        Ok(self.schedule.host_op(thread, &op.label(), op.accesses()))
    }
    fn learns(&mut self, thread: usize, op: OpId) {
        self.schedule.host_learns(thread, op);
    }
    fn hands_to(&mut self, thread: usize) {
        self.schedule.host_joins(thread, 0);
    }
    fn thread_waits(&mut self, thread: usize, e: EventRef) {
        self.schedule.host_wait_event(thread, e.0);
    }
    fn lab_call(&mut self, _call: C, offline: usize) -> Result<usize> {
        Ok(offline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::op::Link;

    #[test]
    fn provenance_flows_through_copies_and_kernel() {
        let mut m = DryRun::new();
        let s = m.stream();
        let (hi, ho) = (m.host("host in", 8, true), m.host("host out", 8, false));
        let (di, dout) = (m.device("device in", 8), m.device("device out", 8));
        m.h2d(s, di, 0, hi, 0, 8, "up").unwrap();
        m.compute(s, di, 0, dout, 0, 4, "k").unwrap();
        m.d2h(s, ho, 0, dout, 0, 8, "down").unwrap();
        let cells = m.host_cells(ho);
        assert_eq!(cells.get(0), Provenance::Output(0));
        assert_eq!(cells.get(3), Provenance::Output(3));
        assert_eq!(cells.get(4), Provenance::Unset, "the kernel covered only 4 elements");
        assert!(m.schedule.races().is_empty());
        assert!(m.h2d(StreamRef(5), di, 0, hi, 0, 1, "x").is_err());
        assert!(m.h2d(s, di, 4, hi, 0, 8, "x").unwrap_err().to_string().contains("do not fit"));
    }

    #[test]
    fn two_stages_on_two_gpus_with_a_peer_copy_between_them() {
        let mut m = DryRun::new();
        let s0 = m.stream_named(StreamDecl::new(StreamKind::NonBlocking, 0, 0), "stage 1");
        let s1 = m.stream_named(StreamDecl::new(StreamKind::NonBlocking, 0, 1), "stage 2");
        let (hi, ho) = (m.host("host in", 8, true), m.host("host out", 8, false));
        let (x, y0) = (m.device_on("x", 8, 0), m.device_on("activation", 8, 0));
        let (y1, z) = (m.device_on("activation on GPU 1", 8, 1), m.device_on("z", 8, 1));
        m.h2d(s0, x, 0, hi, 0, 8, "up").unwrap();
        m.compute(s0, x, 0, y0, 0, 8, "stage 1").unwrap();
        let e = m.event().unwrap();
        m.record(e, s0).unwrap();
        m.wait(s1, e).unwrap();
        m.d2d(s1, y1, 0, y0, 0, 8, "activation to GPU 1").unwrap();
        m.compute(s1, y1, 0, z, 0, 8, "stage 2").unwrap();
        m.d2h(s1, ho, 0, z, 0, 8, "down").unwrap();
        assert_eq!(m.host_cells(ho).get(5), Provenance::Repeated(5, 2), "both stages ran on element 5");
        assert_eq!(Provenance::after(5, 2), Provenance::Repeated(5, 2));
        assert!(m.schedule.races().is_empty(), "{:?}", m.schedule.races());
        let peer = m.schedule.ops.iter().find(|o| o.label == "activation to GPU 1").unwrap();
        assert_eq!((peer.kind, peer.gpu), (OpKind::D2d(Link { from: 0, to: 1 }), 1), "issued on GPU 1's stream");
        // Wrong GPU: a kernel of GPU 1 reading GPU 0's memory, an upload
        // into GPU 0's buffer from GPU 1's stream.
        let e = m.compute(s1, y0, 0, z, 0, 8, "stage 2 without the copy").unwrap_err().to_string();
        assert!(e.contains("a kernel on stream stage 2 (GPU 1) touches activation, which is in GPU 0's memory") && e.contains("peer copy"), "{e}");
        let e = m.h2d(s1, x, 0, hi, 0, 8, "up on the wrong stream").unwrap_err().to_string();
        assert!(e.contains("an H2D") && e.contains("which is in GPU 0's memory: an operation on a stream reaches only its own GPU's memory"), "{e}");
        // A peer copy on a third GPU's stream orders against neither side.
        let s2 = m.stream_named(StreamDecl::new(StreamKind::NonBlocking, 0, 2), "bystander");
        let e = m.d2d(s2, y1, 0, y0, 0, 8, "x").unwrap_err().to_string();
        assert!(e.contains("on stream bystander of GPU 2: a copy runs on a stream of one of the two GPUs it joins, here GPU 0 or GPU 1"), "{e}");
        // Within one buffer the ranges must not overlap.
        let e = m.d2d(s0, y0, 2, y0, 0, 4, "x").unwrap_err().to_string();
        assert!(e.contains("the ranges overlap"), "{e}");
        m.d2d(s0, y0, 4, y0, 0, 4, "within").unwrap();
        assert_eq!(m.schedule.ops.last().unwrap().kind, OpKind::D2d(Link { from: 0, to: 0 }));
    }

    #[test]
    fn without_the_wait_the_peer_copy_races_stage_one() {
        let mut m = DryRun::new();
        let s0 = m.stream_named(StreamDecl::new(StreamKind::NonBlocking, 0, 0), "stage 1");
        let s1 = m.stream_named(StreamDecl::new(StreamKind::NonBlocking, 0, 1), "stage 2");
        let (x, y0, y1) = (m.device_on("x", 8, 0), m.device_on("activation", 8, 0), m.device_on("activation on GPU 1", 8, 1));
        m.compute(s0, x, 0, y0, 0, 8, "stage 1").unwrap();
        m.d2d(s1, y1, 0, y0, 0, 8, "activation to GPU 1").unwrap();
        let r = &m.schedule.races()[0];
        assert!(r.what.contains("'activation to GPU 1' reads") && r.what.contains("'stage 1' may still write"), "{}", r.what);
    }

    /// A kernel reads every input cell before it writes any, whichever way
    /// its input and output overlap within one buffer, and a copy from a
    /// buffer later in the dry run's list to one earlier carries its cells.
    #[test]
    fn kernels_over_one_buffer_read_before_they_write() {
        let mut m = DryRun::new();
        let s = m.stream();
        let hi = m.host("host in", 8, true);
        let (a, b) = (m.device("a", 8), m.device("b", 8));
        m.h2d(s, b, 0, hi, 0, 8, "up").unwrap();
        m.d2d(s, a, 0, b, 0, 8, "back to the first buffer").unwrap();
        assert_eq!(m.device_cells(a).get(7), Provenance::Input(7));
        m.compute(s, a, 0, a, 2, 4, "shifted up").unwrap();
        use Provenance::{Input, Output};
        assert_eq!(m.device_cells(a).to_vec()[..6], [Input(0), Input(1), Output(0), Output(1), Output(2), Output(3)]);
        m.compute(s, b, 2, b, 0, 4, "shifted down").unwrap();
        assert_eq!(m.device_cells(b).to_vec()[..4], [2, 3, 4, 5].map(Provenance::Output));
        assert_eq!(m.device_cells(b).to_vec()[4..], [4, 5, 6, 7].map(Provenance::Input), "the kernel covered only its 4 outputs");
        m.compute(s, b, 4, b, 4, 4, "in place").unwrap();
        assert_eq!(m.device_cells(b).get(7), Provenance::Output(7));
    }

    #[test]
    fn the_kernel_counts_its_passes() {
        assert_eq!(Provenance::Input(3).computed(), Provenance::Output(3));
        assert_eq!(Provenance::Output(3).computed(), Provenance::Repeated(3, 2));
        assert_eq!(Provenance::Repeated(3, 2).computed(), Provenance::Repeated(3, 3));
        assert_eq!(Provenance::Repeated(3, u8::MAX).computed(), Provenance::Garbage);
        assert_eq!(Provenance::Unset.computed(), Provenance::Garbage);
        assert_eq!((Provenance::after(3, 0), Provenance::after(3, 1)), (Provenance::Input(3), Provenance::Output(3)));
    }

    /// Two GPUs, each with a compute and a communication stream: GPU g
    /// uploads input elements g*4.. into its `x`, computes its gradients
    /// into `grad`, and the all-reduce sums them on the comm streams.
    fn two_ranks(wait_for_compute: bool) -> (DryRun, [StreamRef; 4], [DevRef; 2], HostRef) {
        let mut m = DryRun::new();
        let streams =
            [(0, "compute"), (0, "comm"), (1, "compute"), (1, "comm")].map(|(g, n)| m.stream_named(StreamDecl::new(StreamKind::NonBlocking, 0, g), n));
        let hi = m.host("host in", 8, true);
        let grads = [0, 1].map(|g| {
            let x = m.device_on(&format!("x {g}"), 4, g);
            let grad = m.device_on(&format!("grad {g}"), 4, g);
            let s = streams[2 * g];
            m.h2d(s, x, 0, hi, 4 * g, 4, "up").unwrap();
            m.compute(s, x, 0, grad, 0, 4, "gradients").unwrap();
            if wait_for_compute {
                m.wait_for(streams[2 * g + 1], s).unwrap();
            }
            grad
        });
        (m, streams, grads, hi)
    }

    #[test]
    fn an_all_reduce_sums_every_ranks_elements_and_waits_for_every_rank() {
        let (mut m, s, grads, _) = two_ranks(true);
        m.all_reduce(&[(s[1], grads[0]), (s[3], grads[1])], 0, 4, "all-reduce").unwrap();
        let want = Provenance::Summed { first: 0, stride: 4, ranks: 2, passes: 1 };
        assert_eq!(m.device_cells(grads[0]).get(0), want);
        assert_eq!(m.device_cells(grads[1]).get(0), want, "every rank holds the sum");
        assert_eq!(m.device_cells(grads[1]).get(3), Provenance::Summed { first: 3, stride: 4, ranks: 2, passes: 1 });
        assert!(m.schedule.races().is_empty(), "{:?}", m.schedule.races());
        let ops: Vec<&crate::pipeline::op::Op> = m.schedule.ops.iter().filter(|o| o.kind == OpKind::AllReduce(2)).collect();
        assert_eq!(ops.len(), 2, "one op per rank");
        assert_eq!((ops[0].gpu, ops[1].gpu), (0, 1));
        // Each rank's part waits for both GPUs' gradients, not for the other part.
        let kernels: Vec<OpId> = m.schedule.ops.iter().filter(|o| o.kind == OpKind::Kernel).map(|o| o.id).collect();
        for o in &ops {
            assert!(kernels.iter().all(|&k| m.schedule.happens_before(k, o.id)), "{o:?}");
        }
        assert!(!m.schedule.happens_before(ops[0].id, ops[1].id));
        // The sum of one rank is the element itself.
        assert_eq!(Provenance::sum_of(&[Provenance::Output(3)]), Provenance::Output(3));
        assert_eq!(Provenance::sum_of(&[]), Provenance::Garbage);
        assert_eq!(Provenance::sum_of(&[Provenance::Output(3), Provenance::Input(7)]), Provenance::Garbage, "passes differ");
        assert_eq!(Provenance::sum_of(&[Provenance::Output(3), Provenance::Unset]), Provenance::Garbage, "a rank never computed");
        assert_eq!(Provenance::sum_of(&[Provenance::Output(7), Provenance::Output(3)]), Provenance::Garbage, "ranks out of order");
        assert_eq!(Provenance::sum_of(&[want, want]), Provenance::Garbage, "summed twice");
        assert_eq!(want.computed(), Provenance::Garbage);
    }

    #[test]
    fn an_all_reduce_before_the_gradients_are_ready_races_and_a_bad_rank_list_is_an_error() {
        // The comm streams do not wait for the compute streams.
        let (mut m, s, grads, _) = two_ranks(false);
        m.all_reduce(&[(s[1], grads[0]), (s[3], grads[1])], 0, 4, "all-reduce").unwrap();
        let r = &m.schedule.races()[0];
        assert!(r.what.contains("'all-reduce' reads") && r.what.contains("'gradients' may still write"), "{}", r.what);
        let (mut m, s, grads, _) = two_ranks(true);
        let e = m.all_reduce(&[(s[1], grads[1]), (s[3], grads[0])], 0, 4, "x").unwrap_err().to_string();
        assert!(e.contains("an all-reduce on stream comm (GPU 0) touches grad 1, which is in GPU 1's memory"), "{e}");
        let e = m.all_reduce(&[(s[0], grads[0]), (s[1], grads[0])], 0, 4, "x").unwrap_err().to_string();
        assert!(e.contains("two ranks on GPU 0 (compute and comm)"), "{e}");
        assert!(m.all_reduce(&[], 0, 4, "x").unwrap_err().to_string().contains("at least one rank"));
        assert!(m.all_reduce(&[(s[1], grads[0])], 2, 4, "x").unwrap_err().to_string().contains("do not fit"));
    }

    /// One batch per stream through a buffer the stream allocates and frees.
    fn scratch_batches(m: &mut DryRun, free_on_other_stream: bool) -> Result<()> {
        let (a, b) = (m.stream(), m.stream());
        let (hi, ho) = (m.host("host in", 8, true), m.alloc_pinned(8, "host out")?);
        let out = m.device("device out", 8);
        for (batch, s) in [a, b].into_iter().enumerate() {
            let x = m.alloc_async(s, 4, &format!("scratch {batch}"))?;
            m.h2d(s, x, 0, hi, batch * 4, 4, "up")?;
            m.compute(s, x, 0, out, batch * 4, 4, "k")?;
            m.free_async(if free_on_other_stream { [b, a][batch] } else { s }, x)?;
            m.d2h(s, ho, batch * 4, out, batch * 4, 4, "down")?;
        }
        m.sync_device()?;
        m.free_pinned(ho)
    }

    #[test]
    fn each_thread_has_its_own_per_thread_stream_but_shares_the_legacy_one() {
        use crate::pipeline::op::Lane;
        let run = |kind: StreamKind| {
            let mut m = DryRun::new();
            let s = m.stream_named(StreamDecl::new(kind, 0, 0), "the default stream");
            let (hi, ho) = (m.host("host in", 8, true), m.host("host out", 8, false));
            let d = m.device("device", 8);
            for t in 0..2 {
                m.issue_from(t).unwrap();
                m.h2d(s, d, 4 * t, hi, 4 * t, 4, &format!("up {t}")).unwrap();
                m.d2h(s, ho, 4 * t, d, 4 * t, 4, &format!("down {t}")).unwrap();
            }
            m
        };
        let per_thread = run(StreamKind::PerThread);
        let lanes: Vec<Lane> = per_thread.schedule.ops.iter().map(|o| o.lane).collect();
        assert_eq!(lanes, [Lane::Stream(0), Lane::Stream(0), Lane::Stream(1), Lane::Stream(1)], "thread 1's default stream is its own");
        assert_eq!(per_thread.stream_names(), ["the default stream", "the default stream of CPU thread 1"]);
        assert!(!per_thread.schedule.happens_before(1, 2), "and not ordered after thread 0's");
        let legacy = run(StreamKind::Legacy);
        assert!(legacy.schedule.ops.iter().all(|o| o.lane == Lane::Stream(0)), "the legacy stream is one stream for every thread");
        assert!(legacy.schedule.happens_before(1, 2));
        assert_eq!(legacy.host_cells(HostRef(1)).get(7), Provenance::Input(7));
        // A wait on thread 1 orders only thread 1's later calls.
        let mut m = DryRun::new();
        let (a, b) = (m.stream(), m.stream());
        let (hi, d) = (m.host("host in", 8, true), m.device("device", 8));
        m.h2d(a, d, 0, hi, 0, 4, "thread 0's").unwrap();
        m.issue_from(1).unwrap();
        m.host_sync(a).unwrap();
        m.h2d(b, d, 4, hi, 4, 4, "thread 1's").unwrap();
        m.issue_from(0).unwrap();
        m.h2d(b, d, 0, hi, 0, 4, "thread 0's again").unwrap();
        assert!(m.schedule.happens_before(0, 1), "thread 1 waited for stream a");
        assert_eq!(m.schedule.ops[1].after_host_wait, [0]);
        assert!(m.schedule.ops[2].after_host_wait.is_empty(), "thread 0 never waited");
        assert!(m.issue_from(64).unwrap_err().to_string().contains("CPU threads are numbered 0 to 63"));
    }

    #[test]
    fn memory_calls_are_operations_the_schedule_orders_and_checks() {
        let mut m = DryRun::new();
        scratch_batches(&mut m, false).unwrap();
        assert!(m.schedule.races().is_empty(), "{:?}", m.schedule.races());
        assert!(m.unreleased().is_empty());
        let labels: Vec<&str> = m.schedule.ops.iter().map(|o| o.label.as_str()).collect();
        assert_eq!(labels[..3], ["cuMemHostAlloc host out", "cuMemAllocAsync scratch 0", "up"]);
        assert_eq!(m.schedule.ops[1].kind, OpKind::Alloc(Memory::Pool));
        assert_eq!(m.schedule.ops[1].lane, crate::pipeline::op::Lane::Stream(0), "stream-ordered: on its stream");
        assert_eq!(m.schedule.ops[0].lane, crate::pipeline::op::Lane::HostThread(0), "blocking: on the CPU");
        // Synchronizing the device orders the pinned buffer's release after every copy.
        let last = m.schedule.ops.len() - 1;
        assert!((0..last).filter(|&i| m.schedule.ops[i].label == "down").all(|i| m.schedule.happens_before(i, last)));
        assert_eq!(m.host_cells(HostRef(1)).get(7), Provenance::Output(7));

        // Freed on the other stream with no event: a race, named as a release.
        let mut m = DryRun::new();
        scratch_batches(&mut m, true).unwrap();
        let r: Vec<&str> = m.schedule.races().iter().map(|r| r.what.as_str()).collect();
        assert!(r[0].contains("'cuMemFreeAsync scratch 0' releases bytes 0..16 of scratch 0 while 'up' may still write them"), "{r:?}");
        assert!(r.iter().any(|w| w.contains("'cuMemFreeAsync scratch 0' releases bytes 0..16 of scratch 0 while 'k' may still read them")), "{r:?}");
    }

    #[test]
    fn misused_memory_calls_are_clear_errors() {
        let mut m = DryRun::new();
        let s = m.stream();
        let lab = m.device("lab buffer", 8);
        let h = m.host("host", 8, true);
        let x = m.alloc_async(s, 8, "scratch").unwrap();
        m.free_async(s, x).unwrap();
        let e = m.h2d(s, x, 0, h, 0, 8, "late").unwrap_err().to_string();
        assert!(e.contains("scratch is used after cuMemFreeAsync released it"), "{e}");
        let e = m.free_async(s, x).unwrap_err().to_string();
        assert!(e.contains("scratch is released twice: cuMemFreeAsync already released it") && e.contains("double free"), "{e}");
        let e = m.free(lab).unwrap_err().to_string();
        assert!(e.contains("lab buffer belongs to the lab"), "{e}");
        let y = m.alloc(8, "plain").unwrap();
        let e = m.free_async(s, y).unwrap_err().to_string();
        assert!(e.contains("plain came from cuMemAlloc: release it with cuMemFree, not cuMemFreeAsync"), "{e}");
        assert!(m.alloc(0, "nothing").unwrap_err().to_string().contains("allocating 0 elements"));
        assert!(m.alloc_async(StreamRef(9), 8, "x").is_err());
        m.pin(h).unwrap();
        assert!(m.pin(h).unwrap_err().to_string().contains("already page-locked"));
        m.unpin(h).unwrap();
        assert!(m.unpin(h).is_err(), "unpinned memory is the lab's again");
        let p = m.alloc_pinned(8, "pinned").unwrap();
        assert!(m.pin(p).unwrap_err().to_string().contains("already page-locked (cuMemHostAlloc)"));
        assert_eq!(m.unreleased(), ["plain", "pinned"]);
    }
}
