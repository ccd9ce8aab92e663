#!/usr/bin/env bash
# Download, on a machine WITH network, the wheels that the offline GPU image (Python 3.12,
# x86-64) lacks into .whl/ at the repository root; benchmarks/gpu_check.sh installs them there.
# The image already has torch, triton, numpy, safetensors, tokenizers, jinja2, prometheus-client,
# transformers, pytest, hypothesis, httpx, anyio, click, h11, attrs, typing-extensions
# (/work/.library/device/KINDS.md); versions below are the ones this project is tested with.
# .whl/ is git-ignored. Usage: benchmarks/fetch_gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(
  msgspec==0.23.0            # runtime (sampling params, HTTP schemas, program IR)
  starlette==1.10.0          # frontend
  uvicorn==0.55.0            # frontend
  outlines-core==0.2.14      # constrained decoding
  pyzmq==27.3.0              # the engine-core process boundary
  gguf==0.19.0               # GGUF checkpoints
  httptools==0.9.0           # uvicorn's HTTP parser
  jsonschema==4.26.0         # test extra (and its dependencies, next three)
  jsonschema-specifications==2025.9.1
  referencing==0.37.0
  rpds-py==2026.9.1
)
mkdir -p .whl
for spec in "${WHEELS[@]}"; do
  # one version of each package only: a second copy makes the offline install fail
  stem=$(echo "${spec%%==*}" | tr '-' '_')
  find .whl -maxdepth 1 -iname "${stem}-*.whl" ! -iname "${stem}-${spec##*==}-*" -delete
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
ls -l .whl
du -sh .whl
