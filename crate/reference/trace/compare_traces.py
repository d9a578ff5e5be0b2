"""Two Chrome traces of the same program's GPU work, op by op: `overlap-lab
trace`'s and torch.profiler's (separate runs: CUPTI takes one subscriber per
process). For each kernel name, copy name (direction and memory kinds) and
memset, the count and total time in each; the largest relative difference
in total time among the names that hold at least 1% of either trace's GPU
time; and whether the copies' memory kinds agree.

Ops are paired in their order on each stream where both traces hold the
same number of each kind there (the same program issues the same ops in
the same order), and summed under the second trace's name: two demanglers
can spell one kernel two ways. Where the counts differ, by name.

    python3 compare_traces.py OURS.json[.gz] THEIRS.json[.gz] [--json OUT]
"""

import argparse
import gzip
import json
import re
import sys
from collections import defaultdict

GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "copy", "gpu_memset": "memset"}


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        d = json.load(f)
    return d["traceEvents"] if isinstance(d, dict) else d


def key(e):
    # Names as both demanglers write them: spacing aside.
    return (GPU_CATS[e["cat"]], re.sub(r"\s+", "", e["name"]))


def gpu_ops(events):
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS]


def totals(events, names=None):
    """Count and total µs by key; `names` maps an op's id() to the key it
    is summed under (the other trace's name for its paired op)."""
    t = defaultdict(lambda: [0, 0.0])
    for e in events:
        k = names.get(id(e), key(e)) if names else key(e)
        t[k][0] += 1
        t[k][1] += float(e.get("dur", 0))
    return t


def lanes(ops):
    by = defaultdict(list)
    for e in ops:
        by[(e.get("pid"), e.get("tid"), GPU_CATS[e["cat"]])].append(e)
    for v in by.values():
        v.sort(key=lambda e: e["ts"])
    return by


def paired_names(ours, theirs):
    """Our ops' keys taken from their paired op in the other trace, lane by
    lane, where both lanes hold as many ops; None where any lane differs."""
    a, b = lanes(ours), lanes(theirs)
    if set(a) != set(b) or any(len(a[k]) != len(b[k]) for k in a):
        return None
    return {id(x): key(y) for k in a for x, y in zip(a[k], b[k])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ours")
    ap.add_argument("theirs")
    ap.add_argument("--json")
    a = ap.parse_args()
    ops_ours, ops_theirs = gpu_ops(load(a.ours)), gpu_ops(load(a.theirs))
    names = paired_names(ops_ours, ops_theirs)
    print("ops paired in their order on each stream" if names else "ops matched by name (the traces' streams hold different counts)")
    ours, theirs = totals(ops_ours, names), totals(ops_theirs)
    all_ours = sum(v[1] for v in ours.values())
    all_theirs = sum(v[1] for v in theirs.values())
    rows = []
    worst = 0.0
    for k in sorted(set(ours) | set(theirs), key=lambda k: -max(ours.get(k, [0, 0])[1], theirs.get(k, [0, 0])[1])):
        o, t = ours.get(k, [0, 0.0]), theirs.get(k, [0, 0.0])
        big = o[1] >= 0.01 * all_ours or t[1] >= 0.01 * all_theirs
        rel = (o[1] - t[1]) / t[1] if t[1] > 0 else float("inf")
        if big:
            worst = max(worst, abs(rel))
        rows.append({"kind": k[0], "name": k[1], "count_ours": o[0], "count_theirs": t[0], "us_ours": o[1], "us_theirs": t[1], "off": rel, "counted": big})
    copies_ours = {r["name"]: r["count_ours"] for r in rows if r["kind"] == "copy" and r["count_ours"]}
    copies_theirs = {r["name"]: r["count_theirs"] for r in rows if r["kind"] == "copy" and r["count_theirs"]}
    print(f"{'kind':7} {'count ours/theirs':>18} {'total us ours':>14} {'theirs':>12} {'off':>8}  name")
    for r in rows:
        print(f"{r['kind']:7} {r['count_ours']:>8}/{r['count_theirs']:<9} {r['us_ours']:14.1f} {r['us_theirs']:12.1f} {100 * r['off']:+7.2f}%{'' if r['counted'] else ' (<1%)'}  {r['name'][:90]}")
    print(f"GPU time: ours {all_ours:.1f} us, theirs {all_theirs:.1f} us ({100 * (all_ours - all_theirs) / all_theirs:+.2f}%)")
    print(f"largest difference among names holding >= 1% of the GPU time: {100 * worst:.2f}%")
    print(f"copies by name and memory kinds: {'the same' if copies_ours == copies_theirs else 'DIFFERENT'}: ours {copies_ours}, theirs {copies_theirs}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "gpu_us_ours": all_ours, "gpu_us_theirs": all_theirs, "worst": worst, "copies_agree": copies_ours == copies_theirs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
