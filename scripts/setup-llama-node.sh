#!/usr/bin/env bash
# Installs llama.cpp for this machine through the npm package node-llama-cpp
# (its prebuilt CPU library for linux-x64 only, not the CUDA and Vulkan
# builds) into .cache/node-llama-cpp/ (ignored by git), for the GGUF parity
# test against llama.cpp and tools/cpu/peer-bench. Its install script is
# not run (it would fetch or build other variants); the prebuilt library is
# all tools/cpu/peer.mjs loads. Idempotent: nothing is fetched when the
# pinned version is already there.
#
#   scripts/setup-llama-node.sh                          # into <repo>/.cache/node-llama-cpp
#   DEEPINFER_LLAMA_NODE_MODULES=dir/node_modules ...    # the test reads the same variable
set -euo pipefail

version=3.21.1
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
modules="${DEEPINFER_LLAMA_NODE_MODULES:-$root/.cache/node-llama-cpp/node_modules}"
prefix="$(dirname "$modules")"

command -v npm >/dev/null || { echo "setup-llama-node: npm is required" >&2; exit 1; }
command -v node >/dev/null || { echo "setup-llama-node: node is required" >&2; exit 1; }

have="$(node -p "try { require('$modules/node-llama-cpp/package.json').version } catch { '' }")"
if [ "$have" = "$version" ] && [ -d "$modules/@node-llama-cpp/linux-x64" ]; then
	echo "setup-llama-node: node-llama-cpp@$version: present"
	exit 0
fi
mkdir -p "$prefix"
npm install --prefix "$prefix" --no-save --no-audit --no-fund --no-package-lock --omit=optional --ignore-scripts \
	"node-llama-cpp@$version" "@node-llama-cpp/linux-x64@$version" >/dev/null
echo "setup-llama-node: node-llama-cpp@$version (linux-x64 CPU library): installed into $modules"
