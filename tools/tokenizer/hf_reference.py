#!/usr/bin/env python3
"""Reference outputs of Hugging Face tokenizers/transformers for engine/tokenizer.

Runs on the GPU machine (which has tokenizers and transformers, no network).
Steps, each a subcommand; `all` runs them in order:

  train-sp  train a small SentencePiece-style BPE (byte_fallback) on the corpus
            and write it in two layouts: sp_llama2 (Prepend/Replace normalizers,
            Llama 2 / Mistral) and sp_meta (Metaspace pre-tokenizer).
  fixtures  encode every corpus case with every tokenizer and decode the ids
            (with and without special tokens); decode random id sequences.
  chat      render testdata/tokenizer/chat_conversations.json with the Qwen3
            and Llama 3 chat templates through transformers' apply_chat_template.
  bench     single-threaded encode throughput of HF tokenizers on the corpus.

Usage: hf_reference.py all --tokenizers DIR --corpus FILE --chats FILE --out DIR
DIR (tokenizers) is the folder scripts/fetch-tokenizers.sh fills.
"""
import argparse
import gzip
import json
import os
import random
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SP_VOCAB_SIZE = 3000


def log(*a):
    print("[hf_reference]", *a, flush=True)


def read_corpus(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def write_jsonl_gz(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with gzip.GzipFile(path, "wb", compresslevel=9, mtime=0) as f:
        for r in rows:
            f.write((json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8"))


# ---------------------------------------------------------------- tokenizers


def sp_layouts(trained_json):
    """Two tokenizer.json layouts over one trained vocabulary."""
    base = json.loads(trained_json)
    base["added_tokens"] = [t for t in base["added_tokens"] if t["content"] in ("<unk>", "<s>", "</s>")]
    model = base["model"]
    model["byte_fallback"] = True
    model["fuse_unk"] = True
    model["unk_token"] = "<unk>"
    n = max(model["vocab"].values()) + 1

    def tok(id_, content, special, normalized, lstrip=False, rstrip=False, single_word=False):
        return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip,
                "rstrip": rstrip, "normalized": normalized, "special": special}

    def template(single_after):
        single = [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]
        pair = single + [{"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}]
        special = {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}
        if single_after:
            single = single + [{"SpecialToken": {"id": "</s>", "type_id": 0}}]
            pair = pair + [{"SpecialToken": {"id": "</s>", "type_id": 1}}]
            special["</s>"] = {"id": "</s>", "ids": [2], "tokens": ["</s>"]}
        return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special}

    llama2 = json.loads(json.dumps(base))
    llama2["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    llama2["pre_tokenizer"] = None
    llama2["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    llama2["post_processor"] = template(False)
    # A normalized special token: its pattern is normalized too (to "\u2581<pad>").
    llama2["added_tokens"].append(tok(n, "<pad>", True, True))

    meta = json.loads(json.dumps(base))
    meta["normalizer"] = None
    meta["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}
    meta["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"},
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}]}
    meta["post_processor"] = template(True)
    meta["added_tokens"].append(tok(n, "<mask>", False, False, lstrip=True))
    meta["added_tokens"].append(tok(n + 1, "<pad>", True, False, rstrip=True, single_word=True))
    return {"sp_llama2": llama2, "sp_meta": meta}


def cmd_train_sp(a):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    corpus = read_corpus(a.corpus)
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    specials = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=SP_VOCAB_SIZE, special_tokens=specials, limit_alphabet=200,
                                  min_frequency=2, show_progress=False)
    t0 = time.time()
    tok.train_from_iterator(corpus, trainer=trainer)
    log("train-sp: trained in %.1fs, vocab %d" % (time.time() - t0, tok.get_vocab_size()))
    for name, spec in sp_layouts(tok.to_str()).items():
        text = json.dumps(spec, ensure_ascii=False, indent=None)
        Tokenizer.from_str(text)  # must load
        d = os.path.join(a.out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(text)
        log("train-sp: wrote", d)


def load_tokenizers(a):
    """name -> tokenizers.Tokenizer, for every tokenizer under test."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    toks = {}
    for name in ("qwen3", "llama3"):
        toks[name] = Tokenizer.from_file(os.path.join(a.tokenizers, name, "tokenizer.json"))
    # Gemma 3 and gpt-oss: committed from js_reference.js; regenerated here
    # with HF itself when fetched.
    for name in ("gemma3", "gptoss"):
        p = os.path.join(a.tokenizers, name, "tokenizer.json")
        if os.path.exists(p):
            toks[name] = Tokenizer.from_file(p)
    g = os.path.join(a.tokenizers, "gpt2")
    gpt2 = Tokenizer(models.BPE.from_file(os.path.join(g, "encoder.json"), os.path.join(g, "vocab.bpe")))
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    gpt2.decoder = decoders.ByteLevel()
    gpt2.post_processor = processors.ByteLevel(trim_offsets=False)
    gpt2.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    toks["gpt2"] = gpt2
    for name in ("sp_llama2", "sp_meta"):
        p = os.path.join(a.out, name, "tokenizer.json")
        if os.path.exists(p):
            toks[name] = Tokenizer.from_file(p)
    return toks


def random_id_seqs(tok, r, count):
    """Random id sequences biased towards byte tokens and special tokens."""
    size = tok.get_vocab_size(with_added_tokens=True)
    vocab = tok.get_vocab(with_added_tokens=True)
    byte_ids = [i for t, i in vocab.items() if len(t) == 6 and t.startswith("<0x")]
    single = [i for t, i in vocab.items() if len(t) == 1]
    added = [i for t, i in vocab.items() if t.startswith("<") and t.endswith(">") and not t.startswith("<0x")]
    pools = [list(range(size)), byte_ids or single, single, added or [0]]
    seqs = []
    for _ in range(count):
        n = r.randint(1, 40)
        seqs.append([r.choice(pools[r.choice((0, 0, 1, 1, 2, 3))]) for _ in range(n)])
    return seqs


def cmd_fixtures(a):
    corpus = read_corpus(a.corpus)
    toks = load_tokenizers(a)
    r = random.Random(7)
    summary = {}
    for name, tok in toks.items():
        t0 = time.time()
        encs = tok.encode_batch(corpus, add_special_tokens=True)
        ids = [e.ids for e in encs]
        dec = tok.decode_batch(ids, skip_special_tokens=False)
        dec_skip = tok.decode_batch(ids, skip_special_tokens=True)
        rows = []
        for text, i, d, ds in zip(corpus, ids, dec, dec_skip):
            row = {"ids": i}
            if d != text:
                row["dec"] = d
            if ds != d:
                row["dec_skip"] = ds
            rows.append(row)
        write_jsonl_gz(os.path.join(a.out, "fixtures", name + ".jsonl.gz"), rows)
        seqs = random_id_seqs(tok, r, 600)
        rdec = tok.decode_batch(seqs, skip_special_tokens=False)
        rdec_skip = tok.decode_batch(seqs, skip_special_tokens=True)
        write_jsonl_gz(os.path.join(a.out, "fixtures", name + "_random.jsonl.gz"),
                       [{"ids": s, "dec": d, "dec_skip": ds} for s, d, ds in zip(seqs, rdec, rdec_skip)])
        summary[name] = sum(len(i) for i in ids)
        log("fixtures: %s: %d tokens, %.1fs" % (name, summary[name], time.time() - t0))
    return summary


# ---------------------------------------------------------------- chat


def chat_tokenizer(a, name):
    """A transformers tokenizer object for name, built offline from its files."""
    d = os.path.join(a.tokenizers, name)
    with open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    kw = {}
    for k in ("bos_token", "eos_token", "pad_token", "unk_token"):
        v = cfg.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if v is not None:
            kw[k] = v
    errors = []
    try:
        from transformers import PreTrainedTokenizerFast
        t = PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"),
                                    chat_template=cfg["chat_template"], **kw)
        return t, "PreTrainedTokenizerFast"
    except Exception as e:  # noqa: BLE001 - report and try the next way
        errors.append("PreTrainedTokenizerFast: %r" % e)
    try:
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(d, local_files_only=True), "AutoTokenizer"
    except Exception as e:  # noqa: BLE001
        errors.append("AutoTokenizer: %r" % e)
    raise RuntimeError("; ".join(errors))


def cmd_chat(a):
    with open(a.chats, encoding="utf-8") as f:
        convs = json.load(f)
    out = {}
    for name in ("qwen3", "llama3"):
        tok, how = chat_tokenizer(a, name)
        rows = []
        for c in convs:
            msgs = []
            for m in c["messages"]:
                d = {"role": m["role"], "content": m["content"]}
                d.update(m.get("fields", {}))
                msgs.append(d)
            kwargs = dict(c.get("kwargs", {}))
            if c.get("tools") is not None:
                kwargs["tools"] = c["tools"]
            try:
                text = tok.apply_chat_template(msgs, tokenize=False,
                                               add_generation_prompt=c["add_generation_prompt"], **kwargs)
                rows.append({"name": c["name"], "text": text})
            except Exception as e:  # noqa: BLE001 - a template may reject a conversation
                rows.append({"name": c["name"], "error": repr(e)})
        out[name] = {"method": how, "renders": rows}
        log("chat: %s via %s: %d renders, %d errors" % (
            name, how, len(rows), sum(1 for x in rows if "error" in x)))
    d = os.path.join(a.out, "chat")
    os.makedirs(d, exist_ok=True)
    for name, v in out.items():
        with open(os.path.join(d, name + ".json"), "w", encoding="utf-8") as f:
            json.dump(v, f, ensure_ascii=False, indent=1)


# ---------------------------------------------------------------- bench


def cmd_bench(a):
    corpus = read_corpus(a.corpus)
    nbytes = sum(len(s.encode("utf-8")) for s in corpus)
    toks = load_tokenizers(a)
    res = {}
    for name, tok in toks.items():
        tok.encode_batch(corpus, add_special_tokens=True)  # warm the cache
        best = None
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            tok.encode_batch(corpus, add_special_tokens=True)
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        res[name] = {"seconds": best, "mb_per_s": nbytes / best / 1e6}
        log("bench: %s: %.2f MB/s (%.3fs for %d bytes)" % (name, res[name]["mb_per_s"], best, nbytes))
    with open(os.path.join(a.out, "bench_hf.json"), "w") as f:
        json.dump({"bytes": nbytes, "results": res}, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["train-sp", "fixtures", "chat", "bench", "all"])
    ap.add_argument("--tokenizers", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--chats", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    meta = {"python": sys.version.split()[0]}
    for mod in ("tokenizers", "transformers", "jinja2"):
        try:
            meta[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            meta[mod] = "unavailable: %r" % e
    log("versions:", meta)
    with open(os.path.join(a.out, "versions.json"), "w") as f:
        json.dump(meta, f, indent=1)
    steps = {"train-sp": cmd_train_sp, "fixtures": cmd_fixtures, "chat": cmd_chat, "bench": cmd_bench}
    order = list(steps) if a.cmd == "all" else [a.cmd]
    failed = []
    for s in order:
        try:
            steps[s](a)
        except Exception as e:  # noqa: BLE001 - keep going so one call yields all it can
            import traceback
            traceback.print_exc()
            failed.append(s)
            log("step %s FAILED: %r" % (s, e))
    if failed:
        log("failed steps:", failed)
        sys.exit(1)


if __name__ == "__main__":
    main()
