//! What a learner's kernel says before it runs, for lab 7's exercise:
//! its source (a `STAGES` it sets itself) and its PTX (asynchronous copies
//! and waits for them, the entry point and parameters the lab launches,
//! shared memory within a block's limits, which pointer parameter is read
//! and which written). Each reading returns the problem in words, or
//! nothing.
//!
//! May use: nothing of the crate but `std` (text in, words out).

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labs::kernel_pipeline::exercise::solution_source;

    const GIVEN: &str = include_str!("../../../../notebooks/exercises/07-double-buffered.cu");

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
    fn copies_never_waited_for_are_named() {
        let rep = ptx_problem("cp.async.cg.shared.global [%r1], [%rd1], 16;\ncp.async.commit_group;").unwrap();
        assert!(rep.contains("never waits"), "{rep}");
        assert!(ptx_problem("cp.async.cg.shared.global; cp.async.wait_group 1;").is_none());
        assert!(ptx_problem("ld.global.nc.v4.u32").unwrap().contains("no asynchronous copy"));
    }
}
