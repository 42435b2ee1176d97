#!/usr/bin/env python3
"""Build the tiny Gemma 3 parity fixture: a random-weight Gemma3ForCausalLM
(text) and HF transformers' outputs on three prompts, float32 on the CPU.

  make_gemma3_fixture.py --out DIR   writes DIR/gemma3/f32/{config.json,
                                     model.safetensors} and
                                     DIR/gemma3/reference.safetensors

The model: hidden 64, 3 decoder layers (sliding, sliding, full), 4 query /
2 KV heads of head_dim 16, sliding_window 4 (every prompt and its greedy
continuation is several windows long), query_pre_attn_scalar 24 (not
head_dim), final_logit_softcapping 10, local RoPE base 100 and global
theta 10000 with linear scaling 2, tied embeddings, vocab 256. Weights are
drawn from a seeded generator (norm weights around 0: Gemma scales by
1 + weight; a small embedding). The files come back from a GPU machine's
output folder most simply as one archive, e.g.
  make_gemma3_fixture.py --out "$OUT/x" && tar -C "$OUT/x" -cf "$OUT/gemma3.tar" gemma3 The reference has the keys of tools/make_fixtures.py for the
f32 variant: f32.prompt.<i>.ids / .logits, f32.greedy.<i>.ids / .margin
(32 greedy tokens with the KV cache, EOS not special), prompts of lengths
1, 7 and 23.

Real-shape mode, on the GPU machine (tools/gpu/check.sh, phase parity):

  make_gemma3_fixture.py --config tools/configs/real/gemma-3-1b.json --out DIR

writes DIR/gemma-3-1b/bf16/{config.json, model.safetensors} (Gemma-3-1B's
published text config: 26 layers, 22 of them in 512-token windows, 4 query
/ 1 KV heads of 256, query_pre_attn_scalar 256, local RoPE base 10000 and
global 1e6, tied embeddings of 262144 tokens; random weights, see
init_real) and DIR/gemma-3-1b/reference.safetensors: HF in bfloat16 on the
GPU over prompts of 1, 7, 23, 300 and 600 tokens (the last crosses the
window) with the keys and metadata of tools/window_fixtures.py. About a
minute on an H200 (4 GB of GPU memory, 2 GB of files, a 1 GB reference).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import traceback

# Every model here is built locally: never reach for the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import transformers
from safetensors.torch import load_file, save_file

import make_fixtures as mf
import window_fixtures as wf

SEED = 30301
PROMPT_LENS = [1, 7, 23]
GREEDY = 32
# The real-shape reference's prompts: the last two cross Gemma-3-1B's
# 512-token window once and 88 tokens deep.
REAL_PROMPT_LENS = (1, 7, 23, 300, 600)


def build_config():
    kw = dict(
        vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
        rms_norm_eps=1e-6, sliding_window=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        query_pre_attn_scalar=24, final_logit_softcapping=10.0, attn_logit_softcapping=None,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
        bos_token_id=2, eos_token_id=1, pad_token_id=0,
    )
    rope_v5 = {
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
    }
    try:
        cfg = transformers.Gemma3TextConfig(rope_parameters=rope_v5, **kw)
    except Exception as e:  # older layouts
        print("rope_parameters refused:", e)
        cfg = transformers.Gemma3TextConfig(rope_theta=10000.0, rope_local_base_freq=100.0,
                                            rope_scaling={"rope_type": "linear", "factor": 2.0}, **kw)
    cfg.architectures = ["Gemma3ForCausalLM"]
    try:
        cfg._attn_implementation = "eager"
    except Exception as e:
        print("attn implementation:", e)
    return cfg


def init_weights(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) * 0.3)
            elif "embed_tokens" in name:
                # Small, so that the layers and not the token's own tied
                # embedding decide the next token (greedy runs vary).
                p.copy_(torch.randn(p.shape, generator=gen) * 0.03)
            elif p.dim() == 2:
                std = 1.0 / (p.shape[1] ** 0.5)
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


@torch.no_grad()
def init_real(model, seed, std, embed_std):
    """Real-shape weights, in name order from a generator on the model's
    device seeded with seed: RMSNorm weights N(0, 0.1) (Gemma scales by
    1 + weight), the tied embedding N(0, embed_std) (scaled by
    sqrt(hidden) = 34 in the model), every projection N(0, std), all
    rounded to bf16 once."""
    dev = next(model.parameters()).device
    g = torch.Generator(device=dev).manual_seed(seed)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        z = torch.randn(tuple(p.shape), generator=g, device=dev, dtype=torch.float32)
        if name.endswith("norm.weight"):
            p.copy_(0.1 * z)
        elif "embed_tokens" in name or name.startswith("lm_head"):
            p.copy_(embed_std * z)
        elif p.dim() == 2:
            p.copy_(std * z)
        else:
            raise RuntimeError(f"init_real: no rule for {name} {list(p.shape)}")


def real_main(args):
    """The real-shape mode (see the module comment)."""
    spec, name, out_dir = wf.setup(args)
    try:
        if spec.get("architectures") != ["Gemma3ForCausalLM"]:
            raise RuntimeError(f"{args.config}: architectures {spec.get('architectures')}, want Gemma3ForCausalLM")
        model = wf.build(spec, args.device)
        init_real(model, args.seed, args.std, args.embed_std)
        tied = bool(getattr(model.config, "tie_word_embeddings", True))
        sliding = [t == "sliding_attention" for t in model.config.layer_types]
        mf.log(f"  {sum(sliding)} of {len(sliding)} layers in windows of {model.config.sliding_window}, "
               f"tied embeddings {tied}")
        built = wf.state_dict_cpu(model)
        conf = wf.config_json(model)
        conf.setdefault("tie_word_embeddings", tied)
        del model
        if args.device != "cpu":
            torch.cuda.empty_cache()
        vdir = os.path.join(out_dir, "bf16")
        wf.write_checkpoint(vdir, conf, {k: v for k, v in built.items() if not (tied and k == "lm_head.weight")})
        ref, meta = wf.reference(spec, vdir, built, args.prompt_lens, args.seed, args.device)
        meta["init"] = (f"tools/make_gemma3_fixture.py init_real: norms N(0, 0.1), embedding N(0, {args.embed_std}), "
                        f"projections N(0, {args.std}), seed {args.seed}")
        wf.save(out_dir, ref, meta, args.prompt_lens, spec["vocab_size"])
    except Exception as e:
        traceback.print_exc()
        shutil.rmtree(out_dir, ignore_errors=True)
        print(f"FAILED: {name}: {type(e).__name__}: {e}", flush=True)
        sys.exit(1)
    print(f"{name}: OK", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    wf.add_args(ap, REAL_PROMPT_LENS)
    args = ap.parse_args()
    if args.config:
        real_main(args)
        return
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    cfg = build_config()
    model = transformers.Gemma3ForCausalLM(cfg).float().eval()
    try:
        model.config._attn_implementation = "eager"
    except Exception as e:
        print("attn implementation:", e)
    init_weights(model, gen)
    if cfg.tie_word_embeddings:
        model.tie_weights()

    root = os.path.join(args.out, "gemma3")
    f32 = os.path.join(root, "f32")
    os.makedirs(f32, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        with open(os.path.join(tmp, "config.json")) as f:
            conf = json.load(f)
        conf["dtype"] = "float32"
        conf.pop("torch_dtype", None)
        with open(os.path.join(f32, "config.json"), "w") as f:
            json.dump(conf, f, indent=2, sort_keys=True)
        tensors = {}
        for fn in sorted(os.listdir(tmp)):
            if fn.endswith(".safetensors"):
                tensors.update(load_file(os.path.join(tmp, fn)))
        tensors = {k: v.contiguous().float() for k, v in tensors.items()}
        save_file(tensors, os.path.join(f32, "model.safetensors"), metadata={"format": "pt"})
    print(json.dumps(conf, indent=1, sort_keys=True))
    print("tensors:", sorted(tensors))

    # Reference from the files, as the Go side reads them.
    try:
        ref_model = transformers.Gemma3ForCausalLM.from_pretrained(f32, dtype=torch.float32, attn_implementation="eager").eval()
    except TypeError:
        ref_model = transformers.Gemma3ForCausalLM.from_pretrained(f32, torch_dtype=torch.float32, attn_implementation="eager").eval()
    loaded = dict(ref_model.named_parameters())
    for k, v in tensors.items():
        if k in loaded and not torch.equal(loaded[k].detach(), v):
            print("WARNING: loaded", k, "differs from the saved tensor")
    ref = {}
    pgen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for i, n in enumerate(PROMPT_LENS):
            ids = torch.randint(3, cfg.vocab_size, (n,), generator=pgen)
            out = ref_model(ids[None], use_cache=True)
            ref[f"f32.prompt.{i}.ids"] = ids.to(torch.int32)
            ref[f"f32.prompt.{i}.logits"] = out.logits[0].float().contiguous()
            past, last = out.past_key_values, out.logits[0, -1]
            toks, margins = [], []
            for _ in range(GREEDY):
                top = torch.topk(last, 2)
                nxt = int(torch.argmax(last))
                toks.append(nxt)
                margins.append(float(top.values[0] - top.values[1]))
                o = ref_model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past, last = o.past_key_values, o.logits[0, -1]
            ref[f"f32.greedy.{i}.ids"] = torch.tensor(toks, dtype=torch.int32)
            ref[f"f32.greedy.{i}.margin"] = torch.tensor(margins, dtype=torch.float32)
            # The whole sequence in one pass: the cached decode must agree.
            full = torch.cat([ids, torch.tensor(toks[:-1])])
            lg = ref_model(full[None], use_cache=False).logits[0]
            if not torch.equal(torch.argmax(lg[n - 1:], dim=-1), torch.tensor(toks)):
                print(f"prompt {i}: WARNING: cached greedy differs from one pass")
            print(f"prompt {i}: {n} tokens, greedy {toks[:8]}..., min margin {min(margins):.3g}")
    md = {"transformers": transformers.__version__, "torch": torch.__version__, "seed": str(SEED),
          "prompt_lens": ",".join(map(str, PROMPT_LENS)), "compute": "float32"}
    save_file(ref, os.path.join(root, "reference.safetensors"), metadata=md)
    for dp, _, fns in os.walk(root):
        for fn in fns:
            print(os.path.join(dp, fn), os.path.getsize(os.path.join(dp, fn)))


if __name__ == "__main__":
    main()
