"""What compute-sanitizer's initcheck says of an elementwise kernel reading
what a cuBLAS GEMM just wrote, in PyTorch alone: the pattern of lab 9's
ReLU (kernels/relu_f16.cu), which reads the first GEMM's output.

    compute-sanitizer --tool initcheck python3 crate/reference/sanitizer/cublas_then_relu.py

On an H200 (CUDA 13, driver 580, PyTorch 2.11; 2026-11-29) initcheck
reported "Uninitialized __global__ memory read of size 16 bytes" in
PyTorch's own clamp kernel (torch.relu_) reading the FP16 GEMM's output,
as it does in lab 9's ReLU: the tool does not see the GEMM's stores.
MAINTAINERS runs initcheck with relu_f16 excluded, and says why.
"""

import torch

x = torch.randn(4096, 2048, dtype=torch.half, device="cuda")
w = torch.randn(2048, 8192, dtype=torch.half, device="cuda")
h = torch.empty(4096, 8192, dtype=torch.half, device="cuda")
torch.matmul(x, w, out=h)  # every element of h written by cuBLAS
torch.relu_(h)  # read by PyTorch's elementwise kernel
torch.cuda.synchronize()
print("GEMM then ReLU: every value finite:", bool(torch.isfinite(h).all()))
