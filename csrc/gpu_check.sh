#!/usr/bin/env bash
# The CUDA backend's check on the GPU machine, as it was before the real-shape
# parity and the engine benchmarks joined it: build libdeepinfer_cuda.so, the
# GPU tests, the kernel benchmarks and the engine end to end, with the table
# last. The check now lives in tools/gpu/check.sh (the one entry point, see
# its header); this runs its phases build,tests,bench,e2e unless PHASES says
# otherwise:
#   here:  tools/gpu/check.sh prepare [DIR]
#   there: csrc/gpu_check.sh [DIR]     (= PHASES=build,tests,bench,e2e tools/gpu/check.sh [DIR])
set -uo pipefail
export PHASES=${PHASES:-build,tests,bench,e2e}
exec "$(dirname "$0")/../tools/gpu/check.sh" "$@"
