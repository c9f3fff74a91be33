"""The GPU validation and the benchmarks' GPU scripts, run from the repository root as modules: `python -m
ci.gpu_check`, `python -m ci.bench_gfx950`, ... (ci/gpu.sh runs them; docs/gpu-validation.md). The timing, the
float64 reference and the error measures are zyfa_tools' (zyfa_tools.bench.protocol, zyfa_tools.reference), the
same code `python -m zyfa_tools.bench` measures with. Their CPU-runnable parts are tested in ci/tests."""
