"""Shared pytest configuration (``tests`` is a package, so its helpers import as ``tests.*``).

The suite checks the host-memory paths (Gloo, shared memory, models on the CPU) and must give
the same answers on a GPU workstation as on CI's CPU-only machine.  So CUDA is hidden from this
process and every process it starts: ``scaledl.init()`` then defaults to Gloo, as the tests'
CPU tensors need, and ``scaledl simulate profile`` measures the CPU.  On a lent H100 the suite
without this failed in every test whose ranks share one host (NCCL gives each rank its own GPU).
The CUDA checks are ``benchmarks/device/check.sh``.
"""

import os

os.environ["CUDA_VISIBLE_DEVICES"] = ""
