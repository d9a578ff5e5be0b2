"""Records `overlap-lab trace`'s reference programs on this GPU, as lab 10's
programs are recorded: the same copy/compute patterns written three ways
(CUDA C++ `patterns.cu`, compiled here with nvcc; Rust on cudarc,
`cudarc_patterns`; CuPy, `cupy_patterns.py`), each run untraced and traced
by `overlap-lab trace` in turn, round-robin over the programs; and the
tracer's cost beside torch.profiler's (CUDA activities only) on
`torch_patterns.py` (a loop with a host sync each step, and thousands of
tiny ops), untraced, traced and profiled in turn, with the two traces of
each compared op by op (`compare_traces.py`). The reference programs are
traced with `--sync-events` (each event wait's streams read, not
inferred); the PyTorch loops without, as torch.profiler's CUDA activities
alone are.

    python3 crate/reference/trace/record.py --out DIR [--cudarc PATH]
        [--repeats N] [--torch-repeats N] [--overlap-lab PATH] [--nvcc PATH] [--python PATH]
        [--only PROGRAM,... | --torch-only [--torch-loops sync,tiny]] [--cpus LIST]

DIR gets `<program>.json.gz` (each program's trace, from its first traced
run), `torch-<loop>.{ours,profiler}.json.gz` and `programs.json`: each
program's command, its loop times untraced and traced (ms, the program's
own clock), the fixes its diagnosis is held to and the program that applies
each, the torch cost table and the trace comparisons. Prints each figure as
it goes.

`--only` records again the programs it names, and nothing else, into the
recording DIR already holds: their entries and traces replaced, the rest
kept as they were, and the run's date, command and programs added to the
file's `rerecorded` list. A program whose fix is checked against another
is recorded with it (a fix is compared within one run). `--torch-only`
records the PyTorch loops' costs and trace comparisons again, and nothing
else, the same way (the tracer's cost and its traces' agreement with
torch.profiler's are one run's); `--torch-loops` names which loops it
records again (the others' entries kept). The tiny-op loop's traces (a few
MB each) are compared but not kept.

`--cpus` runs every program on those CPUs only (a list as `taskset` takes
it: `0-3,8`), each way alike. A loop of tiny ops is bound by one CPU
thread's speed, which moves by a third from one process to the next where
the scheduler may place it on any core; held to the same cores, the
untraced, traced and profiled runs differ by their tracer, not by their
placement. The CPUs are named in the recording.
"""

import argparse
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The PyTorch loops whose two traces are kept beside the comparison (the
# tiny-op loop's are a few MB each: compared, not kept).
KEPT_TORCH_TRACES = ("sync",)

# Each program: its command ({patterns}, {cudarc}, {python} and {here}
# filled in), and for each fix its diagnosis offers, the program that
# applies that fix (what the fix's prediction is held to).
PROGRAMS = {
    "serial": (["{patterns}", "serial"], {"copy stream": "copy-stream"}),
    "pageable": (["{patterns}", "pageable"], {"pinned": "serial", "pinned + copy stream": "copy-stream"}),
    "sync": (["{patterns}", "sync"], {"sync removed": "serial"}),
    "copy-stream": (["{patterns}", "copy-stream"], {}),
    "chunked": (["{patterns}", "chunked"], {}),
    "cudarc-pageable": (["{cudarc}", "pageable"], {"pinned": "cudarc-pinned", "pinned + copy stream": "cudarc-copy-stream"}),
    "cudarc-pinned": (["{cudarc}", "pinned"], {"copy stream": "cudarc-copy-stream"}),
    "cudarc-copy-stream": (["{cudarc}", "copy-stream"], {}),
    "cupy-pageable": (["{python}", "{here}/cupy_patterns.py", "pageable"], {"pinned": "cupy-pinned", "pinned + copy stream": "cupy-copy-stream"}),
    "cupy-pinned": (["{python}", "{here}/cupy_patterns.py", "pinned"], {"copy stream": "cupy-copy-stream"}),
    "cupy-copy-stream": (["{python}", "{here}/cupy_patterns.py", "copy-stream"], {}),
}

LOOP = re.compile(r"in ([0-9.]+) ms \(wall\)")
STEPS = re.compile(r"steps in ([0-9.]+) ms \(wall\)")


EVENTS = re.compile(r"pageable copies by CUDA events: (.*)")
EVENT_TOTAL = re.compile(r"(\S+) ([0-9.]+) ms over (\d+)")


# The CPUs every program runs on (`--cpus`); None: wherever the scheduler puts it.
CPUS = None


def cpu_list(text):
    """The CPUs `text` names (`0-3,8`), as a set; exits naming `--cpus`
    where it is not such a list or names a CPU this process may not use."""
    cpus = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        sys.exit(f"record.py: --cpus: '{text}' is not a list of CPUs such as 0-3,8")
    allowed = os.sched_getaffinity(0)
    if not cpus or not cpus <= allowed:
        sys.exit(f"record.py: --cpus: '{text}' names CPUs this machine does not give this process (it has {len(allowed)}: {min(allowed)}..{max(allowed)})")
    return cpus


FASTEST_STEP = re.compile(r"steps fastest ([0-9.]+) ms")


def run(cmd, pattern, what, events=None, fastest=None):
    """Runs `cmd` (on `CPUS` where set); the loop time its output prints
    (ms). Exits with a line naming `what` where it fails or prints none.
    Where `events` is a list, appends to it the pageable copies' totals by
    CUDA events the output prints (`torch_patterns.py`'s), ms by copy
    name. Where `fastest` is a list and the output prints its fastest step
    (`torch_patterns.py`'s loops), appends that, ms."""
    pin = (lambda: os.sched_setaffinity(0, CPUS)) if CPUS else None
    out = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pin)
    text = out.stdout + out.stderr
    found = pattern.findall(text)
    if out.returncode != 0 or not found:
        sys.exit(f"record.py: {what} failed (exit {out.returncode}): {(out.stderr or out.stdout).strip()[-400:]}")
    if events is not None:
        line = EVENTS.findall(text)
        if not line:
            print(f"record.py: {what} printed no pageable copies' CUDA event times: its pageable copies are compared as totals", flush=True)
        events.append({name: float(ms) for name, ms, _ in EVENT_TOTAL.findall(line[0])} if line else {})
    step = FASTEST_STEP.findall(text)
    if fastest is not None and step:
        fastest.append(float(step[0]))
    return float(found[0])


def compare_runs(ours, theirs, ours_events=None, theirs_events=None):
    """Each op name's total GPU time in every run of our traces and of
    torch.profiler's (`compare_traces.py`'s pairing: ours named as theirs
    by their order on each stream), as medians over the runs with their
    ranges; the largest relative difference of the medians among the names
    holding at least 1% of the GPU time, and whether the copies' names
    (direction and memory kinds) and counts agree in the first runs. Where
    each run also timed its pageable copies by CUDA events
    (`ours_events`, `theirs_events`: per run, ms by copy name), each
    tracer's total is also set over those events' in the same run (a
    pageable copy's time is the host's staging of it, which moves from one
    process to the next), and the two tracers' median ratios compared:
    `off_by_events`, which `worst_judged` takes for such copies."""
    sys.path.insert(0, HERE)
    import compare_traces as ct

    reference = ct.gpu_ops(ct.load(theirs[0]))
    per_ours = []
    for path in ours:
        ops = ct.gpu_ops(ct.load(path))
        per_ours.append(ct.totals(ops, ct.paired_names(ops, reference)))
    per_theirs = [ct.totals(ct.gpu_ops(ct.load(path))) for path in theirs]
    gpu_theirs = statistics.median(sum(v[1] for v in t.values()) for t in per_theirs)
    rows, worst, worst_every, worst_judged, unmatched = [], 0.0, 0.0, 0.0, False
    for k in sorted(set().union(*per_ours, *per_theirs)):
        o = [t[k][1] if k in t else 0.0 for t in per_ours]
        th = [t[k][1] if k in t else 0.0 for t in per_theirs]
        mo, mt = statistics.median(o), statistics.median(th)
        counted = max(mo, mt) >= 0.01 * gpu_theirs
        # None (JSON null) where torch.profiler's traces hold no such op.
        off = (mo - mt) / mt if mt > 0 else None
        if counted and off is None:
            unmatched = True
        elif counted:
            worst = max(worst, abs(off))
        if off is not None:
            worst_every = max(worst_every, abs(off))
        by_events = {}
        if ours_events and theirs_events and all(k[1] in e for e in ours_events + theirs_events):
            ratio = lambda totals, events: [t / e[k[1]] * 1e-3 for t, e in zip(totals, events) if e[k[1]] > 0]
            ro, rt = ratio(o, ours_events), ratio(th, theirs_events)
            if ro and rt:
                by_events = {"events_ratio_ours": [round(r, 4) for r in ro], "events_ratio_theirs": [round(r, 4) for r in rt],
                             "off_by_events": statistics.median(ro) / statistics.median(rt) - 1}
        if counted and off is not None:
            worst_judged = max(worst_judged, abs(by_events.get("off_by_events", off)))
        rows.append({**by_events, 
            "kind": k[0], "name": k[1],
            "count_ours": per_ours[0][k][0] if k in per_ours[0] else 0, "count_theirs": per_theirs[0][k][0] if k in per_theirs[0] else 0,
            "us_ours": mo, "us_theirs": mt, "ours_range": [round(min(o), 1), round(max(o), 1)], "theirs_range": [round(min(th), 1), round(max(th), 1)],
            "off": off, "ranges_overlap": max(min(o), min(th)) <= min(max(o), max(th)), "counted": counted,
        })
    copies = lambda t: {k[1]: v[0] for k, v in t.items() if k[0] == "copy"}
    # No largest difference where an op holding 1% is in our traces only.
    return {"runs": len(ours), "rows": rows, "worst": None if unmatched else worst, "worst_every_op": worst_every,
            "worst_judged": None if unmatched else worst_judged,
            "copies_agree": copies(per_ours[0]) == copies(per_theirs[0])}


def recording_in(folder, option):
    """The recording `folder`'s programs.json holds, which `option`
    records into; exits with a line naming the option and the file where
    there is none."""
    path = os.path.join(folder, "programs.json")
    try:
        with open(path) as f:
            earlier = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"record.py: {option}: no recording to add to in {folder}: {e}")
    if not isinstance(earlier, dict):
        sys.exit(f"record.py: {option}: {path} is not a recording (a JSON object)")
    return earlier


def scrub(path):
    """Rewrites a kept trace so that it names no folder of the machine that
    made it: its `traceName` and its program's `exe` and `argv` (in
    `overlap_lab`) as file names only, as the data folder keeps them."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        d = json.load(f)
    d["traceName"] = os.path.basename(path)
    ours = d.get("overlap_lab")
    if isinstance(ours, dict):
        if isinstance(ours.get("exe"), str):
            ours["exe"] = os.path.basename(ours["exe"])
        if isinstance(ours.get("argv"), list):
            ours["argv"] = [os.path.basename(a) if isinstance(a, str) and a.startswith("/") else a for a in ours["argv"]]
    with opener(path, "wt") as f:
        json.dump(d, f)


def summary(ms):
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms), "runs_ms": ms}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, metavar="DIR")
    ap.add_argument("--cudarc", metavar="PATH", help="the built cudarc_patterns example (needed unless --only names no cudarc program)")
    ap.add_argument("--repeats", type=int, default=5, metavar="N", help="rounds over the programs, each untraced then traced")
    ap.add_argument("--torch-repeats", type=int, default=None, metavar="N", help="runs of each torch loop each way (default: --repeats)")
    ap.add_argument("--overlap-lab", default=shutil.which("overlap-lab") or "overlap-lab", metavar="PATH")
    ap.add_argument("--nvcc", default="nvcc", metavar="PATH")
    ap.add_argument("--python", default=sys.executable, metavar="PATH")
    ap.add_argument("--only", metavar="PROGRAM,...", help="record these programs again into DIR's recording, and nothing else")
    ap.add_argument("--torch-only", action="store_true", help="record the PyTorch loops' costs and comparisons again into DIR's recording, and nothing else")
    ap.add_argument("--torch-loops", metavar="LOOP,...", help="with --torch-only: the loops to record again (sync, tiny; default both)")
    ap.add_argument("--cpus", metavar="LIST", help="run every program on these CPUs only (0-3,8), each way alike")
    a = ap.parse_args()
    global CPUS
    CPUS = cpu_list(a.cpus) if a.cpus else None
    loops = ["sync", "tiny"] if a.torch_loops is None else [w.strip() for w in a.torch_loops.split(",") if w.strip()]
    if a.torch_loops is not None and not a.torch_only:
        sys.exit("record.py: --torch-loops: only with --torch-only")
    if not loops or any(w not in ("sync", "tiny") for w in loops):
        sys.exit(f"record.py: --torch-loops: '{a.torch_loops}': sync, tiny or both")
    if a.only is not None and a.torch_only:
        sys.exit("record.py: --only and --torch-only: one or the other")
    if a.torch_repeats is None:
        a.torch_repeats = a.repeats
    if a.repeats < 1 or a.torch_repeats < 1:
        sys.exit("record.py: --repeats and --torch-repeats: at least 1")
    chosen = [] if a.torch_only else list(PROGRAMS) if a.only is None else [p.strip() for p in a.only.split(",") if p.strip()]
    # The option that records into the recording DIR holds, if any.
    into = "--torch-only" if a.torch_only else "--only" if a.only is not None else None
    earlier = None
    if a.only is not None:
        unknown = [p for p in chosen if p not in PROGRAMS]
        if unknown or not chosen:
            sys.exit(f"record.py: --only: no program {', '.join(unknown) or '(none named)'}; the programs are {', '.join(PROGRAMS)}")
        apart = [f"{p}'s fix '{fix}' is checked against {after}" for p in chosen for fix, after in PROGRAMS[p][1].items() if after not in chosen]
        if apart:
            sys.exit(f"record.py: --only: {apart[0]}, which would come from another run: name it too")
    if into is not None:
        earlier = recording_in(a.out, into)
    needed = [("--overlap-lab", a.overlap_lab)] + ([("--cudarc", a.cudarc)] if any(p.startswith("cudarc-") for p in chosen) else [])
    for what, path in needed:
        if not path or not shutil.which(path):
            sys.exit(f"record.py: {what}: no program at {path}")
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except FileNotFoundError:
        gpu = ""
    gpu_name, _, driver = gpu.splitlines()[0].partition(", ") if gpu else ("no GPU", "", "")
    if earlier is not None and earlier.get("gpu") != gpu_name:
        sys.exit(f"record.py: {into}: {a.out} was recorded on {earlier.get('gpu')}, this is {gpu_name}")
    os.makedirs(a.out, exist_ok=True)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "patterns")
        if any("{patterns}" in PROGRAMS[p][0] for p in chosen):
            built = subprocess.run([a.nvcc, "-O2", "-o", exe, os.path.join(HERE, "patterns.cu")], capture_output=True, text=True)
            if built.returncode != 0:
                sys.exit(f"record.py: nvcc failed: {built.stderr.strip()[-400:]}")
        fill = {"{patterns}": exe, "{cudarc}": a.cudarc and os.path.abspath(a.cudarc), "{python}": a.python, "{here}": HERE}
        commands = {p: [fill.get(w, w.replace("{here}", HERE)) for w in PROGRAMS[p][0]] for p in chosen}
        for p, cmd in commands.items():  # the driver's and CuPy's caches warmed
            subprocess.run(cmd + (["--batches", "2"] if p.startswith("cupy-") else ["2", "4"]), capture_output=True)
        untraced = {p: [] for p in chosen}
        traced = {p: [] for p in chosen}
        for r in range(a.repeats):
            for p, cmd in commands.items():
                untraced[p].append(run(cmd, LOOP, p))
                trace = os.path.join(a.out if r == 0 else tmp, f"{p}.json.gz")
                # With sync events: each event wait's streams read, not inferred.
                traced[p].append(run([a.overlap_lab, "trace", "--no-diagnose", "--sync-events", "-o", trace, "--"] + cmd, LOOP, f"overlap-lab trace -- {p}"))
                if r == 0:
                    scrub(trace)
            if chosen:
                print(f"round {r + 1}: " + ", ".join(f"{p} {untraced[p][-1]:.2f}/{traced[p][-1]:.2f} ms" for p in chosen), flush=True)
        for p in chosen:
            u, t = statistics.median(untraced[p]), statistics.median(traced[p])
            print(f"{p}: untraced {u:.2f} ms, traced {t:.2f} ms ({t / u - 1:+.1%})", flush=True)
    cost, comparisons = {}, {}
    script = os.path.join(HERE, "torch_patterns.py")
    for name, args in (("sync", []), ("tiny", ["--tiny", "--steps", "20"])) if a.only is None else ():
        if name not in loops:
            continue
        kept = name in KEPT_TORCH_TRACES
        ways = {"untraced": [], "overlap-lab trace": [], "torch.profiler": []}
        # Each run's fastest step, where the loop prints it: a step is too
        # short for the host's slow spells to take every one, so the
        # fastest is the tracer's own cost nearest.
        steps = {w: [] for w in ways}
        with tempfile.TemporaryDirectory() as tmp:
            ours = [os.path.join(tmp, f"ours{r}.json.gz") for r in range(a.torch_repeats)]
            theirs = [os.path.join(tmp, f"profiler{r}.json") for r in range(a.torch_repeats)]
            ours_events, theirs_events = [], []
            for r in range(a.torch_repeats):
                runs = [
                    ("untraced", lambda: run([a.python, script] + args, STEPS, f"torch_patterns {name}", None, steps["untraced"])),
                    ("overlap-lab trace", lambda: run([a.overlap_lab, "trace", "--no-diagnose", "-o", ours[r], "--", a.python, script] + args, STEPS, f"traced torch_patterns {name}", ours_events, steps["overlap-lab trace"])),
                    ("torch.profiler", lambda: run([a.python, script, "--profile", theirs[r]] + args, STEPS, f"profiled torch_patterns {name}", theirs_events, steps["torch.profiler"])),
                ]
                # Each round starts with the next way, so that no way always
                # runs first (a round's first run may find the host warmer or
                # colder than the others do).
                for way, go in runs[r % 3 :] + runs[: r % 3]:
                    ways[way].append(go())
            comparisons[name] = compare_runs(ours, theirs, ours_events, theirs_events)
            if kept:
                shutil.copy(ours[0], os.path.join(a.out, f"torch-{name}.ours.json.gz"))
                with open(theirs[0], "rb") as f, gzip.open(os.path.join(a.out, f"torch-{name}.profiler.json.gz"), "wb") as g:
                    shutil.copyfileobj(f, g)
                for which in ("ours", "profiler"):
                    scrub(os.path.join(a.out, f"torch-{name}.{which}.json.gz"))
        base = statistics.median(ways["untraced"])
        cost[name] = {"command": ["torch_patterns.py"] + args, **{w: summary(ms) for w, ms in ways.items()}, **({"cpus": a.cpus} if a.cpus else {})}
        if all(len(steps[w]) == len(ways[w]) for w in ways):
            for w in ways:
                cost[name][w]["fastest_steps_ms"] = steps[w]
            first = statistics.median(steps["untraced"])
            print(f"  fastest step, median over the runs: " + ", ".join(f"{w} {statistics.median(st):.2f} ms ({statistics.median(st) / first - 1:+.1%})" for w, st in steps.items()), flush=True)
        print(f"torch {name}: " + ", ".join(f"{w} {statistics.median(ms):.2f} ms ({statistics.median(ms) / base - 1:+.1%})" for w, ms in ways.items()), flush=True)
        head = [o / t for o, t in zip(ways["overlap-lab trace"], ways["torch.profiler"])]
        print(f"  ours over torch.profiler's run of the same round: median {statistics.median(head):.3f} ({min(head):.3f}..{max(head):.3f})", flush=True)
        c = comparisons[name]
        for row in c["rows"]:
            off = "only ours" if row["off"] is None else f"{100 * row['off']:+.2f}%"
            small = "" if row["counted"] else " (under 1% of the GPU time)"
            events = f"; over its run's CUDA events {100 * row['off_by_events']:+.2f}%" if "off_by_events" in row else ""
            print(f"  {row['kind']:6} {row['us_ours']:11.1f} us ours {row['ours_range']}, {row['us_theirs']:11.1f} us theirs {row['theirs_range']}: {off}{'' if row['ranges_overlap'] else ' (ranges apart)'}{small}{events}  {row['name'][:80]}")
        worst = "an op only in our traces" if c["worst"] is None else f"{100 * c['worst']:.2f}%"
        judged = "" if c["worst_judged"] is None else f"; judged, pageable copies over their runs' CUDA events: {100 * c['worst_judged']:.2f}%"
        print(f"  largest median difference among ops holding >= 1% of the GPU time: {worst} (among all: {100 * c['worst_every_op']:.2f}%){judged}; copies' memory kinds {'agree' if c['copies_agree'] else 'DIFFER'}", flush=True)
    programs = {
        p: {
            "command": [os.path.basename(w) if w.startswith("/") else w for w in cmd],
            "untraced": summary(untraced[p]),
            "traced": summary(traced[p]),
            "trace": f"{p}.json.gz",
            "fixes": PROGRAMS[p][1],
        }
        for p, cmd in commands.items()
    }
    command = "python3 crate/reference/trace/record.py " + " ".join(sys.argv[1:])
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))
    torch_traces = {name: {"ours": f"torch-{name}.ours.json.gz", "profiler": f"torch-{name}.profiler.json.gz"} for name in comparisons if name in KEPT_TORCH_TRACES}
    if a.torch_only:
        record = earlier
        for field, new in (("torch_cost", cost), ("torch_traces_compared", comparisons)):
            record.setdefault(field, {}).update(new)
        kept = {n: t for n, t in record.get("torch_traces", {}).items() if n not in comparisons}
        record["torch_traces"] = {**kept, **torch_traces}
        record.setdefault("rerecorded", []).append(
            {"date": date, "command": command, "driver": driver, "programs": [f"torch {name}" for name in comparisons],
             "repeats": a.torch_repeats, "seconds": round(time.time() - started, 1), **({"cpus": a.cpus} if a.cpus else {})}
        )
    elif earlier is not None:
        record = earlier
        record["programs"].update(programs)
        record.setdefault("rerecorded", []).append(
            {"date": date, "command": command, "driver": driver, "programs": chosen, "repeats": a.repeats, "seconds": round(time.time() - started, 1), **({"cpus": a.cpus} if a.cpus else {})}
        )
    else:
        record = {
            "command": command,
            "gpu": gpu_name,
            "driver": driver,
            "date": date,
            "repeats": a.repeats,
            **({"cpus": a.cpus} if a.cpus else {}),
            "programs": programs,
            "torch_cost": cost,
            "torch_traces_compared": comparisons,
            "torch_traces": torch_traces,
            "seconds": round(time.time() - started, 1),
        }
    with open(os.path.join(a.out, "programs.json"), "w") as f:
        json.dump(record, f, indent=1)
    print(f"recorded: {os.path.join(a.out, 'programs.json')} ({round(time.time() - started, 1)} s)")


if __name__ == "__main__":
    main()
