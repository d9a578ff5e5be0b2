"""NVTX ranges from PyTorch (`torch.cuda.nvtx`), for `overlap-lab trace` to
record on their CPU thread: a range around each of three steps of a GEMM.

    python3 torch_nvtx.py
"""

import torch

x = torch.randn(1024, 1024, device="cuda")
for step in range(3):
    torch.cuda.nvtx.range_push(f"step {step}")
    x = torch.relu(x @ x) / 1024
    torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
print("torch_nvtx: 3 steps")
