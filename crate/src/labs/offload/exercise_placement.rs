//! Exercise 9's second part: given a GPU budget and a batch, choose how
//! many layers stay resident (R) and the ring's size (K), for the FP16
//! layers and again for the 4-bit ones (a quarter of the bytes, beside
//! FP8's scales and one layer dequantized). The checker
//! ([`check_placement`], one precision; [`check_placements`], several in
//! one report) times each choice on the queue model with the recording's
//! costs for that precision's layers against the planner's best under
//! that budget ([`best_placement`]), and names what a slower choice
//! wastes: budget left idle, a ring too small to hide the upload, slots
//! the ring does not need, activations that do not fit. No GPU: it is
//! judged on the queue model, live or recorded alike.
//!
//! May use: `network`, `forward` (the costs), `placement` (the planner,
//! the budget's room), `results` (the recording it judges on), `lab_kit`
//! and `units`. No CUDA.

use super::forward::Costs;
use super::network::{LayerKind, Placement, Precision};
use super::placement::{self, PlacementPlan, Room};
use super::results::{BatchPoint, OffloadResults};
use crate::error::Result;
use crate::lab_kit::check::CheckReport;
use crate::pipeline::machine::Machine;
use crate::units::{fmt_ms, Bytes};

/// How close to the planner's best a placement must come, on the queue model.
pub const PLACEMENT_WITHIN: f64 = 0.05;

/// Hints for the placement, one at a time ([`hint_placement`]).
pub const PLACEMENT_HINTS: &[&str] = &[
    "Count what the budget must hold before any weights: two activation buffers and the hidden ones for this batch, and cuBLAS's workspace. What is left, over one layer's weights, is how many layer buffers you have to spend.",
    "Each buffer is either a ring slot or a resident layer. A resident layer is one upload fewer every pass; a ring slot lets the copy stream run one more layer ahead of the GEMMs.",
    "Compare one layer's upload with its GEMMs at this batch. Where the upload is slower, the ring only has to keep the link busy, and every other buffer is best spent on resident layers; where the GEMMs are slower, the ring must hold enough slots that an upload is never waited for.",
    "The 4-bit layers: count again. A layer buffer holds about a quarter of an FP16 layer's bytes, and before any weights the budget also holds FP8's scales and one layer dequantized into FP8 for the GEMMs. With the uploads four times shorter, compare them with a layer's dequantization and GEMMs again before you size the ring.",
];

/// Placement hint `k` (from 1).
pub fn hint_placement(k: usize) -> String {
    crate::lab_kit::check::hint(PLACEMENT_HINTS, k)
}

/// The layers the placement exercise times at `p` in `precision`: FP16's
/// fused, or in a recording made before them, GEMM, ReLU, GEMM; FP8's and
/// the 4-bit ones' as their passes run them.
fn placement_kind(p: &BatchPoint, precision: Precision) -> LayerKind {
    match precision {
        Precision::Fp16 if p.layer_fused_ms.is_some() => LayerKind::Fused,
        Precision::Fp16 => LayerKind::Separate,
        Precision::Fp8 => LayerKind::Fp8,
        Precision::Int4 => LayerKind::Int4,
    }
}

/// What the placement exercise is judged with at `batch`: the layers'
/// kind, their costs, the queue model's machine, the budget's room (what
/// it holds besides layer buffers, and how many of those fit) and the
/// planner's best in it.
struct PlacementGround {
    kind: LayerKind,
    costs: Costs,
    machine: Machine,
    room: Room,
    best: PlacementPlan,
}

fn placement_ground(r: &OffloadResults, budget_mib: usize, batch: usize, precision: Precision, rep: &mut CheckReport) -> std::result::Result<PlacementGround, String> {
    let Some(p) = r.points.iter().find(|p| p.batch == batch) else {
        let have: Vec<String> = r.points.iter().map(|p| p.batch.to_string()).collect();
        return Err(format!("the recording holds no batch of {batch} tokens (it has {})", have.join(", ")));
    };
    let kind = placement_kind(p, precision);
    if kind == LayerKind::Separate {
        rep.note("this recording has no fused layers (made before them): the layers are timed as GEMM, ReLU, GEMM");
    }
    let costs = p.costs(kind).ok_or_else(|| format!("the recording has no {} layers' costs at {batch} tokens (made before them, or on a GPU without FP8)", precision.name()))?;
    let (machine, note) = r.checker_machine();
    if let Some(note) = note {
        rep.note(note);
    }
    let no_fit = |e: crate::error::LabError| format!("no placement fits a budget of {budget_mib} MiB at all: {e}");
    let room = placement::room(r.shape, batch, budget_mib, kind.precision()).map_err(no_fit)?;
    let best = placement::plan(r.shape, batch, &room, kind, costs, machine).map_err(no_fit)?;
    Ok(PlacementGround { kind, costs, machine, room, best })
}

/// The planner's placement of `r`'s network in `precision` under
/// `budget_mib` MiB at `batch` tokens (one of the recording's batches), as
/// [`check_placement`] judges against it.
pub fn best_placement(r: &OffloadResults, budget_mib: usize, batch: usize, precision: Precision) -> Result<PlacementPlan> {
    placement_ground(r, budget_mib, batch, precision, &mut CheckReport::new("the planner")).map(|g| g.best).map_err(crate::error::LabError::config)
}

/// Checks a placement of `r`'s network in `precision` under `budget_mib`
/// MiB at `batch` tokens (one of the recording's batches): its pass on the
/// queue model with the recording's costs for that precision's layers
/// against the planner's best (within [`PLACEMENT_WITHIN`]); a slower one
/// is named by what it wastes.
pub fn check_placement(r: &OffloadResults, budget_mib: usize, batch: usize, precision: Precision, mine: Placement) -> CheckReport {
    check_placements(r, budget_mib, batch, &[(precision, mine)])
}

/// Checks several placements under one budget and batch in one report,
/// each in its precision as [`check_placement`] judges it; with more than
/// one, each message starts with its precision's name.
pub fn check_placements(r: &OffloadResults, budget_mib: usize, batch: usize, placed: &[(Precision, Placement)]) -> CheckReport {
    let shape = r.shape;
    let layers: Vec<String> = placed.iter().map(|&(precision, _)| format!("{} in {}", Bytes(shape.layer_bytes_in(precision) as u64), precision.name())).collect();
    let mut rep = CheckReport::new(&format!("placement under {budget_mib} MiB at {batch} tokens ({} layers of {}; queue model)", shape.layers, layers.join(", ")));
    if placed.is_empty() {
        rep.problem("no placement was given to check");
    }
    for &(precision, mine) in placed {
        let named = if placed.len() > 1 { format!("{}: ", precision.name()) } else { String::new() };
        let mut one = CheckReport::new(precision.name());
        judge_placement(&mut one, r, budget_mib, batch, precision, mine);
        rep.absorb(one, &named);
    }
    rep
}

/// The notebook's exercise: an FP16 placement and a 4-bit one under one
/// budget at one batch, in one report ([`check_placements`]). Where the
/// recording has no 4-bit pass at that batch (made before it, or on a
/// GPU without FP8) the FP16 one is judged alone, and a note says so.
pub fn check_fp16_and_4_bit(r: &OffloadResults, budget_mib: usize, batch: usize, fp16: Placement, four_bit: Placement) -> CheckReport {
    if r.has_layers_at(batch, LayerKind::Int4) {
        return check_placements(r, budget_mib, batch, &[(Precision::Fp16, fp16), (Precision::Int4, four_bit)]);
    }
    let mut rep = check_placement(r, budget_mib, batch, Precision::Fp16, fp16);
    rep.note(format!("this recording has no 4-bit pass at {batch} tokens: the 4-bit placement is not judged"));
    rep
}

/// One placement judged into `rep`, as [`check_placement`] says.
fn judge_placement(rep: &mut CheckReport, r: &OffloadResults, budget_mib: usize, batch: usize, precision: Precision, mine: Placement) {
    let shape = r.shape;
    let ground = match placement_ground(r, budget_mib, batch, precision, rep) {
        Ok(g) => g,
        Err(e) => {
            rep.problem(e);
            return;
        }
    };
    let PlacementGround { kind, costs, machine, room, best } = ground;
    let (l, lb, budget) = (shape.layers, room.layer, room.budget());
    if mine.resident > l {
        rep.problem(format!("R = {}: the network has {l} layers, so at most {l} can be resident", mine.resident));
        return;
    }
    if mine.ring > l {
        rep.problem(format!("a ring of {}: more slots than the network has layers ({l})", mine.ring));
        return;
    }
    let holds = shape.placement_bytes(batch, mine, kind.precision());
    if holds > budget {
        rep.problem(format!(
            "{} does not fit: {} layer buffers ({}) beside the activations of {batch} tokens and {} ({}) take {}, {} over the {budget_mib} MiB budget",
            mine.label(),
            mine.buffers(),
            Bytes((mine.buffers() * lb) as u64),
            kind.precision().fixed_parts(),
            Bytes(room.fixed as u64),
            Bytes(holds as u64),
            Bytes((holds - budget) as u64)
        ));
        return;
    }
    if mine.resident < l && mine.ring == 0 {
        rep.problem(format!("no ring: the {} layers that are not resident have no slot to be uploaded into", l - mine.resident));
        return;
    }
    // The planner weighed most placements already; the rest are timed here.
    let predicted = best.predicted(mine).map(Ok).unwrap_or_else(|| super::forward::predict(shape, batch, placement::setup(mine, kind), costs, machine));
    let ms = match predicted {
        Ok(ms) => ms,
        Err(e) => {
            rep.problem(format!("the queue model could not time {}: {e}", mine.label()));
            return;
        }
    };
    let off = ms / best.predicted_ms - 1.0;
    rep.note(format!(
        "{}: predicted {} a pass ({} of GPU memory); the best under this budget: {} ({:+.1}%)",
        mine.label(),
        fmt_ms(ms),
        Bytes(holds as u64),
        fmt_ms(best.predicted_ms),
        100.0 * off
    ));
    if mine.resident == l && mine.ring > 0 {
        rep.note(format!("every layer is resident: the ring's {} slots hold nothing ({} of the budget)", mine.ring, Bytes((mine.ring * lb) as u64)));
    }
    if off <= PLACEMENT_WITHIN {
        return;
    }
    let idle = budget - holds;
    if idle >= lb && mine.resident < l {
        rep.problem(format!(
            "budget left idle: {} holds {} of the {budget_mib} MiB; {} ({:.0}%) holds nothing while {} layers still cross the link every pass, at {} an upload",
            mine.label(),
            Bytes(holds as u64),
            Bytes(idle as u64),
            100.0 * idle as f64 / budget as f64,
            l - mine.resident,
            fmt_ms(costs.h2d)
        ));
    } else if mine.ring > best.placement.ring {
        let work = kind.work();
        let why = if costs.h2d > costs.layer {
            format!(
                "uploads ({} each) are slower than a layer's {work} ({}), so the copy stream is never held back by a full ring",
                fmt_ms(costs.h2d),
                fmt_ms(costs.layer)
            )
        } else {
            format!("a few slots already keep the uploads ({} each) ahead of the {work} ({} a layer)", fmt_ms(costs.h2d), fmt_ms(costs.layer))
        };
        rep.problem(format!("the ring holds more slots than the pass can use: {why}; the slots past that hold weights no layer is waiting for"));
    } else {
        rep.problem(format!(
            "a ring of {} is too small to hide the uploads: the {} wait for weights still crossing the link ({} an upload against {} of {} a layer)",
            mine.ring,
            kind.work(),
            fmt_ms(costs.h2d),
            fmt_ms(costs.layer),
            kind.work()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::super::variant::Variant;
    use super::*;

    /// Every wrong placement a learner would give under the H100's
    /// recording fails naming its fault; the planner's and every honest
    /// near-best one passes; a check takes well under a second.
    #[test]
    fn a_placement_is_judged_on_its_time_and_a_slow_one_named_by_what_it_wastes() {
        let r = crate::labs::offload::fixture::results_beyond();
        let started = std::time::Instant::now();
        let check = |budget: usize, batch: usize, resident: usize, ring: usize| check_placement(&r, budget, batch, Precision::Fp16, Placement { resident, ring });
        // The planner's own choice, and one slot more in the ring where the link bounds (within 5%).
        let best = r.points[0].variant(Variant::Resident).unwrap().plan.clone().unwrap().placement;
        let rep = check(1536, 1024, best.resident, best.ring);
        assert!(rep.passed, "{rep}");
        assert!(rep.to_string().contains("+0.0%"), "{rep}");
        let rep = check(1536, 1024, best.resident - 1, best.ring + 1);
        assert!(rep.passed, "{rep}");
        // Budget left idle: the ring of 3 of lab 9's first half, nothing resident.
        let rep = check(1536, 1024, 0, 3);
        assert!(!rep.passed && rep.to_string().contains("budget left idle") && rep.to_string().contains("holds nothing while 96 layers"), "{rep}");
        // Slots the link cannot use: every spare buffer in the ring.
        let rep = check(1536, 1024, best.buffers() - 12, 12);
        assert!(!rep.passed && rep.to_string().contains("more slots than the pass can use"), "{rep}");
        // Too many buffers: the activations do not fit beside them.
        let rep = check(1536, 1024, best.resident + 3, best.ring);
        assert!(!rep.passed && rep.to_string().contains("does not fit") && rep.to_string().contains("over the 1536 MiB budget"), "{rep}");
        // No ring with layers to stream; a ring of one, timed like any other (slower here: named).
        let rep = check(1536, 1024, best.buffers(), 0);
        assert!(!rep.passed && rep.to_string().contains("no slot to be uploaded into"), "{rep}");
        let rep = check(1536, 1024, best.buffers() - 1, 1);
        assert!(rep.to_string().contains("predicted"), "a ring of one is timed, not refused: {rep}");
        // Far too many slots, or a budget past any size: refused, never a panic.
        assert!(check(1536, 1024, 0, usize::MAX).to_string().contains("more slots than the network has layers"));
        assert!(!check(usize::MAX, 1024, 96, 0).to_string().is_empty());
        // More resident layers than the network has; a batch the recording lacks.
        assert!(check(8192, 1024, 97, 0).to_string().contains("the network has 96 layers"));
        assert!(check(1536, 1000, 10, 2).to_string().contains("no batch of 1000 tokens"));
        // Every layer resident where they fit: passes, and a ring beside it is named as held for nothing.
        let rep = check(8192, 1024, 96, 2);
        assert!(rep.passed && rep.to_string().contains("hold nothing"), "{rep}");
        // The messages leave the fix to the hints: no message names the best placement.
        for rep in [check(1536, 1024, 0, 3), check(1536, 1024, best.buffers() - 12, 12)] {
            assert!(!rep.to_string().contains(&best.label()) && !rep.to_string().contains("more layers"), "{rep}");
        }
        assert!(started.elapsed().as_secs_f64() < 14.0, "fourteen checks in {:?}", started.elapsed());
        // A recording with no 4-bit pass: the notebook's pair judges FP16 alone, and says so.
        let rep = check_fp16_and_4_bit(&r, 1536, 1024, best, Placement { resident: 0, ring: 3 });
        assert!(rep.passed && rep.to_string().contains("the 4-bit placement is not judged"), "{rep}");
        assert!(check_placement(&r, 1536, 1024, Precision::Int4, best).to_string().contains("no 4-bit layers' costs at 1024 tokens"));
    }

    /// The 4-bit part, on the H200's recording (its 4-bit costs): the
    /// planner's 4-bit placement passes; FP16's placement given for the
    /// 4-bit layers, or the ring of 3 alone, leaves the budget idle; more
    /// 4-bit buffers than fit beside FP8's scales and the dequantized layer
    /// do not fit; in the notebook's pair, each problem names its precision
    /// and a right FP16 part is not blamed for a wrong 4-bit one.
    #[test]
    fn a_4_bit_placement_is_judged_on_its_own_sizes_and_costs() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/nvidia-h200/offload.json");
        let r = crate::labs::offload::OffloadRecord::load(&path).expect("the committed H200 recording of lab 9").results;
        let started = std::time::Instant::now();
        let (budget, batch) = (r.config.gpu_budget, r.points[0].batch);
        let fp16 = best_placement(&r, budget, batch, Precision::Fp16).unwrap().placement;
        let four_bit = best_placement(&r, budget, batch, Precision::Int4).unwrap().placement;
        assert!(four_bit.buffers() > 3 * fp16.buffers(), "a 4-bit layer is about a quarter of an FP16 one: {} against {} buffers", four_bit.buffers(), fp16.buffers());
        assert!(check_placement(&r, budget, batch, Precision::Int4, four_bit).passed);
        let rep = check_placement(&r, budget, batch, Precision::Int4, fp16);
        assert!(!rep.passed && rep.to_string().contains("budget left idle"), "{rep}");
        let rep = check_placement(&r, budget, batch, Precision::Int4, Placement { resident: four_bit.resident + 1, ring: four_bit.ring });
        assert!(!rep.passed && rep.to_string().contains("does not fit"), "{rep}");
        let rep = check_fp16_and_4_bit(&r, budget, batch, fp16, four_bit);
        assert!(rep.passed, "{rep}");
        let rep = check_fp16_and_4_bit(&r, budget, batch, fp16, Placement { resident: 0, ring: 3 });
        assert!(!rep.passed, "{rep}");
        let problems: Vec<&str> = rep.problems().collect();
        assert!(problems.len() == 1 && problems[0].starts_with("4-bit: budget left idle"), "{rep}");
        let rep = check_fp16_and_4_bit(&r, budget, batch, Placement { resident: 0, ring: 3 }, Placement { resident: 0, ring: 3 });
        assert!(rep.problems().any(|p| p.starts_with("FP16: ")) && rep.problems().any(|p| p.starts_with("4-bit: ")), "{rep}");
        for rep in [rep, check_placement(&r, budget, batch, Precision::Int4, fp16)] {
            assert!(!rep.to_string().contains(&four_bit.label()), "the messages leave the fix to the hints: {rep}");
        }
        assert!(started.elapsed().as_secs_f64() < 8.0, "eight checks in {:?}", started.elapsed());
    }
}
