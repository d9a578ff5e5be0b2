//! The queue model: a discrete-event model of the GPU's queues (copy
//! engines per direction, the SMs, each link, each host thread, the
//! driver's callback thread) that gives a schedule's start and end times
//! from each operation's duration measured alone ([`predict`]).

use super::machine::Machine;
use super::op::{Lane, Link, Op, OpId, OpKind};
use super::schedule::Schedule;
use std::collections::HashMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Resource {
    /// A GPU's copy engine for uploads (and downloads, with one engine).
    CopyUp(usize),
    /// A GPU's copy engine for downloads.
    CopyDown(usize),
    /// A GPU's SMs.
    Sms(usize),
    /// One stream's share of its GPU's SMs, where kernels of different
    /// streams run side by side ([`Machine::kernels_side_by_side`]).
    StreamSms(usize),
    /// A device-to-device copy's path: within a GPU, or from one GPU to
    /// another (each direction of a link is its own).
    Link(Link),
    /// A CPU thread of the program.
    Host(usize),
    /// The driver's one callback thread: every host function on every
    /// stream runs there, one at a time.
    CallbackThread,
    /// A stream-ordered allocation or release: it takes its turn in its
    /// stream and no engine.
    Stream(usize),
    /// A GPU's part of collectives (NCCL's kernels and the links they
    /// drive): one at a time per GPU, beside its copy engines and the
    /// kernels of other streams.
    Collective(usize),
}

impl Resource {
    /// Whether two running resources slow each other as the two
    /// directions of one path ([`Machine::both_ways`] for a GPU's host
    /// link, [`Machine::peer_both_ways`] for a link between GPUs).
    fn opposite(self, other: Resource) -> bool {
        match (self, other) {
            (Resource::CopyUp(a), Resource::CopyDown(b)) | (Resource::CopyDown(a), Resource::CopyUp(b)) => a == b,
            (Resource::Link(a), Resource::Link(b)) => a.is_peer() && a.from == b.to && a.to == b.from,
            _ => false,
        }
    }
}

impl Machine {
    fn resource(&self, op: &Op) -> Resource {
        match (op.kind, op.lane) {
            (OpKind::H2d, _) => Resource::CopyUp(op.gpu),
            (OpKind::D2h, _) if self.copy_engines >= 2 => Resource::CopyDown(op.gpu),
            (OpKind::D2h, _) => Resource::CopyUp(op.gpu),
            (OpKind::Kernel, Lane::Stream(s)) if self.kernels_side_by_side => Resource::StreamSms(s),
            (OpKind::Kernel, _) => Resource::Sms(op.gpu),
            (OpKind::D2d(link), _) => Resource::Link(link),
            (OpKind::AllReduce(_), _) => Resource::Collective(op.gpu),
            (OpKind::Host | OpKind::Alloc(_) | OpKind::Free(_), Lane::HostThread(t)) => Resource::Host(t),
            (OpKind::Host, Lane::Stream(_)) => Resource::CallbackThread,
            (OpKind::Alloc(_) | OpKind::Free(_), Lane::Stream(s)) => Resource::Stream(s),
        }
    }
}

/// The op a free resource would take next: (priority rank, when it became
/// ready (SMs only), whether it stays on the resource's last lane, id, the
/// half round trip a host function pays first).
type Candidate = (i32, f64, bool, OpId, f64);

/// A host function: CPU work enqueued on a stream.
fn is_host_fn(op: &Op) -> bool {
    op.kind == OpKind::Host && matches!(op.lane, Lane::Stream(_))
}

/// Predicted (start, end) of every op, in the units of `duration`.
///
/// An event-driven model: each op becomes ready once all its dependencies
/// have ended, and starts when its resource is free. A free resource keeps
/// serving the stream it served last while that stream's next op is for it
/// (as the GPU's engines drain one stream's consecutive copies or kernels
/// before switching: measured in lab 2, where breadth-first issue runs like
/// one chunk per stream), else it takes the earliest-issued ready op; among
/// kernels ready at once, the higher-priority stream's goes first (no kernel
/// is preempted). Kernels are assumed to fill the GPU, so one runs at a
/// time (unless [`Machine::kernels_side_by_side`]: each stream's run at
/// once with other streams'); one that takes the SMs straight from another stream's kernel it
/// waited behind is [`Machine::kernel_overlap`] shorter. While an H2D and a D2H run at once, each moves at
/// [`Machine::both_ways`] of its speed alone. A host function waits for the
/// callback thread and pays half its round trip before its body and half
/// after it (its stream's next op waits for that; measured in lab 4), and a
/// host thread that waited on its signal resumes [`Machine::signal_wake`]
/// after its body; a host thread woken by GPU work starts [`Machine::host_wake`] after it, and
/// so does GPU work it issues after waiting (it was not issued before). A
/// stream-ordered allocation or release takes its turn in its stream and
/// no engine; a blocking one takes its host thread, and those that
/// [`Machine::device_waits`] names first wait for every stream's work of
/// the kinds it names so far, and one it says is slowed beside GPU work
/// ([`DeviceWaits::slowed`](super::machine::DeviceWaits::slowed)) runs that much slower while such work runs.
/// Once the issuing thread has waited or worked (or from the start, when
/// the schedule was [`Schedule::issued_live`]), each GPU op it issues
/// starts at the earliest [`Machine::issue`] after the one before; the
/// first op after a wait, [`Machine::host_wake`] after what it waited for
/// (measured so, its issuing included). Ops of
/// several CPU threads are issued in the order they were recorded (what
/// the GPU executor does: it makes each thread's calls in turn).
pub fn predict(s: &Schedule, machine: Machine, duration: impl Fn(&Op) -> f64) -> Vec<(f64, f64)> {
    let n = s.ops.len();
    let mut times: Vec<Option<(f64, f64)>> = vec![None; n];
    // What a host function's stream still pays after its body.
    let mut release = vec![0.0f64; n];
    // Resources: when each became free, the lane it served last, what runs on it.
    let mut free: HashMap<Resource, f64> = HashMap::new();
    let mut last_lane: HashMap<Resource, Lane> = HashMap::new();
    // Per running op: (resource, start, work left in time-alone units).
    let mut running: Vec<(OpId, Resource, f64, f64)> = Vec::new();
    let mut now = 0.0f64;
    let mut done = 0;
    // When `op` may start given its dependencies (None: one has not ended).
    // A blocking call that waits for the device also waits for the last op
    // issued before it on every stream (a timing fact, not an ordering).
    // Per (stream, kind): the last GPU op of that kind issued so far.
    let mut last_on_stream: HashMap<(usize, OpKind), OpId> = HashMap::new();
    let mut device_wait: Vec<Vec<OpId>> = vec![Vec::new(); n];
    for op in &s.ops {
        match op.lane {
            Lane::Stream(st) => {
                last_on_stream.insert((st, op.kind), op.id);
            }
            Lane::HostThread(_) => {
                let waits = machine.device_waits.waits(op.kind);
                device_wait[op.id] = last_on_stream.iter().filter(|((_, kind), _)| waits.includes(*kind)).map(|(_, &id)| id).collect();
            }
        }
    }
    // Err(Some(d)): dependency d has not ended; Err(None): not issued yet.
    let ready_at = |op: &Op, times: &[Option<(f64, f64)>], release: &[f64], issued: usize, floor: &[f64]| -> std::result::Result<f64, Option<OpId>> {
        // Not issued yet (a host call on thread 0 is the one being made).
        let issuing = match op.lane {
            Lane::HostThread(0) => op.id > issued,
            Lane::HostThread(_) => false,
            Lane::Stream(_) => op.id >= issued,
        };
        if issuing {
            return Err(None);
        }
        let mut ready = floor[op.id];
        for &d in op.deps.iter().chain(&device_wait[op.id]) {
            let (_, end) = times[d].ok_or(Some(d))?;
            let dep = &s.ops[d];
            let woken = matches!(op.lane, Lane::HostThread(_)) && dep.is_gpu_work();
            let after = if woken || op.after_host_wait.binary_search(&d).is_ok() {
                // A CPU thread blocked on GPU work wakes, then works or issues.
                machine.host_wake.max(if dep.lane == op.lane { release[d] } else { 0.0 })
            } else if matches!(op.lane, Lane::HostThread(_)) && is_host_fn(dep) {
                // Woken by the host function it waited on.
                machine.signal_wake
            } else if dep.lane == op.lane {
                release[d]
            } else {
                0.0
            };
            ready = ready.max(end + after);
        }
        Ok(ready)
    };
    // The ops that may start (not started, and not known to wait on an op
    // that has not ended), in issue order; an op found waiting on one is
    // set aside with it until it ends (a long loop's schedule is thousands
    // of ops, and each step looks at every candidate).
    let mut candidates: std::collections::BTreeSet<OpId> = (0..n).collect();
    let mut waiters: Vec<Vec<OpId>> = vec![Vec::new(); n];
    // An op's ready time once known: its dependencies have ended and it was
    // issued, so nothing it depends on changes again.
    let mut ready_cache: Vec<Option<f64>> = vec![None; n];
    // The earliest each op can start for its issuing (GPU ops are issued by
    // thread 0, in order): 0 until that thread first waits or works (the
    // gate), then [`Machine::issue`] after the previous op or its wake-up.
    let mut floor: Vec<f64> = vec![0.0; n];
    let (mut issued, mut clock, mut live) = (0usize, 0.0f64, s.issued_live);
    // Whether CPU threads besides the issuing one (thread 0) have work: theirs is never waiting to be issued.
    let other_host = |id: &OpId| matches!(s.ops[*id].lane, Lane::HostThread(t) if t != 0);
    // Their ops among the candidates, so those past the issuing point are
    // looked at without the rest (which wait to be issued).
    let mut others: std::collections::BTreeSet<OpId> = (0..n).filter(other_host).collect();
    while done < n {
        while issued < n {
            let op = &s.ops[issued];
            match op.lane {
                Lane::Stream(_) => {
                    let mut woke = false;
                    if !op.after_host_wait.is_empty() {
                        // Issued once the thread woke from what it waited for:
                        // the wake-up is measured up to this op's start, its
                        // issuing included.
                        let ends: Option<Vec<f64>> = op.after_host_wait.iter().map(|&d| times[d].map(|t| t.1)).collect();
                        let Some(ends) = ends else { break };
                        let woken = ends.iter().fold(0.0f64, |c, &e| c.max(e + machine.host_wake));
                        woke = woken > clock;
                        clock = clock.max(woken);
                        live = true;
                    }
                    if live {
                        if !woke {
                            clock += machine.issue;
                        }
                        floor[issued] = clock;
                    }
                }
                Lane::HostThread(0) => {
                    floor[issued] = if live { clock } else { 0.0 };
                    // The thread issues nothing more until this call returns.
                    let Some((_, end)) = times[issued] else { break };
                    clock = clock.max(end);
                    live = true;
                }
                Lane::HostThread(_) => {}
            }
            issued += 1;
        }
        // Start what can start now: per free resource, the best ready op.
        let busy: Vec<Resource> = running.iter().map(|r| r.1).collect();
        let mut best: HashMap<Resource, Candidate> = HashMap::new();
        let mut next_ready = f64::INFINITY;
        let mut set_aside = Vec::new();
        // Ops past the issuing point wait to be issued, but for other CPU
        // threads' work: a replayed trace's tens of thousands are left
        // unlooked-at (what ready_at would say of each), in the order of
        // their ids still.
        let looked_at = candidates.range(..=issued).chain(others.range(issued.saturating_add(1)..));
        for &id in looked_at {
            let op = &s.ops[id];
            let resource = machine.resource(op);
            if busy.contains(&resource) {
                // Considered again when the resource frees up.
                continue;
            }
            let ready = match ready_cache[id].map_or_else(|| ready_at(op, &times, &release, issued, &floor), Ok) {
                Ok(ready) => {
                    ready_cache[id] = Some(ready);
                    ready
                }
                Err(waits_for) => {
                    if let Some(d) = waits_for {
                        set_aside.push((id, d));
                    }
                    continue;
                }
            };
            let free_at = *free.get(&resource).unwrap_or(&0.0);
            let half = if is_host_fn(op) {
                let asleep = ready > free_at + machine.host_fn_round_trip;
                if asleep { machine.host_fn_round_trip } else { machine.host_fn_awake }.min(machine.host_fn_round_trip) / 2.0
            } else {
                0.0
            };
            let start = (ready + half).max(free_at + half);
            if start > now + 1e-12 {
                next_ready = next_ready.min(start);
                continue;
            }
            let stays = last_lane.get(&resource) == Some(&op.lane);
            let rank = if op.kind == OpKind::Kernel { op.priority } else { 0 };
            // The SMs take the kernel that has waited longest (measured in
            // lab 5: a kernel ready on another stream runs before the next
            // kernel of the stream that just ran); copy engines keep serving
            // their stream.
            let waited = if matches!(resource, Resource::Sms(_)) { ready } else { 0.0 };
            let better =
                best.get(&resource).is_none_or(|&(r, w, st, _, _)| rank < r || (rank == r && (waited < w - 1e-9 || (waited <= w + 1e-9 && stays && !st))));
            if better {
                best.insert(resource, (rank, waited, stays, op.id, half));
            }
        }
        for (id, d) in set_aside {
            candidates.remove(&id);
            others.remove(&id);
            waiters[d].push(id);
        }
        if !best.is_empty() {
            let mut picks: Vec<(Resource, Candidate)> = best.into_iter().collect();
            picks.sort_by_key(|p| p.1 .3);
            for (resource, (_, waited, _, id, half)) in picks {
                candidates.remove(&id);
                others.remove(&id);
                release[id] = half;
                let mut work = duration(&s.ops[id]).max(0.0);
                // Straight after another stream's kernel, while waiting for
                // the SMs: it starts during that kernel's drain.
                let behind_other = last_lane.get(&resource).is_some_and(|&l| l != s.ops[id].lane);
                if matches!(resource, Resource::Sms(_)) && behind_other && waited < now - 1e-12 && free.get(&resource).is_some_and(|&f| f >= now - 1e-12) {
                    work = (work - machine.kernel_overlap).max(work / 2.0);
                }
                last_lane.insert(resource, s.ops[id].lane);
                running.push((id, resource, now, work));
            }
            continue;
        }
        // Nothing starts now: advance to the next end or the next start.
        // A blocking call slowed by GPU work beside it runs at the slowest
        // rate that work gives it.
        let beside: Vec<OpKind> = running.iter().filter(|r| matches!(s.ops[r.0].lane, Lane::Stream(_))).map(|r| s.ops[r.0].kind).collect();
        let rates: Vec<f64> = running
            .iter()
            .map(|&(id, r, _, _)| {
                if running.iter().any(|o| o.1.opposite(r)) {
                    if matches!(r, Resource::Link(_)) { machine.peer_both_ways } else { machine.both_ways }.clamp(0.01, 1.0)
                } else if matches!(s.ops[id].lane, Lane::HostThread(_)) {
                    let slowed = machine.device_waits.slowed(s.ops[id].kind);
                    1.0 / beside.iter().map(|&k| slowed.beside(k)).fold(1.0, f64::max)
                } else {
                    1.0
                }
            })
            .collect();
        let next_end = running.iter().zip(&rates).map(|(&(_, _, _, left), &rate)| now + left / rate).fold(f64::INFINITY, f64::min);
        let next = next_end.min(next_ready);
        assert!(next.is_finite(), "dependencies point only backwards, so some op can always run");
        for (r, rate) in running.iter_mut().zip(&rates) {
            r.3 -= (next - now) * rate;
        }
        now = next;
        running.retain(|&(id, resource, start, left)| {
            if left > 1e-9 * (1.0 + now.abs()) {
                return true;
            }
            times[id] = Some((start, now));
            free.insert(resource, now);
            done += 1;
            let woken: Vec<OpId> = waiters[id].drain(..).collect();
            others.extend(woken.iter().copied().filter(other_host));
            candidates.extend(woken);
            false
        });
    }
    times.into_iter().map(|t| t.expect("every op scheduled")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::machine::{DeviceWaits, SlowedBy, WaitsFor};
    use crate::pipeline::op::{Access, Memory, StreamDecl, StreamKind};

    /// H2D -> kernel -> D2H per chunk on `streams` streams, depth-first.
    fn chunked(chunks: usize, streams: usize) -> Schedule {
        let mut s = Schedule::new();
        for c in 0..chunks {
            let st = c % streams;
            let (a, b) = (c as u64 * 100, (c as u64 + 1) * 100);
            s.gpu_op(0, st, OpKind::H2d, &format!("H2D {c}"), vec![Access::read("host in", a, b), Access::write("dev in", a, b)]);
            s.gpu_op(0, st, OpKind::Kernel, &format!("kernel {c}"), vec![Access::read("dev in", a, b), Access::write("dev out", a, b)]);
            s.gpu_op(0, st, OpKind::D2h, &format!("D2H {c}"), vec![Access::read("dev out", a, b), Access::write("host out", a, b)]);
        }
        s
    }

    fn makespan(t: &[(f64, f64)]) -> f64 {
        t.iter().map(|x| x.1).fold(0.0, f64::max)
    }

    /// Streams 0 and 1 on GPU 0, streams 2 and 3 on GPU 1.
    fn two_gpus() -> Schedule {
        let mut s = Schedule::new();
        for (st, gpu) in [(0, 0), (1, 0), (2, 1), (3, 1)] {
            s.declare_stream(st, StreamDecl::new(StreamKind::NonBlocking, 0, gpu));
        }
        s
    }

    #[test]
    fn a_blocking_call_slowed_beside_downloads_runs_slower_only_while_one_runs() {
        // A D2H of 4 on stream 0; on the CPU, work of 2 then a cuMemAlloc of 1.
        let mut s = Schedule::new();
        s.gpu_op(0, 0, OpKind::D2h, "D2H", vec![]);
        s.host_op(0, "cpu", vec![]);
        s.host_call(0, OpKind::Alloc(Memory::Device), "alloc", vec![]);
        let dur = |o: &Op| match o.kind {
            OpKind::D2h => 4.0,
            OpKind::Host => 2.0,
            _ => 1.0,
        };
        let alloc = |m: Machine| predict(&s, m, dur)[2];
        assert_eq!(alloc(Machine::engines(2)), (2.0, 3.0));
        let slowed = |f: SlowedBy| Machine { device_waits: DeviceWaits { alloc_slowed: f, ..DeviceWaits::default() }, ..Machine::engines(2) };
        // 3x beside downloads: 2 ms of the D2H left do 2/3 of the call, the last third runs alone.
        let (start, end) = alloc(slowed(SlowedBy { downloads: 3.0, ..SlowedBy::NOT }));
        assert_eq!(start, 2.0);
        assert!((end - (4.0 + 1.0 / 3.0)).abs() < 1e-9, "{end}");
        // Slowed beside kernels only: a D2H beside it changes nothing.
        assert_eq!(alloc(slowed(SlowedBy { kernels: 3.0, ..SlowedBy::NOT })), (2.0, 3.0));
        assert_eq!(SlowedBy { downloads: 3.2, ..SlowedBy::NOT }.describe(), "3.20x beside downloads");
        assert!(!SlowedBy { uploads: f64::NAN, kernels: 0.5, ..SlowedBy::NOT }.any());
    }

    #[test]
    fn a_cpu_thread_waiting_on_a_host_function_resumes_its_wake_up_after_the_body() {
        // An upload of 1, a host function (round trip 0.4) after it; the CPU
        // learns of the host function, then works.
        let mut s = Schedule::new();
        s.gpu_op(0, 0, OpKind::H2d, "H2D", vec![]);
        let f = s.gpu_op(0, 0, OpKind::Host, "slot free", vec![]);
        s.host_learns(0, f);
        s.host_op(0, "produce", vec![]);
        let m = Machine { host_fn_round_trip: 0.4, host_fn_awake: 0.1, host_wake: 5.0, ..Machine::engines(2) };
        let t = predict(&s, m, |o| if o.kind == OpKind::Host && o.label == "slot free" { 0.0 } else { 1.0 });
        // The body runs half a round trip after the upload; no event's wake-up.
        assert!((t[1].0 - 1.2).abs() < 1e-9 && (t[2].0 - 1.2).abs() < 1e-9, "{t:?}");
        let t = predict(&s, Machine { signal_wake: 0.3, ..m }, |o| if o.label == "slot free" { 0.0 } else { 1.0 });
        assert!((t[2].0 - 1.5).abs() < 1e-9, "{t:?}");
    }

    #[test]
    fn one_stream_is_serial() {
        let s = chunked(4, 1);
        let t = predict(&s, Machine::engines(2), |_| 1.0);
        assert_eq!(makespan(&t), 12.0);
        assert!(s.races().is_empty());
    }

    #[test]
    fn streams_overlap_up_to_the_engine_bound() {
        // 4 chunks, H = K = D = 1 per chunk: two engines give max(H,K,D) + fill = 4 + 2.
        let s = chunked(4, 4);
        assert_eq!(makespan(&predict(&s, Machine::engines(2), |_| 1.0)), 6.0);
        // One engine shared by H2D and D2H: bound max(H + D, K) = 8 (plus a kernel's fill).
        let one = makespan(&predict(&s, Machine::engines(1), |_| 1.0));
        assert!((8.0..=9.0).contains(&one), "{one}");
    }

    #[test]
    fn an_engine_keeps_serving_one_stream_so_breadth_first_runs_a_stream_at_a_time() {
        // Breadth-first on 2 streams, 4 chunks: stream 0 holds H0 H2 K0 K2 D0 D2.
        let mut s = Schedule::new();
        for (kind, name) in [(OpKind::H2d, "H2D"), (OpKind::Kernel, "kernel"), (OpKind::D2h, "D2H")] {
            for c in 0..4u64 {
                s.gpu_op(0, (c % 2) as usize, kind, &format!("{name} {c}"), vec![Access::write(name, c * 8, c * 8 + 8)]);
            }
        }
        let t = predict(&s, Machine::engines(2), |_| 1.0);
        // The upload engine drains stream 0 (H0, H2) before stream 1 (H1, H3),
        // so stream 0's kernels start at 2, not after every upload.
        assert_eq!((t[0], t[2], t[1], t[3]), ((0.0, 1.0), (1.0, 2.0), (2.0, 3.0), (3.0, 4.0)));
        assert_eq!(t[4], (2.0, 3.0), "kernel 0 right after stream 0's uploads");
        // Like two chunks depth-first on two streams: 2 + 2 + 2 + fill.
        assert_eq!(makespan(&t), 8.0);
    }

    #[test]
    fn events_order_across_streams() {
        let mut s = Schedule::new();
        let up = s.gpu_op(0, 0, OpKind::H2d, "up", vec![Access::write("d", 0, 10)]);
        s.record_event(7, 0);
        s.stream_wait_event(1, 7);
        let k = s.gpu_op(0, 1, OpKind::Kernel, "k", vec![Access::read("d", 0, 10)]);
        assert!(s.happens_before(up, k));
        assert!(s.races().is_empty());
        let t = predict(&s, Machine::engines(2), |o| if o.kind == OpKind::H2d { 3.0 } else { 1.0 });
        assert_eq!(t[k], (3.0, 4.0));
    }

    #[test]
    fn prediction_respects_host_issue_order() {
        // The copy is issued after 5 units of host work: it cannot start before.
        let mut s = Schedule::new();
        s.host_op(0, "produce", vec![Access::write("h", 0, 8)]);
        let c = s.gpu_op(0, 0, OpKind::H2d, "copy", vec![Access::read("h", 0, 8)]);
        let t = predict(&s, Machine::engines(2), |o| if o.kind == OpKind::Host { 5.0 } else { 1.0 });
        assert_eq!(t[c], (5.0, 6.0));
    }

    #[test]
    fn host_functions_share_the_callback_thread_and_pay_their_round_trip() {
        let m = Machine { host_fn_round_trip: 2.0, host_fn_awake: 1.0, host_wake: 0.5, ..Machine::engines(2) };
        let mut s = Schedule::new();
        let f1 = s.gpu_op(0, 1, OpKind::Host, "fn on 1", vec![]);
        let k = s.gpu_op(0, 0, OpKind::Kernel, "long kernel", vec![]);
        let f0 = s.gpu_op(0, 0, OpKind::Host, "fn on 0", vec![]);
        let after = s.gpu_op(0, 0, OpKind::Kernel, "after fn", vec![]);
        s.record_event(3, 0);
        s.host_wait_event(1, 3);
        let woken = s.host_op(1, "woken", vec![]);
        let t = predict(&s, m, |o| if o.label == "long kernel" { 10.0 } else { 1.0 });
        // The callback thread has just started (awake): half of 1 before the body.
        assert_eq!(t[f1], (0.5, 1.5));
        assert_eq!(t[k], (0.0, 10.0));
        // Idle for longer than a round trip, the thread went to sleep: half of 2 before, half after.
        assert_eq!(t[f0], (11.0, 12.0));
        assert_eq!(t[after], (13.0, 14.0), "the stream is released half a round trip after the body");
        assert_eq!(t[woken], (14.5, 15.5), "a host thread wakes half a unit after the GPU work it waited for");
        // A second host function ready while the thread is busy waits for it.
        let mut two = Schedule::new();
        let a = two.gpu_op(0, 0, OpKind::Host, "a", vec![]);
        let b = two.gpu_op(0, 1, OpKind::Host, "b", vec![]);
        let t2 = predict(&two, m, |_| 1.0);
        assert_eq!((t2[a], t2[b]), ((0.5, 1.5), (2.0, 3.0)));
        // No host costs: a plain machine changes nothing for GPU pipelines.
        let plain = predict(&s, Machine::engines(2), |o| if o.label == "long kernel" { 10.0 } else { 1.0 });
        assert_eq!(plain[after], (11.0, 12.0));
    }

    #[test]
    fn the_legacy_stream_serializes_blocking_streams_but_not_non_blocking_ones() {
        let mut s = Schedule::new();
        s.declare_stream(0, StreamDecl::new(StreamKind::Blocking, 0, 0));
        s.declare_stream(1, StreamDecl::new(StreamKind::NonBlocking, 0, 0));
        s.declare_stream(2, StreamDecl::new(StreamKind::Legacy, 0, 0));
        s.declare_stream(3, StreamDecl::new(StreamKind::PerThread, 0, 0));
        let a = s.gpu_op(0, 0, OpKind::Kernel, "on blocking", vec![]);
        let b = s.gpu_op(0, 1, OpKind::H2d, "on non-blocking", vec![]);
        let p = s.gpu_op(0, 3, OpKind::D2h, "on per-thread", vec![]);
        let l = s.gpu_op(0, 2, OpKind::H2d, "tiny op on the NULL stream", vec![]);
        let after_a = s.gpu_op(0, 0, OpKind::Kernel, "blocking, after", vec![]);
        let after_b = s.gpu_op(0, 1, OpKind::H2d, "non-blocking, after", vec![]);
        assert!(s.happens_before(a, l) && s.happens_before(p, l), "the NULL stream waits for blocking and per-thread work");
        assert!(!s.happens_before(b, l), "but not for a non-blocking stream's");
        assert!(s.happens_before(l, after_a) && !s.happens_before(l, after_b));
        let t = predict(&s, Machine::engines(2), |o| if o.kind == OpKind::Kernel { 10.0 } else { 1.0 });
        assert_eq!(t[l], (10.0, 11.0), "the tiny op waits for the blocking stream's kernel");
        assert_eq!(t[after_a], (11.0, 21.0));
        assert_eq!(t[after_b], (1.0, 2.0), "the non-blocking stream runs on");
        // Undeclared streams are non-blocking: the labs' pipelines are unchanged.
        let mut plain = Schedule::new();
        plain.gpu_op(0, 0, OpKind::Kernel, "k", vec![]);
        let x = plain.gpu_op(0, 1, OpKind::Kernel, "k2", vec![]);
        assert!(plain.ops[x].deps.is_empty());
    }

    #[test]
    fn a_high_priority_kernel_goes_first_when_the_sms_free_up() {
        // Two background streams with kernels queued from the start; the
        // urgent kernel is ready at 0.5, after its input arrives.
        let mut s = Schedule::new();
        s.declare_stream(0, StreamDecl::new(StreamKind::NonBlocking, 0, 0));
        s.declare_stream(1, StreamDecl::new(StreamKind::NonBlocking, 0, 0));
        s.declare_stream(2, StreamDecl::new(StreamKind::NonBlocking, -5, 0));
        let first = s.gpu_op(0, 0, OpKind::Kernel, "background a0", vec![]);
        let a1 = s.gpu_op(0, 0, OpKind::Kernel, "background a1", vec![]);
        let b0 = s.gpu_op(0, 1, OpKind::Kernel, "background b0", vec![]);
        s.gpu_op(0, 2, OpKind::H2d, "urgent's input", vec![]);
        let urgent = s.gpu_op(0, 2, OpKind::Kernel, "urgent", vec![]);
        let dur = |o: &Op| if o.kind == OpKind::H2d { 0.5 } else { 1.0 };
        let t = predict(&s, Machine::engines(2), dur);
        assert_eq!(t[first], (0.0, 1.0), "a running kernel is not preempted");
        assert_eq!(t[urgent], (1.0, 2.0), "then the urgent one, ahead of every waiting kernel");
        let mut same = s.clone();
        same.ops.iter_mut().for_each(|o| o.priority = 0);
        let t = predict(&same, Machine::engines(2), dur);
        assert_eq!(t[b0], (1.0, 2.0), "without priority the kernel that waited longest goes first (b0, ready at 0)");
        assert_eq!((t[urgent], t[a1]), ((2.0, 3.0), (3.0, 4.0)), "then the urgent one (ready at 0.5), then a1 (ready at 1)");
    }

    #[test]
    fn a_kernel_waiting_behind_another_streams_kernel_starts_during_its_drain() {
        let mut s = Schedule::new();
        let a0 = s.gpu_op(0, 0, OpKind::Kernel, "a0", vec![]);
        let a1 = s.gpu_op(0, 0, OpKind::Kernel, "a1", vec![]);
        let b0 = s.gpu_op(0, 1, OpKind::Kernel, "b0", vec![]);
        // 8 kernels of 1 alternating over two streams took 6.25: each after the first saved 0.25.
        let m = Machine::engines(2).with_kernel_overlap(1.0, 8, 6.25);
        assert_eq!(m.kernel_overlap, 0.25);
        let t = predict(&s, m, |_| 1.0);
        assert_eq!(t[a0], (0.0, 1.0), "the first kernel pays in full");
        assert_eq!(t[b0], (1.0, 1.75), "b0 waited behind another stream's kernel");
        assert_eq!(t[a1], (1.75, 2.5), "so did a1 (ready at 1, behind b0)");
        let mut one = Schedule::new();
        let k: Vec<OpId> = (0..3).map(|i| one.gpu_op(0, 0, OpKind::Kernel, &format!("k{i}"), vec![])).collect();
        assert_eq!(predict(&one, m, |_| 1.0)[k[2]], (2.0, 3.0), "on one stream each kernel waits for the whole drain");
        assert_eq!(Machine::engines(2).with_kernel_overlap(1.0, 8, 9.0).kernel_overlap, 0.0, "slower side by side saves nothing");
        assert_eq!(Machine::engines(2).with_kernel_overlap(1.0, 8, 0.0).kernel_overlap, 0.5, "never more than half a kernel");
    }

    #[test]
    fn after_its_first_wait_the_cpu_issues_each_op_in_turn() {
        let mut s = Schedule::new();
        let k = s.gpu_op(0, 0, OpKind::Kernel, "k", vec![]);
        let a = s.gpu_op(0, 1, OpKind::H2d, "a", vec![]);
        let a2 = s.gpu_op(0, 1, OpKind::H2d, "a2", vec![]);
        s.host_wait_stream(0, 0);
        let b = s.gpu_op(0, 1, OpKind::H2d, "b", vec![]);
        let c = s.gpu_op(0, 0, OpKind::Kernel, "c", vec![]);
        let m = Machine { host_wake: 0.5, issue: 0.25, ..Machine::engines(2) };
        let t = predict(&s, m, |_| 1.0);
        assert_eq!((t[k], t[a], t[a2]), ((0.0, 1.0), (0.0, 1.0), (1.0, 2.0)), "issued behind the gate: all there when the GPU starts");
        assert_eq!(t[b], (2.0, 3.0), "woke and issued by 1.5 (the wake-up is measured to the next op's start), then waits for a2");
        assert_eq!(t[c], (1.75, 2.75), "issued an issue time after b");
        let none = predict(&s, Machine { issue: 0.0, ..m }, |_| 1.0);
        assert_eq!(none[c], (1.5, 2.5), "with no issue cost it starts as the thread wakes");
    }

    #[test]
    fn kernels_side_by_side_run_each_stream_at_once_with_the_others() {
        // Three kernels of 1 on each of two streams, the second stream's
        // last waiting (an event) for the first's last: one at a time they
        // take 6; side by side, each stream takes 3, and the join 1 more.
        let mut s = Schedule::new();
        let mut last = Vec::new();
        for st in 0..2 {
            if st == 1 {
                s.record_event(0, 0);
            }
            for i in 0..3 {
                if st == 1 && i == 2 {
                    s.stream_wait_event(1, 0);
                }
                last.push(s.gpu_op(0, st, OpKind::Kernel, &format!("k{st}.{i}"), vec![]));
            }
        }
        assert_eq!(makespan(&predict(&s, Machine::engines(2), |_| 1.0)), 6.0);
        let t = predict(&s, Machine { kernels_side_by_side: true, ..Machine::engines(2) }, |_| 1.0);
        assert_eq!((t[last[2]], t[last[5]]), ((2.0, 3.0), (3.0, 4.0)), "{t:?}");
    }

    #[test]
    fn with_no_gate_each_op_waits_for_its_issue_from_the_start() {
        // Four kernels of 1 on four streams: behind the gate they all start
        // at once (one at a time on the SMs); issued live, the 4th cannot
        // start before 4 issue costs have passed.
        let mut s = Schedule::new();
        let k: Vec<OpId> = (0..4).map(|i| s.gpu_op(0, i, OpKind::H2d, &format!("k{i}"), vec![])).collect();
        let m = Machine { issue: 2.0, ..Machine::engines(4) };
        assert_eq!(predict(&s, m, |_| 1.0)[k[3]], (3.0, 4.0), "gated: the engine serves them back to back");
        s.issued_live = true;
        let t = predict(&s, m, |_| 1.0);
        assert_eq!((t[k[0]], t[k[3]]), ((2.0, 3.0), (8.0, 9.0)), "live: each starts as it is issued");
    }

    #[test]
    fn both_directions_at_once_each_run_slower_as_measured() {
        // H2D of 4 and D2H of 2 at once, each at half speed while both run.
        let mut s = Schedule::new();
        let up = s.gpu_op(0, 0, OpKind::H2d, "up", vec![]);
        let down = s.gpu_op(0, 1, OpKind::D2h, "down", vec![]);
        let m = Machine { both_ways: 0.5, ..Machine::engines(2) };
        let t = predict(&s, m, |o| if o.kind == OpKind::H2d { 4.0 } else { 2.0 });
        // The D2H needs 2 units of work at half speed: done at 4; the H2D
        // has done 2 of its 4 by then, and the rest alone: done at 6.
        assert_eq!(t[down], (0.0, 4.0));
        assert_eq!(t[up], (0.0, 6.0));
        // With one copy engine the two never overlap, so nothing slows.
        let one = predict(&s, Machine { both_ways: 0.5, ..Machine::engines(1) }, |o| if o.kind == OpKind::H2d { 4.0 } else { 2.0 });
        assert_eq!(one.iter().map(|x| x.1).fold(0.0, f64::max), 6.0);
    }

    #[test]
    fn a_blocking_free_that_waits_for_the_device_stalls_the_other_stream_in_time_only() {
        // Stream 1 runs a long kernel; the CPU frees a buffer with cuMemFree,
        // then issues stream 0's next copy.
        let mut s = Schedule::new();
        let long = s.gpu_op(0, 1, OpKind::Kernel, "long kernel", vec![]);
        s.gpu_op(0, 0, OpKind::Alloc(Memory::Pool), "cuMemAllocAsync x", vec![Access::write("x", 0, 8)]);
        let free = s.host_call(0, OpKind::Free(Memory::Device), "cuMemFree y", vec![]);
        let next = s.gpu_op(0, 0, OpKind::H2d, "next copy", vec![]);
        let dur = |o: &Op| match o.kind {
            OpKind::Kernel => 10.0,
            OpKind::Free(_) => 0.5,
            OpKind::Alloc(_) => 0.0,
            _ => 1.0,
        };
        let quick = predict(&s, Machine::engines(2), dur);
        assert_eq!((quick[free], quick[next]), ((0.0, 0.5), (0.5, 1.5)), "a free that does not wait costs only itself");
        let waits = Machine { device_waits: DeviceWaits { free: WaitsFor::EVERYTHING, ..DeviceWaits::default() }, host_wake: 0.25, ..Machine::engines(2) };
        let t = predict(&s, waits, dur);
        assert_eq!(t[free], (10.25, 10.75), "it waits for the other stream's kernel, then wakes");
        assert_eq!(t[next], (10.75, 11.75), "so stream 0's next copy is issued only then");
        assert!(!s.happens_before(long, free), "the wait is timing only: the schedule never counts on it");
        // A free that waits only for copies passes the kernel by.
        let copies = WaitsFor { uploads: true, downloads: true, kernels: false };
        let t = predict(&s, Machine { device_waits: DeviceWaits { free: copies, ..DeviceWaits::default() }, ..waits }, dur);
        assert_eq!(t[free], (0.0, 0.5), "{t:?}");
        assert_eq!(DeviceWaits { pinned_free: copies, ..DeviceWaits::default() }.waits(OpKind::Free(Memory::Pinned)), copies);
        assert!(!DeviceWaits { free: WaitsFor::EVERYTHING, ..DeviceWaits::default() }.waits(OpKind::Free(Memory::Pool)).any());
        assert_eq!(copies.describe(), "uploads and downloads");
        // Waiting for everything includes host functions and stream-ordered memory calls.
        assert!(WaitsFor::EVERYTHING.includes(OpKind::Host) && WaitsFor::EVERYTHING.includes(OpKind::Free(Memory::Pool)));
        assert!(!copies.includes(OpKind::Host) && !copies.includes(OpKind::Kernel));
        assert_eq!(WaitsFor::EVERYTHING.describe(), "all GPU work");
        assert_eq!(WaitsFor::NOTHING.describe(), "nothing");
    }

    #[test]
    fn a_call_that_waits_for_downloads_waits_for_the_last_one_on_each_stream() {
        // Stream 0: an upload, then a long download; stream 1: a kernel. A
        // cuMemAlloc that waits for downloads ends after the download (and
        // so after the upload before it), not after the kernel alone.
        let mut s = Schedule::new();
        s.gpu_op(0, 0, OpKind::H2d, "up", vec![]);
        let down = s.gpu_op(0, 0, OpKind::D2h, "down", vec![]);
        s.gpu_op(0, 1, OpKind::Kernel, "kernel", vec![]);
        let alloc = s.host_call(0, OpKind::Alloc(Memory::Device), "cuMemAlloc", vec![]);
        let dur = |o: &Op| match o.kind {
            OpKind::Kernel => 20.0,
            OpKind::D2h => 5.0,
            OpKind::H2d => 1.0,
            _ => 0.5,
        };
        let m = |w: WaitsFor| predict(&s, Machine { device_waits: DeviceWaits { alloc: w, ..DeviceWaits::default() }, ..Machine::engines(2) }, dur);
        assert_eq!(m(WaitsFor { downloads: true, ..WaitsFor::NOTHING })[alloc], (6.0, 6.5));
        assert_eq!(m(WaitsFor { uploads: true, ..WaitsFor::NOTHING })[alloc], (1.0, 1.5));
        assert_eq!(m(WaitsFor::EVERYTHING)[alloc], (20.0, 20.5));
        assert_eq!(m(WaitsFor::NOTHING)[alloc], (0.0, 0.5));
        assert!(down < alloc);
    }

    #[test]
    fn each_gpu_has_its_own_sms_and_copy_engines() {
        let mut s = two_gpus();
        let k0 = s.gpu_op(0, 0, OpKind::Kernel, "k on GPU 0", vec![]);
        let k1 = s.gpu_op(0, 2, OpKind::Kernel, "k on GPU 1", vec![]);
        let up0 = s.gpu_op(0, 1, OpKind::H2d, "up to GPU 0", vec![]);
        let up1 = s.gpu_op(0, 3, OpKind::H2d, "up to GPU 1", vec![]);
        let k0b = s.gpu_op(0, 1, OpKind::Kernel, "second k on GPU 0", vec![]);
        assert_eq!((s.ops[k0].gpu, s.ops[k1].gpu), (0, 1));
        assert_eq!(s.gpus(), [0, 1]);
        let t = predict(&s, Machine::engines(2), |o| if o.kind == OpKind::Kernel { 10.0 } else { 3.0 });
        assert_eq!((t[k0], t[k1]), ((0.0, 10.0), (0.0, 10.0)), "two GPUs compute at once");
        assert_eq!((t[up0], t[up1]), ((0.0, 3.0), (0.0, 3.0)), "and upload at once");
        assert_eq!(t[k0b], (10.0, 20.0), "one GPU's kernels still take turns");
    }

    #[test]
    fn a_peer_copy_takes_its_link_and_the_two_directions_slow_each_other_as_measured() {
        let (there, back) = (Link { from: 0, to: 1 }, Link { from: 1, to: 0 });
        let mut s = two_gpus();
        let k = s.gpu_op(0, 0, OpKind::Kernel, "k", vec![]);
        let up = s.gpu_op(0, 1, OpKind::H2d, "up", vec![]);
        let p01 = s.gpu_op(0, 1, OpKind::D2d(there), "peer 0->1", vec![]);
        let p10 = s.gpu_op(0, 3, OpKind::D2d(back), "peer 1->0", vec![]);
        let p01b = s.gpu_op(0, 0, OpKind::D2d(there), "peer 0->1 again", vec![]);
        let dur = |o: &Op| match o.kind {
            OpKind::Kernel => 10.0,
            OpKind::H2d => 2.0,
            _ => 4.0,
        };
        let t = predict(&s, Machine::engines(2), dur);
        assert_eq!(t[p10], (0.0, 4.0), "the other direction is its own path");
        assert_eq!(t[p01], (2.0, 6.0), "after the H2D on its stream, beside the kernel");
        assert_eq!(t[p01b], (10.0, 14.0), "after the kernel on its stream; the link was free");
        assert_eq!(t[k], (0.0, 10.0));
        assert_eq!(t[up], (0.0, 2.0), "a peer copy does not take the host link's engines");
        // Each direction at half speed while both run: 1->0 runs alone
        // until 0->1 starts at 2 (2 of its 4 done), its other 2 at half
        // speed end at 6; 0->1 has done 2 by then, its other 2 alone end at 8.
        let m = Machine { peer_both_ways: 0.5, ..Machine::engines(2) };
        let half = predict(&s, m, dur);
        assert_eq!(half[p10], (0.0, 6.0));
        assert_eq!(half[p01], (2.0, 8.0));
        assert_eq!(OpKind::D2d(there).label(), "peer");
        assert_eq!(OpKind::D2d(Link { from: 1, to: 1 }).label(), "D2D");
        assert_eq!(OpKind::D2d(back).drawn(), OpKind::D2d(there), "one colour for every peer copy");
        assert!(OpKind::D2d(there).is_device_work() && !OpKind::Host.is_device_work());
        assert_eq!((there.to_string(), Link { from: 1, to: 1 }.to_string()), ("GPU 0 -> GPU 1".to_string(), "GPU 1".to_string()));
        assert_eq!(Link::between(0, 300), None);
    }

    #[test]
    fn a_collectives_ranks_start_together_beside_the_kernels_of_other_streams() {
        // GPU 0's gradients take 10, GPU 1's 4: the all-reduce's ranks
        // both start once both are done, at 10, on the comm streams (1, 3),
        // while the next kernels run on the compute streams (0, 2).
        let mut s = two_gpus();
        let g0 = s.gpu_op(0, 0, OpKind::Kernel, "grad 0", vec![Access::write("g0", 0, 16)]);
        let g1 = s.gpu_op(0, 2, OpKind::Kernel, "grad 1", vec![Access::write("g1", 0, 16)]);
        s.record_event(0, 0);
        s.stream_wait_event(1, 0);
        s.record_event(1, 2);
        s.stream_wait_event(3, 1);
        let rank = |b: &str| vec![Access::read(b, 0, 16), Access::write(b, 0, 16)];
        let ar = s.collective(0, &[(1, rank("g0")), (3, rank("g1"))], OpKind::AllReduce(2), "all-reduce");
        let next0 = s.gpu_op(0, 0, OpKind::Kernel, "next layer 0", vec![]);
        let next1 = s.gpu_op(0, 2, OpKind::Kernel, "next layer 1", vec![]);
        assert!(s.races().is_empty(), "{:?}", s.races());
        assert!(s.happens_before(g1, ar[0]) && s.happens_before(g0, ar[1]), "each rank's part waits for every rank's stream");
        let dur = |o: &Op| match (o.kind, o.gpu) {
            (OpKind::Kernel, 0) => 10.0,
            (OpKind::Kernel, _) => 4.0,
            _ => 6.0,
        };
        let t = predict(&s, Machine::engines(2), dur);
        assert_eq!((t[ar[0]], t[ar[1]]), ((10.0, 16.0), (10.0, 16.0)));
        assert_eq!((t[next0], t[next1]), ((10.0, 20.0), (4.0, 8.0)), "compute runs beside the collective");
        assert_eq!((OpKind::AllReduce(8).label(), OpKind::AllReduce(8).drawn()), ("all-reduce", OpKind::AllReduce(2)));
        assert!(OpKind::AllReduce(2).is_device_work());
    }
}
