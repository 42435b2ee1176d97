#!/usr/bin/env bash
# The CUDA backend's check on the GPU machine, in one call: build
# libdeepinfer_cuda.so with nvcc, run the GPU tests of kernels/cuda (every op
# against the CPU backend, device index checks, graph replay, the parity
# fixtures through whole models), the decode and prefill benchmarks on the
# Llama-3.2-1B shape, and the engine end to end on configs/cuda.yaml; print a
# short table last.
#
# Go is not needed there: build the binaries here first, into a folder that
# .git/info/exclude ignores (DIR, default .gpu-cuda):
#   CGO_ENABLED=1 go test -c -o DIR/cuda.test ./kernels/cuda && gzip -9f DIR/cuda.test
#   CGO_ENABLED=1 go build -ldflags='-s -w' -o DIR/deepinfer ./cmd/deepinfer && gzip -9f DIR/deepinfer
# then run, from the repository root there: csrc/gpu_check.sh [DIR]
# (TESTS_TIMEOUT and BENCH_TIMEOUT, in seconds, bound the two phases.)
# Logs go to $OUT (or /tmp/gpu-check).
set -uo pipefail
export PYTHONUNBUFFERED=1
dir=${1:-.gpu-cuda}
logs=${OUT:-/tmp/gpu-check}
mkdir -p "$logs"
root=$(pwd)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee "$logs/gpu.txt"

t0=$(date +%s)
if ! csrc/build.sh "$dir/libdeepinfer_cuda.so" >"$logs/build.log" 2>&1; then
	cat "$logs/build.log"
	echo "BUILD FAILED"
	exit 1
fi
tail -1 "$logs/build.log"
build_s=$(($(date +%s) - t0))
export DEEPINFER_CUDA_LIB=$root/$dir/libdeepinfer_cuda.so

for b in cuda.test deepinfer; do
	[[ -f $dir/$b.gz ]] && gunzip -kf "$dir/$b.gz" && chmod +x "$dir/$b"
done

t0=$(date +%s)
(cd kernels/cuda && timeout ${TESTS_TIMEOUT:-240} "$root/$dir/cuda.test" -test.run TestGPU -test.v -test.timeout ${TESTS_TIMEOUT:-240}s) >"$logs/tests.log" 2>&1
tests_rc=$?
tests_s=$(($(date +%s) - t0))

t0=$(date +%s)
(cd kernels/cuda && timeout ${BENCH_TIMEOUT:-170} "$root/$dir/cuda.test" -test.run 'XXX' -test.bench 'GPU' -test.benchtime 10x -test.v) >"$logs/bench.log" 2>&1
bench_rc=$?
bench_s=$(($(date +%s) - t0))

e2e_rc=skipped
if [[ -x $dir/deepinfer ]]; then
	prompt="The quick brown fox"
	timeout 45 "$dir/deepinfer" generate --config configs/cuda.yaml -p "$prompt" -m 48 >"$logs/gen_cuda.txt" 2>&1
	e2e_rc=$?
	DEEPINFER_CUDA_GEMM=split timeout 45 "$dir/deepinfer" generate --config configs/cuda.yaml -p "$prompt" -m 48 >"$logs/gen_cuda_split.txt" 2>&1
	timeout 45 "$dir/deepinfer" generate --config configs/default.yaml -p "$prompt" -m 48 >"$logs/gen_cpu.txt" 2>&1
fi

echo
echo "==================== failures (first 40 lines) ===================="
grep -E -- '--- FAIL|FAIL|panic|Error|error' "$logs/tests.log" | head -40
echo "==================== fixture parity ===================="
grep -oE '(round|split) +[a-z0-9.-]+ +(f32|bf16) +err_vs_hf.*' "$logs/tests.log" | sort -u
echo "==================== batch invariance / graph ===================="
grep -E 'bit-identical|GraphReplay|default model|engine graphs' "$logs/tests.log" | sed 's/^ *//' | head
echo "==================== slowest tests ===================="
grep -E -- '^--- (PASS|FAIL)' "$logs/tests.log" | sort -t'(' -k2 -rn | head -8
echo "==================== benchmarks ===================="
grep -E 'loaded on|decode batch|prefill [0-9]|linear |attention decode|attention prefill|FAIL|panic' "$logs/bench.log" | sed 's/^ *//' | sed 's/^[a-z_]*_test.go:[0-9]*: //' | sort -u
echo "==================== end to end (greedy, 48 tokens) ===================="
echo "cuda (rc $e2e_rc):"; tail -4 "$logs/gen_cuda.txt" 2>/dev/null
echo "cuda, gemm split:"; tail -4 "$logs/gen_cuda_split.txt" 2>/dev/null
echo "cpu:"; tail -4 "$logs/gen_cpu.txt" 2>/dev/null
echo "==================== summary ===================="
pass=$(grep -c -- '^--- PASS' "$logs/tests.log")
fail=$(grep -c -- '^--- FAIL' "$logs/tests.log")
skip=$(grep -c -- '^--- SKIP' "$logs/tests.log")
printf '%-10s %s\n' build "ok (${build_s}s)" tests "rc=$tests_rc pass=$pass fail=$fail skip=$skip (${tests_s}s)" \
	bench "rc=$bench_rc (${bench_s}s)" e2e "rc=$e2e_rc"
