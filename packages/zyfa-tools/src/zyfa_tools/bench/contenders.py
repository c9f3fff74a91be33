"""ZYFA and the peers it is measured against, each as a call on the shared inputs.

A contender is prepared once per configuration (layout copies and graph builds happen outside the timing) and
returns its output decoded to float32 (batch, seqlen, heads, d_v), so that the error of every contender is measured
the same way. What cannot run says why: `Skip(reason)` (not installed, no kernel in the manifest, a dtype or head
dim the peer does not take), reported in the results beside the measured rows.
ZYFA's configurations come from the manifest (zyfa_kernels.manifest) for the device's target; on the CPU the
reference path serves every configuration. On sm90a the shipped kernels of the other schedule and kernel variants
(a manifest of builds for measurement) are launched directly as contenders of their own.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import zyfa
from zyfa.backends import backend_name, describe

from .protocol import Config, Inputs, watchdog

FIRST_CALL_LIMIT_S = 30.0  # one call of any contender takes milliseconds on a GPU; the watchdog ends a hang


@dataclass
class Contender:
    name: str
    call: Callable[[], object]  # one call on the prepared inputs
    decode: Callable[[object], torch.Tensor]  # a call's result -> float32 (batch, seqlen, heads, d_v)
    note: str = ""
    error: float | None = None  # relative RMS error of the first call's output against float64


@dataclass(frozen=True)
class Skip:
    name: str
    reason: str


def target_of(device: torch.device) -> str:
    """The ZYFA backend of `device`: "reference" on the CPU, "sm90a" or "gfx950" on a supported GPU."""
    return backend_name(describe(device))


def zyfa_kernels_for(config: Config, target: str) -> list:
    """The manifest entries that serve `config` on `target` (dtype, head dims, and S inside an entry's
    [seqlen_min, seqlen_max) where the manifest gives one)."""
    import zyfa_kernels

    dtype = {"bf16": "bf16", "fp8": "fp8e4m3"}[config.dtype]
    found = []
    for kernel in zyfa_kernels.manifest().kernels:
        fields = kernel.fields
        low, high = fields.get("seqlen_min") or 0, fields.get("seqlen_max")
        if (kernel.target, kernel.dtype, kernel.d_qk, kernel.d_v) == (target, dtype, config.d_qk, config.d_v) \
                and low <= config.seqlen and (high is None or config.seqlen < high):
            found.append(kernel)
    return found


def model_kwargs(kernel) -> dict:
    """zyfa.numerics.attention's keywords for the numerics a kernel's manifest entry declares (config_from_kernel)."""
    from zyfa import numerics

    return dataclasses.asdict(numerics.config_from_kernel(kernel.fields))


def _bshd_float(out) -> torch.Tensor:
    return (out[0] if isinstance(out, tuple) else out).float()


def _default_p_mode(kernels) -> str:
    """The p_mode a call without p_mode gets: the entry marked p_mode_default, else the only one."""
    marked = {k.p_mode for k in kernels if k.fields.get("p_mode_default")}
    return (marked or {k.p_mode for k in kernels}).pop()


def _launch(kernel, config: Config, x: Inputs, name: str) -> Contender:
    """`kernel` (a manifest entry) launched directly by the sm90a backend on the shared inputs."""
    from zyfa.backends import sm90a

    descales = (None, None, None)
    if x.descales:  # the backend takes (batch, heads_k) descales
        descales = tuple(x.descales[f"{n}_descale"].reshape(1, 1).expand(1, config.heads_k).contiguous()
                         for n in ("q", "k", "v"))
    scale = config.d_qk ** -0.5
    return Contender(name, lambda: sm90a.run(kernel, x.q, x.k, x.v, scale, "bshd", descales=descales), _bshd_float,
                     kernel.name)


def _fits(kernel, config: Config) -> bool:
    dtype = {"bf16": "bf16", "fp8": "fp8e4m3"}[config.dtype]
    return (kernel.dtype, kernel.d_qk, kernel.d_v) == (dtype, config.d_qk, config.d_v)


def load_variants(folder: Path) -> list:
    """The manifest entries of a folder of kernel variants (python -m asmgen.sm90a.experiments FOLDER)."""
    import zyfa_kernels

    manifest = Path(folder) / "manifest.json"
    if not manifest.is_file():
        raise ValueError(f"--variants {folder}: no manifest.json there")
    return list(zyfa_kernels.Manifest.from_file(manifest).kernels)


def zyfa_contenders(config: Config, x: Inputs, target: str, variants=()) -> list[Contender | Skip]:
    """"zyfa": the call without p_mode, and for FP8 one "zyfa-<p_mode>" per other p_mode the manifest serves; on
    sm90a "zyfa-<kernel>" for each shipped kernel the call does not dispatch to at this length (kernel_label), and
    each of `variants` (manifest entries) of the configuration's dtype and head dims under its own name."""
    if target == "reference":
        return [Contender("zyfa", lambda: zyfa.flash_attn_func(x.q, x.k, x.v, causal=True, **x.descales),
                          _bshd_float, "reference path (the numerics model)")]
    kernels = zyfa_kernels_for(config, target)
    if not kernels:
        return [Skip("zyfa", f"no {target} kernel for {config.dtype} d {config.d_qk}/{config.d_v} at S = "
                             f"{config.seqlen} in the manifest")]
    default = _default_p_mode(kernels)
    made = [Contender("zyfa", lambda: zyfa.flash_attn_func(x.q, x.k, x.v, causal=True, **x.descales), _bshd_float,
                      ", ".join(k.name for k in kernels if k.p_mode == default))]
    takes_p_mode = "p_mode" in inspect.signature(zyfa.flash_attn_func).parameters
    for p_mode in sorted({k.p_mode for k in kernels} - {default}):
        name = f"zyfa-{p_mode}"
        if not takes_p_mode:
            made.append(Skip(name, "this zyfa.flash_attn_func has no p_mode keyword"))
            continue
        made.append(Contender(name, lambda p_mode=p_mode: zyfa.flash_attn_func(
            x.q, x.k, x.v, causal=True, p_mode=p_mode, **x.descales), _bshd_float,
            ", ".join(k.name for k in kernels if k.p_mode == p_mode)))
    if target != "sm90a":
        return made + [Skip(v.name, f"kernel variants are launched on sm90a only, not {target}") for v in variants
                       if _fits(v, config)]
    made += [_launch(k, config, x, f"zyfa-{kernel_label(k)}") for k in other_kernels(config, kernels, default)]
    return made + [_launch(v, config, x, v.name) for v in variants if _fits(v, config)]


def other_kernels(config: Config, kernels, p_mode: str) -> list:
    """The shipped sm90a kernels of `config`'s dtype, head dims and `p_mode` that none of `kernels` (those serving
    config.seqlen) is: the kernels the call takes at other lengths."""
    import zyfa_kernels

    dispatched = {k.name for k in kernels}
    return [k for k in zyfa_kernels.manifest().of("sm90a")
            if _fits(k, config) and k.p_mode == p_mode and k.name not in dispatched]


def kernel_label(kernel) -> str:
    """What tells a kernel from the others of its dtype and head dims: its name after them (e.g. "pingpong",
    "independent", "code_test_pingpong")."""
    return re.sub(r"^.*?_d\d+(_\d+)?_", "", kernel.name)


def _sdpa(backend_name_: str, device: torch.device):
    """torch SDPA restricted to one backend, on (batch, heads, seqlen, dim) copies of the inputs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name_)

    def prepare(config: Config, x: Inputs) -> Contender | Skip:
        name = f"sdpa-{backend_name_.split('_')[0].lower()}"
        if config.dtype != "bf16":
            return Skip(name, "torch SDPA takes no FP8 inputs")
        q, k, v = (t.transpose(1, 2).contiguous() for t in (x.q, x.k, x.v))
        gqa = config.heads != config.heads_k

        def call():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

        return Contender(name, call, lambda out: out.transpose(1, 2).float())

    return prepare


def _fa3(config: Config, x: Inputs) -> Contender | Skip:
    module = next((m for m in ("flash_attn_interface", "fa3_fwd_interface") if importlib.util.find_spec(m)), None)
    if module is None:
        return Skip("fa3", "not installed (flash_attn_interface from flash-attn 3, or fa3_fwd_interface from fa3-fwd)")
    fa3 = importlib.import_module(module)
    descales = {}
    if x.descales:  # FA3 takes FP8 descales of shape (batch, heads_k)
        descales = {n: d.reshape(1, 1).expand(1, config.heads_k).contiguous() for n, d in x.descales.items()}
    return Contender("fa3", lambda: fa3.flash_attn_func(x.q, x.k, x.v, causal=True, **descales), _bshd_float, module)


def _cudnn_fp8(config: Config, x: Inputs) -> Contender | Skip:
    """cuDNN's FP8 attention through the cudnn frontend's sdpa_fp8 graph: FP8 output (on Hopper), here scaled by
    1 / v_descale so that it spans e4m3's range, P quantized with scale 256."""
    if config.dtype != "fp8":
        return Skip("cudnn-fp8", "BF16 cuDNN attention is sdpa-cudnn")
    if importlib.util.find_spec("cudnn") is None:
        return Skip("cudnn-fp8", "not installed (nvidia-cudnn-frontend)")
    import cudnn

    p_scale = 256.0
    fp8, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
    handle = cudnn.create_handle()
    graph = cudnn.pygraph(io_data_type=fp8, intermediate_data_type=fp32, compute_data_type=fp32, handle=handle)

    def bhsd(t):  # logical (batch, heads, seqlen, dim) over the (batch, seqlen, heads, dim) storage
        return t.permute(0, 2, 1, 3)

    q, k, v = (bhsd(t) for t in (x.q, x.k, x.v))
    out = torch.empty(1, config.seqlen, config.heads, config.d_v, dtype=torch.float8_e4m3fn, device=x.q.device)
    scalars = {"descale_q": x.descales["q_descale"], "descale_k": x.descales["k_descale"],
               "descale_v": x.descales["v_descale"], "descale_s": 1.0 / p_scale, "scale_s": p_scale,
               "scale_o": 1.0 / x.descales["v_descale"]}
    values = {n: torch.as_tensor(s, dtype=torch.float32, device=x.q.device).reshape(1, 1, 1, 1)
              for n, s in scalars.items()}
    tq, tk, tv = (graph.tensor(dim=list(t.shape), stride=list(t.stride()), data_type=fp8) for t in (q, k, v))
    ts = {n: graph.tensor(dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=fp32) for n in values}
    o, _, amax_s, amax_o = graph.sdpa_fp8(q=tq, k=tk, v=tv, **ts, is_inference=True,
                                          attn_scale=1.0 / math.sqrt(config.d_qk), use_causal_mask=True)
    o.set_output(True).set_dim(list(bhsd(out).shape)).set_stride(list(bhsd(out).stride())).set_data_type(fp8)
    amaxes = [torch.empty(1, 1, 1, 1, dtype=torch.float32, device=x.q.device) for _ in range(2)]
    for t in (amax_s, amax_o):
        t.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(fp32)
    try:
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
    except Exception as error:  # cudnn raises its own exception types for unsupported graphs
        return Skip("cudnn-fp8", f"graph not supported: {str(error).splitlines()[0]}")
    workspace = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device=x.q.device)
    pack = {tq: q, tk: k, tv: v, o: bhsd(out), amax_s: amaxes[0], amax_o: amaxes[1],
            **{ts[n]: values[n] for n in values}}
    v_descale = float(x.descales["v_descale"])

    def call():  # on torch's current stream, so that a CUDA graph captures it like the other contenders
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(x.q.device).cuda_stream)
        graph.execute(pack, workspace, handle=handle)
        return out

    version = getattr(cudnn, "backend_version", lambda: "(version unknown)")()
    return Contender("cudnn-fp8", call, lambda result: result.float() * v_descale, f"cudnn {version}, FP8 output")


def _flashinfer(config: Config, x: Inputs) -> Contender | Skip:
    if importlib.util.find_spec("flashinfer") is None:
        return Skip("flashinfer", "not installed (flashinfer-python)")
    if config.dtype != "bf16":
        return Skip("flashinfer", "FP8 q, k and v with BF16 output are not measured for flashinfer")
    import flashinfer

    q, k, v = x.q[0], x.k[0], x.v[0]  # (seqlen, heads, dim): batch 1
    return Contender("flashinfer", lambda: flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True),
                     lambda out: out.float()[None])


def _aiter(config: Config, x: Inputs) -> Contender | Skip:
    if importlib.util.find_spec("aiter") is None:
        return Skip("aiter", "not installed")
    import aiter

    if config.dtype == "bf16":
        return Contender("aiter", lambda: aiter.flash_attn_func(x.q, x.k, x.v, causal=True), _bshd_float)
    descales = {n: d.reshape(1) for n, d in x.descales.items()}
    return Contender("aiter", lambda: aiter.flash_attn_fp8_pertensor_func(x.q, x.k, x.v, causal=True, **descales),
                     _bshd_float, "flash_attn_fp8_pertensor_func")


def peers(device: torch.device) -> list[tuple[str, Callable]]:
    """(name, prepare) of every peer this device can run; prepare(config, inputs) -> Contender | Skip."""
    if device.type == "cpu":
        return [("sdpa-math", _sdpa("MATH", device))]
    if torch.version.hip:
        return [("aiter", _aiter), ("sdpa-flash", _sdpa("FLASH_ATTENTION", device)),
                ("sdpa-efficient", _sdpa("EFFICIENT_ATTENTION", device))]
    return [("fa3", _fa3), ("cudnn-fp8", _cudnn_fp8), ("sdpa-cudnn", _sdpa("CUDNN_ATTENTION", device)),
            ("sdpa-flash", _sdpa("FLASH_ATTENTION", device)),
            ("sdpa-efficient", _sdpa("EFFICIENT_ATTENTION", device)), ("flashinfer", _flashinfer)]


def prepare_all(config: Config, x: Inputs, device: torch.device, error=None, only=None, variants=()):
    """([Contender], [Skip]): ZYFA (with `variants`, manifest entries) and the peers for one configuration (`only`:
    names to keep) and the skips with their reasons. Each contender is called once, under a watchdog on the GPU,
    and error(output) (None: no error measurement) is its error; a peer whose preparation or first call fails is a
    skip that quotes the exception."""
    makers = [("zyfa", lambda c, i: zyfa_contenders(c, i, target_of(device), variants))] + peers(device)
    limit = FIRST_CALL_LIMIT_S if device.type == "cuda" else None
    ready, skipped = [], []
    for name, make in makers:
        if only and name not in only:
            continue
        try:
            made = make(config, x)
        except Exception as failure:  # a peer's own error types (cudnn, flashinfer): reported as a skip
            skipped.append(_skip(name, failure))
            continue
        for item in made if isinstance(made, list) else [made]:
            if isinstance(item, Skip):
                skipped.append(item)
                continue
            try:
                with watchdog(f"the first call of {item.name}", limit):
                    output = item.decode(item.call())  # a peer that declines the shape says so here
                item.error = error(output) if error else None
                del output
                ready.append(item)
            except Exception as failure:
                skipped.append(_skip(item.name, failure))
    return ready, skipped


def _skip(name: str, failure: Exception) -> Skip:
    first_line = (str(failure).strip().splitlines() or [""])[0]
    return Skip(name, f"{type(failure).__name__}: {first_line[:200]}")


def names(device: torch.device) -> list[str]:
    return ["zyfa"] + [name for name, _ in peers(device)]
