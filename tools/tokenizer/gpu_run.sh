#!/usr/bin/env bash
# One GPU-machine call for engine/tokenizer: HF reference fixtures, the trained
# SentencePiece-style tokenizers, chat-template renders, Go parity on the
# fresh fixtures, and the encode-throughput comparison (Go vs HF tokenizers,
# both single-threaded on the same corpus and CPU).
#
# Needs, carried from the development machine: .cache/tokenizers (from
# scripts/fetch-tokenizers.sh) and .gpu/tokenizer/tokenizer.test, built with
#   CGO_ENABLED=0 go test -c -o .gpu/tokenizer/tokenizer.test ./engine/tokenizer
# Writes to $OUT: reference.tar.gz (testdata/tokenizer layout), parity.txt,
# bench_go.txt, summary.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1
root="$(pwd)"
out="${OUT:?OUT must be set}"
work="$(mktemp -d)"
td="$work/td"
mkdir -p "$td"

echo "== hf reference"
python3 tools/tokenizer/hf_reference.py all --tokenizers .cache/tokenizers \
	--corpus testdata/tokenizer/corpus.jsonl.gz --chats testdata/tokenizer/chat_conversations.json \
	--out "$td" --rounds 3 2>&1 | tee "$out/hf_reference.txt"
hf_rc=${PIPESTATUS[0]}
cp testdata/tokenizer/corpus.jsonl.gz testdata/tokenizer/chat_conversations.json "$td/"
# Gemma 3 / gpt-oss texts: their fixtures come from js_reference.js only.
mkdir -p "$td/fixtures"
cp testdata/tokenizer/model_texts.json "$td/"
cp testdata/tokenizer/fixtures/*_texts.jsonl.gz "$td/fixtures/"
tar -czf "$out/reference.tar.gz" -C "$td" .

testbin="$root/.gpu/tokenizer/tokenizer.test"
cd "$root/engine/tokenizer"
echo "== go parity on fresh fixtures"
DEEPINFER_TOKENIZER_TESTDATA="$td" DEEPINFER_TOKENIZERS="$root/.cache/tokenizers" \
	"$testbin" -test.run 'TestParity|TestChatTemplateParity' -test.v -test.count 1 2>&1 |
	grep -v '^=== ' | head -c 400000 >"$out/parity.txt"
grep -E '^(---|ok|FAIL|PASS)|mismatches|conversations render' "$out/parity.txt" | head -40

echo "== go encode benchmark (GOMAXPROCS=1)"
DEEPINFER_TOKENIZER_TESTDATA="$td" DEEPINFER_TOKENIZERS="$root/.cache/tokenizers" \
	"$testbin" -test.run '^$' -test.bench 'BenchmarkEncodeCorpus' -test.benchtime 5x -test.cpu 1 2>&1 | tee "$out/bench_go.txt"
cd "$root"

echo "== summary"
python3 - "$td/bench_hf.json" "$out/bench_go.txt" <<'PY' | tee "$out/summary.txt"
import json, re, sys
hf = json.load(open(sys.argv[1]))["results"] if sys.argv[1] else {}
go = {}
for line in open(sys.argv[2]):
    m = re.match(r"BenchmarkEncodeCorpus/(\S+?)(?:-\d+)?\s+\d+\s+\d+ ns/op\s+([\d.]+) MB/s", line)
    if m:
        go[m.group(1)] = float(m.group(2))
print("%-10s %12s %12s %8s" % ("tokenizer", "HF MB/s", "Go MB/s", "Go/HF"))
for name in sorted(set(hf) | set(go)):
    h = hf.get(name, {}).get("mb_per_s")
    g = go.get(name)
    ratio = "%.2f" % (g / h) if h and g else "-"
    print("%-10s %12s %12s %8s" % (name, "%.2f" % h if h else "-", "%.2f" % g if g else "-", ratio))
PY
echo "hf_reference exit: $hf_rc"
