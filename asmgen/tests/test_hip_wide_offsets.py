"""The 64-bit-offset FP8 kernels address tensors whose byte offsets exceed 32 bits: run in the simulator over a
sparse memory that holds only the slices a call touches, batch 1 placed 2^32 + 2^20 bytes after batch 0."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import asmgen.hip as hip
import zyfa.numerics as zyfa_numerics
from asmgen.sim import MemoryFault, load
from zyfa.jobs import chiplet_order, paired_jobs
from zyfa_kernels import ArgLayout
from zyfa_tools import inputs

BATCH_STRIDE = 2**32 + 2**20  # elements between the batches of q, k, v and out: beyond any 32-bit offset
BASE = 1 << 40


class SparseMemory:
    """Global memory as separate segments at chosen addresses; an access outside every segment faults."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.data: list[np.ndarray] = []
        self.next = BASE

    def place(self, addr: int, data) -> int:
        raw = np.frombuffer(bytes(data), np.uint8).copy() if isinstance(data, (bytes, bytearray)) else \
            np.ascontiguousarray(data).reshape(-1).view(np.uint8).copy()
        at = int(np.searchsorted(self.starts, addr))
        self.starts.insert(at, addr)
        self.data.insert(at, raw)
        self.next = max(self.next, -(-(addr + len(raw)) // 256) * 256)
        return addr

    def put(self, data, align: int = 256) -> int:
        return self.place(-(-self.next // align) * align, data)

    def alloc(self, size: int, align: int = 256) -> int:
        return self.put(np.zeros(size, np.uint8), align)

    def _locate(self, addrs: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        addrs = np.asarray(addrs, dtype=np.int64)
        seg = np.searchsorted(np.array(self.starts, dtype=np.int64), addrs, side="right") - 1
        ends = np.array([s + len(d) for s, d in zip(self.starts, self.data, strict=True)], dtype=np.int64)
        bad = (seg < 0) | (addrs + size > ends[np.maximum(seg, 0)])
        if bad.any():
            raise MemoryFault(f"global access of {size} bytes at {int(addrs[bad][0]):#x} is outside every segment")
        return seg, addrs - np.array(self.starts, dtype=np.int64)[seg]

    def check(self, addrs, size: int) -> None:
        self._locate(addrs, size)

    def gather(self, addrs, size: int) -> np.ndarray:
        seg, off = self._locate(addrs, size)
        out = np.empty((len(seg), size), np.uint8)
        for s in np.unique(seg):
            rows = seg == s
            out[rows] = self.data[s][off[rows, None] + np.arange(size)]
        return out

    def scatter(self, addrs, rows: np.ndarray) -> None:
        seg, off = self._locate(addrs, rows.shape[1])
        for s in np.unique(seg):
            sel = seg == s
            self.data[s][off[sel, None] + np.arange(rows.shape[1])] = rows[sel]

    def read(self, addr: int, size: int) -> np.ndarray:
        return self.gather(np.array([addr]), size)[0].copy()


def launch(entry: dict, code: bytes, q8, k8, v8, descales, scale: float):
    """One call with batch b of every tensor at base + b * BATCH_STRIDE elements; returns (out, lse)."""
    batch, seqlen, heads, d_qk = q8.shape
    heads_k, d_v = k8.shape[2], v8.shape[3]
    memory = SparseMemory()
    bases = {}
    for name, t, elem in (("q", q8, 1), ("k", k8, 1), ("v", v8, 1), ("out", None, 2)):
        bases[name] = memory.next
        for b in range(batch):
            data = np.zeros(seqlen * heads * d_v * 2, np.uint8) if t is None else \
                t[b].contiguous().view(torch.uint8).numpy()
            memory.place(bases[name] + b * BATCH_STRIDE * elem, data)
        memory.next = bases[name] + batch * BATCH_STRIDE * elem
    jobs = chiplet_order(paired_jobs(batch, heads, seqlen // entry["tile_m"]), entry["grid_size"], 8)
    values = {**bases, "lse": memory.alloc(batch * heads * seqlen * 4), "jobs": memory.put(jobs),
              "num_jobs": len(jobs), "seqlen": seqlen, "heads": heads, "heads_k": heads_k, "softmax_scale": scale}
    values.update({f"{n}_descale": memory.put(d.numpy().astype(np.float32)) for n, d in zip("qkv", descales,
                                                                                            strict=True)})
    for name, h, d in (("q", heads, d_qk), ("k", heads_k, d_qk), ("v", heads_k, d_v), ("out", heads, d_v)):
        values.update({f"{name}_stride_b": BATCH_STRIDE, f"{name}_stride_s": h * d, f"{name}_stride_h": d})
    kernarg = ArgLayout.from_manifest(entry["args"], entry["name"]).pack(values, entry["name"])
    load(code).launch(entry["symbol"], (entry["grid_size"], 1, 1), (entry["threads"], 1, 1), kernarg, memory,
                      workgroups=[(w, 0, 0) for w in range(len(jobs))])
    out = np.stack([memory.read(bases["out"] + 2 * b * BATCH_STRIDE, seqlen * heads * d_v * 2) for b in range(batch)])
    out = torch.from_numpy(out.view(np.int16).copy()).view(torch.bfloat16).reshape(batch, seqlen, heads, d_v)
    lse = memory.read(values["lse"], batch * heads * seqlen * 4).view(np.float32)
    return out, torch.from_numpy(lse.copy()).reshape(batch, heads, seqlen)


@pytest.fixture(scope="module")
def problem():
    entry = hip.kernel_entry("fp8_d128_wide")
    q, k, v = inputs.gaussian(2, 256, 1, 1, 128, 128, seed=9, std=1.0)
    q8, k8, v8, d = inputs.quantize(q, k, v, torch.float8_e4m3fn)
    descales = (d["q_descale"], d["k_descale"], d["v_descale"])
    scale = float(torch.tensor(128 ** -0.5, dtype=torch.float32))
    model, lse = zyfa_numerics.attention(q8, k8, v8, q_descale=descales[0], k_descale=descales[1],
                                         v_descale=descales[2], softmax_scale=scale,
                                         config=zyfa_numerics.config_from_kernel(entry), return_lse=True)
    return entry, (q8, k8, v8), descales, scale, model, lse


def test_wide_kernel_addresses_beyond_4_gib(problem):
    """Every byte of batch 1 lies more than 2^32 bytes from its tensor's base; an offset that wrapped (or was
    truncated) would leave the placed slices and fault."""
    entry, tensors, descales, scale, model, lse = problem
    assert BATCH_STRIDE > 2**32 and entry["offset_bits"] == 64
    out, got_lse = launch(entry, hip.code_object(entry["name"]), *tensors, descales, scale)
    assert torch.equal(out.view(torch.int16), model.view(torch.int16))  # lean P: bit for bit the model here
    torch.testing.assert_close(got_lse, lse, rtol=1e-5, atol=1e-5)
