"""Records `overlap-lab trace`'s reference programs on this GPU, as lab 10's
programs are recorded: each CUDA C++ pattern of `patterns.cu` (compiled
here with nvcc) timed untraced, round-robin over the patterns, and traced
once by `overlap-lab trace`; and the tracer's cost beside torch.profiler's
on `torch_patterns.py` (a loop with a host sync each step, and thousands of
tiny ops), untraced, traced and profiled in turn.

    python3 crate/reference/trace/record.py --out DIR [--repeats N]
        [--overlap-lab PATH] [--nvcc PATH] [--python PATH]

DIR gets `<pattern>.json.gz` (each pattern's trace) and `programs.json`:
each pattern's untraced loop times (ms, the program's own clock), the fix
each pattern's diagnosis predicts and the pattern that applies it, and the
cost table (loop ms of each run, each way). Prints each figure as it goes.
"""

import argparse
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

# Each pattern, and for each fix its diagnosis suggests, the pattern that
# applies that fix (what its prediction is held to).
PATTERNS = {
    "serial": {"copy stream": "copy-stream"},
    "pageable": {"pinned": "serial", "pinned + copy stream": "copy-stream"},
    "sync": {"sync removed": "serial"},
    "copy-stream": {},
    "chunked": {},
}

LOOP = re.compile(r"in ([0-9.]+) ms \(wall\)")
STEPS = re.compile(r"steps in ([0-9.]+) ms \(wall\)")


def run(cmd, pattern, what):
    """Runs `cmd`; the loop time its output prints (ms). Exits with a line
    naming `what` where it fails or prints none."""
    out = subprocess.run(cmd, capture_output=True, text=True)
    found = pattern.findall(out.stdout + out.stderr)
    if out.returncode != 0 or not found:
        sys.exit(f"record.py: {what} failed (exit {out.returncode}): {(out.stderr or out.stdout).strip()[-400:]}")
    return float(found[0])


def summary(ms):
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms), "runs_ms": ms}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, metavar="DIR")
    ap.add_argument("--repeats", type=int, default=5, metavar="N")
    ap.add_argument("--overlap-lab", default=shutil.which("overlap-lab") or "overlap-lab", metavar="PATH")
    ap.add_argument("--nvcc", default="nvcc", metavar="PATH")
    ap.add_argument("--python", default=sys.executable, metavar="PATH")
    a = ap.parse_args()
    if a.repeats < 1:
        sys.exit("record.py: --repeats: at least 1")
    os.makedirs(a.out, exist_ok=True)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "patterns")
        built = subprocess.run([a.nvcc, "-O2", "-o", exe, os.path.join(HERE, "patterns.cu")], capture_output=True, text=True)
        if built.returncode != 0:
            sys.exit(f"record.py: nvcc failed: {built.stderr.strip()[-400:]}")
        subprocess.run([exe, "serial", "2", "4"], capture_output=True)  # the driver's caches warmed
        untraced = {p: [] for p in PATTERNS}
        for r in range(a.repeats):
            for p in PATTERNS:
                untraced[p].append(run([exe, p], LOOP, f"patterns {p}"))
            print(f"round {r + 1}: " + ", ".join(f"{p} {untraced[p][-1]:.2f} ms" for p in PATTERNS), flush=True)
        traced = {}
        for p in PATTERNS:
            trace = os.path.join(a.out, f"{p}.json.gz")
            traced[p] = run([a.overlap_lab, "trace", "--no-diagnose", "-o", trace, "--", exe, p], LOOP, f"overlap-lab trace -- patterns {p}")
            print(f"{p}: traced {traced[p]:.2f} ms, untraced median {statistics.median(untraced[p]):.2f} ms", flush=True)
    cost = {}
    script = os.path.join(HERE, "torch_patterns.py")
    for name, args in (("host sync each step", []), ("tiny ops", ["--tiny", "--steps", "20"])):
        ways = {"untraced": [], "overlap-lab trace": [], "torch.profiler": []}
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(a.repeats):
                ways["untraced"].append(run([a.python, script] + args, STEPS, f"torch_patterns {name}"))
                ways["overlap-lab trace"].append(
                    run([a.overlap_lab, "trace", "--no-diagnose", "-o", os.path.join(tmp, "t.json.gz"), "--", a.python, script] + args, STEPS, f"traced torch_patterns {name}")
                )
                ways["torch.profiler"].append(run([a.python, script, "--profile", os.path.join(tmp, "k.json")] + args, STEPS, f"profiled torch_patterns {name}"))
        base = statistics.median(ways["untraced"])
        cost[name] = {w: summary(ms) for w, ms in ways.items()}
        print(f"{name}: " + ", ".join(f"{w} {statistics.median(ms):.2f} ms ({statistics.median(ms) / base - 1:+.1%})" for w, ms in ways.items()), flush=True)
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    record = {
        "command": "python3 crate/reference/trace/record.py " + " ".join(sys.argv[1:]),
        "gpu": gpu,
        "repeats": a.repeats,
        "patterns": {p: {"untraced": summary(untraced[p]), "traced_ms": traced[p], "trace": f"{p}.json.gz", "fixes": PATTERNS[p]} for p in PATTERNS},
        "cost": cost,
        "seconds": round(time.time() - started, 1),
    }
    with open(os.path.join(a.out, "programs.json"), "w") as f:
        json.dump(record, f, indent=1)
    print(f"recorded: {os.path.join(a.out, 'programs.json')} ({record['seconds']} s)")


if __name__ == "__main__":
    main()
