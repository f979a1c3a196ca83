#!/usr/bin/env python3
"""f32 GEMM 512x512x512: mslc's kernel against NumPy's matmul (its BLAS), in one script.

Runs `cargo bench --bench kernels -- gemm512` (mslc's packed GEMM on all cores and on one) and
times `a @ b` in NumPy on the same shapes, then prints both and the ratio per thread count.
NumPy's BLAS thread count is set with threadpoolctl when it is installed, else through the
OPENBLAS/OMP/MKL environment variables before NumPy loads.

usage: scripts/bench_gemm.py [--seconds 2]
"""
import argparse
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 512


def numpy_best_us(threads, seconds):
    """Best microseconds per 512^3 f32 product in a fresh NumPy limited to `threads`."""
    code = f"""
import os, time
for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[v] = "{threads}"
import numpy as np
rng = np.random.default_rng(0)
a = rng.standard_normal(({N}, {N}), dtype=np.float32)
b = rng.standard_normal(({N}, {N}), dtype=np.float32)
for _ in range(20):
    a @ b
best, end = float("inf"), time.perf_counter() + {seconds}
while time.perf_counter() < end:
    t = time.perf_counter(); a @ b; best = min(best, time.perf_counter() - t)
print(best * 1e6)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def mslc_best_us(seconds):
    """{threads: best microseconds} from the kernels bench."""
    env = dict(os.environ, KERNELS_BENCH_SECONDS=str(seconds))
    out = subprocess.run(
        ["cargo", "bench", "-q", "--bench", "kernels", "--", "gemm512"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    ).stdout
    found = {}
    for line in out.splitlines():
        m = re.search(rf"m={N} k={N} n={N}\s+(\d+)T best\s+([\d.]+) us", line)
        if m:
            found[int(m.group(1))] = float(m.group(2))
    if not found:
        sys.exit(f"no gemm512 line in the bench output:\n{out}")
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    import numpy as np

    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    isa = "AVX-512" if " avx512f" in flags else "AVX2" if " avx2" in flags else "no AVX2"
    model = re.search(r"model name\s*:\s*(.*)", flags)
    print(f"machine: {model.group(1) if model else 'unknown CPU'}, {isa}, {os.cpu_count()} CPUs;"
          f" NumPy {np.__version__}")
    mslc = mslc_best_us(args.seconds)
    flops = 2.0 * N ** 3
    for threads in sorted(mslc):
        ours, theirs = mslc[threads], numpy_best_us(threads, args.seconds)
        print(f"{threads} thread(s): mslc {ours:.0f} us ({flops / ours / 1e3:.1f} GFLOP/s), "
              f"numpy {theirs:.0f} us ({flops / theirs / 1e3:.1f} GFLOP/s): "
              f"mslc at {theirs / ours:.2f}x numpy's speed")


if __name__ == "__main__":
    main()
