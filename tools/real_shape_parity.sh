#!/usr/bin/env bash
# Real-shape parity on the GPU machine: random-weight models at the published
# shapes of Qwen3-0.6B, Llama-3.2-1B and DeepSeek-V2-Lite (its per-layer shapes
# with 4 of its 27 layers, so that HF's float32 reference fits the machine's
# memory next to the weights), HF transformers' float32 reference over the
# BF16 weights, then the engine's fixture parity test over the same folders on
# the CPU cores. Expects the test binary at .gpu/models.test:
#   CGO_ENABLED=1 go test -c -o .gpu/models.test ./engine/models
# REF_DTYPE=bfloat16 makes HF's reference run in bf16 (default float32);
# PROMPT_LENS (default 1,7,23) sets the reference prompts. The same models
# checked through the CUDA backend, against HF in bf16, are a phase of
# tools/gpu/check.sh (PHASES=parity).
set -euo pipefail
export PYTHONUNBUFFERED=1
out=${1:-/tmp/real-shapes}
logs=${OUT:-/tmp}
names=qwen3-0.6b,llama-3.2-1b,deepseek-v2-lite-4layers
args=()
for n in ${names//,/ }; do args+=(--config "tools/configs/real/$n.json"); done
python3 tools/make_fixtures.py "${args[@]}" --out "$out" --variants bf16 --device cuda \
	--reference-dtype "${REF_DTYPE:-float32}" --prompt-lens "${PROMPT_LENS:-1,7,23}" \
	--max-dir-bytes 0 --min-margin 0 --max-tries 1 --threads "$(nproc)" 2>&1 | tee "$logs/make_fixtures.log"
DEEPINFER_PARITY_DIR="$out" DEEPINFER_PARITY_NAMES="$names" DEEPINFER_PARITY_VARIANTS=bf16 \
	.gpu/models.test -test.run 'TestFixtureParity' -test.v -test.timeout 20m 2>&1 | tee "$logs/parity.log" |
	grep -E 'prefill error|greedy token|--- (PASS|FAIL)|^(ok|FAIL|PASS)' || true
