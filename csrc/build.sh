#!/usr/bin/env bash
# Builds libdeepinfer_cuda.so from csrc/*.cu and kernels/cuda/*.cu with nvcc.
#
#   csrc/build.sh [output]        default output: .gpu/libdeepinfer_cuda.so
#
# Environment:
#   CUDA_ARCH   target, default 90a (H100/H200; wgmma-capable). Use e.g. 90,
#               80 or 89 for other cards; the library refuses a device it
#               has no kernel image for, naming the arch to rebuild with.
#   NVCC        the compiler, default: nvcc on PATH, else $CUDA_HOME/bin/nvcc,
#               else /usr/local/cuda/bin/nvcc.
#   NVCC_FLAGS  extra flags (e.g. -lineinfo, -Xptxas -v).
#   JOBS        parallel compile jobs, default: the number of cores.
#
# Toolkit: CUDA 12.9 or later. kernels/cuda/fp8.cu uses cuBLASLt's
# block-scaled FP8 matmul (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F and
# VEC128_32F), which older cuBLASLt headers lack. Built and measured with
# CUDA 13.0. Without a GPU, tools/gpu/ptxas_check.sh compiles the kernel
# files and prints their registers and spills.
#
# Point the engine at the result with DEEPINFER_CUDA_LIB=<output>, or put it
# on the dynamic loader's path.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/.gpu/libdeepinfer_cuda.so}
arch=${CUDA_ARCH:-90a}
nvcc=${NVCC:-}
if [[ -z $nvcc ]]; then
	if command -v nvcc >/dev/null; then
		nvcc=nvcc
	elif [[ -n ${CUDA_HOME:-} && -x $CUDA_HOME/bin/nvcc ]]; then
		nvcc=$CUDA_HOME/bin/nvcc
	elif [[ -x /usr/local/cuda/bin/nvcc ]]; then
		nvcc=/usr/local/cuda/bin/nvcc
	else
		echo "build.sh: no nvcc found: install the CUDA toolkit or set NVCC" >&2
		exit 1
	fi
fi
cuda_home=$(cd "$(dirname "$(readlink -f "$(command -v "$nvcc")")")/.." && pwd)
gencode="-gencode=arch=compute_${arch},code=sm_${arch}"
sources=("$root"/csrc/*.cu "$root"/kernels/cuda/*.cu)
objdir=$(mktemp -d)
trap 'rm -rf "$objdir"' EXIT
flags=(-O3 -std=c++17 "$gencode" -Xcompiler -fPIC -Xcompiler -fvisibility=hidden
	-I"$root/csrc" -I"$root/kernels/cuda" -DDI_ARCH="\"sm_${arch}\"" ${NVCC_FLAGS:-})
jobs=${JOBS:-$(nproc 2>/dev/null || echo 4)}
pids=()
for src in "${sources[@]}"; do
	obj=$objdir/$(basename "${src%.cu}").$(echo "$src" | cksum | cut -d' ' -f1).o
	"$nvcc" "${flags[@]}" -c "$src" -o "$obj" &
	pids+=($!)
	if ((${#pids[@]} >= jobs)); then
		wait "${pids[0]}"
		pids=("${pids[@]:1}")
	fi
done
for p in "${pids[@]}"; do wait "$p"; done
mkdir -p "$(dirname "$out")"
libdir=
for d in "$cuda_home/lib64" "$cuda_home/lib" "$cuda_home/targets/x86_64-linux/lib" /usr/lib/x86_64-linux-gnu; do
	if compgen -G "$d/libcublas.so*" >/dev/null; then
		libdir=$d
		break
	fi
done
if [[ -z $libdir ]]; then
	echo "build.sh: libcublas.so not found under $cuda_home" >&2
	exit 1
fi
"$nvcc" -shared "$gencode" -o "$out" "$objdir"/*.o -L"$libdir" -lcublas -lcublasLt -Xlinker -rpath -Xlinker "$libdir"
echo "built $out for sm_${arch} with $("$nvcc" --version | tail -1)"
