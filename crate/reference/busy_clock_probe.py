#!/usr/bin/env python3
"""Does a GPU kept busy run the same kernels slower than one that idles
between them? A probe for lab 10's download miss (data/<gpu>/README.md).

The queue model prices every kernel at its traced time. Lab 10's fixed
download loop keeps its GPU busy where the "before" loop left it idle a
quarter of the time, and ran the same GEMMs about 6% slower. This probe
runs the download programs' step (`lab10_programs._Mlp`, the recording's
width and blocks) in phases: back to back (the next step queued behind
the one running), then each step followed by an idle gap (the CPU waits
for it, then sleeps), in turn, several times. Each step is timed by CUDA
events; the SM clock and the board's power are sampled beside it by
`nvidia-smi -lms` where it runs. It prints, per phase, the median step
and its spread, and the clocks and power sampled in it.

Usage: python3 crate/reference/busy_clock_probe.py [--hidden N] [--blocks N]
    [--steps N] [--gap-ms MS] [--rounds N] [--out FILE]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=24832, help="the MLP's hidden width (default: the 2026-12-02 H200 recording's)")
    ap.add_argument("--blocks", type=int, default=4, help="MLP blocks in a step (default 4)")
    ap.add_argument("--steps", type=int, default=300, help="steps a phase (default 300)")
    ap.add_argument("--gap-ms", type=float, default=0.5, help="the idle gap after each step of an idle phase, ms (default 0.5)")
    ap.add_argument("--rounds", type=int, default=3, help="busy and idle phases, each this many times in turn (default 3)")
    ap.add_argument("--out", help="write the figures as JSON here too")
    args = ap.parse_args()
    for name in ("hidden", "blocks", "steps", "rounds"):
        if getattr(args, name) < 1:
            print(f"busy_clock_probe: --{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    if args.gap_ms < 0:
        print("busy_clock_probe: --gap-ms must not be negative", file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError as e:
        print(f"busy_clock_probe: PyTorch is needed ({e})", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("busy_clock_probe: PyTorch sees no CUDA GPU", file=sys.stderr)
        return 1
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import lab10_programs as lab

    device = torch.device("cuda")
    sizes = lab.Sizes(download_hidden=args.hidden, download_blocks=args.blocks)
    mlp = lab._Mlp(device, sizes, sizes.download_hidden, sizes.download_blocks)
    x = torch.randn(sizes.result_rows, sizes.width, device=device).to(torch.bfloat16)
    for _ in range(20):  # warm-up: cuBLAS's choices made, the clocks up
        mlp(x)
    torch.cuda.synchronize()

    smi = shutil.which("nvidia-smi")
    samples_file = tempfile.NamedTemporaryFile("w+", suffix=".csv", delete=False)
    sampler = None
    if smi:
        sampler = subprocess.Popen([smi, "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "20", "-i", "0"],
                                   stdout=samples_file, stderr=subprocess.DEVNULL)
        time.sleep(0.5)

    phases = []
    for r in range(args.rounds):
        for kind in ("busy", "idle gaps"):
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(args.steps)]
            t0 = time.time()
            for start, end in events:
                start.record()
                mlp(x)
                end.record()
                if kind == "idle gaps":
                    end.synchronize()
                    time.sleep(args.gap_ms / 1e3)
            torch.cuda.synchronize()
            t1 = time.time()
            steps = [s.elapsed_time(e) for s, e in events]
            phases.append({"round": r, "kind": kind, "from": t0, "to": t1, "steps_ms": steps})
            time.sleep(0.2)
    if sampler:
        sampler.terminate()
        sampler.wait()
    samples = []
    samples_file.seek(0)
    for line in samples_file:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            when = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + parts[0].split(".")[1])
            samples.append((when, float(parts[1]), float(parts[2])))
        except (ValueError, IndexError):
            continue
    os.unlink(samples_file.name)

    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}: a step of {args.blocks} blocks of width {args.hidden} "
          f"on {sizes.result_rows}x{sizes.width} bfloat16, {args.steps} steps a phase, idle gaps of {args.gap_ms} ms")
    print(f"{'phase':<16}{'median ms':>10}{'25-75% ms':>20}{'SM MHz (samples)':>26}{'power W':>16}")
    for p in phases:
        q = statistics.quantiles(p["steps_ms"], n=4)
        inside = [s for s in samples if p["from"] <= s[0] <= p["to"]]
        clocks = f"{statistics.median([s[1] for s in inside]):.0f} ({min(s[1] for s in inside):.0f}-{max(s[1] for s in inside):.0f}, {len(inside)})" if inside else "not sampled"
        power = f"{statistics.median([s[2] for s in inside]):.0f}" if inside else "-"
        p["sm_mhz"] = [s[1] for s in inside]
        p["power_w"] = [s[2] for s in inside]
        print(f"{p['kind'] + ' ' + str(p['round'] + 1):<16}{statistics.median(p['steps_ms']):>10.3f}{f'{q[0]:.3f}-{q[2]:.3f}':>20}{clocks:>26}{power:>16}")
    busy = statistics.median([t for p in phases if p["kind"] == "busy" for t in p["steps_ms"]])
    idle = statistics.median([t for p in phases if p["kind"] != "busy" for t in p["steps_ms"]])
    print(f"all busy phases' median step {busy:.3f} ms, all idle-gap phases' {idle:.3f} ms: busy/idle {busy / idle:.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "gpu": torch.cuda.get_device_name(0), "phases": phases}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
