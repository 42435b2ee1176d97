"""The real-shape mode of tools/make_gemma3_fixture.py and
tools/make_gptoss_fixture.py (their --config): a random-weight model at a
published config's shapes, written as a BF16 checkpoint, and HF
transformers' bfloat16 reference over it, on the GPU machine.

  OUT/<name>/bf16/{config.json, model.safetensors}   the checkpoint
  OUT/<name>/reference.safetensors                   HF's outputs

The reference has the keys and metadata of tools/make_fixtures.py's bf16
references (--reference-dtype bfloat16), which kernels/cuda's
TestGPUWindowFixtureParity reads: for prompt i (random ids, the lengths
given, long enough to cross the sliding window)
  bf16.prompt.<i>.ids     I32 [L]         the prompt
  bf16.prompt.<i>.logits  F32 [L, vocab]  HF's logits of the whole prompt
  bf16.greedy.<i>.ids     I32 [32]        32 greedy tokens with HF's cache
  bf16.greedy.<i>.margin  F32 [32]        top-1 minus top-2 logit per step
and in the header bf16.hf_self_err / bf16.hf_self_top1: HF run again with
every bf16 matrix product (F.linear, torch.matmul, torch.bmm and the @
operator, which gpt-oss's experts use) computed in float32 from the same
bf16 values and rounded once (f32_matmul_order), against the reference:
the worst max|diff| / max|ref| over positions and "same/positions" top-1.
That is the reference's own spread: both runs are equally valid bf16 runs.
Then HF again in float32 over the same weights (upcast, exact; TF32 off):
  hf_f32.prompt.<i>.logits  F32 [L, vocab]  the float32 logits of prompt i
with hf_f32.bf16_err / hf_f32.bf16_top1 in the header (the bf16 reference
against it): the yardstick of the engine's float32 paths.

HF loads the checkpoint with from_pretrained(dtype=bfloat16) as it runs a
bf16 checkpoint (RoPE's frequencies stay float32), eager attention and the
eager experts loop, and every weight it holds is checked equal to the one
written. Needs torch, transformers 5 and safetensors; runs in a few
minutes on an H200 (see the two scripts).
"""

import contextlib
import json
import os
import shutil
import tempfile
import time

import torch
import torch.nn.functional as F

import make_fixtures as mf

# Greedy tokens a prompt, as make_fixtures.
NEW_TOKENS = mf.NEW_TOKENS


def add_args(ap, prompt_lens):
    """The real-shape flags, shared by both scripts."""
    ap.add_argument("--config", help="a published config.json (tools/configs/real/): real-shape mode, see the module comment")
    ap.add_argument("--name", help="output folder name (default: the config file's stem)")
    ap.add_argument("--device", default="cuda", help="where to build the model and run HF (real-shape mode)")
    ap.add_argument("--prompt-lens", type=mf.prompt_lens_arg, default=prompt_lens,
                    help="comma-separated prompt lengths of the reference (real-shape mode; default %s)" %
                         ",".join(map(str, prompt_lens)))
    ap.add_argument("--std", type=float, default=0.02, help="std of projection and router weights (real-shape mode)")
    ap.add_argument("--embed-std", type=float, default=0.02, help="std of embeddings and LM heads (real-shape mode)")
    ap.add_argument("--seed", type=int, default=4242, help="weights seed (real-shape mode); prompts use seed + 17")
    ap.add_argument("--threads", type=int, default=8)


def setup(args):
    """Reads the config, empties OUT/<name> and returns (spec, name, out_dir)."""
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with open(args.config) as f:
        spec = json.load(f)
    name = args.name or os.path.splitext(os.path.basename(args.config))[0]
    out_dir = os.path.join(args.out, name)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    import transformers

    mf.log(f"== {name} ({args.config}): torch {torch.__version__}, transformers {transformers.__version__}, "
           f"device {args.device}, prompt lengths {list(args.prompt_lens)}")
    return spec, name, out_dir


def build(spec, device):
    """The model of spec (its quantization_config dropped) in bfloat16 on
    device, eager attention and experts."""
    spec = {k: v for k, v in spec.items() if k != "quantization_config"}
    model = mf.build_model(spec, torch.bfloat16, device)
    want = spec["architectures"][0]
    if type(model).__name__ != want:
        raise RuntimeError(f"transformers built {type(model).__name__}, want {want}")
    n = sum(p.numel() for p in model.parameters())
    mf.log(f"  built {type(model).__name__}: {n / 1e9:.3f}B parameters, {spec['num_hidden_layers']} layers")
    return model


def state_dict_cpu(model):
    """The model's state dict as contiguous CPU tensors (its dtypes)."""
    return {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}


def config_json(model, dtype="bfloat16"):
    """The config.json transformers writes for the model, with dtype set and
    no quantization_config."""
    tmp = tempfile.mkdtemp()
    try:
        model.config.save_pretrained(tmp)
        with open(os.path.join(tmp, "config.json")) as f:
            conf = json.load(f)
    finally:
        shutil.rmtree(tmp)
    conf["dtype"] = dtype
    conf.pop("torch_dtype", None)
    conf.pop("quantization_config", None)
    return conf


def write_checkpoint(vdir, conf, tensors):
    """vdir/config.json and vdir/model.safetensors (one file)."""
    from safetensors.torch import save_file

    t0 = time.time()
    os.makedirs(vdir, exist_ok=True)
    save_file(tensors, os.path.join(vdir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(vdir, "config.json"), "w") as f:
        json.dump(conf, f, indent=2, sort_keys=True)
        f.write("\n")
    counts = {}
    for v in tensors.values():
        d = str(v.dtype).removeprefix("torch.")
        counts[d] = counts.get(d, 0) + 1
    mf.log(f"  wrote {vdir}: {mf.dir_bytes(vdir) / 2**30:.2f} GiB, tensors {dict(sorted(counts.items()))}, "
           f"{time.time() - t0:.1f}s")


@contextlib.contextmanager
def f32_matmul_order(counts):
    """make_fixtures.f32_gemm_order extended to every matrix product the
    models compute: F.linear, torch.matmul, torch.bmm and Tensor @ Tensor
    with bf16 operands run as float32 products of the same values, rounded
    to bf16 once (the products are exact in float32; only the order of the
    float32 sums differs from cuBLAS's bf16 GEMMs). counts[kind] counts the
    calls so taken, to show what the spread covers."""
    orig_linear, orig_matmul, orig_bmm = F.linear, torch.matmul, torch.bmm
    had_own = "__matmul__" in torch.Tensor.__dict__
    orig_at = torch.Tensor.__matmul__
    bf = torch.bfloat16

    def wide(kind, fn, a, b):
        counts[kind] = counts.get(kind, 0) + 1
        return fn(a.float(), b.float()).to(bf)

    def linear(x, w, b=None):
        if x.dtype != bf or w.dtype != bf:
            return orig_linear(x, w, b)
        counts["linear"] = counts.get("linear", 0) + 1
        return orig_linear(x.float(), w.float(), None if b is None else b.float()).to(bf)

    def matmul(a, b, **kw):
        if kw or not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dtype != bf or b.dtype != bf:
            return orig_matmul(a, b, **kw)
        return wide("matmul", orig_matmul, a, b)

    def bmm(a, b, **kw):
        if kw or a.dtype != bf or b.dtype != bf:
            return orig_bmm(a, b, **kw)
        return wide("bmm", orig_bmm, a, b)

    def at(a, b):
        if not isinstance(b, torch.Tensor) or a.dtype != bf or b.dtype != bf:
            return orig_at(a, b)
        return wide("@", orig_matmul, a, b)

    F.linear, torch.matmul, torch.bmm, torch.Tensor.__matmul__ = linear, matmul, bmm, at
    try:
        yield
    finally:
        F.linear, torch.matmul, torch.bmm = orig_linear, orig_matmul, orig_bmm
        if had_own:
            torch.Tensor.__matmul__ = orig_at
        else:
            del torch.Tensor.__matmul__


def load_bf16(vdir, spec, device):
    """The checkpoint in vdir as HF runs a bf16 checkpoint: from_pretrained
    in bfloat16, eager attention and experts, on device; fails on any
    missing (but a tied LM head), unexpected or mismatched tensor."""
    from transformers import AutoModelForCausalLM

    kwargs = dict(dtype=torch.bfloat16, attn_implementation="eager", experts_implementation="eager",
                  output_loading_info=True)
    model, info = mf.call_with_optional(AutoModelForCausalLM.from_pretrained, (vdir,), kwargs,
                                        ["experts_implementation", "dtype"])
    model = model.to(device).eval()  # a device move only: buffers keep their dtypes
    mf.force_eager(model)
    missing = [k for k in mf.loading_info_get(info, "missing_keys")
               if not (k == "lm_head.weight" and getattr(model.config, "tie_word_embeddings", False))]
    bad = (missing, mf.loading_info_get(info, "mismatched_keys"), mf.loading_info_get(info, "unexpected_keys"))
    if any(bad):
        raise RuntimeError(f"loading {vdir}: missing {bad[0][:8]}, mismatched {bad[1][:8]}, unexpected {bad[2][:8]}")
    want = spec["architectures"][0]
    if type(model).__name__ != want:
        raise RuntimeError(f"loading {vdir}: transformers built {type(model).__name__}, want {want}")
    return model


@torch.no_grad()
def check_weights(model, built, what):
    """Every tensor of the loaded model's state dict holds the values of the
    built one (compared in float32, so that a tensor transformers keeps in
    float32 compares with its bf16 file value), and every built tensor is
    there. Returns how many were compared and the dtypes that differ."""
    got = model.state_dict()
    widened = set()
    for k, v in got.items():
        if k not in built:
            raise RuntimeError(f"{what}: the loaded model has {k}, which the built model lacks")
        w = built[k]
        if tuple(v.shape) != tuple(w.shape) or not torch.equal(v.detach().cpu().float(), w.float()):
            raise RuntimeError(f"{what}: {k} {v.dtype} {list(v.shape)} differs from the built {w.dtype} {list(w.shape)}")
        if v.dtype != w.dtype:
            widened.add(f"{k.split('.')[-1]}: {w.dtype} held as {v.dtype}")
    absent = [k for k in built if k not in got]
    if absent:
        raise RuntimeError(f"{what}: built tensors {absent[:8]} are absent from the loaded model")
    return len(got), sorted(widened)


@torch.no_grad()
def reference(spec, vdir, built, prompt_lens, seed, device):
    """HF's bf16 outputs over the checkpoint in vdir (see the module
    comment). Returns the tensors and the header metadata; save() writes
    them."""
    import transformers

    t0 = time.time()
    model = load_bf16(vdir, spec, device)
    n, widened = check_weights(model, built, vdir)
    mf.log(f"  reference: {type(model).__name__} loaded in bfloat16 on {device}, {n} tensors equal the written ones "
           f"{widened or ''} ({time.time() - t0:.1f}s)")
    vocab = spec["vocab_size"]
    prompts = [p.to(device) for p in mf.make_prompts(vocab, seed + 17, prompt_lens)]
    attn = model.model.layers[0].self_attn
    rot = model.model.rotary_emb
    rope = {}
    for k, v in vars(rot).items():
        if k.endswith("attention_scaling") or k == "rope_type":
            rope[k] = v if isinstance(v, (int, float, str, dict)) else repr(v)
    meta = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "weights_seed": str(seed),
        "prompt_seed": str(seed + 17),
        "prompt_lengths": json.dumps(list(prompt_lens)),
        "new_tokens": str(NEW_TOKENS),
        "compute": f"bfloat16 on {device}",
        "model_class": type(model).__name__,
        "attn_implementation": str(getattr(model.config, "_attn_implementation", "?")),
        "experts_implementation": str(getattr(model.config, "_experts_implementation", "n/a")),
        "attn_softmax_scale": repr(float(getattr(attn, "scaling", float("nan")))),
        "rope": json.dumps(rope, sort_keys=True, default=str),
        "bf16_reduced_precision_reduction": str(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction),
        "held_wider": json.dumps(widened),
    }
    ref = {}
    counts = {}
    self_err, self_top1, positions = 0.0, 0, 0
    min_std, min_margin, cache_diff, mismatch, distinct = float("inf"), float("inf"), 0.0, 0, set()
    for i, ids in enumerate(prompts):
        t1 = time.time()
        logits = model(input_ids=ids[None], use_cache=False).logits[0].float()
        if not torch.isfinite(logits).all():
            raise RuntimeError(f"prompt {i} ({ids.shape[0]} tokens): non-finite logits")
        with f32_matmul_order(counts):
            alt = model(input_ids=ids[None], use_cache=False).logits[0].float()
        e, same = mf.worst_err_top1(alt, logits)
        del alt
        self_err, self_top1, positions = max(self_err, e), self_top1 + same, positions + ids.shape[0]
        min_std = min(min_std, float(logits.std(dim=-1).min()))
        toks, margins, step_logits = mf.greedy(model, ids, NEW_TOKENS)
        # The cached decode against one uncached pass (informational: in
        # bf16 the two differ by rounding).
        full_ids = torch.cat([ids, torch.tensor(toks[:-1], dtype=ids.dtype, device=device)])
        full = model(input_ids=full_ids[None], use_cache=False).logits[0].float()
        L = ids.shape[0]
        cache_diff = max(cache_diff, float((full[L - 1:] - step_logits).abs().max()))
        mismatch += int((full[L - 1:].argmax(-1).cpu() != torch.tensor(toks)).sum())
        del full, step_logits
        ref[f"bf16.prompt.{i}.ids"] = ids.to(torch.int32).cpu().contiguous()
        ref[f"bf16.prompt.{i}.logits"] = logits.cpu().contiguous()
        ref[f"bf16.greedy.{i}.ids"] = torch.tensor(toks, dtype=torch.int32)
        ref[f"bf16.greedy.{i}.margin"] = torch.tensor(margins, dtype=torch.float32)
        del logits
        min_margin = min(min_margin, min(margins))
        distinct.update(toks)
        mf.log(f"    prompt {i}: {L} tokens, HF f32 order vs HF err {e:.2e} top-1 {same}/{L}, "
               f"greedy {toks[:8]}..., min margin {min(margins):.2e} ({time.time() - t1:.1f}s)")
    # HF in float32 over the same weights (the bf16 values upcast, exact;
    # TF32 off), prompt logits only: what the engine's float32 paths (the
    # CPU backend, CUDA in GEMM mode split) compute. On models whose routing
    # or attention amplifies rounding, HF's bf16 run is far from it (its
    # spread against itself, above, says how far).
    t1 = time.time()
    model = model.float()
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    f32_err, f32_top1 = 0.0, 0
    for i, ids in enumerate(prompts):
        lg = model(input_ids=ids[None], use_cache=False).logits[0].float()
        if not torch.isfinite(lg).all():
            raise RuntimeError(f"prompt {i}: non-finite float32 logits")
        e, same = mf.worst_err_top1(ref[f"bf16.prompt.{i}.logits"].to(lg.device), lg)
        f32_err, f32_top1 = max(f32_err, e), f32_top1 + same
        ref[f"hf_f32.prompt.{i}.logits"] = lg.cpu().contiguous()
        del lg
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    meta["hf_f32.compute"] = f"float32 on {device} (the bf16 weights upcast), TF32 off, prompt logits only"
    meta["hf_f32.bf16_err"] = repr(f32_err)
    meta["hf_f32.bf16_top1"] = f"{f32_top1}/{positions}"
    mf.log(f"  reference: HF in float32 vs HF in bf16: worst err {f32_err:.2e}, top-1 {f32_top1}/{positions} "
           f"({time.time() - t1:.1f}s)")
    del model
    if device != "cpu":
        torch.cuda.empty_cache()
    meta["bf16.hf_self_err"] = repr(self_err)
    meta["bf16.hf_self_top1"] = f"{self_top1}/{positions}"
    meta["bf16.hf_self_order"] = ("HF again with F.linear, torch.matmul, torch.bmm and Tensor @ on bf16 operands "
                                  "computed in float32 and rounded to bf16 once; calls so taken: " +
                                  json.dumps(dict(sorted(counts.items()))))
    mf.log(f"  reference: HF with float32 product order vs HF: worst err {self_err:.2e}, top-1 {self_top1}/{positions} "
           f"(products taken: {dict(sorted(counts.items()))}); min logit row std {min_std:.3f}, min greedy margin "
           f"{min_margin:.2e}, {len(distinct)} distinct greedy tokens, cached vs uncached max diff {cache_diff:.2e}, "
           f"argmax disagreements {mismatch} ({time.time() - t0:.1f}s)")
    if min_std < 0.05:
        raise RuntimeError(f"degenerate logits (row std {min_std:.3g}): raise --std / --embed-std")
    if len(distinct) < 4:
        raise RuntimeError(f"degenerate greedy continuations ({len(distinct)} distinct tokens)")
    return ref, meta


def save(out_dir, ref, meta, prompt_lens, vocab):
    """Writes out_dir/reference.safetensors and checks its header holds
    what the Go test reads."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = os.path.join(out_dir, "reference.safetensors")
    save_file(ref, path, metadata={k: str(v) for k, v in meta.items()})
    with safe_open(path, framework="pt") as f:
        for i, L in enumerate(prompt_lens):
            for key, shape in ((f"bf16.prompt.{i}.ids", [L]), (f"bf16.prompt.{i}.logits", [L, vocab]),
                               (f"bf16.greedy.{i}.ids", [NEW_TOKENS]), (f"bf16.greedy.{i}.margin", [NEW_TOKENS])):
                got = list(f.get_slice(key).get_shape())
                if got != shape:
                    raise RuntimeError(f"{path}: {key} has shape {got}, want {shape}")
        got_meta = f.metadata()
    for k in ("bf16.hf_self_err", "bf16.hf_self_top1"):
        if k not in got_meta:
            raise RuntimeError(f"{path}: metadata lacks {k}")
    mf.log(f"  wrote {path} ({os.path.getsize(path) / 2**20:.0f} MiB)")
    for k in sorted(got_meta):
        mf.log(f"    {k}: {got_meta[k][:300]}")
