#!/usr/bin/env python3
"""PyTorch's pinned copy_ bandwidth, measured the same way as lab 1 (CUDA
events, warm-up, median of repeats), compared with an overlap-lab record.

Usage: torch_bandwidth.py RECORD.json [--min-ratio 0.98]
Prints a table and exits 1 if overlap-lab is below min-ratio of PyTorch at
any size >= 64 MiB in H2D or D2H."""
import argparse, json, statistics, sys
import torch

def bench(direction, nbytes, warmup=3, repeats=10):
    n = nbytes // 4
    host = torch.empty(n, dtype=torch.float32).pin_memory()
    host.uniform_()
    dev = torch.empty(n, dtype=torch.float32, device="cuda")
    s = torch.cuda.Stream()
    times = []
    for i in range(warmup + repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(s):
            a.record(s)
            if direction == "h2d":
                dev.copy_(host, non_blocking=True)
            else:
                host.copy_(dev, non_blocking=True)
            b.record(s)
        b.synchronize()
        if i >= warmup:
            times.append(a.elapsed_time(b))
    if direction == "h2d":
        assert torch.equal(dev.cpu(), host), "torch H2D copy wrong"
    return nbytes / (statistics.median(times) * 1e-3) / 1e9

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("record")
    ap.add_argument("--min-ratio", type=float, default=0.98)
    ap.add_argument("--out")
    a = ap.parse_args()
    rec = json.load(open(a.record))
    ours = {(p["direction"], p["bytes"]): p["gbps"]["median"] for p in rec["results"]["transfers"] if p["kind"] == "pinned"}
    sizes = sorted({b for (d, b) in ours if b >= 64 << 20})
    rows, ok = [], True
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    print(f"{'dir':<4} {'size':>9} {'overlap-lab GB/s':>17} {'torch GB/s':>11} {'ratio':>7}")
    for d in ("h2d", "d2h"):
        for b in sizes:
            if (d, b) not in ours:
                continue
            t = bench(d, b)
            r = ours[(d, b)] / t
            ok &= r >= a.min_ratio
            rows.append({"direction": d, "bytes": b, "overlap_lab_gbps": ours[(d, b)], "torch_gbps": t, "ratio": r})
            print(f"{d:<4} {b >> 20:>5} MiB {ours[(d, b)]:>17.2f} {t:>11.2f} {r:>7.3f}")
    if a.out:
        json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "rows": rows}, open(a.out, "w"), indent=1)
    print("PASS" if ok else f"FAIL: below {a.min_ratio} of torch somewhere")
    sys.exit(0 if ok else 1)

if __name__ == "__main__":
    main()
