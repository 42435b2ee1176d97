#!/usr/bin/env python3
"""Build the tiny gpt-oss parity fixture: a random-weight GptOssForCausalLM
and HF transformers' outputs on three prompts, float32 on the CPU.

  make_gptoss_fixture.py --out DIR   writes DIR/gpt-oss/f32/{config.json,
                                     model.safetensors},
                                     DIR/gpt-oss/mxfp4/{config.json,
                                     model.safetensors} and
                                     DIR/gpt-oss/reference.safetensors

The model: hidden 32, 2 decoder layers (sliding, full), 4 query / 2 KV
heads of head_dim 16 (q width 64 != hidden), sliding_window 4 (every prompt
and its greedy continuation is several windows long), learned attention
sinks, q/k/v/o biases, 4 experts of intermediate 64, top-2, expert and
router biases, YaRN RoPE (factor 4 over 32 original positions, truncate
false), untied LM head, vocab 256.

The expert weights are drawn as MXFP4 (random 4-bit codes and E8M0 block
scales, 32 values a block, as the official checkpoints ship them): mxfp4/
stores them so (`*_blocks` uint8 [E, rows, cols/32, 16], `*_scales` uint8
[E, rows, cols/32], rows the output features, gate/up interleaved), f32/
stores the same values dequantized in transformers' layout
(`gate_up_proj` [E, hidden, 2*inter], `down_proj` [E, inter, hidden]). Both
have the same reference. Everything else is float32 in both.

The reference has the keys of tools/make_fixtures.py for the f32 variant:
f32.prompt.<i>.ids / .logits, f32.greedy.<i>.ids / .margin (32 greedy
tokens with the KV cache, EOS not special), prompts of lengths 1, 7 and 23.
The files come back from a GPU machine's output folder most simply as one
archive, e.g.
  make_gptoss_fixture.py --out "$OUT/x" && tar -C "$OUT/x" -cf "$OUT/gptoss.tar" gpt-oss
"""
import argparse
import json
import os
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

SEED = 30302
PROMPT_LENS = [1, 7, 23]
GREEDY = 32
FP4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def build_config():
    kw = dict(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
        rms_norm_eps=1e-5, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
        num_local_experts=4, num_experts_per_tok=2, attention_bias=True, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, initial_context_length=32,
    )
    yarn = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "original_max_position_embeddings": 32, "truncate": False}
    try:
        cfg = transformers.GptOssConfig(rope_parameters=dict(yarn, rope_theta=150000.0), **kw)
    except Exception as e:  # older layouts
        print("rope_parameters refused:", e)
        cfg = transformers.GptOssConfig(rope_theta=150000.0, rope_scaling=yarn, **kw)
    cfg.architectures = ["GptOssForCausalLM"]
    return cfg


def dequant(blocks, scales):
    """[E, rows, G, 16] codes + [E, rows, G] E8M0 -> [E, rows, G*32] f32."""
    lut = torch.tensor(FP4, dtype=torch.float32)
    lo, hi = (blocks & 0x0F).long(), (blocks >> 4).long()
    vals = torch.stack([lut[lo], lut[hi]], dim=-1).reshape(*blocks.shape[:-1], 32)
    exp = scales.to(torch.int32) - 127
    vals = torch.ldexp(vals, exp[..., None].to(torch.float32))
    return vals.reshape(*blocks.shape[:2], -1)


def to_param(dense_rows, shape):
    """[E, rows, cols] (rows = outputs) -> the parameter's layout."""
    t = dense_rows.transpose(1, 2).contiguous()
    if tuple(t.shape) == tuple(shape):
        return t
    if tuple(dense_rows.shape) == tuple(shape):
        print("NOTE: expert parameter stored as [E, out, in]")
        return dense_rows.contiguous()
    raise SystemExit(f"expert shape {tuple(shape)} fits neither {tuple(t.shape)} nor {tuple(dense_rows.shape)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    cfg = build_config()
    model = transformers.GptOssForCausalLM(cfg).float().eval()
    try:
        model.config._attn_implementation = "eager"
    except Exception as e:
        print("attn implementation:", e)
    sd = model.state_dict()
    print("parameters:", {k: tuple(v.shape) for k, v in sd.items()})
    E, h, inter = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
    mx = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                rows, cols = (2 * inter, h) if name.endswith("gate_up_proj") else (h, inter)
                blocks = torch.randint(0, 256, (E, rows, cols // 32, 16), generator=gen, dtype=torch.int32).to(torch.uint8)
                lo = -4 if name.endswith("gate_up_proj") else -5
                scales = (127 + torch.randint(lo, lo + 3, (E, rows, cols // 32), generator=gen)).to(torch.uint8)
                dense = dequant(blocks, scales)
                try:
                    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
                    theirs = convert_moe_packed_tensors(blocks, scales).float()
                    print(name, "transformers' dequant agrees:",
                          torch.equal(theirs, dense.transpose(1, 2)) or torch.equal(theirs, dense))
                except Exception as e:
                    print("no transformers mxfp4 dequant to compare:", e)
                p.copy_(to_param(dense, p.shape))
                mx[name + "_blocks"] = blocks
                mx[name + "_scales"] = scales
            elif "norm" in name:
                p.copy_(1 + (torch.rand(p.shape, generator=gen) * 2 - 1) * 0.3)
            elif name.endswith("sinks"):
                p.copy_(torch.randn(p.shape, generator=gen) * 1.5)
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            elif p.dim() == 2:
                std = 1.0 / (p.shape[1] ** 0.5)
                if "router" in name:
                    std *= 3
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            else:  # biases
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)

    root = os.path.join(args.out, "gpt-oss")
    f32, mxd = os.path.join(root, "f32"), os.path.join(root, "mxfp4")
    os.makedirs(f32, exist_ok=True)
    os.makedirs(mxd, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        with open(os.path.join(tmp, "config.json")) as f:
            conf = json.load(f)
        conf["dtype"] = "float32"
        conf.pop("torch_dtype", None)
        conf.pop("quantization_config", None)
        with open(os.path.join(f32, "config.json"), "w") as f:
            json.dump(conf, f, indent=2, sort_keys=True)
        tensors = {}
        for fn in sorted(os.listdir(tmp)):
            if fn.endswith(".safetensors"):
                tensors.update(load_file(os.path.join(tmp, fn)))
        tensors = {k: v.contiguous().float() for k, v in tensors.items()}
        save_file(tensors, os.path.join(f32, "model.safetensors"), metadata={"format": "pt"})
    print(json.dumps(conf, indent=1, sort_keys=True))
    print("tensors:", {k: tuple(v.shape) for k, v in sorted(tensors.items())})
    mconf = dict(conf)
    mconf["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    with open(os.path.join(mxd, "config.json"), "w") as f:
        json.dump(mconf, f, indent=2, sort_keys=True)
    mt = {k: v for k, v in tensors.items() if not (k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj"))}
    mt.update(mx)
    save_file(mt, os.path.join(mxd, "model.safetensors"), metadata={"format": "pt"})

    try:
        ref_model = transformers.GptOssForCausalLM.from_pretrained(f32, dtype=torch.float32, attn_implementation="eager").eval()
    except TypeError:
        ref_model = transformers.GptOssForCausalLM.from_pretrained(f32, torch_dtype=torch.float32, attn_implementation="eager").eval()
    loaded = dict(ref_model.state_dict())
    for k, v in sd.items():
        if k in loaded and not torch.equal(loaded[k].detach().float(), model.state_dict()[k].float()):
            print("WARNING: reloaded", k, "differs from the model's tensor")
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
