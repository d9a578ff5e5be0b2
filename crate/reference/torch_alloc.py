#!/usr/bin/env python3
"""Lab 6's release-threshold workload in PyTorch: its native caching
allocator against its cudaMallocAsync backend (the driver's stream-ordered
pool), on the sizes and batches of an overlap-lab memory record.

The backend is chosen by PYTORCH_CUDA_ALLOC_CONF before CUDA starts, so the
script runs itself once per backend as a child process (the parent's
environment copied, that one variable set) and reads the child's JSON.
Each child runs, as the lab does:
  - allocate + free by size: torch.empty, a 1-byte fill_ (a tiny kernel
    touching the block), del, synchronize the stream; host time
    (perf_counter), one warm-up after empty_cache, then --repeats samples;
    the same 1-byte fill_ + synchronize alone is timed beside it, since the
    lab's pair has no kernel;
  - the varying-size batches: exactly the byte sizes of the record's trace,
    each allocated, filled whole, freed, synchronized; host time per batch
    and torch.cuda.memory_reserved() after it;
and reports what PyTorch's memory_stats() has of its counters, and the
driver's default pool (release threshold, reserved) read through libcuda.

Usage: torch_alloc.py RECORD.json [--out torch.json] [--repeats N] [--device N]
RECORD.json is a lab-6 record (data/<device>/memory.json). Prints, by size,
the lab's cuMemAlloc / threshold 0 / threshold max medians beside PyTorch's
native and cudaMallocAsync medians; then each run's median batch (after the
first), its first batch and the most it held reserved; then what was
observed of the pools. No verdict: exits 0 when both backends ran, 2 when
torch or CUDA is missing or the record is not a lab-6 record, 1 when a run
failed."""
import argparse, ctypes, datetime, gc, json, math, os, statistics, subprocess, sys, time

BACKENDS = ("native", "cudaMallocAsync")
LAB_ALLOCATORS = ("cu-mem-alloc", "pool-threshold-zero", "pool-threshold-max")
LAB_LABELS = {"cu-mem-alloc": "lab cuMemAlloc", "pool-threshold-zero": "lab threshold 0", "pool-threshold-max": "lab threshold max"}
TORCH_LABELS = {"native": "torch native", "cudaMallocAsync": "torch cudaMallocAsync"}
MARK = "TORCH_ALLOC_RESULT "
TOUCH_BYTES = 1
# memory_stats() counters worth showing, where this PyTorch has them (the
# cudaMallocAsync backend fills only the *_bytes ones; the rest read 0).
STAT_KEYS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
             "segment.all.allocated", "segment.all.freed", "allocation.all.allocated", "allocation.all.freed",
             "reserved_bytes.all.peak", "allocated_bytes.all.peak")
# CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, _RESERVED_MEM_CURRENT, _USED_MEM_CURRENT
POOL_ATTRS = {"release_threshold": 4, "reserved": 5, "used": 7}


class Refused(Exception):
    """Exit 2: no torch, no CUDA, or not a lab-6 record."""


def summary(samples):
    """As the lab's Summary: median, min, max, n, middle (nearest-rank 25%, 75%)."""
    s = sorted(samples)
    n = len(s)
    rank = lambda p: s[min(max(math.ceil(p * n), 1), n) - 1]
    return {"median": statistics.median(s), "min": s[0], "max": s[-1], "n": n, "middle": [rank(0.25), rank(0.75)]}


def workload(path):
    """The record's sizes, repeats, trace sizes and lab numbers, or Refused."""
    try:
        with open(path) as f:
            rec = json.load(f)
    except (OSError, ValueError) as e:
        raise Refused(f"{path}: cannot read a JSON record ({e})")
    where = "the record"
    try:
        if not isinstance(rec, dict):
            raise TypeError("not an object")
        if "lab" in rec and rec["lab"] != "memory":
            raise Refused(f"{path} is a record of lab '{rec['lab']}', not lab 6 (memory): run overlap-lab memory and pass data/<device>/memory.json")
        where = "results.config.sizes_mib"
        r = rec["results"]
        sizes = [int(m) for m in r["config"]["sizes_mib"]]
        where = "results.config.repeats"
        repeats = int(r["config"]["repeats"])
        where = "results.pairs[].allocator/bytes/ms.median"
        pairs = {(p["allocator"], int(p["bytes"])): p["ms"] for p in r["pairs"]}
        for ms in pairs.values():
            float(ms["median"])
        where = "results.traces[].allocator/batches[].bytes/ms/after.reserved"
        traces = {t["allocator"]: [(int(b["bytes"]), float(b["ms"]), int(b["after"]["reserved"])) for b in t["batches"]] for t in r["traces"]}
        trace_bytes = [int(b["bytes"]) for b in r["traces"][0]["batches"]]
        device = int(r["config"].get("device", 0))
    except Refused:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise Refused(f"{path} is not a lab-6 (memory) record: {where} missing or malformed ({type(e).__name__}: {e})")
    if not sizes or repeats < 1 or len(trace_bytes) < 2:
        raise Refused(f"{path} is not a usable lab-6 record: needs sizes_mib, repeats >= 1 and a trace of at least 2 batches")
    fp = rec.get("fingerprint") or {}
    return {"path": path, "sizes_mib": sizes, "repeats": repeats, "trace_bytes": trace_bytes, "device": device, "pairs": pairs,
            "traces": traces, "record": {"lab": rec.get("lab"), "created": rec.get("created"), "command": rec.get("command"),
                                         "gpu_name": fp.get("gpu_name"), "driver_version": fp.get("driver_version"),
                                         "driver_cuda_version": fp.get("driver_cuda_version")}}


def driver_pool(ordinal):
    """The device's default stream-ordered pool as the driver sees it, or None."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        dev, pool = ctypes.c_int(), ctypes.c_void_p()
        if cu.cuInit(0) or cu.cuDeviceGet(ctypes.byref(dev), ordinal) or cu.cuDeviceGetDefaultMemPool(ctypes.byref(pool), dev):
            return None
        out = {}
        for name, attr in POOL_ATTRS.items():
            v = ctypes.c_uint64()
            out[name] = v.value if cu.cuMemPoolGetAttribute(pool, attr, ctypes.byref(v)) == 0 else None
        return out
    except Exception:
        return None


def stats(torch):
    try:
        s = torch.cuda.memory_stats()
    except Exception:
        return {}
    return {k: s[k] for k in STAT_KEYS if k in s}


def child(a):
    """One backend's runs (PYTORCH_CUDA_ALLOC_CONF already set); JSON on stdout."""
    w = workload(a.record)
    try:
        import torch
    except ImportError as e:
        raise Refused(f"torch is not available ({e})")
    if not torch.cuda.is_available():
        raise Refused("torch sees no CUDA device")
    dev = a.device if a.device is not None else w["device"]
    torch.cuda.set_device(dev)
    get_backend = getattr(torch.cuda, "get_allocator_backend", None)
    backend = get_backend() if get_backend else None
    repeats = a.repeats or w["repeats"]
    stream = torch.cuda.current_stream()
    props = torch.cuda.get_device_properties(dev)
    gc.collect()
    gc.disable()  # no collector pauses inside the timed loops (del frees at once)

    def pair(nbytes):
        t = time.perf_counter()
        x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        x[:TOUCH_BYTES].fill_(1)
        del x
        stream.synchronize()
        return (time.perf_counter() - t) * 1e3

    kept = torch.empty(TOUCH_BYTES, dtype=torch.uint8, device="cuda")

    def touch():
        t = time.perf_counter()
        kept.fill_(1)
        stream.synchronize()
        return (time.perf_counter() - t) * 1e3

    def batch(nbytes):
        t = time.perf_counter()
        x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        (x.view(torch.int32) if nbytes % 4 == 0 else x).zero_()  # the whole buffer, as the lab's fill_u32
        del x
        stream.synchronize()
        return (time.perf_counter() - t) * 1e3

    touch()
    touch_ms = summary([touch() for _ in range(repeats)])
    del kept
    pairs = []
    for mib in w["sizes_mib"]:
        nbytes = mib << 20
        torch.cuda.empty_cache()  # start from nothing held, as the lab's settle
        pair(nbytes)  # warm-up: the one that gets the memory
        pairs.append({"bytes": nbytes, "ms": summary([pair(nbytes) for _ in range(repeats)])})
    pool_after_pairs = driver_pool(dev)
    stats_pairs = stats(torch)

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    try:
        torch.cuda.reset_peak_memory_stats()
    except Exception:
        pass
    before = stats(torch)
    batches = []
    for nbytes in w["trace_bytes"]:
        ms = batch(nbytes)
        batches.append({"bytes": nbytes, "ms": ms, "reserved": torch.cuda.memory_reserved(), "allocated": torch.cuda.memory_allocated()})
    after = stats(torch)
    reserved_end = torch.cuda.memory_reserved()
    pool_end = driver_pool(dev)
    torch.cuda.empty_cache()
    reserved_emptied = torch.cuda.memory_reserved()
    pool_emptied = driver_pool(dev)
    gc.enable()
    steady = [b["ms"] for b in batches[1:]]
    trace = {"batches": batches, "steady_ms": summary(steady), "first_ms": batches[0]["ms"],
             "most_reserved": max(b["reserved"] for b in batches), "reserved_at_end": reserved_end,
             "reserved_after_empty_cache": reserved_emptied,
             "stats_delta": {k: after[k] - before.get(k, 0) for k in after if k.startswith(("num_", "segment.", "allocation."))}}
    uuid = getattr(props, "uuid", None)
    return {"backend_requested": a.child, "backend": backend, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
            "device": {"index": dev, "name": torch.cuda.get_device_name(dev), "uuid": str(uuid) if uuid is not None else None,
                       "compute_capability": f"{props.major}.{props.minor}", "memory_bytes": props.total_memory},
            "torch": torch.__version__, "torch_cuda": torch.version.cuda, "repeats": repeats,
            "touch_ms": touch_ms, "pairs": pairs, "trace": trace,
            "pool": {"after_pairs": pool_after_pairs, "after_trace": pool_end, "after_empty_cache": pool_emptied},
            "memory_stats": {"after_pairs": stats_pairs, "after_trace": after}}


def run_child(a, backend):
    env = os.environ.copy()
    env["PYTORCH_CUDA_ALLOC_CONF"] = f"backend:{backend}"
    env.pop("PYTORCH_ALLOC_CONF", None)  # newer PyTorch reads this one first
    cmd = [sys.executable, os.path.abspath(__file__), a.record, "--child", backend]
    if a.repeats:
        cmd += ["--repeats", str(a.repeats)]
    if a.device is not None:
        cmd += ["--device", str(a.device)]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)  # stderr: straight through
    lines = [l for l in p.stdout.splitlines() if l.startswith(MARK)]
    if p.returncode == 2:
        raise Refused(f"the {backend} run refused (see above)")
    if p.returncode != 0 or not lines:
        sys.stdout.write(p.stdout)
        print(f"torch_alloc: the {backend} run failed (exit {p.returncode})", file=sys.stderr)
        sys.exit(1)
    out = json.loads(lines[-1][len(MARK):])
    if out["backend"] is not None and out["backend"] != backend:
        print(f"torch_alloc: asked for backend {backend}, PyTorch runs {out['backend']}: is the allocator configured elsewhere?", file=sys.stderr)
        sys.exit(1)
    return out


def driver_version():
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        lines = p.stdout.strip().splitlines()
        return lines[0].strip() if p.returncode == 0 and lines else None
    except Exception:
        return None


def shown_path(path):
    """A record's path as the repository names it (data/<device>/<file>),
    never the absolute path of the machine that ran this: the part from the
    last 'data' folder on, else the file's name."""
    parts = os.path.normpath(path).split(os.sep)
    if "data" in parts[:-1]:
        i = len(parts) - 1 - parts[::-1].index("data")
        return "/".join(parts[i:])
    return os.path.basename(path)


def command_line(argv):
    """As the lab records it: the program's name, without --out (where the
    output went), files named as the repository names them."""
    out, skip = [os.path.basename(argv[0])], False
    for x in argv[1:]:
        if skip or x.startswith("--out="):
            skip = False
        elif x == "--out":
            skip = True
        else:
            out.append(shown_path(x) if x.endswith(".json") else x)
    return out


def ratio(x, y):
    return x / y if x is not None and y else None


def fmt_ms(v, width):
    return f"{v:>{width}.4f}" if v is not None else f"{'-':>{width}}"


def mib(b):
    return f"{b / (1 << 20):.0f} MiB" if b is not None else "-"


def main():
    ap = argparse.ArgumentParser(description="PyTorch's caching allocator vs its cudaMallocAsync backend on lab 6's release-threshold workload")
    ap.add_argument("record", help="a lab-6 record, data/<device>/memory.json")
    ap.add_argument("--out", help="write the comparison here as JSON")
    ap.add_argument("--repeats", type=int, help="timed samples per size (default: the record's config.repeats)")
    ap.add_argument("--device", type=int, help="CUDA ordinal (default: the record's config.device)")
    ap.add_argument("--child", choices=BACKENDS, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.repeats is not None and a.repeats < 1:
        ap.error("--repeats: give 1 or more")
    try:
        if a.child:
            print(MARK + json.dumps(child(a)), flush=True)
            return
        w = workload(a.record)
        try:
            import torch
        except ImportError as e:
            raise Refused(f"torch is not available ({e}): this reference needs PyTorch with CUDA")
        # Whether CUDA is there, without starting it in this process (the
        # children each choose their allocator before theirs starts).
        probe = subprocess.run([sys.executable, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"],
                               capture_output=True, text=True)
        if probe.returncode != 0:
            raise Refused(f"torch {torch.__version__} sees no CUDA device (torch.version.cuda = {torch.version.cuda})")
    except Refused as e:
        print(f"torch_alloc: {e}", file=sys.stderr)
        sys.exit(2)

    try:
        runs = {b: run_child(a, b) for b in BACKENDS}
    except Refused as e:
        print(f"torch_alloc: {e}", file=sys.stderr)
        sys.exit(2)
    nat, asy = runs["native"], runs["cudaMallocAsync"]
    dev = nat["device"]
    drv = driver_version()

    # The lab's numbers beside them.
    lab_pairs, rows = [], []
    for m in w["sizes_mib"]:
        nbytes = m << 20
        lab = {al: w["pairs"].get((al, nbytes)) for al in LAB_ALLOCATORS}
        tn = next(p["ms"] for p in nat["pairs"] if p["bytes"] == nbytes)
        ta = next(p["ms"] for p in asy["pairs"] if p["bytes"] == nbytes)
        lab_pairs.append({"bytes": nbytes, **{al: lab[al] for al in LAB_ALLOCATORS}})
        lmax = lab["pool-threshold-max"]["median"] if lab["pool-threshold-max"] else None
        rows.append({"bytes": nbytes, "native_over_lab_threshold_max": ratio(tn["median"], lmax),
                     "async_over_lab_threshold_max": ratio(ta["median"], lmax),
                     "native_over_async": ratio(tn["median"], ta["median"])})
    lab_traces = {}
    for al in LAB_ALLOCATORS:
        t = w["traces"].get(al)
        if t and len(t) >= 2:
            lab_traces[al] = {"steady_ms": summary([b[1] for b in t[1:]]), "first_ms": t[0][1], "most_reserved": max(b[2] for b in t)}
    lab_tmax = lab_traces.get("pool-threshold-max", {}).get("steady_ms", {}).get("median")
    trace_ratios = {"native_over_lab_threshold_max": ratio(nat["trace"]["steady_ms"]["median"], lab_tmax),
                    "async_over_lab_threshold_max": ratio(asy["trace"]["steady_ms"]["median"], lab_tmax),
                    "native_over_async": ratio(nat["trace"]["steady_ms"]["median"], asy["trace"]["steady_ms"]["median"])}

    rec = w["record"]
    print(f"torch {nat['torch']} (CUDA {nat['torch_cuda']}) on {dev['name']} (device {dev['index']}), driver {drv or 'unknown'}")
    print(f"record: {w['path']}, lab {rec['lab']} on {rec['gpu_name']}, {rec['created']}")
    if rec["gpu_name"] and rec["gpu_name"] != dev["name"]:
        print(f"NOTE: the record was made on {rec['gpu_name']}, this run is on {dev['name']}: not the same GPU")
    prior = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")
    if prior:
        print(f"NOTE: the allocator settings in your environment ({prior}) were replaced by backend:<name> alone in both runs")
    tn_touch, ta_touch = nat["touch_ms"]["median"], asy["touch_ms"]["median"]
    print(f"\nallocate + free (+ synchronize), host time, median ms, {nat['repeats']} samples after a warm-up")
    print(f"(torch's pair also runs a {TOUCH_BYTES}-byte fill_ kernel; that fill_ + synchronize alone: "
          f"{tn_touch:.4f} ms native, {ta_touch:.4f} ms cudaMallocAsync; the lab's pair has no kernel)")
    cols = [LAB_LABELS[al] for al in LAB_ALLOCATORS] + [TORCH_LABELS[b] for b in BACKENDS]
    print(f"{'size':>10} " + " ".join(f"{c:>{max(len(c), 10)}}" for c in cols))
    for lp, m in zip(lab_pairs, w["sizes_mib"]):
        vals = [lp[al]["median"] if lp[al] else None for al in LAB_ALLOCATORS]
        vals += [next(p["ms"]["median"] for p in runs[b]["pairs"] if p["bytes"] == lp["bytes"]) for b in BACKENDS]
        print(f"{str(m) + ' MiB':>10} " + " ".join(fmt_ms(v, max(len(c), 10)) for v, c in zip(vals, cols)))

    tb = w["trace_bytes"]
    print(f"\n{len(tb)} batches of varying size ({mib(min(tb))} to {mib(max(tb))}): allocate, fill, free, synchronize; host time")
    print(f"{'':<24} {'median ms (after the first)':>28} {'25%..75% ms':>18} {'first ms':>9} {'most reserved':>14}")
    lines = [(LAB_LABELS[al], lab_traces.get(al)) for al in LAB_ALLOCATORS] + [(TORCH_LABELS[b], runs[b]["trace"]) for b in BACKENDS]
    for label, t in lines:
        if not t:
            print(f"{label:<24} {'-':>28}")
            continue
        s = t["steady_ms"]
        print(f"{label:<24} {s['median']:>28.4f} {s['middle'][0]:>8.4f}..{s['middle'][1]:<8.4f} {t['first_ms']:>9.4f} {mib(t['most_reserved']):>14}")

    # What the comparison means, from what was observed rather than assumed.
    ap_ = asy["pool"]["after_trace"] or {}
    thr = ap_.get("release_threshold")
    thr_s = "max (UINT64_MAX)" if thr == 2**64 - 1 else (str(thr) if thr is not None else "unreadable (libcuda not reached)")
    print("\nwhat it means:")
    print(f"  torch native keeps freed blocks in its own cache (cudaMalloc once, reuse, give back only on empty_cache): like the pool at "
          f"threshold max. Observed: {mib(nat['trace']['reserved_at_end'])} reserved after the batches, "
          f"{mib(nat['trace']['reserved_after_empty_cache'])} after empty_cache.")
    print(f"  torch cudaMallocAsync allocates from the driver's default pool; PyTorch sets that pool's release threshold "
          f"to UINT64_MAX at first use (c10/cuda/CUDAMallocAsyncAllocator.cpp). Observed: threshold {thr_s}, "
          f"{mib(asy['trace']['reserved_at_end'])} reserved after the batches, "
          f"{mib(asy['trace']['reserved_after_empty_cache'])} after empty_cache (which trims the pool to 0).")
    print("  neither backend gives memory back at each synchronize, as the lab's threshold 0 does.")
    for b in BACKENDS:
        s = runs[b]["memory_stats"]["after_trace"]
        if s:
            print(f"  memory_stats, {TORCH_LABELS[b]}: " + ", ".join(f"{k} {v}" for k, v in s.items()))
    print("  (the cudaMallocAsync backend keeps only the *_bytes statistics; its counters read 0)")

    if a.out:
        doc = {"reference": "crate/reference/torch_alloc.py", "command": command_line(sys.argv),
               "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "fingerprint": {"gpu_name": dev["name"], "gpu_uuid": dev["uuid"], "device_index": dev["index"],
                               "compute_capability": dev["compute_capability"], "memory_bytes": dev["memory_bytes"],
                               "torch": nat["torch"], "torch_cuda": nat["torch_cuda"], "driver_version": drv},
               "record": {"path": shown_path(w["path"]), **rec},
               "config": {"sizes_mib": w["sizes_mib"], "repeats": nat["repeats"], "trace_bytes": tb, "touch_bytes": TOUCH_BYTES},
               "torch": {b: {k: runs[b][k] for k in ("backend", "alloc_conf", "touch_ms", "pairs", "trace", "pool", "memory_stats")} for b in BACKENDS},
               "lab": {"pairs": lab_pairs, "traces": lab_traces},
               "ratios": {"pairs": rows, "trace": trace_ratios}}
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"\nwrote {a.out}")
    sys.exit(0)


if __name__ == "__main__":
    try:
        main()
    except Refused as e:  # a child's refusal (exit 2, the parent says so)
        print(f"torch_alloc: {e}", file=sys.stderr)
        sys.exit(2)
