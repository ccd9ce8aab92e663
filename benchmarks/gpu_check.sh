#!/usr/bin/env bash
# The GPU check, on a CUDA machine without network: install (wheels from .whl/ when present, see
# fetch_gpu_wheels.sh), then the steps named in RADIXFLOW_GPU_STEPS (default: all five; each has a
# time limit, 10.5 minutes in all at worst, ~5.5 minutes as measured on an H200):
#   pytest_gpu       `pytest -m gpu` (kernels in bf16, CUDA graphs on/off, overlap on/off)
#   kernel_tests     every test in tests/kernels, on the device
#   kernels          benchmarks/attention_kernels.py --extend-sweep
#   engine_decode    benchmarks/engine_decode.py: decode tok/s, graphs on/off, overlap on/off at 64 and 256
#   engine_overhead  benchmarks/engine_overhead.py --gpu: engine work per step, 100K-prefix TTFT
#                    ratio, memory-blocked steps, on the 8B shape (not its HTTP part)
#   mixed_chunk      (opt-in, not in the default list) benchmarks/mixed_chunk.py --gpu: mixed prefill +
#                    decode steps against prefill-first on the 8B shape; writes mixed_chunk.json
# The limits: RADIXFLOW_GPU_SCALE multiplies each step's (default 1).
# Writes into OUT_DIR (flat, at most 8 files, so the device tool brings all of them back):
#   summary.txt      GPU (nvidia-smi), commit, install notes, step exit codes, benchmark tables
#   pytest_gpu.xml, kernel_tests.xml, kernels.json, engine_decode.json, engine_overhead.json
#   logs.tar.gz      every step's log
# Usage: benchmarks/gpu_check.sh OUT_DIR
#   RADIXFLOW_GPU_STEPS="..."   the steps to run, in their order above
#   RADIXFLOW_COMMIT=<sha>      names the commit measured (else .git's HEAD)
#   RADIXFLOW_SKIP_INSTALL=1    use the radixflow already importable (a dry run of the script's flow)
set -uo pipefail
if [ $# -ne 1 ]; then echo "usage: $0 OUT_DIR" >&2; exit 2; fi
cd "$(dirname "$0")/.."
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
SUMMARY="$OUT/summary.txt"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

note "== radixflow GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
note "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
# RADIXFLOW_COMMIT first: a copied working tree can carry an older .git than its files
commit=${RADIXFLOW_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
export RADIXFLOW_COMMIT=$commit  # the benchmarks' JSONs record it too
dirty=$(git status --porcelain 2>/dev/null | wc -l)
note "commit: $commit (uncommitted changes: $dirty files)"

# -- install -------------------------------------------------------------------------------------
if [ "${RADIXFLOW_SKIP_INSTALL:-0}" = 1 ]; then
  note "install: skipped (RADIXFLOW_SKIP_INSTALL=1)"
elif compgen -G ".whl/*.whl" >/dev/null; then
  if $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      >>"$SUMMARY" 2>&1; then
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    note "wheels: installed $(ls .whl/*.whl | wc -l) from .whl/ into /tmp/site"
  else
    note "wheels: install from .whl/ FAILED (tests importing them will not collect)"
  fi
else
  note "wheels: no .whl/ folder (run benchmarks/fetch_gpu_wheels.sh where there is network)"
fi
if [ "${RADIXFLOW_SKIP_INSTALL:-0}" = 1 ]; then
  :
elif $PY -m pip install -q --no-deps --no-build-isolation -e . >>"$SUMMARY" 2>&1; then
  note "install: pip install -e . ok"
else
  # the same import layout as pyproject's package-dir mapping, without installing anything
  mkdir -p /tmp/rf_path/radixflow
  for pkg in radix kernels runtime frontend lang; do ln -sfn "$PWD/$pkg" "/tmp/rf_path/radixflow/$pkg"; done
  export PYTHONPATH=/tmp/rf_path${PYTHONPATH:+:$PYTHONPATH}
  note "install: pip install -e . FAILED; importing radixflow through /tmp/rf_path symlinks"
fi
note "versions: $($PY -c 'import sys, torch, triton; print(sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "cuda", torch.cuda.is_available())' 2>&1)"

# -- steps (each under its own time limit; the JSON files are rewritten as results come) ---------
step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout --kill-after=15 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  note "step $name: exit $rc after $((SECONDS - start)) s (limit $limit s)"
}
STEPS=" ${RADIXFLOW_GPU_STEPS:-pytest_gpu kernel_tests kernels engine_decode engine_overhead} "
wanted() { [[ "$STEPS" == *" $1 "* ]]; }
# the step limits, scaled by RADIXFLOW_GPU_SCALE (default 1)
scale=${RADIXFLOW_GPU_SCALE:-1}
lim() { $PY -c "print(int($1 * $scale))"; }
# the gpu tests compile many Triton kernels: in 4 processes when pytest-xdist is there
xdist=$($PY -c 'import xdist' 2>/dev/null && echo "-n 4")
wanted pytest_gpu && step pytest_gpu "$(lim 120)" $PY -m pytest -m gpu -q -p no:cacheprovider $xdist \
  --continue-on-collection-errors --junitxml="$OUT/pytest_gpu.xml" tests
# every kernel test (not only the gpu-marked ones) on the device, against the torch references
wanted kernel_tests && step kernel_tests "$(lim 150)" $PY -m pytest -q -p no:cacheprovider $xdist \
  --junitxml="$OUT/kernel_tests.xml" tests/kernels
wanted kernels && step kernels "$(lim 130)" $PY benchmarks/attention_kernels.py --out "$OUT" --time-budget-s "$(lim 100)" \
  --extend-sweep
wanted engine_decode && step engine_decode "$(lim 130)" $PY benchmarks/engine_decode.py --out "$OUT" \
  --time-budget-s "$(lim 80)"
wanted engine_overhead && step engine_overhead "$(lim 100)" $PY benchmarks/engine_overhead.py --gpu --repeats 3 \
  --only decode_step,prefix_ttft,blocked --out "$OUT/engine_overhead.json"
# opt-in (RADIXFLOW_GPU_STEPS=".. mixed_chunk"): mixed prefill + decode steps against prefill-first
wanted mixed_chunk && step mixed_chunk "$(lim 200)" $PY benchmarks/mixed_chunk.py --gpu --rounds 2 \
  --out "$OUT/mixed_chunk.json"
note ""
note "== pytest -m gpu"
[ -f "$OUT/pytest_gpu.log" ] && tail -n 15 "$OUT/pytest_gpu.log" | tee -a "$SUMMARY"
note "== tests/kernels on the device"
[ -f "$OUT/kernel_tests.log" ] && grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/kernel_tests.log" | tail -n 25 | tee -a "$SUMMARY"
note "== kernels"
if ! wanted kernels; then
  note "(not run)"
elif [ -f "$OUT/kernels_summary.txt" ]; then
  cat "$OUT/kernels_summary.txt" | tee -a "$SUMMARY"
  rm -f "$OUT/kernels_summary.txt"  # its text is in summary.txt; keeps OUT within 8 files
else
  tail -n 20 "$OUT/kernels.log" | tee -a "$SUMMARY"
fi
note "== engine decode"
[ -f "$OUT/engine_decode.log" ] && { grep -E "tok/s|speedup" "$OUT/engine_decode.log" | tee -a "$SUMMARY" \
  || tail -n 20 "$OUT/engine_decode.log" | tee -a "$SUMMARY"; }
if wanted mixed_chunk; then
  note "== mixed chunk"
  [ -f "$OUT/mixed_chunk.log" ] && tail -n 30 "$OUT/mixed_chunk.log" | tee -a "$SUMMARY"
fi
note "== engine overhead"
[ -f "$OUT/engine_overhead.log" ] && { grep -E "^(decode_step|prefix_ttft|blocked)" "$OUT/engine_overhead.log" \
  | tee -a "$SUMMARY" || tail -n 20 "$OUT/engine_overhead.log" | tee -a "$SUMMARY"; }
(cd "$OUT" && compgen -G "*.log" >/dev/null && tar czf logs.tar.gz ./*.log && rm -f ./*.log)
note "== done after $SECONDS s"
