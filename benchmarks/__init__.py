"""Measurement scripts beside the benchmark of zyfa_tools.bench, run from the repository root as modules:
`python -m benchmarks.sm90a_fp8` (the sm90a FP8 kernels: kernel alone, V^T pre-pass, variants, accuracy table),
`python -m benchmarks.plot_sm90a` (the ratio-to-cuDNN chart), `python -m benchmarks.host_overhead` (host time per call).
Their timing is zyfa_tools.bench.protocol.Clock's; their CPU-runnable parts are tested in benchmarks/tests."""
