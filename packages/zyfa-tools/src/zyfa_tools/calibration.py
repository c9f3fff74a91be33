"""Static FP8 scales: calibrated per layer from data, saved and loaded as safetensors, used with no amax at
run time.

A `Calibrator` sees the post-RoPE q, k, v of each layer on calibration data (through zyfa_tools.hf or any loop
of your own) and keeps, per KV head, the largest |q R| (over the GQA group's query heads), the per-channel
minimum, maximum and sum of k R, and the largest |v|. `scales()` turns them into `StaticScales`: the key mean
mu = sum / count and the largest |k R - mu| = max over channels of max(max - mu, mu - min), exact without a
second pass over the data. At run time the scales are powers of two from these maxima (values beyond them
saturate at e4m3's 448), and the fixed mean keeps K smoothing exact for chunked prefill.

Scales hold the recipe they were calibrated with (rotation, smoothing, seed); using them with another recipe is
refused. The file format: tensors layers.<i>.{q_amax,k_amax,v_amax} float32 (heads_k,) and layers.<i>.k_mean
float32 (heads_k, d_qk), metadata {"format": "zyfa-fp8-scales", "version": "1", "rotation", "smoothing",
"seed"}. Saving and loading need the safetensors package (pip install zyfa-tools[hf]).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .quantize import DEFAULT_RECIPE, Recipe, rotation_for

FORMAT, VERSION = "zyfa-fp8-scales", "1"


@dataclass(frozen=True)
class LayerScales:
    """One layer's calibrated maxima per KV head and its key mean (in the rotated space when rotating)."""

    q_amax: torch.Tensor  # float32 (heads_k,)
    k_amax: torch.Tensor  # of k R - mu when smoothing, else of k R
    v_amax: torch.Tensor
    k_mean: torch.Tensor  # float32 (heads_k, d_qk)
    recipe: Recipe

    def check(self, recipe: Recipe, heads_k: int, d_qk: int, d_v: int) -> None:
        if recipe != self.recipe:
            raise ValueError(
                f"static scales were calibrated with {self.recipe} but are used with {recipe}: calibrate again "
                "with the recipe you run (rotation, smoothing and seed change q's and k's maxima)"
            )
        if self.q_amax.shape != (heads_k,) or self.k_mean.shape != (heads_k, d_qk):
            raise ValueError(
                f"static scales are for {self.q_amax.shape[0]} KV heads of d_qk={self.k_mean.shape[1]}, the call "
                f"has heads_k={heads_k}, d_qk={d_qk}: these scales belong to another model"
            )


@dataclass(frozen=True)
class StaticScales:
    recipe: Recipe
    layers: dict[int, LayerScales]

    def __getitem__(self, layer: int) -> LayerScales:
        if layer not in self.layers:
            raise KeyError(f"no static scales for layer {layer}: the file holds layers {sorted(self.layers)}")
        return self.layers[layer]

    def save(self, path) -> None:
        from safetensors.torch import save_file

        tensors = {}
        for i, s in self.layers.items():
            for name in ("q_amax", "k_amax", "v_amax", "k_mean"):
                tensors[f"layers.{i}.{name}"] = getattr(s, name).detach().float().cpu().contiguous()
        save_file(tensors, str(path), metadata={
            "format": FORMAT, "version": VERSION, "rotation": str(self.recipe.rotation).lower(),
            "smoothing": str(self.recipe.smoothing).lower(), "seed": str(self.recipe.seed),
        })

    @classmethod
    def load(cls, path) -> StaticScales:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT or meta.get("version") != VERSION:
                raise ValueError(
                    f"{path}: not a ZYFA static-scales file (metadata format={meta.get('format')!r}, version="
                    f"{meta.get('version')!r}; expected {FORMAT!r} version {VERSION}): write one with "
                    "python -m zyfa_tools calibrate"
                )
            recipe = Recipe(meta["rotation"] == "true", meta["smoothing"] == "true", int(meta["seed"]))
            tensors = {key: f.get_tensor(key) for key in f.keys()}
        layers = {}
        for key in tensors:
            _, i, name = key.split(".")
            if name == "q_amax":
                i = int(i)
                layers[i] = LayerScales(*(tensors[f"layers.{i}.{n}"] for n in ("q_amax", "k_amax", "v_amax",
                                                                                  "k_mean")), recipe)
        return cls(recipe, dict(sorted(layers.items())))


class Calibrator:
    """Running per-layer statistics of post-RoPE q, k, v (batch, seqlen, heads, d) for a recipe."""

    def __init__(self, recipe: Recipe = DEFAULT_RECIPE):
        self.recipe = recipe
        self._stats: dict[int, dict[str, torch.Tensor]] = {}

    def observe(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        heads_k = k.shape[2]
        qf, kf = q.detach().float(), k.detach().float()
        if self.recipe.rotation:
            r = rotation_for(q.shape[-1], q.device, self.recipe.seed)
            qf, kf = qf @ r, kf @ r
        qg = qf.reshape(*qf.shape[:2], heads_k, -1)
        new = {
            "q_amax": qg.abs().amax(dim=(0, 1, 3)),
            "k_max": kf.amax(dim=(0, 1)), "k_min": kf.amin(dim=(0, 1)), "k_sum": kf.sum(dim=(0, 1)),
            "count": torch.tensor(float(kf.shape[0] * kf.shape[1]), device=kf.device),
            "v_amax": v.detach().float().abs().amax(dim=(0, 1, 3)),
        }
        old = self._stats.get(layer)
        if old is None:
            self._stats[layer] = new
            return
        for name, value in new.items():
            if name in ("k_sum", "count"):
                old[name] = old[name] + value
            elif name == "k_min":
                old[name] = torch.minimum(old[name], value)
            else:
                old[name] = torch.maximum(old[name], value)

    @property
    def layers(self) -> list[int]:
        return sorted(self._stats)

    def scales(self) -> StaticScales:
        if not self._stats:
            raise ValueError("the calibrator has seen no data: run the model on calibration inputs first")
        layers = {}
        for i in self.layers:
            st = self._stats[i]
            mean = st["k_sum"] / st["count"]
            if self.recipe.smoothing:
                k_amax = torch.maximum(st["k_max"] - mean, mean - st["k_min"]).amax(dim=-1)
            else:
                k_amax = torch.maximum(st["k_max"].abs(), st["k_min"].abs()).amax(dim=-1)
            layers[i] = LayerScales(st["q_amax"].cpu(), k_amax.cpu(), st["v_amax"].cpu(), mean.cpu(), self.recipe)
        return StaticScales(self.recipe, layers)


def calibrate(model, batches, recipe: Recipe = DEFAULT_RECIPE) -> StaticScales:
    """Static scales of a transformers model from its attention inputs on `batches` (token id tensors)."""
    from . import hf
    from .progress import progress

    calibrator = Calibrator(recipe)
    batches = list(batches)
    with torch.no_grad(), hf.observe(model, lambda layer, q, k, v, out, scale: calibrator.observe(layer, q, k, v)):
        for input_ids in progress(batches, "calibration batches", len(batches)):
            model(input_ids)
    return calibrator.scales()
