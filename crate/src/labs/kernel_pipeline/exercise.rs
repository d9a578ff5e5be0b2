//! Lab 7's exercise: the learner makes the naive kernel double-buffered in
//! `notebooks/exercises/07-double-buffered.cu`. The checker compiles their
//! file with NVRTC (a compile error is a failed check quoting NVRTC's log),
//! reads the PTX for the kernel's name and parameters as the lab launches
//! it and for asynchronous copies, and on a GPU checks every output
//! against the CPU reference on fresh random input and times the kernel
//! against the naive one (one block per SM), rounds interleaved, saying
//! which of these failed. With no GPU it judges what it can: the compile,
//! the signature, the copies and which parameter is read and which
//! written.

use super::kernel::{TileKernel, TileKind, TileShape};
use super::measure::TileData;
use super::KernelPipelineConfig;
use crate::error::Result;
use crate::gpu::kernels;
use crate::gpu::Gpu;
use crate::lab_kit::check::CheckReport;
use crate::lab_kit::progress::{Examples, Exercise, FileAnswer};
use crate::measure::stats::Summary;

/// The exercise, as the course lists it (`overlap-lab progress`).
pub const EXERCISES: &[Exercise] = &[Exercise {
    id: "07-kernel-pipeline",
    asks: "a double-buffered tile kernel",
    file: Some(FileAnswer { path: "exercises/07-double-buffered.cu", problems: offline_problems }),
    hints: HINTS,
    // The wrong one: the given kernel, answered only with a comment, still
    // copies through registers.
    examples: Examples::File {
        right: || solution_source().to_string(),
        wrong: |given| format!("// my answer: not yet\n{given}"),
        mistake: "no asynchronous copy",
    },
}];

/// The problem of a check with no GPU that only says so.
const NEEDS_A_GPU: &str =
    "whether every output is right and whether it beats the naive kernel is judged on a GPU: there is none here, so the check is not complete";

/// What [`check_offline`] finds wrong in `source` at the lab's default
/// settings (the recordings' too; the notebook's check uses its recording's),
/// beyond needing a GPU for the rest (nothing, where this machine cannot
/// compile it, [`Toolchain::problem`]: the verdict saved by the notebook
/// stands then).
fn offline_problems(source: &str) -> Vec<String> {
    let toolchain = Toolchain::here();
    if toolchain.problem(source).is_some() {
        return Vec::new();
    }
    let rep = check_offline_with(&toolchain, "07-double-buffered.cu", source, &KernelPipelineConfig::default());
    rep.problems().filter(|p| *p != NEEDS_A_GPU).map(String::from).collect()
}

/// The exercise as the notebook names it.
pub const EXERCISE: &str = "lab 7: a double-buffered tile kernel";

/// The shape the checker compiles the learner's file for: the lab's tile,
/// 256 threads, 2 stages.
pub fn shape(cfg: &KernelPipelineConfig) -> TileShape {
    TileShape { tile: cfg.tile, threads: 256, stages: 2 }
}

/// The blur's vector width of the given file (one output at a time, by
/// `blur_at`): the checker compiles the learner's file, the naive kernel
/// and the solution at it, so a kernel that calls the header's `blur_tile`
/// is timed on its pipeline, not on a wider blur.
pub const GIVEN_VECTOR_WIDTH: u32 = 1;

/// How much slower than the solution (its median time) a kernel may be and
/// still count as double-buffered. One stage of asynchronous copies, which
/// waits for each tile right after issuing it, is far slower than two at
/// the lab's tile size, yet can beat the naive kernel: beating naive alone
/// would not tell them apart.
pub const SOLUTION_SLACK: f64 = 0.15;

/// The solution: the lab's own asynchronous-copy kernel (kernels/tile_async.cu).
pub fn solution_source() -> &'static str {
    super::kernel::TILE_ASYNC.source
}

/// What the PTX says without running it: `None` if the kernel copies
/// asynchronously, else the problem in words.
pub fn ptx_problem(ptx: &str) -> Option<String> {
    if !ptx.contains("cp.async") {
        return Some("your kernel has no asynchronous copy (no cp.async in its PTX): every tile still goes through registers while the block waits".into());
    }
    if !ptx.contains("cp.async.wait_group") && !ptx.contains("cp.async.wait_all") && !ptx.contains("mbarrier") {
        return Some("your kernel issues asynchronous copies but never waits for them: it would read shared memory before the copies land".into());
    }
    None
}

/// Static shared memory a block may declare (48 KiB: more must be dynamic).
pub const STATIC_SMEM_LIMIT: u64 = 48 << 10;
/// Shared memory a block of compute capability 9.0 may have in all (227 KiB).
pub const SMEM_LIMIT_SM90: u64 = 227 << 10;

/// What the source says before it is compiled: a `STAGES` it sets itself
/// (the lab sets it, `-DSTAGES=`, and sizes each block's shared memory by
/// it), unless only as a default: inside `#ifndef STAGES`, `#if
/// !defined(STAGES)` or `#if !defined STAGES` (before any `#else`).
pub fn source_problem(source: &str) -> Option<String> {
    // Per open conditional: whether this branch has STAGES undefined.
    let mut open: Vec<bool> = Vec::new();
    for (i, l) in source.lines().map(str::trim).enumerate() {
        let Some(directive) = l.strip_prefix('#').map(|r| r.split("//").next().unwrap_or("").trim()) else { continue };
        let word = directive.split(|c: char| !c.is_ascii_alphanumeric() && c != '_').next().unwrap_or("");
        let rest = directive[word.len()..].trim();
        match word {
            "if" | "ifdef" | "ifndef" => {
                let squeezed: String = rest.chars().filter(|c| !c.is_whitespace() && *c != '(' && *c != ')').collect();
                open.push((word == "ifndef" && rest == "STAGES") || (word == "if" && squeezed == "!definedSTAGES"));
            }
            "elif" | "else" => {
                if let Some(top) = open.last_mut() {
                    *top = false;
                }
            }
            "endif" => {
                open.pop();
            }
            "define" => {
                let sets = rest.strip_prefix("STAGES").is_some_and(|r| r.is_empty() || r.starts_with(char::is_whitespace) || r.starts_with('('));
                if sets && !open.contains(&true) {
                    return Some(format!(
                        "line {}: your file sets STAGES itself ({l}): the lab sets it (-DSTAGES=2) and gives each block shared memory for that many slots, so the kernel and its launch would disagree",
                        i + 1
                    ));
                }
            }
            _ => {}
        }
    }
    None
}

/// The parameters the lab launches the kernel with, as the given file and
/// the solution declare them: each one's PTX type and its declaration.
pub const LAUNCH_PARAMS: &[(&str, &str)] = &[(".u64", "const float* in"), (".u64", "float* out"), (".u32", "unsigned int tiles")];

/// The PTX types of `entry`'s parameters (`.u64`, `.u32`, `.b8[16]` for a
/// struct passed by value), in order; `None` where the PTX has no such entry.
pub fn entry_params(ptx: &str, entry: &str) -> Option<Vec<String>> {
    let mut lines = ptx.lines().map(str::trim);
    let head = lines.by_ref().find(|l| {
        l.strip_prefix(".visible")
            .map(str::trim_start)
            .and_then(|r| r.strip_prefix(".entry"))
            .map(str::trim_start)
            .and_then(|r| r.strip_prefix(entry))
            .is_some_and(|r| r.trim_start().starts_with('(') || r.is_empty())
    })?;
    // The list runs to the closing parenthesis, on the head's line or a later one.
    let mut text = head.split_once('(').map_or(String::new(), |(_, r)| r.to_string());
    while !text.contains(')') {
        let Some(l) = lines.next() else { break };
        text.push(' ');
        text.push_str(l);
    }
    let list = text.split(')').next().unwrap_or("");
    let params = list
        .split(',')
        .filter_map(|p| {
            let mut tokens = p.split_whitespace().skip_while(|t| *t != ".param").skip(1).peekable();
            let mut ty = None;
            while let Some(t) = tokens.next() {
                match t {
                    ".align" => {
                        tokens.next();
                    }
                    ".ptr" | ".global" | ".shared" | ".const" | ".local" => {}
                    t if t.starts_with('.') && ty.is_none() => ty = Some(t.to_string()),
                    name => {
                        let bytes = name.split_once('[').map_or(String::new(), |(_, n)| format!("[{n}"));
                        return ty.map(|t| t + &bytes);
                    }
                }
            }
            ty
        })
        .collect();
    Some(params)
}

/// What the PTX says of `entry`'s parameters against those the lab
/// launches it with (`params`: each one's PTX type and declaration):
/// `None` where they agree in number and type, else the difference.
pub fn signature_problem(ptx: &str, entry: &str, params: &[(&str, &str)]) -> Option<String> {
    let mine = entry_params(ptx, entry)?;
    let declared = params.iter().map(|p| p.1).collect::<Vec<_>>().join(", ");
    if mine.len() != params.len() {
        return Some(format!(
            "your kernel {entry} takes {} parameter{} in its PTX ({}); the lab launches it with {}, as the given file declares them ({declared}): the launch and the kernel would disagree on every argument",
            mine.len(),
            if mine.len() == 1 { "" } else { "s" },
            if mine.is_empty() { "none".to_string() } else { mine.join(", ") },
            params.len()
        ));
    }
    let (k, (ty, (want, decl))) = mine.iter().zip(params).enumerate().find(|(_, (ty, (want, _)))| ty.as_str() != *want)?;
    Some(format!(
        "parameter {} of your kernel {entry} is {ty} in its PTX where the lab passes {decl} ({want}): the lab launches it with ({declared}), in that order, as the given file declares them",
        k + 1
    ))
}

/// What the PTX says of how the lab would load and launch it: the entry
/// point it launches (`entry`), its parameters as the lab passes them
/// (`params`, [`signature_problem`]), and shared memory within what a
/// block may have, with `dynamic` bytes of dynamic shared memory from the
/// launch.
pub fn launch_problem(ptx: &str, entry: &str, params: &[(&str, &str)], dynamic: u64) -> Option<String> {
    let entries: Vec<&str> = ptx
        .lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        .map(|r| r.split(|c: char| c == '(' || c.is_whitespace()).next().unwrap_or(""))
        .collect();
    if !entries.contains(&entry) {
        return Some(format!(
            "the PTX has no kernel named {entry} (it has: {}): the lab launches {entry} by that name",
            if entries.is_empty() { "none".to_string() } else { entries.join(", ") }
        ));
    }
    if let Some(p) = signature_problem(ptx, entry, params) {
        return Some(p);
    }
    // Static arrays: `.shared .align 16 .b8 name[bytes];` (not `.extern`, the dynamic one).
    let fixed: u64 = ptx
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with(".shared") && !l.starts_with(".extern"))
        .filter_map(|l| l.rsplit_once('[').and_then(|(_, n)| n.split(']').next()).and_then(|n| n.trim().parse::<u64>().ok()))
        .sum();
    let kib = |b: u64| format!("{:.1} KiB", b as f64 / 1024.0);
    if fixed > STATIC_SMEM_LIMIT {
        return Some(format!("your kernel declares {} of static shared memory; a block may declare at most {}", kib(fixed), kib(STATIC_SMEM_LIMIT)));
    }
    if fixed + dynamic > SMEM_LIMIT_SM90 {
        return Some(format!(
            "your kernel's {} of static shared memory and the launch's {} of dynamic make {}, more than a block may have ({})",
            kib(fixed),
            kib(dynamic),
            kib(fixed + dynamic),
            kib(SMEM_LIMIT_SM90)
        ));
    }
    None
}

/// What the PTX says of where `entry`'s two pointer parameters go, the lab
/// passing the input first and the output second: `None` where the kernel
/// reads global memory through the first and stores through the second
/// only, else the difference. Each register is followed from the
/// `ld.param` of a parameter through every instruction that computes from
/// it (to a fixed point, for loops); a global read is an `ld.global`, an
/// `ld` in generic space, or the source of a `cp.async`, a global store an
/// `st.global` or a generic `st`.
pub fn pointer_problem(ptx: &str, entry: &str) -> Option<String> {
    // Operands split at commas outside braces (`{%f1, %f2}` is one: a vector).
    fn operands(text: &str) -> Vec<&str> {
        let (mut out, mut depth, mut from) = (Vec::new(), 0i32, 0);
        for (i, c) in text.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(text[from..i].trim());
                    from = i + 1;
                }
                _ => {}
            }
        }
        out.push(text[from..].trim());
        out
    }
    // The entry by its exact name (not one it is the start of).
    let head = format!(".entry {entry}");
    let start = ptx.match_indices(&head).map(|(i, _)| i).find(|&i| ptx[i + head.len()..].starts_with(|c: char| c == '(' || c.is_whitespace()))?;
    let body = &ptx[start..];
    let body = body[1..].find(".entry").map_or(body, |end| &body[..end + 1]);
    // Each instruction: its opcode and its operands (predicate guard and
    // the final ';' dropped); directives, labels and braces skipped.
    let parsed: Vec<(&str, Vec<&str>)> = body
        .lines()
        .map(|l| l.split("//").next().unwrap_or("").trim().trim_end_matches(';'))
        .filter(|l| !l.is_empty() && !l.starts_with(['.', '{', '}', ')', '$']) && !l.ends_with(':'))
        .map(|l| if l.starts_with('@') { l.split_once(char::is_whitespace).map_or("", |(_, r)| r.trim()) } else { l })
        .filter_map(|l| {
            let (op, rest) = l.split_once(char::is_whitespace).unwrap_or((l, ""));
            (!op.is_empty()).then(|| (op, operands(rest)))
        })
        .collect();
    // The registers an operand names (`%rd4`, each of `{%f1, %f2}`, the
    // base of `[%rd5+16]`).
    fn registers(operand: &str) -> Vec<&str> {
        let mut out = Vec::new();
        let mut rest = operand;
        while let Some(at) = rest.find('%') {
            let len = rest[at + 1..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len() - at - 1);
            out.push(&rest[at + 1..at + 1 + len]);
            rest = &rest[at + 1 + len..];
        }
        out
    }
    // Which pointer parameter an `ld.param` reads (0 or 1), if either.
    let param = |operand: &str| (0..2).find(|k| operand.trim_matches(['[', ']']) == format!("{entry}_param_{k}"));
    // Each instruction: its opcode, the taint an `ld.param` starts, and
    // its operands' registers, read once.
    struct Instruction<'p> {
        op: &'p str,
        loads_param: u8,
        regs: Vec<Vec<&'p str>>,
    }
    let instructions: Vec<Instruction> = parsed
        .iter()
        .map(|(op, operands)| Instruction {
            op,
            loads_param: if op.starts_with("ld.param") { operands.get(1).and_then(|o| param(o)).map_or(0, |k| 1u8 << k) } else { 0 },
            regs: operands.iter().map(|o| registers(o)).collect(),
        })
        .collect();
    let mut from: std::collections::HashMap<&str, u8> = std::collections::HashMap::new();
    let stores = |op: &str| op.starts_with("st.") && !op.starts_with("st.shared") && !op.starts_with("st.local") && !op.starts_with("st.param");
    let writes_nothing = |op: &str| ["st.", "cp.", "bar", "bra", "ret"].iter().any(|p| op.starts_with(p));
    loop {
        let mut changed = false;
        for Instruction { op, loads_param, regs } in &instructions {
            let Some(dst) = regs.first() else { continue };
            if writes_nothing(op) {
                continue;
            }
            let taint = if op.starts_with("ld.param") {
                *loads_param
            } else {
                regs[1..].iter().flatten().map(|r| from.get(r).copied().unwrap_or(0)).fold(0, |a, b| a | b)
            };
            for &r in dst {
                let t = from.entry(r).or_default();
                if *t | taint != *t {
                    *t |= taint;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    let reaches = |regs: Option<&Vec<&str>>| regs.map_or(0, |rs| rs.iter().map(|r| from.get(r).copied().unwrap_or(0)).fold(0, |a, b| a | b));
    // A read of global memory: a cp.async's source, or a load outside the
    // parameter, shared, local and constant spaces.
    let global_read = |op: &str| {
        (op.starts_with("cp.async") && op.contains(".global"))
            || (op.starts_with("ld.") && !["ld.param", "ld.shared", "ld.local", "ld.const"].iter().any(|p| op.starts_with(p)))
    };
    let (mut read, mut written) = (0u8, 0u8);
    for Instruction { op, regs, .. } in &instructions {
        if stores(op) {
            written |= reaches(regs.first());
        } else if global_read(op) {
            read |= reaches(regs.get(1));
        }
    }
    let (input, output) = (LAUNCH_PARAMS[0].1, LAUNCH_PARAMS[1].1);
    if written & 1 != 0 {
        return Some(format!(
            "your kernel stores into global memory through its first parameter, where the lab passes the input ({input}): it would overwrite the data it reads"
        ));
    }
    if written & 2 == 0 {
        return Some(format!("your kernel never stores through its second parameter, where the lab passes the output ({output}): no result would reach it"));
    }
    if read & 1 == 0 {
        return Some(format!("your kernel never reads global memory through its first parameter, where the lab passes the input ({input}): the tiles it computes would not be the input's"));
    }
    None
}

/// What this machine has to compile a learner's kernel with: NVRTC, and
/// CUDA's C++ headers for a file that includes them (`#include <...>`).
/// Without them the kernel cannot be compiled, which is no fault of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Toolchain {
    /// libnvrtc loads.
    pub nvrtc: bool,
    /// CUDA's C++ headers were found (else what the search says).
    pub headers: std::result::Result<(), String>,
}

impl Toolchain {
    /// This machine's.
    pub fn here() -> Toolchain {
        Toolchain { nvrtc: kernels::nvrtc_present(), headers: kernels::cuda_include_dirs().map(|_| ()).map_err(|e| e.to_string()) }
    }

    /// Why `source` cannot be compiled here, if it cannot: a finding that
    /// says the kernel was not judged (not that it fails to compile).
    pub fn problem(&self, source: &str) -> Option<String> {
        const NOT_JUDGED: &str = "so your kernel could not be compiled and was not judged: nothing here says it is wrong";
        if !self.nvrtc {
            return Some(format!("NVRTC (libnvrtc.so, CUDA's run-time compiler) was not found on this machine, {NOT_JUDGED}"));
        }
        let includes = source.lines().any(|l| l.trim_start().starts_with("#include <"));
        match &self.headers {
            Err(_) if includes => {
                Some(format!("CUDA's C++ headers, which your file includes (#include <...>), were not found on this machine for NVRTC, {NOT_JUDGED}"))
            }
            _ => None,
        }
    }
}

/// A compile's outcome as the learner reads it: the PTX if the source sets
/// nothing the lab sets, this machine can compile it (`toolchain`), it
/// compiled, the lab could launch it and it copies asynchronously, else
/// the problem recorded in `rep`.
fn read_compile(rep: &mut CheckReport, toolchain: &Toolchain, source: &str, shape: TileShape, compiled: impl FnOnce() -> Result<String>) -> Option<String> {
    if let Some(p) = source_problem(source) {
        rep.problem(p);
        return None;
    }
    if let Some(p) = toolchain.problem(source) {
        rep.problem(p);
        return None;
    }
    match compiled() {
        // A GPU older than the kernel's copies: no fault of the kernel either.
        Err(crate::error::LabError::Unsupported(why)) => rep.problem(format!("this GPU cannot run asynchronous copies ({why}), so your kernel was not judged")),
        Err(e) => rep.problem(format!("your kernel does not compile. NVRTC says:\n{e}")),
        Ok(ptx) => {
            let entry = super::kernel::TILE_ASYNC.entry;
            match launch_problem(&ptx, entry, LAUNCH_PARAMS, TileKind::Async.smem_bytes(shape) as u64)
                .or_else(|| ptx_problem(&ptx))
                .or_else(|| pointer_problem(&ptx, entry))
            {
                Some(p) => rep.problem(p),
                None => {
                    rep.note("it compiles and copies asynchronously (cp.async in its PTX)");
                    return Some(ptx);
                }
            }
        }
    }
    None
}

/// The checks that need no GPU: compile (for sm_90) and read the PTX.
pub fn check_offline(file: &str, source: &str, cfg: &KernelPipelineConfig) -> CheckReport {
    check_offline_with(&Toolchain::here(), file, source, cfg)
}

/// [`check_offline`] with `toolchain` for this machine's.
fn check_offline_with(toolchain: &Toolchain, file: &str, source: &str, cfg: &KernelPipelineConfig) -> CheckReport {
    let mut rep = CheckReport::new(EXERCISE);
    let s = shape(cfg);
    if read_compile(&mut rep, toolchain, source, s, || {
        kernels::compile_source(file, source, super::kernel::TILE_ASYNC.headers, "compute_90", &s.defines(GIVEN_VECTOR_WIDTH))
    })
    .is_some()
    {
        rep.problem(NEEDS_A_GPU);
    }
    rep
}

/// The whole check on `gpu`: compile for it (once) and read the PTX, every
/// output against the CPU reference (twice, on fresh inputs), then
/// `cfg.repeats` interleaved rounds of the learner's kernel, the naive one
/// and the solution.
pub fn check_on_gpu(gpu: &Gpu, file: &str, source: &str, cfg: &KernelPipelineConfig) -> Result<CheckReport> {
    let mut rep = CheckReport::new(&format!("{EXERCISE} (live)"));
    let s = shape(cfg);
    let Some(ptx) = read_compile(&mut rep, &Toolchain::here(), source, s, || TileKernel::compile(gpu, TileKind::Async, file, source, s, GIVEN_VECTOR_WIDTH))
    else {
        return Ok(rep);
    };
    let Some(mine) = rep.learner("your kernel", || TileKernel::from_ptx(gpu, TileKind::Async, &ptx, s, 1)) else {
        return Ok(rep);
    };
    // Both blur one output at a time, as the given file does: the learner's
    // kernel is timed against pipelines, not against a wider blur.
    let naive = TileKernel::load_with(gpu, TileKind::Naive, TileShape { stages: 1, ..s }, GIVEN_VECTOR_WIDTH, 1)?;
    let solution = TileKernel::load_with(gpu, TileKind::Async, s, GIVEN_VECTOR_WIDTH, 1)?;
    let mut data = TileData::new(gpu, cfg.elements())?;
    for _ in 0..2 {
        data.refresh()?;
        if let Err(e) = data.verified(&mine, "your kernel's output") {
            let what = data.wrong_tile(s.tile as usize, mine.resources().grid as usize).map_or(String::new(), |w| format!(": {}", wrong_tile_words(w, s.tile)));
            rep.problem(format!("{e}{what}"));
            return Ok(rep);
        }
    }
    rep.note("every output matches the CPU reference, on two fresh random inputs");
    let (mut t_mine, mut t_naive, mut t_sol) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..=cfg.repeats {
        let (a, b, c) = (data.timed(&mine)?, data.timed(&naive)?, data.timed(&solution)?);
        if round > 0 {
            t_mine.push(a);
            t_naive.push(b);
            t_sol.push(c);
        }
    }
    let (m, n, sol) = (Summary::of(&t_mine)?, Summary::of(&t_naive)?, Summary::of(&t_sol)?);
    let speedup = n.median / m.median;
    let clear = n.median - m.median > m.middle_spread().max(n.middle_spread());
    let line = format!(
        "yours {:.4} ms, the naive kernel {:.4} ms ({speedup:.2}x), the solution {:.4} ms ({:.2}x); spreads {:.4} / {:.4} / {:.4} ms",
        m.median,
        n.median,
        sol.median,
        n.median / sol.median,
        m.middle_spread(),
        n.middle_spread(),
        sol.middle_spread()
    );
    let of_solution = m.median / sol.median;
    if !clear {
        rep.problem(format!("{line}: not faster than the naive kernel beyond the spreads: the copies still do not run beside the compute"));
    } else if of_solution > 1.0 + SOLUTION_SLACK {
        rep.problem(format!(
            "{line}: faster than the naive kernel, but {:.0}% slower than the solution: with only one tile in flight the block still waits for each copy",
            100.0 * (of_solution - 1.0)
        ));
    } else {
        rep.note(format!("{line}: double-buffered"));
    }
    Ok(rep)
}

/// What a wrong tile of the learner's outputs holds, in words: where it is
/// (which block computed it, its how-manyth tile) and what went wrong there.
fn wrong_tile_words(w: super::measure::WrongTile, tile: u32) -> String {
    use super::measure::TileHolds;
    let at = format!("output tile {} (block {}'s tile {})", w.tile, w.block, w.k);
    match w.holds {
        TileHolds::Unwritten { outputs } => {
            format!("{at} was never fully written: {outputs} of its {tile} outputs still hold the poison the check filled them with")
        }
        TileHolds::Another { other } => format!(
            "{at} holds exactly the results of tile {other}: the block blurred the data of another tile in its place (a slot, or the tile a slot was filled with, is not the one it computes)"
        ),
        TileHolds::Part { wrong } => format!(
            "{wrong} of the {tile} outputs of {at} are wrong and the rest right: the block read that tile while some of its copies had not yet landed, or while the next tile's copies were already refilling its slot"
        ),
        TileHolds::Whole => format!("every output of {at} is wrong, and it is no other tile's result either"),
    }
}

/// Hints, one at a time ([`hint`]).
pub const HINTS: &[&str] = &[
    "While a block computes one tile, the next tile can already be on its way into shared memory: two slots, one being filled and one being read.",
    "Asynchronous copies (`cuda::memcpy_async` through a `cuda::pipeline`) do not pass through registers; commit each tile's copies as one batch and wait only for the oldest.",
    "A slot may be refilled only after every thread has finished reading it, and the kernel's name and parameters must stay as the lab launches them.",
];

/// Hint `k` (from 1): `hint(1)`, then `hint(2)` if still stuck.
pub fn hint(k: usize) -> String {
    crate::lab_kit::check::hint(HINTS, k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nvrtc() -> bool {
        if kernels::nvrtc_present() && kernels::cuda_include_dirs().is_ok() {
            return true;
        }
        assert!(std::env::var_os("OVERLAP_LAB_REQUIRE_NVRTC").is_none(), "NVRTC and CUDA's headers are required here");
        eprintln!("SKIPPED: NVRTC or CUDA's headers not found");
        false
    }

    const GIVEN: &str = include_str!("../../../../notebooks/exercises/07-double-buffered.cu");

    #[test]
    fn the_given_file_compiles_and_is_named_as_not_asynchronous() {
        if !nvrtc() {
            return;
        }
        let rep = check_offline("07-double-buffered.cu", GIVEN, &KernelPipelineConfig::small());
        assert!(!rep.passed && rep.to_string().contains("no asynchronous copy"), "{rep}");
    }

    #[test]
    fn the_solution_passes_what_can_be_judged_without_a_gpu_and_says_the_rest_needs_one() {
        if !nvrtc() {
            return;
        }
        let rep = check_offline("tile_async.cu", solution_source(), &KernelPipelineConfig::small());
        let text = rep.to_string();
        assert!(text.contains("compiles and copies asynchronously") && text.contains("judged on a GPU"), "{text}");
        assert!(!rep.passed, "with no GPU the check is not complete: {text}");
    }

    #[test]
    fn a_compile_error_is_a_failed_check_quoting_nvrtc() {
        if !nvrtc() {
            return;
        }
        let broken = GIVEN.replace("smem4[v] = src[v];", "smem4[v] = src[v]");
        let rep = check_offline("07-double-buffered.cu", &broken, &KernelPipelineConfig::small());
        let text = rep.to_string();
        assert!(!rep.passed && text.contains("does not compile") && text.contains("07-double-buffered.cu("), "{text}");
        assert!(!text.lines().any(|l| l.starts_with("error:") || l.starts_with("Error:")), "a notebook runner would read it as a crash: {text}");
    }

    /// With no NVRTC (or no CUDA headers for a file that includes them) a
    /// right kernel is not told it does not compile: the check says what
    /// this machine lacks and that the kernel was not judged. Runs with or
    /// without NVRTC here (the compile is never reached).
    #[test]
    fn a_missing_compiler_or_headers_is_said_and_the_kernel_not_judged() {
        let cfg = KernelPipelineConfig::small();
        let none = Toolchain { nvrtc: false, headers: Ok(()) };
        let headless = Toolchain { nvrtc: true, headers: Err("searched /usr/local/cuda".into()) };
        for (toolchain, names) in [(&none, "NVRTC (libnvrtc.so, CUDA's run-time compiler) was not found"), (&headless, "CUDA's C++ headers")] {
            for (what, source) in [("the solution", solution_source()), ("the given file", GIVEN)] {
                let rep = check_offline_with(toolchain, "mine.cu", source, &cfg);
                let text = rep.to_string();
                assert!(!rep.passed && text.contains(names) && text.contains("was not judged"), "{what}: {text}");
                for judged in ["does not compile", "no asynchronous copy", "compiles and copies"] {
                    assert!(!text.contains(judged), "{what}: judged the kernel ('{judged}') with no compiler: {text}");
                }
            }
        }
        // Headers matter only to a file that includes them.
        assert_eq!(headless.problem("extern \"C\" __global__ void k() {}"), None);
        assert!(Toolchain { nvrtc: true, headers: Ok(()) }.problem(GIVEN).is_none());
    }

    #[test]
    fn a_file_that_cannot_be_read_is_a_failed_check_naming_it() {
        let run = crate::lab_kit::LabRun::<super::super::KernelPipelineResults>::recorded(super::super::LAB, "test".into()).unwrap();
        let rep = run.check_double_buffered("exercises/no-such-file.cu");
        assert!(!rep.passed && rep.to_string().contains("could not read exercises/no-such-file.cu"), "{rep}");
    }

    /// Each (what, source, words) fails the check without a GPU, saying
    /// every one of `words` and none of `not`: the fault is known from the
    /// compile and the PTX.
    fn fails_offline_with(cases: &[(&str, String, &[&str])], cfg: &KernelPipelineConfig, not: &[&str]) {
        for (what, source, words) in cases {
            let rep = check_offline("mine.cu", source, cfg);
            let text = rep.to_string();
            assert!(!rep.passed, "{what} passed: {text}");
            for w in *words {
                assert!(text.contains(w), "{what}: no '{w}' in {text}");
            }
            for n in not {
                assert!(!text.contains(n), "{what}: the fault is known without a GPU, yet the check says '{n}': {text}");
            }
        }
    }

    #[test]
    fn faults_the_compile_or_the_ptx_shows_are_named_without_a_gpu() {
        if !nvrtc() {
            return;
        }
        let cfg = KernelPipelineConfig::small();
        let sol = solution_source();
        let cases: Vec<(&str, String, &[&str])> = vec![
            ("renamed", sol.replace("tile_async(", "my_tile_async("), &["no kernel named tile_async", "my_tile_async"]),
            ("extern \"C\" dropped", sol.replace("extern \"C\" ", ""), &["no kernel named tile_async", "it has: _Z10tile_async"]),
            (
                "static shared memory over the limit",
                sol.replacen("{", "{\n    __shared__ float4 big[4096]; big[threadIdx.x] = make_float4(0, 0, 0, 0); __syncthreads(); out[0] += big[1].x;", 1),
                &["64.0 KiB of static shared memory", "at most 48.0 KiB"],
            ),
            ("STAGES redefined", format!("#define STAGES 1\n{sol}"), &["line 1: your file sets STAGES itself", "-DSTAGES=2"]),
        ];
        fails_offline_with(&cases, &cfg, &["judged on a GPU"]);
        // The given file's guarded default is not a redefinition.
        assert!(source_problem(GIVEN).is_none());
    }

    /// Pointers a learner mixes up, named from the PTX without a GPU; the
    /// solution, the given file and the lab's other kernels use theirs as
    /// the lab passes them.
    #[test]
    fn swapped_or_misused_pointers_are_named_from_the_ptx_without_a_gpu() {
        if !nvrtc() {
            return;
        }
        let cfg = KernelPipelineConfig::small();
        let sol = solution_source();
        let signature = "tile_async(const float* __restrict__ in, float* __restrict__ out, unsigned int tiles)";
        assert!(sol.contains(signature));
        let cases: Vec<(&str, String, &[&str])> = vec![
            (
                "parameters declared in the other order",
                sol.replace(signature, "tile_async(float* __restrict__ out, const float* __restrict__ in, unsigned int tiles)"),
                &["stores into global memory through its first parameter", "const float* in"],
            ),
            (
                "tiles fetched from the output",
                sol.replace("reinterpret_cast<const float4*>(in + ", "reinterpret_cast<const float4*>(out + "),
                &["never reads global memory through its first parameter"],
            ),
            (
                "results written back into the input",
                sol.replace(signature, "tile_async(float* __restrict__ in, float* __restrict__ out, unsigned int tiles)")
                    .replace("blur_tile(s, out + ", "blur_tile(s, in + "),
                &["stores into global memory through its first parameter"],
            ),
        ];
        fails_offline_with(&cases, &cfg, &["judged on a GPU"]);
        let s = shape(&cfg);
        for (name, source) in [("solution", sol), ("given file", GIVEN)] {
            let ptx =
                kernels::compile_source("k.cu", source, super::super::kernel::TILE_ASYNC.headers, "compute_90", &s.defines(super::super::kernel::VEC_DEFAULT))
                    .unwrap();
            assert_eq!(pointer_problem(&ptx, "tile_async"), None, "{name}");
        }
    }

    #[test]
    fn pointer_uses_are_followed_through_vectors_predicates_and_loops() {
        let ptx = ".visible .entry k(\n.param .u64 k_param_0,\n.param .u64 k_param_1,\n.param .u32 k_param_2\n)\n{\n\
            ld.param.u64 %rd1, [k_param_0];\n\
            ld.param.u64 %rd2, [k_param_1];\n\
            $L__BB0_1:\n\
            add.s64 %rd5, %rd4, %rd7;\n\
            @%p1 ld.global.nc.v4.f32 {%f1, %f2, %f3, %f4}, [%rd5];\n\
            st.global.v4.f32 [%rd6], {%f1, %f2, %f3, %f4};\n\
            cvta.to.global.u64 %rd4, %rd1;\n\
            cvta.to.global.u64 %rd6, %rd2;\n\
            @%p1 bra $L__BB0_1;\n\
            ret;\n}";
        // %rd4 is defined after its use in the loop body: found on the second pass.
        assert_eq!(pointer_problem(ptx, "k"), None);
        let swapped = ptx.replace("[%rd5]", "[%rd6]").replace("[%rd6], {", "[%rd5], {");
        assert!(pointer_problem(&swapped, "k").unwrap().contains("through its first parameter"));
        assert_eq!(pointer_problem(ptx, "other"), None);
    }

    #[test]
    fn a_stages_default_under_any_guard_is_honest_and_a_bare_one_is_named_by_line() {
        let sol = solution_source();
        let guarded = "#ifndef STAGES\n#define STAGES 2\n#endif";
        assert!(sol.contains(guarded) && GIVEN.contains(guarded));
        for guard in [
            "#if !defined(STAGES)\n#define STAGES 2\n#endif",
            "#if !defined STAGES\n#define STAGES 2\n#endif",
            "#  if  !defined( STAGES )  // the lab's -DSTAGES wins\n#  define STAGES 2\n#  endif",
            "#ifndef STAGES\n// two slots unless the lab says otherwise\n#define STAGES 2\n#endif",
            "#ifndef STAGES\n#if 1\n#define STAGES 2\n#endif\n#endif",
        ] {
            assert_eq!(source_problem(&sol.replace(guarded, guard)), None, "{guard}");
        }
        // Each with the line (from the guard's) of the definition named.
        let at = sol.lines().position(|l| l == "#ifndef STAGES").unwrap() + 1;
        for (bare, offset) in [
            ("#define STAGES 2", 0),
            ("#if defined(STAGES)\n#undef STAGES\n#endif\n#define STAGES 2", 3),
            ("#ifndef STAGES\n#define STAGES 2\n#else\n#undef STAGES\n#define STAGES 3\n#endif", 4),
            ("#ifdef STAGES\n#undef STAGES\n#define STAGES 1\n#endif", 2),
            ("#if !defined(TILE)\n#define STAGES 2\n#endif", 1),
        ] {
            let p = source_problem(&sol.replace(guarded, bare)).unwrap_or_else(|| panic!("{bare} passed"));
            assert!(p.contains(&format!("line {}: your file sets STAGES itself (#define STAGES", at + offset)), "{bare}: {p}");
        }
    }

    #[test]
    fn the_kernels_parameters_are_read_from_the_ptx() {
        let ptx = ".visible .entry tile_async(\n\t.param .u64 .ptr .global .align 4 tile_async_param_0,\n\t.param .u64 .ptr .global .align 4 tile_async_param_1,\n\t.param .u32 tile_async_param_2\n)\n{\n}";
        assert_eq!(entry_params(ptx, "tile_async").unwrap(), [".u64", ".u64", ".u32"]);
        assert_eq!(signature_problem(ptx, "tile_async", LAUNCH_PARAMS), None);
        assert_eq!(entry_params(ptx, "tile"), None);
        assert_eq!(entry_params(".visible .entry k()\n{\n}", "k").unwrap(), Vec::<String>::new());
        assert_eq!(entry_params(".visible .entry k(\n\t.param .align 4 .b8 k_param_0[12]\n)", "k").unwrap(), [".b8[12]"]);
        let extra = ptx.replace("tile_async_param_2\n", "tile_async_param_2,\n\t.param .u32 tile_async_param_3\n");
        let p = signature_problem(&extra, "tile_async", LAUNCH_PARAMS).unwrap();
        assert!(p.contains("your kernel tile_async takes 4 parameters in its PTX (.u64, .u64, .u32, .u32); the lab launches it with 3"), "{p}");
        assert!(p.contains("(const float* in, float* out, unsigned int tiles)"), "{p}");
    }

    /// A learner who changes the kernel's signature is told so from the PTX
    /// (its parameters against the given file's), with no GPU.
    #[test]
    fn a_changed_signature_is_named_from_the_ptx_without_a_gpu() {
        if !nvrtc() {
            return;
        }
        let cfg = KernelPipelineConfig::small();
        let sig = "tile_async(const float* __restrict__ in, float* __restrict__ out, unsigned int tiles)";
        let sol = solution_source();
        assert!(sol.contains(sig) && GIVEN.contains(sig), "the case below edits the signature both declare");
        let cases: Vec<(&str, String, &[&str])> = vec![
            (
                "a parameter added",
                sol.replace(sig, "tile_async(const float* __restrict__ in, float* __restrict__ out, unsigned int tiles, unsigned int stages)"),
                &[
                    "your kernel tile_async takes 4 parameters in its PTX (.u64, .u64, .u32, .u32)",
                    "the lab launches it with 3",
                    "(const float* in, float* out, unsigned int tiles)",
                ],
            ),
            (
                "a parameter removed",
                sol.replace(sig, "tile_async(const float* __restrict__ in, float* __restrict__ out)").replace(
                    "cuda::pipeline<cuda::thread_scope_thread> pipe",
                    "const unsigned int tiles = 64;\n    cuda::pipeline<cuda::thread_scope_thread> pipe",
                ),
                &["your kernel tile_async takes 2 parameters in its PTX (.u64, .u64)", "the lab launches it with 3"],
            ),
            (
                "parameters reordered",
                sol.replace(sig, "tile_async(unsigned int tiles, const float* __restrict__ in, float* __restrict__ out)"),
                &["parameter 1 of your kernel tile_async is .u32 in its PTX where the lab passes const float* in (.u64)", "in that order"],
            ),
        ];
        fails_offline_with(&cases, &cfg, &["judged on a GPU", "no asynchronous copy"]);
        // The given file and the solution declare what the lab launches
        // (LAUNCH_PARAMS): their offline checks, tested above, get past the signature to the
        // copies (the given file's "no asynchronous copy", the solution's
        // "compiles and copies asynchronously").
    }

    /// Wrong outputs on the GPU are told by where they are (the tile, its
    /// block and place) and what the tile holds, never by a fix.
    #[test]
    fn a_wrong_tile_is_named_by_its_block_and_what_it_holds() {
        use super::super::measure::{TileHolds, WrongTile};
        let at = |holds| WrongTile { tile: 137, block: 5, k: 1, holds };
        let cases = [
            (TileHolds::Unwritten { outputs: 12 }, "12 of its 4096 outputs still hold the poison"),
            (TileHolds::Another { other: 5 }, "holds exactly the results of tile 5: the block blurred the data of another tile"),
            (TileHolds::Part { wrong: 300 }, "300 of the 4096 outputs of output tile 137 (block 5's tile 1) are wrong and the rest right"),
            (TileHolds::Whole, "every output of output tile 137 (block 5's tile 1) is wrong"),
        ];
        for (holds, words) in cases {
            let text = wrong_tile_words(at(holds), 4096);
            assert!(text.contains(words) && text.contains("output tile 137 (block 5's tile 1)"), "{holds:?}: {text}");
            assert_eq!(crate::lab_kit::check::dictated_fix(&text), None, "{text}");
        }
    }

    #[test]
    fn copies_never_waited_for_are_named() {
        let rep = ptx_problem("cp.async.cg.shared.global [%r1], [%rd1], 16;\ncp.async.commit_group;").unwrap();
        assert!(rep.contains("never waits"), "{rep}");
        assert!(ptx_problem("cp.async.cg.shared.global; cp.async.wait_group 1;").is_none());
        assert!(ptx_problem("ld.global.nc.v4.u32").unwrap().contains("no asynchronous copy"));
    }
}
