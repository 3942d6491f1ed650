"""What one copy costs against where its source and destination lie in their pages.

    python benchmarks/paths/copy_alias.py [--sizes 4K,16K,64K,256K,1M] [--offsets 0,16,64,4080]

Every shared-memory collective copies pieces between a rank's buffer and the page-aligned
windows with ``np.copyto`` (glibc's ``memcpy``).  On this project's VM (AMD EPYC, glibc 2.36,
ERMS and FSRM) ``memcpy`` of a few KiB to a few hundred KiB uses ``rep movsb``, which is many
times slower when the destination starts a few bytes after the source's position in its
4 KiB page (4K aliasing).  The script times, for each size, ``np.copyto`` with the destination
shifted by each offset (bytes, modulo 4096) against a page-aligned source, beside ``torch``'s
``copy_`` (its own vector loop) on the same memory: minimum of 5 repeats of a timed batch,
microseconds per copy.  It prints one row per size and offset.
"""

from __future__ import annotations

import argparse
import timeit

import numpy as np
import torch

from scaledl.cli.bench_collectives import parse_bytes

PAGE = 4096


def _aligned(nbytes: int) -> np.ndarray:
    raw = np.ones(nbytes + 2 * PAGE, np.uint8)
    start = (-raw.ctypes.data) % PAGE
    return raw[start:start + nbytes + PAGE]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4K,16K,64K,256K,1M")
    parser.add_argument("--offsets", default="0,16,64,4080")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'size':>8} {'offset':>6} {'np.copyto us':>13} {'torch copy_ us':>15}")
    for nbytes in (parse_bytes(text) for text in args.sizes.split(",")):
        source = _aligned(nbytes)[:nbytes]
        target = _aligned(nbytes)
        number = max(20, (1 << 22) // nbytes)
        for offset in (int(text) for text in args.offsets.split(",")):
            dst = target[offset:offset + nbytes]
            tsrc, tdst = torch.from_numpy(source), torch.from_numpy(dst)
            names = {"np": np, "dst": dst, "source": source, "tdst": tdst, "tsrc": tsrc}
            numpy_us = min(timeit.repeat("np.copyto(dst, source)", globals=names,
                                         number=number, repeat=5)) / number * 1e6
            torch_us = min(timeit.repeat("tdst.copy_(tsrc)", globals=names, number=number,
                                         repeat=5)) / number * 1e6
            print(f"{nbytes:>8} {offset:>6} {numpy_us:>13.2f} {torch_us:>15.2f}", flush=True)


if __name__ == "__main__":
    main()
