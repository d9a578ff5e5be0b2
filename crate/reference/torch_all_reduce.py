#!/usr/bin/env python3
"""Lab 8's reference: PyTorch's all-reduce (torch.distributed over NCCL, a
float32 sum in place) over GPUS, one process per GPU, timed as overlap-lab
times its own: by difference (COPIES all-reduces minus one, over COPIES-1),
each run bracketed by CUDA events on rank 0's current stream after a spin
kernel holds it while Python issues the run, RUNS runs after one untimed
run of each; the sum checked once per size on every rank (each rank fills
its tensor with rank+1, every element must be the sum of those fills).
NVLink multicast (NCCL's NVLS) stays off, as in overlap-lab's own process.

Usage: torch_all_reduce.py --gpus 0,1,2,3 --sizes-bytes 1048576,67108864
       [--copies 11] [--runs 5]
Rank 0 prints one JSON object: {"torch": version, "nccl": "2.x.y", "gpus":
[...], "sizes": [bytes per GPU, ...], "ms": [[per all-reduce, ms, one per
run], ...]} (one list per size). overlap-lab runs it in the same process
tree as its own measurement (`overlap-lab multi-gpu`). On an error it exits
non-zero with the reason in one line."""
import argparse, json, os, shutil, sys, tempfile

# Before PyTorch or NCCL read their environment (the ranks inherit it).
# overlap-lab passes these already; set here too where they are unset.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
for _k, _v in MULTICAST_OFF.items():
    os.environ.setdefault(_k, _v)

# About 10 ms of a GPU's clock: far longer than issuing a run's all-reduces.
HOLD_CYCLES = 20_000_000


def numbers(text):
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated whole numbers")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch's NCCL all-reduce over several GPUs, one process each (lab 8's reference).")
    ap.add_argument("--gpus", type=numbers, required=True, help="GPU ordinals, one rank each, e.g. 0,1,2,3")
    ap.add_argument("--sizes-bytes", type=numbers, required=True, help="bytes each GPU sums, per size, e.g. 1048576,67108864")
    ap.add_argument("--copies", type=int, default=11, help="all-reduces in the long run of each pair (default 11)")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per size (default 5)")
    a = ap.parse_args(argv)
    if not a.gpus or len(set(a.gpus)) != len(a.gpus) or min(a.gpus) < 0:
        ap.error(f"--gpus {a.gpus}: give distinct GPU ordinals")
    if not a.sizes_bytes or min(a.sizes_bytes) < 4:
        ap.error("--sizes-bytes: give sizes of 4 bytes or more")
    if a.copies < 2 or a.runs < 1:
        ap.error("give --copies >= 2 and --runs >= 1")
    return a


def nccl_version(torch):
    v = torch.cuda.nccl.version()
    if isinstance(v, tuple):
        return ".".join(str(x) for x in v[:3])
    # NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9.
    return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"


def measure(rank, a, store):
    import torch
    import torch.distributed as dist

    gpu = a.gpus[rank]
    world = len(a.gpus)
    torch.cuda.set_device(gpu)
    dev = torch.device("cuda", gpu)
    # Ended by `worker` once this returns; a failed rank only exits (its
    # peers may be gone, and ending the group could wait on them).
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world, device_id=dev)
    want = world * (world + 1) / 2
    sizes, ms = [], []
    for size in a.sizes_bytes:
        n = size // 4
        x = torch.empty(n, dtype=torch.float32, device=dev)

        def run(k):
            x.fill_(rank + 1.0)
            dist.barrier()
            torch.cuda.synchronize(dev)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            # A spin kernel holds the stream while Python issues the
            # all-reduces (as overlap-lab's gate holds its streams), so
            # the time Python takes to issue them is not in their time.
            torch.cuda._sleep(HOLD_CYCLES)
            start.record()
            for _ in range(k):
                dist.all_reduce(x)
            end.record()
            end.synchronize()
            return start.elapsed_time(end)

        run(1)
        run(a.copies)
        # The sum, checked once per size, on every rank.
        x.fill_(rank + 1.0)
        dist.all_reduce(x)
        torch.cuda.synchronize(dev)
        wrong = int((x != want).sum().item())
        if wrong:
            raise RuntimeError(f"the all-reduce of {n * 4} bytes left {wrong} of {n} elements other than {want:g}")
        per_op = []
        for _ in range(a.runs):
            t1 = run(1)
            tk = run(a.copies)
            per_op.append((tk - t1) / (a.copies - 1))
        sizes.append(n * 4)
        ms.append(per_op)
        del x
        torch.cuda.empty_cache()
    return {"torch": torch.__version__, "nccl": nccl_version(torch), "gpus": a.gpus, "sizes": sizes, "ms": ms}


def worker(rank, a, store, errors):
    import torch.distributed as dist

    try:
        out = measure(rank, a, store)
        dist.destroy_process_group()
        if rank == 0:
            print(json.dumps(out), flush=True)
    except Exception as e:
        line = (str(e).strip().splitlines() or [""])[0]
        with open(os.path.join(errors, f"rank{rank}"), "w") as f:
            f.write(f"rank {rank} (GPU {a.gpus[rank]}): {type(e).__name__}: {line}")
        # Not an Exception: spawn passes on the exit code, not a traceback.
        raise SystemExit(1)


def first_error(errors):
    """The first rank's reason to be written (the others' often follow from it)."""
    paths = [os.path.join(errors, p) for p in os.listdir(errors)]
    for p in sorted(paths, key=os.path.getmtime):
        with open(p) as f:
            return f.read().strip()
    return None


def main():
    a = parse_args()
    try:
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
    except ImportError as e:
        sys.exit(f"torch_all_reduce.py: PyTorch is not importable by {sys.executable}: {e}")
    if not torch.cuda.is_available():
        sys.exit("torch_all_reduce.py: PyTorch sees no CUDA GPU")
    if max(a.gpus) >= torch.cuda.device_count():
        sys.exit(f"torch_all_reduce.py: --gpus {a.gpus}: PyTorch sees {torch.cuda.device_count()} GPU(s)")
    if not dist.is_nccl_available():
        sys.exit("torch_all_reduce.py: this PyTorch has no NCCL backend")
    work = tempfile.mkdtemp(prefix="torch-all-reduce-")
    errors = os.path.join(work, "errors")
    os.mkdir(errors)
    try:
        # The store's file must not exist yet: it is made in a fresh folder.
        mp.spawn(worker, args=(a, os.path.join(work, "store"), errors), nprocs=len(a.gpus), join=True)
    except Exception as e:
        why = first_error(errors) or (str(e).strip().splitlines() or [type(e).__name__])[0]
        sys.exit(f"torch_all_reduce.py: {why}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
