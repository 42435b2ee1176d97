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

Real-shape mode, on the GPU machine (tools/gpu/check.sh, phase parity):

  make_gptoss_fixture.py --config tools/configs/real/gpt-oss-20b-2layers.json --out DIR

builds gpt-oss-20B's published config cut to its first two layers (a
128-token window and a full one; hidden 2880, 64 query / 8 KV heads of 64,
learned sinks, YaRN, 32 experts of 2880 top-4, vocab 201088) with random
weights (init_real), the experts drawn as MXFP4 as above, and writes
  DIR/<name>/mxfp4/  the checkpoint as the official one ships: experts as
                     *_blocks / *_scales, every other tensor bfloat16, and
                     its quantization_config
  DIR/<name>/bf16/   the same model with the experts dequantized (exact:
                     bf16 holds every MXFP4 value) in transformers' layout
  DIR/<name>/reference.safetensors
The reference is HF in bfloat16 on the GPU over bf16/ (so over exactly the
values the engine loads from either folder) with the keys and metadata of
tools/window_fixtures.py (bf16.*), prompts of 1, 7, 23, 200 and 300 tokens;
its header also records how transformers' own MXFP4 code reads mxfp4/
(mxfp4.hf_dequant: convert_moe_packed_tensors on the first layer's
experts; mxfp4.hf_loader: from_pretrained with Mxfp4Config(dequantize=True),
its weights and logits against bf16/'s), informational. About a minute or
two on an H200 (12 GB of GPU memory at most, 9 GB of files, a 0.4 GB
reference, 30 GB of host memory).
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

SEED = 30302
PROMPT_LENS = [1, 7, 23]
GREEDY = 32
# The real-shape reference's prompts: the last two cross gpt-oss's
# 128-token window.
REAL_PROMPT_LENS = (1, 7, 23, 200, 300)
# Real-shape MXFP4 scales: E8M0 exponents (less 127) drawn from these three
# values a block, so that an expert's gate/up outputs come out near unit
# size over 2880 inputs (random codes: rms 2.9 x 2^e x sqrt(2880)) and its
# down projection adds about a third of that to the residual.
REAL_GATE_UP_EXP = (-8, -7, -6)
REAL_DOWN_EXP = (-10, -9, -8)
# Real-shape biases (q/k/v/o, router, experts): N(0, REAL_BIAS_STD).
REAL_BIAS_STD = 0.1
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
    lut = torch.tensor(FP4, dtype=torch.float32, device=blocks.device)
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


def is_expert_matrix(name):
    return name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj")


@torch.no_grad()
def init_real(model, seed, std, embed_std):
    """Real-shape weights, in name order from a generator on the model's
    device seeded with seed: expert matrices from random MXFP4 codes and
    E8M0 scales (REAL_GATE_UP_EXP, REAL_DOWN_EXP), dequantized into the
    parameters (exact in bf16); RMSNorm weights 1 + N(0, 0.1); sinks
    N(0, 1); embedding and LM head N(0, embed_std); projections and router
    N(0, std); biases N(0, REAL_BIAS_STD). Returns the MXFP4 tensors
    (name_blocks, name_scales, on the CPU) of every expert matrix."""
    cfg = model.config
    E, h, inter = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
    dev = next(model.parameters()).device
    g = torch.Generator(device=dev).manual_seed(seed)
    mx = {}
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if is_expert_matrix(name):
            gate = name.endswith("gate_up_proj")
            rows, cols = (2 * inter, h) if gate else (h, inter)
            exps = REAL_GATE_UP_EXP if gate else REAL_DOWN_EXP
            blocks = torch.randint(0, 256, (E, rows, cols // 32, 16), generator=g, device=dev,
                                   dtype=torch.int32).to(torch.uint8)
            scales = (127 + torch.randint(exps[0], exps[-1] + 1, (E, rows, cols // 32), generator=g,
                                          device=dev)).to(torch.uint8)
            for e in range(E):  # one expert at a time: [rows, cols] float32
                dense = dequant(blocks[e:e + 1], scales[e:e + 1])[0]
                if tuple(p.shape[1:]) == (cols, rows):
                    p[e].copy_(dense.T)
                elif tuple(p.shape[1:]) == (rows, cols):
                    p[e].copy_(dense)
                else:
                    raise RuntimeError(f"{name} {list(p.shape)} fits neither [E, {cols}, {rows}] nor [E, {rows}, {cols}]")
            mx[name + "_blocks"] = blocks.cpu().contiguous()
            mx[name + "_scales"] = scales.cpu().contiguous()
            continue
        z = torch.randn(tuple(p.shape), generator=g, device=dev, dtype=torch.float32)
        if name.endswith("norm.weight"):
            p.copy_(1 + 0.1 * z)
        elif name.endswith("sinks"):
            p.copy_(z)
        elif name.endswith("bias"):  # the experts' biases are [E, n]
            p.copy_(REAL_BIAS_STD * z)
        elif "embed_tokens" in name or name.startswith("lm_head"):
            p.copy_(embed_std * z)
        elif p.dim() == 2:
            p.copy_(std * z)
        else:
            raise RuntimeError(f"init_real: no rule for {name} {list(p.shape)}")
    if len(mx) != 4 * cfg.num_hidden_layers:
        raise RuntimeError(f"init_real: {len(mx) // 2} expert matrices for {cfg.num_hidden_layers} layers, want 2 a layer")
    return mx


@torch.no_grad()
def hf_dequant_check(mx, built, device):
    """transformers' MXFP4 dequantization (convert_moe_packed_tensors) of
    the first layer's experts against the values written to bf16/."""
    try:
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors

        out = []
        for w in ("gate_up_proj", "down_proj"):
            name = f"model.layers.0.mlp.experts.{w}"
            theirs = convert_moe_packed_tensors(mx[name + "_blocks"].to(device), mx[name + "_scales"].to(device)).cpu()
            ours = built[name]
            if tuple(theirs.shape) == tuple(ours.shape):
                same = torch.equal(theirs.float(), ours.float())
            else:
                same = torch.equal(theirs.transpose(1, 2).float(), ours.float())
            out.append(f"{w} {'equal' if same else 'DIFFERENT'} ({theirs.dtype} {list(theirs.shape)})")
        msg = "convert_moe_packed_tensors on layer 0 against bf16/: " + ", ".join(out)
    except Exception as e:  # informational only
        msg = f"convert_moe_packed_tensors failed: {type(e).__name__}: {str(e)[:300]}"
    mf.log(f"  {msg}")
    return msg


@torch.no_grad()
def hf_loader_check(mxd, built, device, ids, want):
    """transformers' own reading of mxfp4/ (from_pretrained with
    Mxfp4Config(dequantize=True), bfloat16, eager): how many of its
    tensors equal bf16/'s, and its logits of one prompt against the
    reference's. Informational; the reason when it fails."""
    try:
        from transformers import AutoModelForCausalLM, Mxfp4Config

        kwargs = dict(quantization_config=Mxfp4Config(dequantize=True), dtype=torch.bfloat16,
                      attn_implementation="eager", experts_implementation="eager", device_map=device)
        m = mf.call_with_optional(AutoModelForCausalLM.from_pretrained, (mxd,), kwargs,
                                  ["experts_implementation", "dtype", "device_map"])
        m = m.to(device).eval()
        mf.force_eager(m)
        n = exact = 0
        differ, absent = [], []
        for k, v in m.state_dict().items():
            if k not in built:
                absent.append(k)
                continue
            n += 1
            w = built[k]
            if tuple(v.shape) == tuple(w.shape) and torch.equal(v.detach().cpu().float(), w.float()):
                exact += 1
            else:
                differ.append(f"{k} {v.dtype} {list(v.shape)}")
        lg = m(input_ids=ids.to(device)[None], use_cache=False).logits[0].float().cpu()
        err, same = mf.worst_err_top1(lg, want)
        msg = (f"from_pretrained(mxfp4/, Mxfp4Config(dequantize=True)) in bfloat16: {exact}/{n} tensors equal bf16/'s"
               f"{'; differ: ' + ', '.join(differ[:4]) if differ else ''}"
               f"{'; not in bf16/: ' + ', '.join(absent[:4]) if absent else ''}; "
               f"logits of a {ids.shape[0]}-token prompt against the reference: err {err:.2e}, top-1 {same}/{lg.shape[0]}")
        del m
    except Exception as e:  # informational only
        msg = f"from_pretrained(mxfp4/, Mxfp4Config(dequantize=True)) failed: {type(e).__name__}: {str(e)[:300]}"
    mf.log(f"  {msg}")
    return msg


def real_main(args):
    """The real-shape mode (see the module comment)."""
    spec, name, out_dir = wf.setup(args)
    try:
        if spec.get("architectures") != ["GptOssForCausalLM"]:
            raise RuntimeError(f"{args.config}: architectures {spec.get('architectures')}, want GptOssForCausalLM")
        model = wf.build(spec, args.device)
        cfg = model.config
        if cfg.hidden_size % 32 or cfg.intermediate_size % 32:
            raise RuntimeError(f"hidden {cfg.hidden_size}, intermediate {cfg.intermediate_size}: MXFP4 needs multiples of 32")
        mx = init_real(model, args.seed, args.std, args.embed_std)
        mf.log(f"  layers {list(cfg.layer_types)}, window {cfg.sliding_window}, {cfg.num_local_experts} experts "
               f"top-{cfg.num_experts_per_tok}")
        built = wf.state_dict_cpu(model)
        for want in ("model.layers.0.self_attn.sinks", "model.layers.0.mlp.experts.gate_up_proj_bias", "lm_head.weight"):
            if want not in built:
                raise RuntimeError(f"the model has no {want}; has e.g. {sorted(built)[:12]}")
        conf = wf.config_json(model)
        del model
        if args.device != "cpu":
            torch.cuda.empty_cache()
        bf16d, mxd = os.path.join(out_dir, "bf16"), os.path.join(out_dir, "mxfp4")
        wf.write_checkpoint(bf16d, conf, built)
        mconf = dict(conf)
        mconf["quantization_config"] = spec.get("quantization_config") or {
            "quant_method": "mxfp4", "modules_to_not_convert": [
                "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
        mt = {k: v for k, v in built.items() if not is_expert_matrix(k)}
        mt.update(mx)
        wf.write_checkpoint(mxd, mconf, mt)
        dq = hf_dequant_check(mx, built, args.device)
        del mx, mt
        ref, meta = wf.reference(spec, bf16d, built, args.prompt_lens, args.seed, args.device)
        meta["mxfp4.weights"] = ("mxfp4/ holds the experts as MXFP4 blocks and scales; bf16/ holds them dequantized "
                                 "(code value x 2^(scale - 127), exact in bf16) in transformers' layout; every other "
                                 "tensor is the same bf16 tensor in both; the reference is HF over bf16/")
        meta["mxfp4.hf_dequant"] = dq
        k = min(2, len(args.prompt_lens) - 1)
        meta["mxfp4.hf_loader"] = hf_loader_check(mxd, built, args.device, ref[f"bf16.prompt.{k}.ids"].long(),
                                                  ref[f"bf16.prompt.{k}.logits"])
        meta["init"] = (f"tools/make_gptoss_fixture.py init_real: experts MXFP4 (exponents {REAL_GATE_UP_EXP} gate/up, "
                        f"{REAL_DOWN_EXP} down), norms 1 + N(0, 0.1), sinks N(0, 1), embedding and head "
                        f"N(0, {args.embed_std}), projections and router N(0, {args.std}), biases N(0, {REAL_BIAS_STD}), "
                        f"seed {args.seed}")
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
