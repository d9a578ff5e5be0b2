//! The runner's GPU operations: the buffers a loop uses, copies (host to
//! device, device to host, within a GPU or between GPUs), kernels, a
//! lab's own ops, NCCL's all-reduce, and the events and stream waits that
//! order them. Each is checked and recorded here; its driver calls go into
//! a command (`super::command`).

use super::command::{Base, Bracket, Command, EventHandle, Place, Span, What};
use super::timing::{Mark, TimelineSource};
use super::{DeviceEntry, HostEntry, Runner, MAX_GATED_OPS};
use crate::error::{LabError, Result};
use crate::gpu::nccl::Communicators;
use crate::gpu::{ComputeKernel, DeviceBuffer, DeviceSpan, HostBuffer, Stream};
use crate::pipeline::issue::{check_ranks, d2d_link, same_gpu, DevRef, EventRef, Holding, HostRef, StreamRef};
use crate::pipeline::op::{Access, OpId, OpKind};
use std::sync::Arc;

/// NCCL's communicators, carried by a command that runs on the loop's
/// own thread (thread 0) and nowhere else.
struct LoopThreadOnly<'a>(&'a Communicators);

// SAFETY: a command of thread 0 runs on the thread that made it (the
// runner's `Exec::run` calls it there); NCCL sees its communicators used
// by that one thread, as it requires.
unsafe impl Send for LoopThreadOnly<'_> {}

impl<'a> LoopThreadOnly<'a> {
    /// Taken whole (a closure that named the field would capture only it).
    fn get(self) -> &'a Communicators {
        self.0
    }
}

impl<'a> Runner<'a> {
    /// Adds the lab's device buffer `d` under `name`.
    pub fn device(&mut self, d: &'a DeviceBuffer, name: &str) -> DevRef {
        self.devices.push(DeviceEntry { base: Base::Fixed(d.ptr()), bytes: d.bytes(), hold: Holding::lab(name), gpu: d.gpu().clone() });
        DevRef(self.devices.len() - 1)
    }
    /// Adds the first `bytes` of the lab's device buffer `d` under `name`
    /// (a buffer of the loop's smaller than the one it lives in).
    pub fn device_part(&mut self, d: &'a DeviceBuffer, bytes: usize, name: &str) -> Result<DevRef> {
        if bytes == 0 || bytes > d.bytes() {
            return Err(LabError::config(format!("{name}: {bytes} bytes of a device buffer of {}", d.bytes())));
        }
        self.devices.push(DeviceEntry { base: Base::Fixed(d.ptr()), bytes, hold: Holding::lab(name), gpu: d.gpu().clone() });
        Ok(DevRef(self.devices.len() - 1))
    }
    /// Borrows a host buffer exclusively for the runner's life.
    pub fn host(&mut self, h: &'a mut dyn HostBuffer, name: &str) -> HostRef {
        let words = h.words().len();
        let page_locked = h.kind().is_page_locked();
        let ptr = h.words_mut().as_mut_ptr();
        self.hosts.push(HostEntry { base: Base::Fixed(ptr as u64), words, hold: Holding::lab(name), page_locked });
        HostRef(self.hosts.len() - 1)
    }
    /// An event for dependencies (record / wait / host_wait). It takes no
    /// timestamp: a timed event costs the engine that records it a flush.
    /// Made now, before the loop's calls run.
    pub fn event(&mut self) -> Result<EventRef> {
        let event = self.exec.gpu.sync_event()?;
        self.user_events.push(Arc::new(event));
        Ok(EventRef(self.user_events.len() - 1))
    }

    pub(super) fn host_entry(&self, h: HostRef) -> Result<&HostEntry> {
        self.hosts.get(h.0).ok_or_else(|| LabError::config(format!("host buffer {} was never made", h.0)))
    }
    pub(super) fn device_entry(&self, d: DevRef) -> Result<&DeviceEntry> {
        self.devices.get(d.0).ok_or_else(|| LabError::config(format!("device buffer {} was never made", d.0)))
    }
    pub(super) fn host_range(&self, h: HostRef, at: usize, bytes: usize) -> Result<(Place, Access)> {
        let e = self.host_entry(h)?;
        e.hold.live()?;
        if at % 8 != 0 || bytes % 8 != 0 || bytes == 0 || at.checked_add(bytes).is_none_or(|end| end > e.words * 8) {
            return Err(LabError::config(format!("{} bytes at {at} do not fit host buffer {} ({} bytes, 8-byte aligned)", bytes, e.hold.name, e.words * 8)));
        }
        Ok((Place { base: e.base.clone(), at: at as u64 }, Access { buffer: e.hold.name.clone(), start: at as u64, end: (at + bytes) as u64, write: false }))
    }
    pub(super) fn dev_range(&self, d: DevRef, at: usize, bytes: usize) -> Result<(Place, Access)> {
        let e = self.device_entry(d)?;
        e.hold.live()?;
        if bytes == 0 || at.checked_add(bytes).is_none_or(|end| end > e.bytes) {
            return Err(LabError::config(format!("{bytes} bytes at {at} do not fit device buffer {} ({} bytes)", e.hold.name, e.bytes)));
        }
        Ok((Place { base: e.base.clone(), at: at as u64 }, Access { buffer: e.hold.name.clone(), start: at as u64, end: (at + bytes) as u64, write: false }))
    }
    /// Device buffer `d` whole, wherever its memory turns out to be.
    fn whole(&self, d: DevRef) -> Span {
        let e = &self.devices[d.0];
        Span { base: e.base.clone(), bytes: e.bytes }
    }

    /// Records a GPU op of `kind` on `s` and makes (or keeps) the command
    /// `what` builds from its stream, its timing events and whether its
    /// GPU's context must be made current first; `host_blocks`: the call
    /// blocks the CPU until the GPU ran it (a copy from pageable memory),
    /// so the gate opens first.
    fn gpu_op(
        &mut self,
        s: StreamRef,
        kind: OpKind,
        label: &str,
        accesses: Vec<Access>,
        host_blocks: bool,
        what: impl FnOnce(&'a Stream, Bracket, bool) -> What<'a>,
    ) -> Result<OpId> {
        let lane = self.lane(s)?;
        self.one_thread_per_lane(lane)?;
        let (mark, start, end) = self.op_marks(lane)?;
        let stream = self.streams[lane];
        let bracket = Bracket { start: start.map(|i| EventHandle(self.pool.get(i).raw)), end: end.map(|i| EventHandle(self.pool.get(i).raw)) };
        // Over several GPUs, calls go to the stream's GPU's context.
        let what = what(stream, bracket, self.gpus.len() > 1);
        let what = if host_blocks {
            // SAFETY: as for every command the runner makes (see `Exec::run`).
            What::Blocking(Box::new(move || unsafe { what.issue() }))
        } else {
            what
        };
        let thread = self.lanes.thread();
        self.dispatch(Command { thread, what })?;
        let id = self.schedule.gpu_op(thread, lane, kind, label, accesses);
        self.marks.push(mark);
        Ok(id)
    }

    /// A GPU op whose driver calls `enqueue` makes on its stream, between
    /// its timing events.
    fn gpu_call(
        &mut self,
        s: StreamRef,
        kind: OpKind,
        label: &str,
        accesses: Vec<Access>,
        enqueue: impl FnOnce(&Stream) -> Result<()> + Send + 'a,
    ) -> Result<OpId> {
        self.gpu_op(s, kind, label, accesses, false, move |stream, bracket, bind| {
            What::Issue(Box::new(move || {
                if bind {
                    stream.gpu().bind()?;
                }
                if let Some(a) = bracket.start {
                    // SAFETY: a pool event of the runner, alive for its life.
                    unsafe { crate::gpu::driver::event_record(a.0, stream.raw()) }?;
                }
                enqueue(stream)?;
                // SAFETY: a pool event of the runner too, alive for its life;
                // the stream is borrowed for it.
                bracket.end.map_or(Ok(()), |b| unsafe { crate::gpu::driver::event_record(b.0, stream.raw()) })
            }))
        })
    }

    /// One more GPU op on lane `lane`: how it is timed (its mark), and the
    /// pool events to record before it (None: the previous op's end is its
    /// start) and after it.
    fn op_marks(&mut self, lane: usize) -> Result<(Mark, Option<usize>, Option<usize>)> {
        if let Some(why) = &self.capture_broken {
            return Err(LabError::config(format!("the CUDA graph capture failed: {why}")));
        }
        if self.behind_gate >= MAX_GATED_OPS && self.gate_closed {
            self.dispatch(Command { thread: 0, what: What::OpenGate })?;
        }
        self.gpu_ops += 1;
        self.behind_gate += 1;
        Ok(match self.source {
            TimelineSource::Cupti => (Mark::Activity(self.gpu_ops - 1), None, None),
            TimelineSource::Events => {
                // Each timed event after a copy costs the copy engine a flush, so
                // events are shared: the previous op's end on this stream is this
                // op's start, unless something (a wait, host work) came between.
                let gpu = self.exec.gpu.clone();
                let (a, fresh) = match self.reusable_end[lane] {
                    Some(e) => (e, false),
                    None => (self.pool.take(&gpu, &mut self.pool_used)?, true),
                };
                let b = self.pool.take(&gpu, &mut self.pool_used)?;
                self.reusable_end[lane] = Some(b);
                (Mark::Gpu(a, b), fresh.then_some(a), Some(b))
            }
            TimelineSource::Off => (Mark::None, None, None),
        })
    }

    /// Copies `bytes` from host buffer `src` at byte `src_at` to device `dst` at `dst_at`.
    pub fn h2d(&mut self, s: StreamRef, dst: DevRef, dst_at: usize, src: HostRef, src_at: usize, bytes: usize, label: &str) -> Result<()> {
        self.copy(s, true, dst, dst_at, src, src_at, bytes, label)
    }

    /// Copies `bytes` from device `src` at `src_at` to host buffer `dst` at byte `dst_at`.
    pub fn d2h(&mut self, s: StreamRef, dst: HostRef, dst_at: usize, src: DevRef, src_at: usize, bytes: usize, label: &str) -> Result<()> {
        self.copy(s, false, src, src_at, dst, dst_at, bytes, label)
    }

    /// A copy between host buffer `host` and device buffer `dev` (`up`:
    /// host to device).
    #[allow(clippy::too_many_arguments)]
    fn copy(&mut self, s: StreamRef, up: bool, dev: DevRef, dev_at: usize, host: HostRef, host_at: usize, bytes: usize, label: &str) -> Result<()> {
        self.on_stream_gpu(s, dev, if up { "an H2D" } else { "a D2H" })?;
        let (hp, mut ha) = self.host_range(host, host_at, bytes)?;
        let (dp, mut da) = self.dev_range(dev, dev_at, bytes)?;
        (ha.write, da.write) = (!up, up);
        // A copy from pageable memory blocks inside its call until its DMA ran.
        let blocks = !self.hosts[host.0].page_locked;
        let (kind, accesses) = if up { (OpKind::H2d, vec![ha, da]) } else { (OpKind::D2h, vec![da, ha]) };
        // Both ranges lie in their buffers (checked above); the runner holds
        // the buffers' borrows until it synchronizes.
        self.gpu_op(s, kind, label, accesses, blocks, move |stream, bracket, bind| What::Copy { stream, up, host: hp, device: dp, bytes, bracket, bind })
            .map(|_| ())
    }

    /// Copies `bytes` from device `src` at `src_at` to device `dst` at
    /// `dst_at`: within one GPU, or from one GPU's memory to another's (a
    /// peer copy, on a stream of either GPU).
    pub fn d2d(&mut self, s: StreamRef, dst: DevRef, dst_at: usize, src: DevRef, src_at: usize, bytes: usize, label: &str) -> Result<()> {
        let (sp, mut sa) = self.dev_range(src, src_at, bytes)?;
        let (dp, mut da) = self.dev_range(dst, dst_at, bytes)?;
        sa.write = false;
        da.write = true;
        let lane = self.lane(s)?;
        let (src_gpu, dst_gpu) = (self.devices[src.0].gpu.clone(), self.devices[dst.0].gpu.clone());
        let link = d2d_link(self.streams[lane].gpu().ordinal(), self.lanes.name(lane), (src_gpu.ordinal(), &sa.buffer), (dst_gpu.ordinal(), &da.buffer))?;
        if !link.is_peer() && sa.buffer == da.buffer && sa.start < da.end && da.start < sa.end {
            return Err(LabError::config(format!(
                "a copy within {} from bytes {}..{} onto {}..{}: the ranges overlap",
                sa.buffer, sa.start, sa.end, da.start, da.end
            )));
        }
        self.gpu_call(s, OpKind::D2d(link), label, vec![sa, da], move |st| {
            let (to, from) = (DeviceSpan::new(dp.addr(), bytes), DeviceSpan::new(sp.addr(), bytes));
            // SAFETY: both ranges lie in their buffers (checked above) and
            // do not overlap (two buffers, or two GPUs' memories, or
            // checked above); the runner holds the buffers' borrows until
            // it synchronizes every GPU.
            unsafe {
                if link.is_peer() {
                    st.enqueue_peer_copy(to, &dst_gpu, from, &src_gpu, bytes)
                } else {
                    st.enqueue_copy_on_device(to, from, bytes)
                }
            }
        })
        .map(|_| ())
    }

    /// Refuses `what` on `s` touching device buffer `d` of another GPU ([`same_gpu`]).
    fn on_stream_gpu(&mut self, s: StreamRef, d: DevRef, what: &str) -> Result<()> {
        let lane = self.lane(s)?;
        let e = self.device_entry(d)?;
        same_gpu(what, (self.lanes.name(lane), self.streams[lane].gpu().ordinal()), (&e.hold.name, e.gpu.ordinal()))
    }

    /// `output[out_at..+bytes] = compute(input[in_at..+bytes])`: the lab's
    /// kernel over `bytes` of f32 (offsets and size in bytes, whole f32).
    #[allow(clippy::too_many_arguments)]
    pub fn compute(
        &mut self,
        s: StreamRef,
        k: &'a ComputeKernel,
        input: DevRef,
        in_at: usize,
        output: DevRef,
        out_at: usize,
        bytes: usize,
        iterations: i32,
        label: &str,
    ) -> Result<()> {
        self.on_stream_gpu(s, input, "a kernel")?;
        self.on_stream_gpu(s, output, "a kernel")?;
        if in_at % 4 != 0 || out_at % 4 != 0 || bytes % 4 != 0 {
            return Err(LabError::config(format!("a kernel over {bytes} bytes at {in_at} -> {out_at}: give whole f32 elements")));
        }
        let (_, mut ia) = self.dev_range(input, in_at, bytes)?;
        let (_, mut oa) = self.dev_range(output, out_at, bytes)?;
        ia.write = false;
        oa.write = true;
        let (input, output) = (self.whole(input), self.whole(output));
        let (in_at, out_at, n) = (in_at / 4, out_at / 4, bytes / 4);
        // Both ranges lie in their buffers (checked above); the runner
        // holds the buffers' borrows until it synchronizes.
        self.gpu_op(s, OpKind::Kernel, label, vec![ia, oa], false, move |stream, bracket, bind| What::Kernel {
            stream,
            kernel: k,
            input,
            output,
            in_at,
            out_at,
            n,
            iterations,
            bracket,
            bind,
        })
        .map(|_| ())
    }

    /// A lab's own GPU operation (a kernel or copy of its own buffers):
    /// `enqueue` puts it on the stream; `accesses` name what it reads and
    /// writes, for the race check. Timed and ordered like every other op.
    /// A lab whose loop also runs on the dry run writes its operations once
    /// for both and issues them through [`super::LabRunner`], which calls this.
    ///
    /// # Safety
    /// What `enqueue` puts on the stream touches only memory that stays
    /// allocated until the runner has synchronized (buffers that outlive
    /// the runner), and `accesses` name everything it reads and writes.
    pub unsafe fn op(
        &mut self,
        s: StreamRef,
        kind: OpKind,
        label: &str,
        accesses: Vec<Access>,
        enqueue: impl FnOnce(&Stream) -> Result<()> + Send + 'a,
    ) -> Result<OpId> {
        self.gpu_call(s, kind, label, accesses, enqueue)
    }

    /// The NCCL communicators [`Self::all_reduce`] uses: one per GPU of
    /// the all-reduces' ranks, in their order.
    pub fn use_communicators(&mut self, c: &'a Communicators) {
        self.communicators = Some(c);
    }

    /// Sums `bytes` at byte `at` of each rank's device buffer in place
    /// across the ranks (an NCCL all-reduce, one grouped call): `ranks`
    /// holds a (stream, buffer) per GPU of the runner's communicators,
    /// in their order. Each rank's part is an op on its stream, timed like
    /// any other.
    pub fn all_reduce(&mut self, ranks: &[(StreamRef, DevRef)], at: usize, bytes: usize, label: &str) -> Result<()> {
        self.not_captured("an all-reduce")?;
        // NCCL's communicators are used by one thread: the loop's.
        self.lanes.on_loop_thread("an all-reduce")?;
        let Some(comms) = self.communicators else {
            return Err(LabError::config(
                "an all-reduce needs NCCL: this runner has no communicators (run the plan on a rig made with NCCL, PlanRig::with_nccl)",
            ));
        };
        if bytes % 4 != 0 {
            return Err(LabError::config(format!("an all-reduce of {bytes} bytes: give whole f32 elements")));
        }
        let mut parts = Vec::with_capacity(ranks.len());
        for &(s, d) in ranks {
            let lane = self.lane(s)?;
            let (place, access) = self.dev_range(d, at, bytes)?;
            parts.push((lane, d, place, access));
        }
        let sides: Vec<(&str, usize, &str, usize)> = parts
            .iter()
            .map(|(lane, d, _, a)| (self.lanes.name(*lane), self.streams[*lane].gpu().ordinal(), a.buffer.as_str(), self.devices[d.0].gpu.ordinal()))
            .collect();
        let kind = OpKind::AllReduce(check_ranks(&sides)?);
        let gpus: Vec<usize> = sides.iter().map(|s| s.1).collect();
        if gpus != comms.ordinals() {
            return Err(LabError::config(format!(
                "an all-reduce over GPUs {gpus:?}, and NCCL's communicators are for GPUs {:?}: give one (stream, buffer) per GPU, in that order",
                comms.ordinals()
            )));
        }
        let mut marks = Vec::with_capacity(parts.len());
        let mut sides = Vec::with_capacity(parts.len());
        for (lane, _, place, _) in &parts {
            let (mark, start, end) = self.op_marks(*lane)?;
            marks.push(mark);
            sides.push((self.streams[*lane], place.clone(), start.map(|i| self.pool.get(i).clone()), end.map(|i| self.pool.get(i).clone())));
        }
        let own = self.exec.gpu.clone();
        let comms = LoopThreadOnly(comms);
        self.dispatch(Command {
            thread: 0,
            what: What::Issue(Box::new(move || {
                let comms = comms.get();
                for (s, _, start, _) in &sides {
                    if let Some(a) = start {
                        s.gpu().bind()?;
                        a.record(s)?;
                    }
                }
                let spans: Vec<(DeviceSpan, &Stream)> = sides.iter().map(|(s, p, ..)| (DeviceSpan::new(p.addr(), bytes), *s)).collect();
                // SAFETY: each span lies in its buffer (dev_range), which the
                // runner borrows until it has synchronized every GPU.
                unsafe { comms.all_reduce_spans(&spans) }?;
                for (s, _, _, end) in &sides {
                    if let Some(b) = end {
                        s.gpu().bind()?;
                        b.record(s)?;
                    }
                }
                own.bind()
            })),
        })?;
        let accesses: Vec<(usize, Vec<Access>)> = parts.into_iter().map(|(lane, _, _, a)| (lane, vec![a.clone(), Access { write: true, ..a }])).collect();
        self.schedule.collective(self.lanes.thread(), &accesses, kind, label);
        self.marks.extend(marks);
        Ok(())
    }

    /// cuEventRecord: `e` completes when `s` has done everything issued so far.
    pub fn record(&mut self, e: EventRef, s: StreamRef) -> Result<()> {
        let lane = self.lane(s)?;
        let (mut event, stream) = (self.user_event(e)?, self.streams[lane]);
        if event.gpu.ordinal() != stream.gpu().ordinal() {
            // An event is recorded on its own context's streams: a record
            // on another GPU's stream takes a new event there (a wait
            // takes the latest record, as CUDA's does).
            event = Arc::new(stream.gpu().sync_event()?);
            // Commands recorded before may name the old one: it lives on.
            self.replaced_events.push(std::mem::replace(&mut self.user_events[e.0], event.clone()));
            self.exec.gpu.bind()?;
        }
        let thread = self.lanes.thread();
        self.dispatch(Command { thread, what: What::Record { stream, event: EventHandle(event.raw) } })?;
        self.schedule.record_event(e.0, lane);
        Ok(())
    }
    /// cuStreamWaitEvent: later work on `s` waits for `e`.
    pub fn wait(&mut self, s: StreamRef, e: EventRef) -> Result<()> {
        let lane = self.lane(s)?;
        let (event, stream) = (self.user_event(e)?, self.streams[lane]);
        let thread = self.lanes.thread();
        self.dispatch(Command { thread, what: What::Wait { stream, event: EventHandle(event.raw) } })?;
        self.reusable_end[lane] = None;
        self.schedule.stream_wait_event(lane, e.0);
        Ok(())
    }
    pub(super) fn user_event(&self, e: EventRef) -> Result<Arc<crate::gpu::Event>> {
        self.user_events.get(e.0).cloned().ok_or_else(|| LabError::config(format!("event {} was never made", e.0)))
    }
}
