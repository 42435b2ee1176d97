#!/usr/bin/env bash
# Variants of one kernel file, side by side in one call on the GPU machine:
# every other source of the library is compiled once and shared, each
# variant's copy of FILE is compiled with its own flags and linked into a
# library of its own, then the tests and a benchmark run on every library,
# the benchmark alternating between them. A sweep of build-time settings
# costs one compile of the library and a link per variant.
#
# Here (with Go): tools/gpu/check.sh prepare DIR, and for an older
# revision's kernel as a variant, its file somewhere git ignores:
#
#   git show REV:kernels/cuda/moe.cu > .gpu/moe_base.cu
#
# carry DIR (and .gpu), then on the GPU machine, from the repository root:
#
#   FILE=kernels/cuda/moe.cu VARIANTS='base|.gpu/moe_base.cu|
#   cur||
#   s4||-DMG_STAGES=4' TESTS=TestGPUMoEPrefill BENCH='MoEPrefill/v2lite/tokens=4096$' tools/gpu/variants.sh DIR
#
# VARIANTS: lines of name|source|nvcc flags (source empty: FILE itself).
# TESTS: a -test.run pattern run once on each library (empty: none);
# BENCH: a -test.bench pattern (empty: none), BENCHTIME (default 1x),
# ROUNDS (default 2) rounds alternating the libraries; KEEP: a grep -E
# pattern of the benchmark lines to keep (default: the figures' "|"
# lines); MATCH: kernels whose registers to print (a grep -E pattern of
# the mangled names, default none); ENVS: variables set for every run
# (NAME=VALUE, space-separated). Logs and libraries go to OUTDIR (default
# $OUT if set, else /tmp/variants); the table is printed last.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:?usage: FILE=... VARIANTS=... tools/gpu/variants.sh DIR}
file=${FILE:?FILE: the kernel file the variants replace, e.g. kernels/cuda/moe.cu}
out=${OUTDIR:-${OUT:-/tmp/variants}}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
test=$root/$dir/cuda.test
[[ -f $test.gz ]] && gunzip -kf "$test.gz" && chmod +x "$test"
[[ -x $test ]] || { echo "variants.sh: no $dir/cuda.test(.gz): run tools/gpu/check.sh prepare $dir here" >&2; exit 2; }
flags=(-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC -Xcompiler -fvisibility=hidden
	-I"$root/csrc" -I"$root/kernels/cuda" -DDI_ARCH="\"sm_90a\"")
t0=$(date +%s)
mkdir -p "$tmp/shared" "$tmp/var"
pids=()
for f in "$root"/csrc/*.cu "$root"/kernels/cuda/*.cu; do
	[[ $f -ef $root/$file ]] && continue
	"$nvcc" "${flags[@]}" -c "$f" -o "$tmp/shared/$(basename "$f" .cu).o" >"$tmp/shared/$(basename "$f" .cu).log" 2>&1 &
	pids+=($!)
done
names=()
while IFS='|' read -r name src vflags; do
	name=${name//[[:space:]]/}
	[[ -z $name ]] && continue
	names+=("$name")
	read -ra vf <<<"$vflags"
	"$nvcc" "${flags[@]}" "${vf[@]}" -Xptxas -v -c "$root/${src:-$file}" -o "$tmp/var/$name.o" >"$out/ptxas_$name.log" 2>&1 &
	pids+=($!)
done <<<"${VARIANTS:?VARIANTS: lines of name|source|flags}"
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
if ((rc)); then
	grep -l -i error "$tmp"/shared/*.log "$out"/ptxas_*.log >&2
	echo "variants.sh: a source did not compile" >&2
	exit 1
fi
cublas=$(find "$(dirname "$(readlink -f "$(command -v "$nvcc")")")/.." /usr/local/cuda/ -name 'libcublas.so' 2>/dev/null | head -1)
libdir=$(dirname "$cublas")
for name in "${names[@]}"; do
	"$nvcc" -shared -gencode=arch=compute_90a,code=sm_90a -o "$out/lib_$name.so" "$tmp"/shared/*.o "$tmp/var/$name.o" \
		-L"$libdir" -lcublas -lcublasLt -Xlinker -rpath -Xlinker "$libdir" || { echo "variants.sh: $name did not link" >&2; exit 1; }
done
echo "built ${#names[@]} libraries in $(($(date +%s) - t0)) s"
read -ra envs <<<"${ENVS:-}"
run() { # library, then the test binary's arguments
	local so=$1
	shift
	(cd "$root/kernels/cuda" && env "${envs[@]}" DEEPINFER_CUDA_LIB="$so" timeout "${TIMEOUT:-300}" "$test" "$@")
}
: >"$out/tests.txt"
: >"$out/bench.txt"
for name in "${names[@]}"; do
	[[ -z ${TESTS:-} ]] && break
	run "$out/lib_$name.so" -test.run "$TESTS" -test.v >"$out/tests_$name.log" 2>&1
	echo "$name | tests rc=$? | $(grep -c -- '--- PASS' "$out/tests_$name.log") pass, $(grep -c -- '--- FAIL' "$out/tests_$name.log") fail" >>"$out/tests.txt"
done
for round in $(seq "${ROUNDS:-2}"); do
	[[ -z ${BENCH:-} ]] && break
	for name in "${names[@]}"; do
		run "$out/lib_$name.so" -test.run XXX -test.bench "$BENCH" -test.benchtime "${BENCHTIME:-1x}" 2>&1 |
			grep -E "${KEEP:-\|}" | sed 's/^ *//; s/^[a-z_]*_test\.go:[0-9]*: //' | sed "s/^/$name r$round | /" >>"$out/bench.txt"
	done
done
echo "== $file: ${#names[@]} variants, $(($(date +%s) - t0)) s"
if [[ -n ${MATCH:-} ]]; then
	for name in "${names[@]}"; do
		awk -v match_re="$MATCH" -f "$root/tools/gpu/ptxas_regs.awk" "$out/ptxas_$name.log" |
			while IFS=$'\t' read -r k regs spill stack; do
				echo "$name | ${k:0:60} | $regs registers, $spill bytes spilled, $stack stack"
			done
	done
fi
cat "$out/tests.txt"
for name in "${names[@]}"; do grep "^$name r" "$out/bench.txt"; done
