//! Judging a learner's issue loop (the exercises of labs 5, 6 and 8; lab
//! 2 looks up its D2Hs with [`last_d2h_into_output`]): the
//! model runs it first and says what is wrong with its shape — a race,
//! wrong data, memory never released ([`shape`]); then its time is put
//! beside the given loop and the fix ([`Judge`]), predicted from a
//! recording's costs with no GPU or measured on the GPU, and judged.
//!
//! May use: `pipeline` (plans and the model), `gpu` (to run them), `measure`,
//! `lab_kit::check`.

use crate::error::Result;
use crate::gpu::{PlanRig, TimelineSource};
use crate::lab_kit::check::CheckReport;
use crate::measure::stats::Summary;
use crate::pipeline::cells::Provenance;
use crate::pipeline::dry_run::DryRun;
use crate::pipeline::machine::Machine;
use crate::pipeline::op::{Op, OpKind};
use crate::pipeline::plan::{cost_keys, Costs, Plan, OUTPUT, REUSED};
use crate::pipeline::schedule::Schedule;

/// The learner's loop run on the model: `None` (a failed check) if it
/// panicked or stopped with an error; else its model, with a problem
/// for its first race, its first wrong output element (for data nothing
/// computed, the op that reads what nothing wrote: [`first_unwritten_read`])
/// and any memory it never released.
pub fn shape(plan: &Plan, rep: &mut CheckReport) -> Option<DryRun> {
    let model = rep.learner("your loop", || plan.dry_run())?;
    if let Some(r) = model.schedule.races().first() {
        rep.problem(format!("race: {}", r.what));
    }
    let (cells, passes) = (Plan::output_cells(&model), plan.passes);
    // A run of elements is right when its first is: both step by one.
    if let Some((j, cell)) = cells.runs().map(|(r, p)| (r.start, p)).find(|&(j, c)| c != Provenance::after(j as u32, passes)) {
        let times = |k: u8| if k == 1 { "once".to_string() } else { format!("{k} times") };
        rep.problem(match cell {
            Provenance::Unset => copied_unwritten(&model.schedule, j)
                .unwrap_or_else(|| format!("wrong data: output element {j} never reached the host: a D2H is missing")),
            Provenance::Input(_) => format!("wrong data: output element {j} holds an input: a D2H reads the input, not the kernel's output"),
            Provenance::Output(i) | Provenance::Repeated(i, _) if i as usize != j => {
                format!("wrong data: output element {j} holds the result for element {i}: an offset is wrong")
            }
            Provenance::Output(_) => {
                format!("wrong data: output element {j} went through the kernel once, not {} times: a stage is missing, or reads its input instead of the stage before", passes)
            }
            Provenance::Repeated(_, k) if k > passes => {
                format!("wrong data: output element {j} went through the kernel {}, not {}: a kernel reads another kernel's output", times(k), times(passes))
            }
            Provenance::Repeated(_, k) => format!("wrong data: output element {j} went through the kernel {}, not {}: a stage is missing", times(k), times(passes)),
            Provenance::Summed { ranks, .. } => format!("wrong data: output element {j} holds a sum over {ranks} GPUs: an all-reduce summed data this loop's output should not hold"),
            Provenance::Garbage => match first_unwritten_read(&model.schedule) {
                Some(u) => format!("wrong data: output element {j} was computed from data nothing wrote: {}", u.describe(&model.schedule)),
                None => format!("wrong data: output element {j} was computed from data never uploaded: a kernel reads a range no H2D wrote"),
            },
        });
    }
    let leaked = model.unreleased();
    if !leaked.is_empty() {
        rep.problem(format!("memory never released: {} (the program's memory grows every batch)", leaked.join(", ")));
    }
    Some(model)
}

/// A read of device memory nothing had written ([`first_unwritten_read`]).
#[derive(Clone, Debug, PartialEq)]
pub struct UnwrittenRead {
    /// The op that reads it.
    pub op: usize,
    pub buffer: String,
    /// The elements it reads that nothing wrote before it (the first run of them).
    pub elements: std::ops::Range<u64>,
}

impl UnwrittenRead {
    /// "'stage 2, micro-batch 0' on GPU 1 reads elements 0..8 of activation
    /// received by GPU 1, and no copy or kernel issued before it writes
    /// there (...)": the GPU named where the schedule has several.
    pub fn describe(&self, schedule: &Schedule) -> String {
        let op = &schedule.ops[self.op];
        let on = if schedule.gpus().len() > 1 { format!(" on GPU {}", op.gpu) } else { String::new() };
        format!(
            "'{}'{on} reads elements {}..{} of {}, and no copy or kernel issued before it writes there (the step that fills them is missing, or issued after it)",
            op.label, self.elements.start, self.elements.end, self.buffer
        )
    }
}

/// The first op, in issue order, that reads device memory no op issued
/// before it wrote (a kernel, a device-to-device copy or an all-reduce
/// reading a range no upload, copy or kernel filled): where data nothing
/// computed enters a pipeline. Host buffers the lab fills before the loop
/// are not ops, so uploads' reads are not judged; an allocation writes
/// nothing. Offsets in f32 elements.
pub fn first_unwritten_read(schedule: &Schedule) -> Option<UnwrittenRead> {
    // Per buffer, the byte ranges written so far: sorted, disjoint, merged.
    let mut written: std::collections::HashMap<&str, Vec<(u64, u64)>> = std::collections::HashMap::new();
    for o in &schedule.ops {
        let reads_device = matches!(o.kind, OpKind::Kernel | OpKind::D2d(_) | OpKind::AllReduce(_));
        for a in o.accesses.iter().filter(|a| reads_device && !a.write && a.start < a.end) {
            // The first byte from a.start that no written range covers.
            let mut at = a.start;
            let ranges = written.get(a.buffer.as_str()).map_or(&[][..], |v| v.as_slice());
            for &(s, e) in ranges {
                if s > at {
                    break;
                }
                at = at.max(e);
            }
            if at < a.end {
                let next = ranges.iter().map(|r| r.0).find(|&s| s > at).unwrap_or(a.end).min(a.end);
                return Some(UnwrittenRead { op: o.id, buffer: a.buffer.clone(), elements: at / 4..next.div_ceil(4) });
            }
        }
        let fills = matches!(o.kind, OpKind::H2d | OpKind::Kernel | OpKind::D2d(_) | OpKind::AllReduce(_) | OpKind::Host);
        for a in o.accesses.iter().filter(|a| fills && a.write && a.start < a.end) {
            let v = written.entry(a.buffer.as_str()).or_default();
            let i = v.partition_point(|r| r.1 < a.start);
            let mut merged = (a.start, a.end);
            let mut k = i;
            while k < v.len() && v[k].0 <= merged.1 {
                merged = (merged.0.min(v[k].0), merged.1.max(v[k].1));
                k += 1;
            }
            v.splice(i..k, [merged]);
        }
    }
    None
}

/// The last D2H that wrote output element `j` into the plan's host output
/// buffer ([`OUTPUT`]), if any did.
pub fn last_d2h_into_output(schedule: &Schedule, j: usize) -> Option<&Op> {
    let byte = j as u64 * 4;
    schedule
        .ops
        .iter()
        .rev()
        .filter(|o| o.kind == OpKind::D2h)
        .find(|o| o.accesses.iter().any(|a| a.write && a.buffer == OUTPUT && (a.start..a.end).contains(&byte)))
}

/// Why output element `j` holds nothing although a D2H copied it there
/// (None where no D2H did): the last such D2H was issued before the op
/// that writes what it copies, or nothing ever writes that.
fn copied_unwritten(schedule: &Schedule, j: usize) -> Option<String> {
    let byte = j as u64 * 4;
    // The last D2H into element j, and the device buffer and byte it copies from.
    let d2h = last_d2h_into_output(schedule, j)?;
    let to = d2h.accesses.iter().find(|a| a.write && a.buffer == OUTPUT && (a.start..a.end).contains(&byte))?;
    let from = d2h.accesses.iter().find(|a| !a.write)?;
    let (buffer, at) = (from.buffer.clone(), from.start + (byte - to.start));
    let writes = |o: &&Op| o.kind.is_device_work() && o.accesses.iter().any(|a| a.write && a.buffer == buffer && (a.start..a.end).contains(&at));
    Some(match schedule.ops[d2h.id + 1..].iter().find(writes) {
        Some(later) => format!(
            "wrong data: output element {j} was copied to the host ('{}') before '{}' wrote it: the D2H is issued before the op that computes what it copies",
            d2h.label, later.label
        ),
        None => format!(
            "wrong data: output element {j} was copied to the host ('{}') from {buffer}, which nothing ever wrote there: the step that computes it (a stage, a kernel or a copy) is missing",
            d2h.label
        ),
    })
}

/// `recorded` with a cost for every op of `schedule`. A copy (device to
/// device included) or kernel of a size not recorded (a loop that splits
/// the work differently) costs the largest recorded op of its kind scaled
/// by elements (they take time in proportion to their data, less a
/// start-up the scale ignores); an allocation or release of a size not
/// recorded costs the recorded one of its kind nearest in size (their cost hardly depends on size at a
/// pipeline's sizes; lab 6 measures it by size).
pub fn costs_for(mut recorded: Costs, schedule: &Schedule) -> Costs {
    for (o, key) in schedule.ops.iter().zip(cost_keys(schedule)) {
        let (n, reused) = (key & !REUSED, key & REUSED != 0);
        if recorded.contains_key(&(o.kind, key)) {
            continue;
        }
        let same_kind = recorded.iter().filter(|((k, _), _)| *k == o.kind).map(|(&(_, e), &ms)| (e, ms));
        let cost = if o.kind.is_device_work() {
            same_kind.filter(|&(e, _)| e > 0 && e & REUSED == 0).max_by_key(|&(e, _)| e).map(|(e, ms)| ms * n as f64 / e as f64)
        } else if matches!(o.kind, OpKind::Alloc(_) | OpKind::Free(_)) {
            // Prefer a cost of the same reuse; else any of the kind.
            let near = |want_reused: bool| {
                recorded
                    .iter()
                    .filter(|((k, e), _)| *k == o.kind && (e & REUSED != 0) == want_reused)
                    .min_by_key(|((_, e), _)| (e & !REUSED).abs_diff(n))
                    .map(|(_, &ms)| ms)
            };
            near(reused).or_else(|| near(!reused))
        } else {
            None
        };
        if let Some(ms) = cost {
            recorded.insert((o.kind, key), ms);
        }
    }
    recorded
}

/// What a learner's loop is judged against: the loop they were given and
/// the fix, a pass within `slack` of the fix's time, and what a loop
/// slower than that usually still does (`slow_means`, said in the problem).
pub struct Judge {
    pub given: Plan,
    pub fixed: Plan,
    pub slack: f64,
    pub slow_means: &'static str,
}

impl Judge {
    /// The model's times of the given loop, the fix and the learner's
    /// (whose model is `model`), from `recorded` costs on `machine`, ms.
    pub fn predict(&self, mine: &Plan, model: &DryRun, machine: Machine, recorded: &Costs) -> Result<[f64; 3]> {
        let time =
            |plan: &Plan, model: &DryRun| -> Result<f64> { Ok(plan.prediction(model, machine, &costs_for(recorded.clone(), &model.schedule))?.total_ms) };
        Ok([time(&self.given, &self.given.dry_run()?)?, time(&self.fixed, &self.fixed.dry_run()?)?, time(mine, model)?])
    }

    /// The given loop, the fix and the learner's (whose model is `model`)
    /// run on the GPU: the learner's once first (verified: an error there
    /// is a failed check, `None`), then the three in turn, `repeats` times
    /// each; their medians, ms.
    pub fn measure(&self, rig: &mut PlanRig, mine: &Plan, model: &DryRun, repeats: usize, rep: &mut CheckReport) -> Result<Option<[f64; 3]>> {
        let (given_model, fixed_model) = (self.given.dry_run()?, self.fixed.dry_run()?);
        if rep.learner("your loop", || rig.run_modelled(mine, model, TimelineSource::Off)).is_none() {
            return Ok(None);
        }
        let mut t = [Vec::new(), Vec::new(), Vec::new()];
        for _ in 0..repeats.max(3) {
            t[0].push(rig.run_modelled(&self.given, &given_model, TimelineSource::Off)?.total_ms);
            t[1].push(rig.run_modelled(&self.fixed, &fixed_model, TimelineSource::Off)?.total_ms);
            t[2].push(rig.run_modelled(mine, model, TimelineSource::Off)?.total_ms);
        }
        let med = |v: &[f64]| Summary::of(v).map(|s| s.median);
        Ok(Some([med(&t[0])?, med(&t[1])?, med(&t[2])?]))
    }

    /// Judges the learner's time against the given loop's and the fix's
    /// (`[given, fixed, mine]`, ms; `how` says where they came from): a
    /// problem when it is more than `slack` slower than the fix.
    pub fn time(&self, rep: &mut CheckReport, how: &str, [given, fixed, mine]: [f64; 3]) {
        let lost = given - fixed;
        rep.note(format!("{how}: given loop {given:.3} ms, the fix {fixed:.3} ms, yours {mine:.3} ms"));
        if mine > fixed * (1.0 + self.slack) {
            rep.problem(format!("your loop takes {mine:.3} ms, {:.0}% more than the fix ({fixed:.3} ms): {}", 100.0 * (mine / fixed - 1.0), self.slow_means));
        } else if lost > 0.0 {
            rep.note(format!("you won back {:.3} of the {lost:.3} ms the given loop lost", (given - mine).clamp(0.0, lost)));
        }
    }

    /// [`Self::predict`], then [`Self::time`] (or a problem naming why it cannot be predicted).
    pub fn on_model(&self, rep: &mut CheckReport, mine: &Plan, model: &DryRun, machine: Machine, recorded: &Costs) {
        match self.predict(mine, model, machine, recorded) {
            Ok(t) => self.time(rep, "predicted from the recorded costs", t),
            Err(e) => rep.problem(format!("cannot predict your loop: {e}")),
        }
    }

    /// [`Self::measure`], then [`Self::time`].
    pub fn on_gpu(&self, rep: &mut CheckReport, rig: &mut PlanRig, mine: &Plan, model: &DryRun, repeats: usize) -> Result<()> {
        if let Some(t) = self.measure(rig, mine, model, repeats, rep)? {
            self.time(rep, "measured, medians", t);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::issue::Issue;

    #[test]
    fn a_read_of_device_memory_nothing_wrote_is_found_where_it_starts() {
        let mut m = DryRun::new();
        let s = m.stream();
        let h = m.host("input", 64, true);
        let (a, b) = (m.device("a", 64), m.device("b", 64));
        // Written in two pieces by two uploads, read whole: nothing unwritten.
        m.h2d(s, a, 0, h, 0, 16, "up 0").unwrap();
        m.h2d(s, a, 16, h, 16, 16, "up 1").unwrap();
        m.compute(s, a, 0, b, 0, 32, "k 0").unwrap();
        assert_eq!(first_unwritten_read(&m.schedule), None);
        // Read past what was uploaded: from element 32 to where the next upload starts.
        m.h2d(s, a, 48, h, 48, 16, "up 3").unwrap();
        m.compute(s, a, 24, b, 0, 40, "k 1").unwrap();
        let u = first_unwritten_read(&m.schedule).unwrap();
        assert_eq!((m.schedule.ops[u.op].label.as_str(), u.buffer.as_str(), u.elements.clone()), ("k 1", "a", 32..48));
        let said = u.describe(&m.schedule);
        assert!(said.starts_with("'k 1' reads elements 32..48 of a, and no copy or kernel issued before it writes there"), "{said}");
        // An allocation fills nothing.
        let mut m = DryRun::new();
        let s = m.stream();
        let scratch = m.alloc_async(s, 8, "scratch").unwrap();
        let out = m.device("out", 8);
        m.compute(s, scratch, 0, out, 0, 8, "k").unwrap();
        assert_eq!(first_unwritten_read(&m.schedule).map(|u| (u.buffer, u.elements)), Some(("scratch".to_string(), 0..8)));
    }
}
