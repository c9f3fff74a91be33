"""Accuracy of the FMA-pipe exponential (exp2_poly in asmgen/sm90a/experiments/exp2_poly.cuh) on the GPU, against
ex2.approx (the MUFU instruction the kernels use) and against exact 2^x (float64).

    python -m ci.gpu_exp2_poly [--out DIR]

Compiles a small test kernel that includes exp2_poly.cuh with nvcc, runs both exponentials on every input of a dense
set over the range the softmax passes them ([-125, 0.5]: x - m <= tau = 0.5), and writes DIR/exp2_poly.json: maximum
relative errors, the maximum relative difference between the two, and how often bf16(p) differs (P of the PV
product). Exits non-zero when exp2_poly's relative error exceeds MAX_REL_ERROR.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import cupy as cp

HEADER_DIR = Path(__file__).resolve().parents[1] / "asmgen" / "sm90a"
MAX_REL_ERROR = 2.5e-7  # exp2_poly's design bound is 1.7e-7 (FP32 Horner evaluation of the degree-5 fit)
LOWEST, HIGHEST = -125.0, 0.5  # the inputs the attention kernels pass it
DENSE = 1 << 26  # evenly spaced inputs over the range, and as many over [-1, 0.5] where most probabilities lie
THREADS = 256

SOURCE = r"""
#include "exp2_poly.cuh"
extern "C" __global__ void exponentials(const float* x, float* poly, float* mufu, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    poly[i] = zyfa::exp2_poly(x[i]);
    mufu[i] = zyfa::ex2(x[i]);
  }
}
"""


def build(folder: Path) -> Path:
    (folder / "exponentials.cu").write_text(SOURCE)
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc") or "nvcc"
    subprocess.run([nvcc, "-cubin", "-O3", "-std=c++17", "-gencode", "arch=compute_90a,code=sm_90a",
                    f"-I{HEADER_DIR}", f"-I{HEADER_DIR / 'experiments'}", "-o", "exponentials.cubin",
                    "exponentials.cu"], cwd=folder, check=True)
    return folder / "exponentials.cubin"


def bf16_bits(x: cp.ndarray) -> cp.ndarray:
    """Round-to-nearest-even BF16 bit patterns of float32 values (finite, as here)."""
    bits = x.view(cp.uint32)
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        kernel = cp.RawModule(path=str(build(Path(tmp)))).get_function("exponentials")
        x = cp.concatenate([cp.linspace(LOWEST, HIGHEST, DENSE, dtype=cp.float64),
                            cp.linspace(-1.0, HIGHEST, DENSE, dtype=cp.float64)]).astype(cp.float32)
        n = x.size
        poly, mufu = cp.empty_like(x), cp.empty_like(x)
        kernel(((n + THREADS - 1) // THREADS,), (THREADS,), (x, poly, mufu, cp.int32(n)))
        exact = cp.exp2(x.astype(cp.float64))
        report = {
            "inputs": int(n), "range": [LOWEST, HIGHEST],
            "max_rel_error_poly": float(cp.abs(poly / exact - 1).max()),
            "max_rel_error_ex2_approx": float(cp.abs(mufu / exact - 1).max()),
            "max_rel_diff_poly_vs_ex2": float(cp.abs(poly.astype(cp.float64) / mufu - 1).max()),
            "frac_bf16_differs_poly_vs_ex2": float((bf16_bits(poly) != bf16_bits(mufu)).mean()),
            "frac_bf16_differs_ex2_vs_exact": float((bf16_bits(mufu) != bf16_bits(exact.astype(cp.float32))).mean()),
        }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "exp2_poly.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report))
    return 0 if report["max_rel_error_poly"] <= MAX_REL_ERROR else 1


if __name__ == "__main__":
    sys.exit(main())
