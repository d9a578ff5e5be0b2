"""Copies between two GPUs, to see what `overlap-lab trace` records of them
with and without `--peer-copies`: five 16 MiB copies by PyTorch's
`.to("cuda:1")` (a `cudaMemcpyAsync` between the two GPUs' addresses),
five by CuPy's `memcpyPeerAsync`, and one copy within GPU 0, each checked.

    overlap-lab trace [--peer-copies] -- python3 peer_copies.py

Needs two GPUs, PyTorch and CuPy (`data/nvidia-h200/README.md` has what
it recorded on two H200s).
"""

import sys

import cupy
import torch


def main():
    if torch.cuda.device_count() < 2:
        sys.exit("peer_copies.py: needs two GPUs")
    n = 16 << 20  # bytes a copy
    a = torch.arange(n // 4, dtype=torch.float32, device="cuda:0")
    for _ in range(5):
        b = a.to("cuda:1")
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    if not torch.equal(b.cpu(), a.cpu()):
        sys.exit("peer_copies.py: PyTorch's copy to GPU 1 differs")
    with cupy.cuda.Device(0):
        x = cupy.arange(n // 4, dtype=cupy.float32)
    with cupy.cuda.Device(1):
        y = cupy.empty_like(x)
    for _ in range(5):
        cupy.cuda.runtime.memcpyPeerAsync(y.data.ptr, 1, x.data.ptr, 0, n, 0)
    cupy.cuda.runtime.deviceSynchronize()
    with cupy.cuda.Device(1):
        if not bool((y == cupy.arange(n // 4, dtype=cupy.float32)).all()):
            sys.exit("peer_copies.py: CuPy's peer copy differs")
    a.clone()  # a copy within GPU 0
    torch.cuda.synchronize()
    print("peer_copies: 5 PyTorch copies to GPU 1, 5 CuPy memcpyPeerAsync, 1 copy within GPU 0: checked")


if __name__ == "__main__":
    main()
