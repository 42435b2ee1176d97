#!/usr/bin/env bash
# Builds and runs the MLA latent-kernel sweep (sweep.cu) on the GPU machine:
# every variant below is its own translation unit (variant.cu), compiled in
# parallel with nvcc for sm_90a, and linked with the driver. The baseline is
# an older revision's kernel file, made here (with git) before the call:
#
#   git show REV:kernels/cuda/attention_mla_tc.cu > .gpu/mla_base.cu
#
# then, on the GPU machine, from the repository root:
#
#   tools/gpu/mla_sweep/run.sh .gpu/mla_base.cu [OUTDIR]      # the table
#   NCU=1 tools/gpu/mla_sweep/run.sh ...                       # and ncu of the baseline and the best F16 variant
#
# NCU=1 adds ncu's stall reasons (warps stalled per issued instruction) of
# the baseline and of the fastest F16 variant at batch 64. VARIANTS (lines
# of: name, keys a tile, warps, F16 stages, FP8 stages, bulk copies 1 or
# cp.async 0, and optionally the launch bounds' blocks a multiprocessor,
# 0 for the kernel's own choice, and a kernel file of the current form)
# replaces the list below.
#
# Logs and the binary go to OUTDIR (default .gpu/mla_sweep); the table is
# printed last.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
here=$root/tools/gpu/mla_sweep
base=$(readlink -f "$1")
out=${2:-$root/.gpu/mla_sweep}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The kernels section of a kernel file: everything above its host side.
cut_kernels() { awk '/^\/\/ -+ host side/{exit} {print}' "$1" >"$2"; }
cut_kernels "$base" "$tmp/base_kernels.cu"
cut_kernels "$root/kernels/cuda/attention_mla_tc.cu" "$tmp/cur_kernels.cu"

# name, keys a tile, warps, F16 stages, FP8 stages, bulk copies (1) or
# cp.async (0)[, blocks a multiprocessor in the launch bounds (0: the
# kernel's choice)[, a kernel file relative to the repository root, in the
# current file's form (default: kernels/cuda/attention_mla_tc.cu), so that
# two revisions of the current kernel run side by side]]
variants=${VARIANTS:-"
c_b32_w4_s2 32 4 2 2 0
c_b32_w4_s3 32 4 3 3 0
c_b32_w8_s2 32 8 2 2 0
c_b32_w8_s4 32 8 4 4 0
c_b16_w4_s5 16 4 5 5 0
t_b32_w4_s2 32 4 2 2 1
t_b32_w4_s3 32 4 3 3 1
t_b32_w4_s4 32 4 4 4 1
t_b32_w8_s2 32 8 2 2 1
t_b32_w8_s3 32 8 3 3 1
t_b32_w8_s4 32 8 4 4 1
t_b32_w8_s5 32 8 5 5 1
t_b16_w4_s4 16 4 4 4 1
t_b16_w4_s5 16 4 5 5 1
t_b64_w4_s2 64 4 2 2 1
t_b64_w8_s2 64 8 2 2 1
"}
nvcc=${NVCC:-nvcc}
flags=(-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I"$root/csrc" -I"$root/kernels/cuda" -I"$here" -I"$tmp"
)
echo "V(v_base)" >"$tmp/variants.inc"
pids=()
"$nvcc" "${flags[@]}" -DV_BASE -DV_FUNC=v_base -DV_SRC='"base_kernels.cu"' -c "$here/variant.cu" -o "$tmp/v_base.o" \
	>"$out/build_v_base.log" 2>&1 &
pids+=($!)
while read -r name bk w ns ns8 bulk minb src; do
	[[ -z $name ]] && continue
	echo "V(v_$name)" >>"$tmp/variants.inc"
	vsrc=cur_kernels.cu
	if [[ -n ${src:-} ]]; then
		vsrc=src_$name.cu
		cut_kernels "$root/$src" "$tmp/$vsrc"
	fi
	"$nvcc" "${flags[@]}" -DV_FUNC="v_$name" -DV_SRC="\"$vsrc\"" -DV_BK="$bk" -DV_W="$w" -DV_NS="$ns" \
		-DV_NS8="$ns8" -DV_BULK="$bulk" -DV_MINB="${minb:-0}" -c "$here/variant.cu" -o "$tmp/v_$name.o" >"$out/build_v_$name.log" 2>&1 &
	pids+=($!)
done <<<"$variants"
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
if ((fail)); then
	for f in "$out"/build_*.log; do
		if grep -q -i "error" "$f"; then
			echo "== $f"
			grep -i -B2 -A3 "error" "$f" | head -40
		fi
	done
	exit 1
fi
"$nvcc" "${flags[@]}" "$here/sweep.cu" "$tmp"/v_*.o -o "$out/sweep" >"$out/build_sweep.log" 2>&1 || {
	cat "$out/build_sweep.log" | head -60
	exit 1
}
"$out/sweep" | tee "$out/sweep.txt"
if [[ ${NCU:-0} == 1 ]] && command -v ncu >/dev/null; then
	best=$(awk '$1 == "BEST" && $2 == "F16" {print $3}' "$out/sweep.txt")
	for v in v_base $best; do
		ncu --clock-control none --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,sm__warps_active.avg.per_cycle_active' \
			-k regex:di_mla_tc_k -s 1 -c 1 "$out/sweep" --ncu "$v" 0 >"$out/ncu_$v.txt" 2>&1 || true
		echo "== ncu $v (F16, batch 64): top stall reasons (warps stalled per issued instruction)"
		grep -E "gpu__time_duration|dram__throughput|issue_active|warps_active" "$out/ncu_$v.txt" | awk '{print "   ", $1, $NF}'
		grep -E "issue_stalled" "$out/ncu_$v.txt" | awk '{print $NF, $1}' | sort -g -r | head -9 | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | awk '{printf "    %-22s %s\n", $2, $1}'
	done
	echo
	sed -n '/^F16 cache/,$p' "$out/sweep.txt"
fi
