#!/usr/bin/env bash
# Installs the official OpenAI Node client, used by the server end-to-end
# test, from npm into .cache/node/ (ignored by git). Idempotent: nothing is
# fetched when the pinned version is already there.
#
#   scripts/setup-openai-node.sh                 # into <repo>/.cache/node
#   DEEPINFER_NODE_MODULES=dir/node_modules ...  # the test reads the same variable
set -euo pipefail

version=6.49.0 # the last major that runs on Node 20 (7.x needs Node 22)
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
modules="${DEEPINFER_NODE_MODULES:-$root/.cache/node/node_modules}"
prefix="$(dirname "$modules")"

command -v npm >/dev/null || { echo "setup-openai-node: npm is required" >&2; exit 1; }
command -v node >/dev/null || { echo "setup-openai-node: node is required" >&2; exit 1; }

have="$(node -p "try { require('$modules/openai/package.json').version } catch { '' }")"
if [ "$have" = "$version" ]; then
	echo "setup-openai-node: openai@$version: present"
	exit 0
fi
mkdir -p "$prefix"
npm install --prefix "$prefix" --no-save --no-audit --no-fund --no-package-lock --omit=peer "openai@$version" >/dev/null
echo "setup-openai-node: openai@$version: installed into $modules"
