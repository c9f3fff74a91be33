#!/usr/bin/env bash
# GPU validation run through the installed packages: the sm90a kernels on an H100/H200, the gfx950 FP8 kernels on
# an MI355X. The target is detected from torch (ci/gpu_target.py: a ROCm GPU whose gcnArchName is gfx950, or a CUDA
# GPU of compute capability 9.0); GPU_TARGET=sm90a|gfx950 overrides the detection. docs/gpu-validation.md.
#
# On sm90a (H100/H200):
#   ci/gpu.sh [STAGE ...]     stages: install sass check sanitize bench (default: all, in that order), and on
#                             request: exp2 (accuracy of the FMA-pipe exponential), variants (the benchmark's kernel
#                             variants against the model), ab (prebuilt variants, env VARIANTS: checked, timed beside
#                             their shipped kernels and FA3, compared; AGAINST: a control variant), profile (Nsight
#                             Compute, ci/profile_sm90a.py)
# On gfx950 (MI355X):
#   ci/gpu.sh [STAGE ...]     stages: install check bench summary (default: all, in that order), and on request:
#                             small (the check on one small configuration)
#   env OUT (default ./out): where the JSON results and logs go; BENCH_ARGS: extra benchmark arguments;
#   WHEELS: a folder of wheels to install first, for build tools the machine lacks (e.g. hatchling, offline)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
stages=("$@")

install() {  # the three packages, built here without network (WHEELS: build tools the machine lacks)
  if [ -n "${WHEELS:-}" ]; then "$PY" -m pip install -q --no-index --no-deps "$WHEELS"/*.whl; fi
  "$PY" -m pip install -q --no-build-isolation --no-deps packages/zyfa-kernels packages/zyfa-torch packages/zyfa-tools
}

gpu=${GPU_TARGET:-}
if [ -z "$gpu" ]; then
  detected=$("$PY" -m ci.gpu_target --describe)
  gpu=${detected%% *}
  echo "=== target: $detected"
fi

if [ "$gpu" = gfx950 ]; then
  [ ${#stages[@]} -eq 0 ] && stages=(install check bench summary)
  failed=()  # a failing check or benchmark does not stop the later stages (an MI355X is scarce): exit 1 at the end
  for stage in "${stages[@]}"; do
    echo "=== $stage"
    case "$stage" in
      install) install ;;
      check)
        "$PY" -m ci.gpu_check_gfx950 --out "$OUT" || failed+=(check)
        ;;
      small)
        "$PY" -m ci.gpu_check_gfx950 --small --out "$OUT" || failed+=(small)
        ;;
      bench)
        # shellcheck disable=SC2086
        "$PY" -m ci.bench_gfx950 --out "$OUT" ${BENCH_ARGS:-} || failed+=(bench)
        ;;
      summary)
        "$PY" -m ci.gfx950_validation --out "$OUT"
        ;;
      *)
        echo "unknown stage $stage for gfx950 (install check bench summary small)" >&2
        exit 2
        ;;
    esac
  done
  if [ ${#failed[@]} -gt 0 ]; then
    echo "gfx950: failed stages: ${failed[*]}" >&2
    exit 1
  fi
  exit 0
elif [ "$gpu" != sm90a ]; then
  echo "GPU_TARGET=$gpu: must be sm90a or gfx950" >&2
  exit 2
fi

[ ${#stages[@]} -eq 0 ] && stages=(install sass check sanitize bench)

for stage in "${stages[@]}"; do
  echo "=== $stage"
  case "$stage" in
    install) install ;;
    sass)  # the attention cubins use wgmma (HGMMA for BF16, QGMMA for FP8); no cubin uses local memory
      for cubin in packages/zyfa-kernels/src/zyfa_kernels/objects/sm90a/*.cubin; do
        cuobjdump --dump-sass "$cubin" > "$OUT/$(basename "$cubin" .cubin).sass"
        hgmma=$(grep -cE 'HGMMA|QGMMA' "$OUT/$(basename "$cubin" .cubin).sass" || true)
        local_ops=$(grep -cE '\b(LDL|STL)\b' "$OUT/$(basename "$cubin" .cubin).sass" || true)
        echo "$(basename "$cubin"): $hgmma HGMMA/QGMMA, $local_ops local-memory instructions"
        case "$(basename "$cubin")" in sm90a_fwd_*) [ "$hgmma" -gt 0 ] ;; esac  # not the V^T pre-pass
        [ "$local_ops" -eq 0 ]
      done
      "$PY" -m asmgen.sm90a report | tee "$OUT/sass_report.md"  # the key-tile steps (asmgen/sm90a/sass.py)
      ;;
    check)
      "$PY" -m ci.gpu_check --out "$OUT"
      ;;
    sanitize)  # memcheck and racecheck of our kernels on small configurations (API errors: probing is expected)
      for tool in memcheck racecheck; do
        compute-sanitizer --tool "$tool" --kernel-name kns=zyfa_sm90a --report-api-errors no --error-exitcode 1 \
          "$PY" -m ci.gpu_check --small --out "$OUT/$tool"
      done
      ;;
    exp2)
      "$PY" -m ci.gpu_exp2_poly --out "$OUT"
      ;;
    profile)  # Nsight Compute counters and per-instruction stall samples of ours and the peers' kernels (PROFILE_ARGS)
      # shellcheck disable=SC2086
      ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -1)
      "$ncu" --clock-control none -f -o "$OUT/profile" --kernel-name-base demangled \
        -k 'regex:zyfa|sdpa|fmha|fprop|FlashAttnFwd' \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
        --section InstructionStats --section SourceCounters "$PY" -m ci.profile_sm90a ${PROFILE_ARGS:-}
      "$ncu" -i "$OUT/profile.ncu-rep" > "$OUT/profile.txt"
      "$ncu" -i "$OUT/profile.ncu-rep" --page source --csv --print-source sass > "$OUT/profile_sass.csv"
      "$PY" -m ci.profile_summary "$OUT/profile.txt" "$OUT/profile_sass.csv" | tee "$OUT/profile.md"
      ;;
    variants)
      variants=$(mktemp -d)
      "$PY" -m asmgen.sm90a.experiments "$variants" --dtype bf16  # the FP8 ones: python -m asmgen.sm90a.experiments.measure
      "$PY" -m ci.gpu_check --variants "$variants" --out "$OUT"
      ;;
    ab)  # prebuilt variants (VARIANTS: python -m asmgen.sm90a.experiments DIR [--patch ...]) against the model, then
         # the quick protocol with them, their shipped kernels and FA3 (BENCH_ARGS: the configurations), compared; a
         # failed check fails the stage after the timing (device time is scarce; the check names the variant)
      : "${VARIANTS:?the ab stage needs VARIANTS, a folder of python -m asmgen.sm90a.experiments}"
      checked=0
      "$PY" -m ci.gpu_check --variants "$VARIANTS" --out "$OUT/ab" || checked=$?
      # shellcheck disable=SC2086
      "$PY" -m zyfa_tools.bench --quick --calls 40 --contenders zyfa fa3 --error-max-seqlen 0 --no-plots \
        --variants "$VARIANTS" --out "$OUT/ab" ${BENCH_ARGS:-}
      "$PY" -m asmgen.sm90a.experiments.compare "$OUT/ab/bench.json" | tee "$OUT/ab/compare.md"
      if [ -n "${AGAINST:-}" ]; then
        "$PY" -m asmgen.sm90a.experiments.compare "$OUT/ab/bench.json" --against "$AGAINST" \
          | tee "$OUT/ab/compare-$AGAINST.md"
      fi
      [ "$checked" -eq 0 ]
      ;;
    bench)  # the protocol, then its sustained-clock mode; the variants named by SM90A_VARIANT_ARGS are timed too
      variant_args=()
      if [ -n "${SM90A_VARIANT_ARGS:-}" ]; then
        variants=$(mktemp -d)
        # shellcheck disable=SC2086
        "$PY" -m asmgen.sm90a.experiments "$variants" $SM90A_VARIANT_ARGS
        variant_args=(--variants "$variants")
      fi
      # shellcheck disable=SC2086
      "$PY" -m zyfa_tools.bench --out "$OUT/bench" "${variant_args[@]}" ${BENCH_ARGS:-}
      # shellcheck disable=SC2086
      "$PY" -m zyfa_tools.bench --sustained --out "$OUT/bench-sustained" ${BENCH_ARGS:-}
      ;;
    *)
      echo "unknown stage $stage (install sass check sanitize bench exp2 variants ab profile)" >&2
      exit 2
      ;;
  esac
done
