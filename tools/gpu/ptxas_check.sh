#!/usr/bin/env bash
# Compiles CUDA kernel files for sm_90a without a GPU and prints what ptxas
# reports for each kernel: registers, spill bytes and stack. For work on the
# kernels on a machine with a CUDA toolkit but no device: a kernel that no
# longer compiles, or that starts to spill, shows here before a GPU call.
#
#   tools/gpu/ptxas_check.sh [FILE.cu ...]    default: csrc/*.cu kernels/cuda/*.cu
#   MATCH=di_mla_tc_k tools/gpu/ptxas_check.sh kernels/cuda/attention_mla_tc.cu
#
# MATCH (a grep -E pattern) keeps the kernels whose mangled names match it;
# NVCC and JOBS as in csrc/build.sh. CUDA 12.4's toolkit compiles every
# kernel file but kernels/cuda/fp8.cu, whose cuBLASLt block scales need
# 12.9 or later (as the library's build does): an older toolkit reports
# that file's errors and goes on. Registers and spills can differ by a few
# from the compiler the library is built with (CUDA 13 on the GPU machine).
# Last, every kernel whose wgmma ptxas serializes (its C7510-C7519
# "Potential Performance Loss" notes: a non-wgmma instruction touching a
# wgmma's registers while it may run, so each wgmma waits for the one
# before) is listed with the reason: such a kernel still computes the same
# results, at a fraction of its speed.
# Exit status: 1 if a file failed to compile, else 0.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
nvcc=${NVCC:-nvcc}
if ! command -v "$nvcc" >/dev/null; then
	echo "ptxas_check.sh: no nvcc: install a CUDA toolkit or set NVCC" >&2
	exit 2
fi
files=("$@")
((${#files[@]})) || files=("$root"/csrc/*.cu "$root"/kernels/cuda/*.cu)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
jobs=${JOBS:-$(nproc 2>/dev/null || echo 4)}
pids=()
for f in "${files[@]}"; do
	b=$(basename "$f" .cu)
	"$nvcc" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I"$root/csrc" -I"$root/kernels/cuda" \
		-Xptxas -v -c "$f" -o "$tmp/$b.o" >"$tmp/$b.log" 2>&1 &
	pids+=($!)
	if ((${#pids[@]} >= jobs)); then
		wait "${pids[0]}"
		pids=("${pids[@]:1}")
	fi
done
rc=0
for p in "${pids[@]}"; do wait "$p"; done
printf '%-28s %-60s %5s %7s %6s\n' file kernel regs spill stack
for f in "${files[@]}"; do
	b=$(basename "$f" .cu)
	if [[ ! -s $tmp/$b.o ]]; then
		echo "$b.cu: FAILED to compile:"
		grep -E "error" "$tmp/$b.log" | head -5 | sed 's/^/    /'
		rc=1
		continue
	fi
	awk -v match_re="${MATCH:-.}" -f "$root/tools/gpu/ptxas_regs.awk" "$tmp/$b.log" |
		while IFS=$'\t' read -r name regs spill stack; do
			printf '%-28s %-60s %5s %7s %6s\n' "$b.cu" "${name:0:60}" "$regs" "$spill" "$stack"
		done
done
for f in "${files[@]}"; do
	b=$(basename "$f" .cu)
	grep -h "Potential Performance Loss: wgmma" "$tmp/$b.log" 2>/dev/null |
		sed -E "s/.*\((C75[0-9]+)\) Potential Performance Loss: (.*) in the function '([^']*)'.*/\3\t\1: \2/" |
		grep -E "${MATCH:-.}" | sort -u |
		while IFS=$'\t' read -r name why; do
			printf '%s %s: wgmma serialized (%s)\n' "$b.cu" "$name" "$why"
		done
done
exit $rc
