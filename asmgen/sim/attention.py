"""Running the gfx950 FP8 attention kernels in the simulator: memory, job table and argument buffer as a launch
through zyfa_kernels would build them, then out and lse read back.

Tensors are (batch, seqlen, heads, dim) ("bshd"), contiguous; seqlen a multiple of the kernel's tile_m.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from zyfa.jobs import chiplet_order, paired_jobs

from .machine import LaunchStats, load
from .memory import Memory

CHIPLETS = 8  # XCDs of an MI355X
TARGET = "gfx950"


@dataclass
class AttentionRun:
    out: torch.Tensor  # bf16 (batch, seqlen, heads, d_v); rows of jobs not simulated stay zero
    lse: torch.Tensor  # float32 (batch, heads, seqlen)
    jobs: np.ndarray  # the job rows [batch, head, tile_lo, tile_hi] the simulated workgroups ran
    stats: LaunchStats

    def rows_done(self, tile_m: int) -> torch.Tensor:
        """bool (batch, heads, seqlen): the query rows whose out and lse the simulated jobs wrote."""
        batch, seqlen, heads = self.out.shape[:3]
        done = torch.zeros(batch, heads, seqlen, dtype=torch.bool)
        for b, h, lo, hi in self.jobs.tolist():
            for tile in {lo, hi}:
                done[b, h, tile * tile_m:(tile + 1) * tile_m] = True
        return done


def manifest_entry(kernel_name: str) -> tuple[dict, bytes]:
    """(manifest entry fields, code object bytes) of a committed gfx950 kernel."""
    import zyfa_kernels
    kernel = zyfa_kernels.manifest().find(TARGET, name=kernel_name)
    return dict(kernel.fields), kernel.image()


def _as_fp8_bytes(name: str, t) -> np.ndarray:
    t = torch.as_tensor(t)
    if t.dtype == torch.float8_e4m3fn:
        return t.contiguous().view(torch.uint8).numpy()
    if t.dtype == torch.uint8:
        return t.contiguous().numpy()
    if t.dtype == torch.bfloat16:  # the BF16 kernels (asmgen.hip): 16-bit patterns
        return t.contiguous().view(torch.int16).numpy()
    raise TypeError(f"{name} must be torch.float8_e4m3fn (or its uint8 bit patterns) or torch.bfloat16, got {t.dtype}")


def _descale(name: str, value, batch: int, heads_k: int) -> np.ndarray:
    d = torch.as_tensor(value, dtype=torch.float32).broadcast_to((batch, heads_k))
    if not bool((d > 0).all()) or not bool(torch.isfinite(d).all()):
        raise ValueError(f"{name} must hold positive finite float32 values")
    return np.ascontiguousarray(d.numpy(), dtype=np.float32)


def run_attention(kernel_name: str, q8, k8, v8, q_descale=1.0, k_descale=1.0, v_descale=1.0,
                  softmax_scale: float | None = None, *, entry: dict | None = None, code_object: bytes | None = None,
                  workgroups: list[int] | None = None, schedule: str = "round_robin", seed: int = 0,
                  latency: int | None = None, progress: Callable[[int, int], None] | None = None,
                  trace: Callable[[int, int], None] | None = None) -> AttentionRun:
    """Simulate one causal FP8 attention call of a gfx950 kernel.

    kernel_name: "fp8_d128" or "fp8_d192" (the committed object and manifest entry), unless `entry` (a manifest
    entry dict) and `code_object` are given, e.g. a fault-injected variant. The launch is the real one: a grid of
    entry["grid_size"] persistent workgroups over the job list chiplet-ordered for that grid, workgroup w taking
    rows w, w + grid, ... . workgroups: the ones to simulate (default: every one that has a job); the others
    are skipped, and the AttentionRun lists the jobs that ran. With more jobs than workgroups, a few simulated
    workgroups each run several jobs. trace: passed to Program.launch (each executed instruction's wave and index).
    """
    if (entry is None) != (code_object is None):
        raise ValueError("entry and code_object must be given together")
    if entry is None:
        entry, code_object = manifest_entry(kernel_name)
    from zyfa_kernels import ArgLayout
    q, k, v = (_as_fp8_bytes(n, t) for n, t in (("q8", q8), ("k8", k8), ("v8", v8)))
    batch, seqlen, heads, d_qk = q.shape
    heads_k, d_v = k.shape[2], v.shape[3]
    if (k.shape[3], k.shape[:2], v.shape[:3]) != (d_qk, (batch, seqlen), (batch, seqlen, heads_k)):
        raise ValueError(f"shapes q {q.shape}, k {k.shape}, v {v.shape} do not form one attention problem")
    if (d_qk, d_v) != (entry["d_qk"], entry["d_v"]):
        raise ValueError(f"{entry['name']} takes d_qk={entry['d_qk']}, d_v={entry['d_v']}; got {d_qk}, {d_v}")
    if heads % heads_k:
        raise ValueError(f"heads ({heads}) must be a multiple of heads_k ({heads_k})")
    if seqlen % entry["tile_m"]:
        raise ValueError(f"seqlen ({seqlen}) must be a multiple of tile_m ({entry['tile_m']})")
    scale = d_qk ** -0.5 if softmax_scale is None else float(softmax_scale)

    grid = entry["grid_size"]
    jobs = chiplet_order(paired_jobs(batch, heads, seqlen // entry["tile_m"]), grid, CHIPLETS)
    if workgroups is None:
        workgroups = list(range(min(grid, len(jobs))))
    if any(not 0 <= w < grid for w in workgroups):
        raise ValueError(f"workgroups must lie in [0, {grid}), got {workgroups}")
    memory = Memory()
    ptr = {
        "q": memory.put(q), "k": memory.put(k), "v": memory.put(v),
        "out": memory.alloc(batch * seqlen * heads * d_v * 2),
        "lse": memory.alloc(batch * heads * seqlen * 4),
        "q_descale": memory.put(_descale("q_descale", q_descale, batch, heads_k)),
        "k_descale": memory.put(_descale("k_descale", k_descale, batch, heads_k)),
        "v_descale": memory.put(_descale("v_descale", v_descale, batch, heads_k)),
        "jobs": memory.put(jobs),
    }
    values = dict(ptr, num_jobs=len(jobs), seqlen=seqlen, heads=heads, heads_k=heads_k, softmax_scale=scale)
    for name, (h, d) in {"q": (heads, d_qk), "k": (heads_k, d_qk), "v": (heads_k, d_v), "out": (heads, d_v)}.items():
        values.update({f"{name}_stride_b": seqlen * h * d, f"{name}_stride_s": h * d, f"{name}_stride_h": d})
    kernarg = ArgLayout.from_manifest(entry["args"], entry["name"]).pack(values, entry["name"])

    program = load(code_object)
    static_lds = program.descriptor(entry["symbol"]).group_segment_size
    stats = program.launch(entry["symbol"], (grid, 1, 1), (entry["threads"], 1, 1), kernarg, memory,
                           lds_bytes=max(0, entry["shared_bytes"] - static_lds), schedule=schedule, seed=seed,
                           latency=latency, workgroups=[(w, 0, 0) for w in workgroups], progress=progress,
                           trace=trace)
    out = memory.read(ptr["out"], batch * seqlen * heads * d_v * 2).view(np.int16)
    lse = memory.read(ptr["lse"], batch * heads * seqlen * 4).view(np.float32)
    return AttentionRun(
        out=torch.from_numpy(out.copy()).view(torch.bfloat16).reshape(batch, seqlen, heads, d_v),
        lse=torch.from_numpy(lse.copy()).reshape(batch, heads, seqlen),
        jobs=np.concatenate([jobs[w::grid] for w in workgroups]) if workgroups else jobs[:0],
        stats=stats,
    )
