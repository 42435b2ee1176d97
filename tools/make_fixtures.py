#!/usr/bin/env python3
"""Build random-weight Hugging Face models from config.json files and dump
reference outputs of HF transformers for the Go parity tests.

For each input config (default: the five tiny fixtures in tools/configs/
and the four in BUILTIN_CONFIGS below: qwen3-moe, mixtral, deepseek-v3-fp8,
qwen3-fp8; --only picks some of them, --only new the last four):

  1. transformers builds the model (float32, eager attention, eager experts);
     every parameter is re-initialised from a seeded generator (see
     init_weights) so that logits are far from flat;
  2. the model is saved with save_pretrained (the hub layout, per-expert
     tensors) and rewritten as OUT/<name>/f32/ and OUT/<name>/bf16/, each with
     the config.json that transformers wrote and one model.safetensors;
     for DeepSeek V3 with num_nextn_predict_layers > 0 the MTP layer is
     appended under DeepSeek's published names (model.layers.<N>.*);
  3. unless --no-reference, each variant is loaded back with from_pretrained
     in float32 (the bf16 checkpoint is upcast) and checked against the built
     weights; with --reference-dtype bfloat16 the loaded model is then cast to
     bfloat16, as HF runs a bf16 checkpoint (weights, activations and norms
     in bf16; the f32 variant's weights rounded), while the default float32
     keeps every weight as stored and computes in float32. Then
     OUT/<name>/reference.safetensors gets, for v in {f32, bf16} and prompt
     i in {0, 1, 2} (random ids, lengths 1, 7, 23; --prompt-lens changes
     them):
       <v>.prompt.<i>.ids     I32 [L]         the prompt
       <v>.prompt.<i>.logits  F32 [L, vocab]  logits of the whole prompt
       <v>.greedy.<i>.ids     I32 [32]        32 greedy new tokens (plain argmax
                                              with the KV cache, EOS ignored)
       <v>.greedy.<i>.margin  F32 [32]        top-1 minus top-2 logit per step
       <v>.rope.inv_freq      F32 [rot/2]     the model's RoPE inverse frequencies
     and for an MTP model
       <v>.mtp.<i>.ids        I32 [L]         prompt[1:] + [greedy[0]]
       <v>.mtp.<i>.logits     F32 [L, vocab]  MTP logits (see mtp_reference)
     The header's __metadata__ records versions, seeds, the prompt lengths,
     the reference dtype ("compute") and the scales HF used; with a bf16
     reference also <v>.hf_self_err and <v>.hf_self_top1, the prompt logits
     of HF again under f32_gemm_order against the reference (the worst
     max|diff| / max|ref| and "same/positions" top-1). The MTP
     reference is computed in float32 in either case.

The variant fp8 (the default, and only, variant of deepseek-v3-fp8 and
qwen3-fp8) is a checkpoint laid out as DeepSeek-V3/R1's and Qwen3's FP8
releases are: OUT/<name>/fp8/model.safetensors holds every linear layer's
matrix of the decoder layers (attention projections, dense, shared and
routed expert MLPs; not the embeddings, LM heads, norms, routers or the MTP
eh_proj) as float8_e4m3fn with "<name>_scale_inv" float32
[ceil(out/128), ceil(in/128)] (DeepSeek's recipe: scale = amax|block| / 448,
q = round-to-nearest-even(w / scale)), every other tensor bfloat16
(e_score_correction_bias float32), and its config.json has
quantization_config {quant_method: fp8, fmt: e4m3, activation_scheme:
dynamic, weight_block_size: [128, 128]}. Its reference (fp8.* in
reference.safetensors, the same keys as above) is HF in float32 over the
checkpoint dequantized (q * scale per block, every other tensor its bf16
value); the header also records fp8.hf_fp8_check, how transformers' own FP8
loader (dequantize=True) reads the file against those weights.

Large real-shape configs (tools/configs/real/) are meant for
  make_fixtures.py --config tools/configs/real/qwen3-0.6b.json --out DIR \
      --no-reference --variants bf16 --device cuda
or, with references on the GPU against HF in bfloat16 (tools/gpu/check.sh):
  make_fixtures.py --config ... --out DIR --variants bf16 --device cuda \
      --reference-dtype bfloat16 --prompt-lens 1,7,23,100,250 \
      --max-dir-bytes 0 --min-margin 0 --max-tries 1

Runs on the GPU machine (torch, transformers 5, safetensors); the references
are computed on the CPU by default so that float32 means float32 (no TF32).
"""

import argparse
import contextlib
import copy
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
import time
import traceback
import zlib

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = ["llama", "mistral", "qwen3", "deepseek-v2", "deepseek-v3"]
# Fixtures whose config lives here rather than in tools/configs/: two MoE
# families and two FP8 block-quantized checkpoints. The FP8 ones are big
# enough for 128x128 blocks to mean something (full and partial blocks in
# both dimensions) and small enough for about 1 MB a folder.
BUILTIN_CONFIGS = {
    "qwen3-moe": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 24,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": False,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [0],
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 2,
        "router_aux_loss_coef": 0.001,
        "output_router_logits": False,
        "bos_token_id": None,
        "eos_token_id": 1,
    },
    "mixtral": {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 24,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "router_aux_loss_coef": 0.02,
        "output_router_logits": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    # DeepSeek-V3's architecture at hidden 192 (a full and a partial
    # 128-column block in every matrix that reads the hidden state), with its
    # MTP layer, as DeepSeek-V3/R1 ship.
    "deepseek-v3-fp8": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": 128,
        "hidden_size": 192,
        "intermediate_size": 160,
        "moe_intermediate_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 160,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "topk_method": "noaux_tc",
        "n_group": 4,
        "topk_group": 2,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "num_nextn_predict_layers": 1,
        "hidden_act": "silu",
        "max_position_embeddings": 163840,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "attention_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
    },
    # Qwen3 at hidden 256 (whole 128-column blocks) with an intermediate
    # size and q/k/v widths that end in partial blocks; untied LM head, as
    # the larger Qwen3-FP8 checkpoints.
    "qwen3-fp8": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": 256,
        "hidden_size": 256,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 48,
        "hidden_act": "silu",
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 2,
        "bos_token_id": None,
        "eos_token_id": 1,
    },
}
NEW = list(BUILTIN_CONFIGS)
# The variants a fixture gets unless --variants says otherwise.
DEFAULT_VARIANTS = {"deepseek-v3-fp8": "fp8", "qwen3-fp8": "fp8"}
# The quantization_config of DeepSeek-V3/R1's and Qwen3's FP8 checkpoints.
FP8_QUANT_CONFIG = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
}
FP8_MAX = 448.0
PROMPT_LENS = (1, 7, 23)
# --reference-dtype choices.
REFERENCE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
NEW_TOKENS = 32
# Tensors kept in float32 in the bf16 checkpoint, as DeepSeek-V3's published
# checkpoints do.
KEEP_F32 = ("e_score_correction_bias",)
# Weights of a DeepSeek MTP layer besides a decoder layer's own.
MTP_EXTRAS = (
    "enorm.weight",
    "hnorm.weight",
    "eh_proj.weight",
    "shared_head.norm.weight",
    "shared_head.head.weight",
    "embed_tokens.weight",
)
# Tensors each fixture's checkpoint must hold: proof that transformers built
# the architecture the config asks for, in the hub layout.
EXPECT_TENSORS = {
    "llama": [
        "model.layers.0.self_attn.q_proj.bias",
        "model.layers.1.self_attn.o_proj.bias",
        "lm_head.weight",
    ],
    "mistral": ["model.layers.1.self_attn.k_proj.weight", "lm_head.weight"],
    "qwen3": ["model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight"],
    "deepseek-v2": [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.1.mlp.gate.weight",
        "model.layers.1.mlp.experts.7.down_proj.weight",
        "model.layers.1.mlp.shared_experts.up_proj.weight",
    ],
    "qwen3-moe": [
        "model.layers.0.self_attn.q_norm.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.1.mlp.gate.weight",
        "model.layers.1.mlp.experts.7.down_proj.weight",
        "lm_head.weight",
    ],
    "mixtral": [
        "model.layers.0.block_sparse_moe.gate.weight",
        "model.layers.1.block_sparse_moe.experts.7.w2.weight",
        "lm_head.weight",
    ],
    "qwen3-fp8": [
        "model.layers.0.self_attn.q_norm.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.layers.1.mlp.down_proj.weight_scale_inv",
        "lm_head.weight",
    ],
    "deepseek-v3-fp8": [
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv",
        "model.layers.1.mlp.experts.7.gate_proj.weight_scale_inv",
        "model.layers.1.mlp.gate.e_score_correction_bias",
        "model.layers.2.eh_proj.weight",
        "model.layers.2.mlp.shared_experts.down_proj.weight_scale_inv",
    ],
    "deepseek-v3": [
        "model.layers.0.self_attn.q_a_proj.weight",
        "model.layers.0.self_attn.q_a_layernorm.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.1.mlp.gate.e_score_correction_bias",
        "model.layers.1.mlp.experts.7.gate_proj.weight",
        "model.layers.1.mlp.shared_experts.down_proj.weight",
        "model.layers.2.eh_proj.weight",
        "model.layers.2.mlp.experts.0.up_proj.weight",
        "model.layers.2.self_attn.kv_b_proj.weight",
    ],
}
EXPECT_ABSENT = {
    "qwen3": ["lm_head.weight"],
    "mixtral": ["model.layers.0.mlp.gate.weight"],
    "deepseek-v3-fp8": ["model.layers.2.eh_proj.weight_scale_inv", "model.layers.1.mlp.gate.weight_scale_inv"],
}


def prompt_lens_arg(text):
    """--prompt-lens: positive integers, comma-separated."""
    try:
        lens = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        lens = ()
    if not lens or min(lens) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: want positive lengths, comma-separated, e.g. 1,7,23")
    return lens


class NearTie(Exception):
    """A greedy step whose top two logits are closer than --min-margin."""


def log(*args):
    print(*args, flush=True)


def call_with_optional(fn, args, kwargs, optional):
    """Call fn, dropping keyword arguments from `optional` that this version of
    transformers rejects with a TypeError naming them."""
    kwargs = dict(kwargs)
    while True:
        try:
            return fn(*args, **kwargs)
        except TypeError as e:
            dropped = [k for k in optional if k in kwargs and k in str(e)]
            if not dropped:
                raise
            for k in dropped:
                log(f"    note: {getattr(fn, '__qualname__', fn)} rejects {k}; dropped")
                kwargs.pop(k)


def make_config(spec):
    from transformers import AutoConfig

    tmp = tempfile.mkdtemp()
    try:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(spec, f)
        return AutoConfig.from_pretrained(tmp)
    finally:
        shutil.rmtree(tmp)


def build_model(spec, dtype, device):
    from transformers import AutoModelForCausalLM

    config = make_config(spec)
    # Build large models directly on the GPU.
    where = contextlib.nullcontext() if device == "cpu" else torch.device(device)
    with where:
        model = call_with_optional(
            AutoModelForCausalLM.from_config,
            (config,),
            dict(dtype=dtype, attn_implementation="eager", experts_implementation="eager"),
            ["experts_implementation", "dtype"],
        )
    model = model.to(device=device, dtype=dtype)
    model.eval()
    force_eager(model)
    patch_moe(model)
    return model


def force_eager(model):
    """Plain attention and the plain per-expert loop: the simplest math, for
    references. Logs what the model ends up using."""
    for setter, value in (("set_attn_implementation", "eager"), ("set_experts_implementation", "eager")):
        fn = getattr(model, setter, None)
        if fn is not None:
            try:
                fn(value)
            except Exception as e:  # a model without experts may refuse
                log(f"    note: {setter}({value!r}): {e}")
    log(f"    attention {getattr(model.config, '_attn_implementation', '?')}, "
        f"experts {getattr(model.config, '_experts_implementation', 'n/a')}")


def patch_moe(model):
    """Some transformers versions read `num_experts` in DeepSeek V2's grouped
    routing without setting it; give it the configured value (no effect where
    it is set)."""
    n = getattr(model.config, "n_routed_experts", None)
    for mod in model.modules():
        if type(mod).__name__.lower().endswith("moe") and hasattr(mod, "experts") and not hasattr(mod, "num_experts"):
            mod.num_experts = n
            log(f"    note: set {type(mod).__name__}.num_experts = {n}")


def is_norm(name):
    return name.endswith("norm.weight")


def is_embed_or_head(name):
    return "embed_tokens" in name or name.startswith("lm_head") or "shared_head.head" in name


@torch.no_grad()
def init_weights(module, seed, std, embed_std, prefix=""):
    """Seeded re-initialisation of every parameter, in name order:
    RMSNorm weights 1 + N(0, 0.1); biases N(0, std); embeddings and LM heads
    N(0, embed_std); every other matrix (projections, routers, experts)
    N(0, std); DeepSeek V3's e_score_correction_bias N(0, 0.1)."""
    device = next(module.parameters()).device
    g = torch.Generator(device=device).manual_seed(seed)

    def normal(shape):
        return torch.randn(tuple(shape), generator=g, device=device, dtype=torch.float32)

    for name, p in sorted(module.named_parameters(), key=lambda kv: kv[0]):
        full = prefix + name
        z = normal(p.shape)
        if is_norm(full):
            val = 1.0 + 0.1 * z
        elif full.endswith("bias"):
            val = (0.1 if "e_score_correction_bias" in full else std) * z
        elif is_embed_or_head(full):
            val = embed_std * z
        else:
            val = std * z
        p.copy_(val.to(p.dtype))
    for name, b in sorted(module.named_buffers(), key=lambda kv: kv[0]):
        if name.endswith("e_score_correction_bias"):
            b.copy_((0.1 * normal(b.shape)).to(b.dtype))


def saved_tensors(d):
    from safetensors.torch import load_file

    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for name in files:
        out.update(load_file(os.path.join(d, name)))
    return out


def unfuse_experts(tensors, hidden):
    """Split fused expert tensors (mlp.experts.gate_up_proj [E, 2I, H] and
    mlp.experts.down_proj [E, H, I], as transformers 5 holds them in memory)
    into the hub's per-expert names, in case save_pretrained kept them fused.
    The reload check in reference() proves the split right."""
    out = {}
    n = 0
    for k, t in tensors.items():
        if k.endswith("mlp.experts.gate_up_proj") and t.dim() == 3:
            base = k[: -len("gate_up_proj")]
            if t.shape[2] != hidden:  # [E, H, 2I]
                t = t.transpose(1, 2)
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :inter].contiguous()
                out[f"{base}{e}.up_proj.weight"] = t[e, inter:].contiguous()
            n += 1
        elif k.endswith("mlp.experts.down_proj") and t.dim() == 3:
            base = k[: -len("down_proj")]
            if t.shape[1] != hidden:  # [E, I, H]
                t = t.transpose(1, 2)
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].contiguous()
            n += 1
        else:
            out[k] = t
    if n:
        log(f"    note: split {n} fused expert tensors into per-expert tensors")
    return out


def layer_index(name):
    m = re.match(r"model\.layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def keep_f32(name):
    return any(k in name for k in KEEP_F32)


def to_variant(tensors, variant):
    if variant == "f32":
        return {k: v.float().contiguous() for k, v in tensors.items()}
    return {k: (v.float() if keep_f32(k) else v.to(torch.bfloat16)).contiguous() for k, v in tensors.items()}


def variant_dtype(variant):
    return {"f32": torch.float32, "bf16": torch.bfloat16}[variant]


def is_fp8_linear(name):
    """The tensors DeepSeek-V3's and Qwen3's FP8 checkpoints store in
    float8_e4m3fn: the matrices of a decoder layer's linear layers (attention
    projections, DeepSeek's kv_a_proj_with_mqa, dense, shared and routed
    expert MLPs, Mixtral-style w1/w2/w3), not the embeddings, the LM heads,
    the norms, the MoE routers or the MTP layer's eh_proj."""
    if layer_index(name) is None or name.endswith(".eh_proj.weight"):
        return False
    return (name.endswith("_proj.weight") or name.endswith(".kv_a_proj_with_mqa.weight")
            or re.search(r"\.w[123]\.weight$", name) is not None)


def quantize_fp8_blocks(w, block):
    """DeepSeek-V3's weight recipe on the float32 matrix w [n, k]: per block
    of block[0] x block[1] (the last ones partial), scale = amax|block| / 448
    (1 for an all-zero block), q = round-to-nearest-even(w / scale) in
    float8_e4m3fn. Returns q [n, k] and the float32 scales
    [ceil(n/bn), ceil(k/bk)] (the checkpoint's weight_scale_inv: w ~ q * s)."""
    bn, bk = block
    w = w.detach().float().cpu()
    n, k = w.shape
    nb, kb = -(-n // bn), -(-k // bk)
    pad = F.pad(w, (0, kb * bk - k, 0, nb * bn - n))
    blocks = pad.view(nb, bn, kb, bk)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax)).float()
    scaled = (blocks / scale[:, None, :, None]).view(nb * bn, kb * bk)[:n, :k]
    q = scaled.clamp(-FP8_MAX, FP8_MAX).contiguous().to(torch.float8_e4m3fn)
    return q, scale.contiguous()


def dequantize_fp8_blocks(q, scale, block):
    """q * scale per block, each product rounded once to float32."""
    bn, bk = block
    n, k = q.shape
    s = scale.repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]
    return (q.float() * s).contiguous()


def to_fp8(tensors, block):
    """The checkpoint as DeepSeek-V3/R1 and Qwen3-FP8 ship it, and its
    dequantized float32 twin (the reference's weights): every is_fp8_linear
    matrix as float8_e4m3fn with "<name>_scale_inv" float32 scales; every
    other tensor in bfloat16 (e_score_correction_bias float32)."""
    stored, deq = {}, {}
    n = 0
    for k, v in tensors.items():
        if is_fp8_linear(k) and v.dim() == 2:
            q, sc = quantize_fp8_blocks(v, block)
            if not torch.isfinite(q.float()).all():
                raise RuntimeError(f"{k}: non-finite FP8 values")
            stored[k] = q
            stored[k + "_scale_inv"] = sc
            deq[k] = dequantize_fp8_blocks(q, sc, block)
            n += 1
        else:
            t = v.float() if keep_f32(k) else v.to(torch.bfloat16)
            stored[k] = t.contiguous()
            deq[k] = t.float().contiguous()
    log(f"    fp8: {n} matrices quantized in {block[0]}x{block[1]} blocks, {len(stored) - 2 * n} tensors kept")
    return stored, deq


def safetensors_dtypes(path):
    """Tensor name -> the dtype string in the file's header."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    return {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}


def check_fp8_file(path, stored):
    """The written FP8 checkpoint holds what the official ones do: F8_E4M3
    matrices with F32 [ceil(n/128), ceil(k/128)] scales, the rest BF16 (F32
    for e_score_correction_bias)."""
    dt = safetensors_dtypes(path)
    counts = {}
    for k, d in dt.items():
        counts[d] = counts.get(d, 0) + 1
        if k.endswith("_scale_inv"):
            w = k[: -len("_scale_inv")]
            if d != "F32" or dt.get(w) != "F8_E4M3":
                raise RuntimeError(f"{path}: {k} is {d} for {w} of {dt.get(w)}")
        elif d == "F8_E4M3":
            if k + "_scale_inv" not in dt:
                raise RuntimeError(f"{path}: {k} has no scale")
        elif d != ("F32" if keep_f32(k) else "BF16"):
            raise RuntimeError(f"{path}: {k} is {d}")
    if set(dt) != set(stored):
        raise RuntimeError(f"{path}: tensors differ from those meant to be written")
    log(f"    wrote {path}: dtypes {dict(sorted(counts.items()))}")
    return counts


def module_tensor_from_hub(hub, name, shape):
    """The value of the module's state-dict entry `name` (of `shape`) from
    tensors in the hub layout: the same name, or the fused experts
    (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I], or
    transposed) stacked from the per-expert gate/up/down matrices."""
    shape = tuple(shape)
    if name in hub and tuple(hub[name].shape) == shape:
        return hub[name]
    m = re.match(r"(.*\.experts\.)(gate_up_proj|down_proj)$", name)
    if m and len(shape) == 3:
        base, kind = m.groups()
        if kind == "gate_up_proj":
            parts = [torch.cat([hub[f"{base}{e}.gate_proj.weight"], hub[f"{base}{e}.up_proj.weight"]], 0)
                     for e in range(shape[0])]
        else:
            parts = [hub[f"{base}{e}.down_proj.weight"] for e in range(shape[0])]
        t = torch.stack(parts)
        if tuple(t.shape) != shape:
            t = t.transpose(1, 2)
        if tuple(t.shape) == shape:
            return t.contiguous()
    raise KeyError(f"{name} {list(shape)}: not in the checkpoint")


@torch.no_grad()
def check_fp8_roundtrip(model, built_sd, deq, num_layers):
    """Every weight of the model loaded from the dequantized checkpoint
    equals the dequantized value, and lies within FP8's rounding of the built
    weight (|deq - built| <= max|built| / 8 per tensor)."""
    got = model.state_dict()
    n, worst = 0, 0.0
    for k, v in got.items():
        if k not in built_sd:
            if layer_index(k) is not None and layer_index(k) >= num_layers:
                continue
            raise RuntimeError(f"reloaded model has {k}, which the built model lacks")
        if k == "lm_head.weight" and k not in deq:  # tied
            want = deq["model.embed_tokens.weight"].float()
        else:
            want = module_tensor_from_hub(deq, k, v.shape).float()
        if not torch.equal(v.float().cpu(), want.cpu()):
            raise RuntimeError(f"reloaded {k} differs from the dequantized weight")
        b = built_sd[k].float().cpu()
        rel = float((want.cpu() - b).abs().max() / b.abs().max().clamp_min(1e-30))
        if rel > 0.125:
            raise RuntimeError(f"{k}: dequantized weight {rel:.3g} (relative) from the built one")
        worst = max(worst, rel)
        n += 1
    log(f"    fp8: worst |dequantized - built| / max|built| over {n} weights: {worst:.3g}")
    return n


@torch.no_grad()
def hf_fp8_check(fp8_dir, ref_sd, num_mtp, prompt, want_logits):
    """transformers' own reading of the FP8 checkpoint (FineGrainedFP8Config
    with dequantize=True, on the CPU): how far its weights and logits are
    from the dequantized reference. Informational; the reason when it fails."""
    try:
        from transformers import AutoModelForCausalLM, FineGrainedFP8Config

        qc = call_with_optional(FineGrainedFP8Config, (), dict(weight_block_size=(128, 128), dequantize=True),
                                ["dequantize"])
        kwargs = dict(quantization_config=qc, dtype=torch.float32, attn_implementation="eager",
                      experts_implementation="eager", device_map="cpu")
        if num_mtp:
            kwargs["num_nextn_predict_layers"] = 0
        m = call_with_optional(AutoModelForCausalLM.from_pretrained, (fp8_dir,), kwargs,
                               ["experts_implementation", "dtype", "device_map"])
        m = m.eval()
        force_eager(m)
        patch_moe(m)
        worst, n, dtypes, errs = 0.0, 0, set(), []
        for k, v in m.state_dict().items():
            if k in ref_sd and tuple(v.shape) == tuple(ref_sd[k].shape) and v.is_floating_point():
                r = ref_sd[k].float().cpu()
                e = float((v.float().cpu() - r).abs().max() / r.abs().max().clamp_min(1e-30))
                worst = max(worst, e)
                errs.append((e, k, list(v.shape)))
                n += 1
                dtypes.add(str(v.dtype).removeprefix("torch."))
        errs.sort(reverse=True)
        exact = sum(1 for e, _, _ in errs if e == 0)
        log(f"    transformers FP8 load: {exact}/{n} weights exact; worst: " +
            "; ".join(f"{k} {shape} {e:.3g}" for e, k, shape in errs[:4]))
        m = m.float()
        lg = m(input_ids=prompt.cpu()[None], use_cache=False).logits[0].float()
        err, same = worst_err_top1(lg, want_logits.cpu())
        msg = (f"transformers FP8 load (dequantize=True): {exact}/{n} weights ({'/'.join(sorted(dtypes))}) exact, all within "
               f"{worst:.3g} (relative) of the dequantized ones; logits err {err:.3g}, top-1 {same}/{lg.shape[0]}")
    except Exception as e:  # informational only
        msg = f"transformers FP8 load failed: {type(e).__name__}: {str(e)[:300]}"
    log(f"    {msg}")
    return msg


def to_hub_names(tensors, arch):
    """Mixtral's expert and router tensors under the hub's names
    (block_sparse_moe.gate, block_sparse_moe.experts.<e>.w1/w3/w2 for
    gate/up/down), whichever names save_pretrained used."""
    if arch != "MixtralForCausalLM":
        return tensors
    out = {}
    for k, v in tensors.items():
        k2 = re.sub(r"\.mlp\.gate\.weight$", ".block_sparse_moe.gate.weight", k)
        m = re.match(r"(.*)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$", k2)
        if m:
            k2 = f"{m.group(1)}.block_sparse_moe.experts.{m.group(2)}.{dict(gate='w1', up='w3', down='w2')[m.group(3)]}.weight"
        out[k2] = v
    return out


def patch_config_json(cfg, variant, num_layers, num_mtp):
    """The config.json transformers wrote, with the dtype of the variant and,
    for MTP models, the main layer count and the MTP layer count restored."""
    cfg = dict(cfg)
    name = {"f32": "float32", "bf16": "bfloat16", "fp8": "bfloat16"}[variant]
    cfg["dtype"] = name
    if "torch_dtype" in cfg:
        cfg["torch_dtype"] = name
    cfg["num_hidden_layers"] = num_layers
    if isinstance(cfg.get("layer_types"), list):
        cfg["layer_types"] = cfg["layer_types"][:num_layers]
    if num_mtp or "num_nextn_predict_layers" in cfg:
        cfg["num_nextn_predict_layers"] = num_mtp
    if "num_mtp_layers" in cfg:
        cfg["num_mtp_layers"] = num_mtp
    return cfg


def dir_bytes(d):
    total = 0
    for root, _, files in os.walk(d):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def rms_norm(x, w, eps):
    x = x.float()
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def loading_info_get(info, key):
    if isinstance(info, dict):
        return list(info.get(key, []) or [])
    return list(getattr(info, key, []) or [])


def load_variant(d, spec, num_mtp, dtype=torch.float32):
    """The checkpoint in d loaded by from_pretrained in dtype (float32: the
    bf16 checkpoint upcast; bfloat16: as HF runs it, with the buffers it
    keeps in float32, such as RoPE's inverse frequencies, left so)."""
    from transformers import AutoModelForCausalLM

    kwargs = dict(
        dtype=dtype,
        attn_implementation="eager",
        experts_implementation="eager",
        output_loading_info=True,
    )
    if num_mtp:
        kwargs["num_nextn_predict_layers"] = 0
    model, info = call_with_optional(
        AutoModelForCausalLM.from_pretrained, (d,), kwargs, ["experts_implementation", "dtype"]
    )
    if dtype == torch.float32:
        model = model.float()
    elif next(model.parameters()).dtype != dtype:
        model = model.to(dtype)
    model = model.eval()
    force_eager(model)
    patch_moe(model)
    num_layers = spec["num_hidden_layers"]
    missing = loading_info_get(info, "missing_keys")
    if spec.get("tie_word_embeddings"):
        missing = [k for k in missing if k != "lm_head.weight"]
    mismatched = loading_info_get(info, "mismatched_keys")
    unexpected = [k for k in loading_info_get(info, "unexpected_keys")]
    bad_unexpected = [k for k in unexpected if not (layer_index(k) is not None and layer_index(k) >= num_layers)]
    if missing or mismatched or bad_unexpected:
        raise RuntimeError(
            f"loading {d}: missing {missing[:8]}, mismatched {mismatched[:8]}, unexpected {bad_unexpected[:8]}"
        )
    want_cls = spec["architectures"][0]
    if type(model).__name__ != want_cls:
        raise RuntimeError(f"loading {d}: transformers built {type(model).__name__}, want {want_cls}")
    return model, len(unexpected)


@torch.no_grad()
def check_roundtrip(model, built_sd, variant, num_layers):
    """Every weight of the reloaded model equals the built one (rounded to
    bf16 for the bf16 variant): the files mean to HF what we built."""
    got = model.state_dict()
    n = 0
    for k, v in got.items():
        if k not in built_sd:
            if "mtp" in k or (layer_index(k) is not None and layer_index(k) >= num_layers):
                continue
            raise RuntimeError(f"reloaded model has {k}, which the built model lacks")
        want = built_sd[k].float()
        if variant == "bf16" and not keep_f32(k):
            want = want.to(torch.bfloat16).float()
        if v.shape != want.shape or not torch.equal(v.float().cpu(), want.cpu()):
            diff = (v.float().cpu() - want.cpu()).abs().max().item() if v.shape == want.shape else "shape"
            raise RuntimeError(f"reloaded {k} differs from the built weight ({variant}, max diff {diff})")
        n += 1
    for k in built_sd:
        li = layer_index(k)
        if (li is None or li < num_layers) and k not in got:
            raise RuntimeError(f"built weight {k} is absent from the reloaded model")
    return n


@torch.no_grad()
def greedy(model, ids, n):
    """n greedy tokens by plain argmax with the KV cache (EOS ignored), and
    the top-1 minus top-2 margin at each step."""
    out = model(input_ids=ids[None], use_cache=True)
    past = out.past_key_values
    logits = out.logits[0, -1].float()
    toks, margins, step_logits = [], [], []
    for k in range(n):
        tok = int(torch.argmax(logits))
        others = logits.clone()
        others[tok] = -float("inf")
        toks.append(tok)
        margins.append(float(logits[tok] - others.max()))
        step_logits.append(logits)
        if k == n - 1:
            break
        out = model(input_ids=torch.tensor([[tok]], device=ids.device), past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
    return toks, margins, torch.stack(step_logits)


@torch.no_grad()
def mtp_reference(model, block, extras, eps, ids, first_new, h):
    """DeepSeek-V3 MTP over the prompt positions t = 0..L-1:
        x_t = eh_proj(cat(enorm(embed(next_t)), hnorm(h_t)))
    with next = prompt[1:] + [first greedy token] and h_t the main model's
    final hidden state before its final norm; then the MTP decoder layer over
    x_0..x_{L-1} with causal attention among these L positions and RoPE
    positions t; logits_t = shared_head.head(shared_head.norm(layer_out_t)).
    embed, the norms, eh_proj and the head are the MTP layer's own tensors."""
    L = ids.shape[0]
    nxt = torch.cat([ids[1:], torch.tensor([first_new], dtype=ids.dtype, device=ids.device)])
    emb = F.embedding(nxt, extras["embed_tokens.weight"])
    x = torch.cat([rms_norm(emb, extras["enorm.weight"], eps), rms_norm(h, extras["hnorm.weight"], eps)], dim=-1)
    x = (x @ extras["eh_proj.weight"].T)[None]
    pos = torch.arange(L, device=ids.device)[None]
    pe = model.model.rotary_emb(x, pos)
    mask = torch.full((L, L), float("-inf"), device=ids.device).triu(1)[None, None]
    out = block(x, attention_mask=mask, position_ids=pos, position_embeddings=pe)
    if isinstance(out, tuple):
        out = out[0]
    y = rms_norm(out[0], extras["shared_head.norm.weight"], eps)
    return y @ extras["shared_head.head.weight"].T, nxt


@contextlib.contextmanager
def f32_gemm_order():
    """Every bf16 linear (F.linear, which nn.Linear and the eager experts
    call) computed as a float32 GEMM of the same bf16 values and rounded to
    bf16 once: the products are exact in float32 either way, so only the
    order of the float32 sums differs from cuBLAS's bf16 GEMM. HF in bf16
    under this context is as valid a bf16 run as HF without it; how far the
    two lie apart is the spread of the bf16 reference itself."""
    orig = F.linear

    def linear(x, w, b=None):
        if x.dtype != torch.bfloat16:
            return orig(x, w, b)
        return orig(x.float(), w.float(), None if b is None else b.float()).to(torch.bfloat16)

    F.linear = linear
    try:
        yield
    finally:
        F.linear = orig


def worst_err_top1(got, want):
    """The parity check's two figures over rows of logits: the worst
    max|got - want| / max|want| and how many rows share want's top-1."""
    err = (got - want).abs().amax(dim=-1) / want.abs().amax(dim=-1)
    return float(err.max()), int((got.argmax(dim=-1) == want.argmax(dim=-1)).sum())


def make_prompts(vocab, seed, lens=PROMPT_LENS):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (L,), generator=g) for L in lens]


@torch.no_grad()
def reference(name, spec, out_dir, built, num_mtp, seed, device, ref_dtype=torch.float32, prompt_lens=PROMPT_LENS,
              load_dirs=None):
    """HF's outputs for each variant written (see the module comment), in
    ref_dtype (float32, or bfloat16 as HF runs a bf16 checkpoint). load_dirs
    maps a variant to the folder HF loads in its place (the fp8 variant: its
    dequantized float32 twin)."""
    load_dirs = load_dirs or {}
    from safetensors.torch import load_file, save_file
    import transformers

    num_layers = spec["num_hidden_layers"]
    vocab = spec["vocab_size"]
    eps = spec.get("rms_norm_eps", 1e-6)
    prompts = [p.to(device) for p in make_prompts(vocab, seed + 17, prompt_lens)]
    ref = {}
    meta = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "weights_seed": str(seed),
        "prompt_seed": str(seed + 17),
        "prompt_lengths": json.dumps(list(prompt_lens)),
        "new_tokens": str(NEW_TOKENS),
        "compute": f"{str(ref_dtype).removeprefix('torch.')} on {device}",
    }
    summary = {}
    for variant in ("f32", "bf16", "fp8"):
        vdir = load_dirs.get(variant, os.path.join(out_dir, variant))
        if not os.path.isdir(vdir):
            continue
        model, n_unexpected = load_variant(vdir, spec, num_mtp)
        if variant == "fp8":
            if ref_dtype != torch.float32:
                raise RuntimeError("the fp8 variant's reference is the dequantized model in float32")
            n_checked = check_fp8_roundtrip(model, built["state_dict"], built["deq"], num_layers)
        else:
            n_checked = check_roundtrip(model, built["state_dict"], variant, num_layers)
        model.to(device)
        log(f"  {variant}: {type(model).__name__} reloaded, {n_checked} weights equal the built ones"
            f" ({n_unexpected} MTP tensors left to the engine)")
        if ref_dtype != torch.float32:
            # Loaded again as HF loads a checkpoint in that dtype (casting
            # the float32 model would also round RoPE's frequencies).
            del model
            model, _ = load_variant(vdir, spec, num_mtp, dtype=ref_dtype)
            model.to(device)
            log(f"  {variant}: reference computed in {next(model.parameters()).dtype}")
        attn = model.model.layers[0].self_attn
        meta["attn_softmax_scale"] = repr(float(getattr(attn, "scaling", float("nan"))))
        rot = model.model.rotary_emb
        meta["rope_attention_scaling"] = repr(float(getattr(rot, "attention_scaling", 1.0)))
        meta["rope_type"] = str(getattr(rot, "rope_type", "?"))
        meta["model_class"] = type(model).__name__
        ref[f"{variant}.rope.inv_freq"] = rot.inv_freq.detach().float().cpu().contiguous()

        captured = {}
        hook = model.model.norm.register_forward_pre_hook(lambda mod, args: captured.__setitem__("h", args[0]))
        all_new, min_margin, min_std, max_cache_diff, argmax_mismatch = [], float("inf"), float("inf"), 0.0, 0
        self_err, self_top1, positions = 0.0, 0, 0
        for i, ids in enumerate(prompts):
            logits = model(input_ids=ids[None], use_cache=False).logits[0].float()
            if ref_dtype != torch.float32:
                with f32_gemm_order():
                    alt = model(input_ids=ids[None], use_cache=False).logits[0].float()
                e, same = worst_err_top1(alt, logits)
                self_err, self_top1, positions = max(self_err, e), self_top1 + same, positions + ids.shape[0]
            h = captured["h"][0].float().clone()
            if not torch.isfinite(logits).all():
                raise RuntimeError(f"{variant} prompt {i}: non-finite logits")
            min_std = min(min_std, float(logits.std(dim=-1).min()))
            toks, margins, step_logits = greedy(model, ids, NEW_TOKENS)
            # Cross-check the cached decode against one uncached pass.
            full_ids = torch.cat([ids, torch.tensor(toks[:-1], dtype=ids.dtype, device=device)])
            full = model(input_ids=full_ids[None], use_cache=False).logits[0].float()
            L = ids.shape[0]
            max_cache_diff = max(
                max_cache_diff,
                float((full[L - 1:] - step_logits).abs().max()),
                float((full[:L] - logits).abs().max()),
            )
            argmax_mismatch += int((full[L - 1:].argmax(-1).cpu() != torch.tensor(toks)).sum())
            ref[f"{variant}.prompt.{i}.ids"] = ids.to(torch.int32).cpu().contiguous()
            ref[f"{variant}.prompt.{i}.logits"] = logits.cpu().contiguous()
            ref[f"{variant}.greedy.{i}.ids"] = torch.tensor(toks, dtype=torch.int32)
            ref[f"{variant}.greedy.{i}.margin"] = torch.tensor(margins, dtype=torch.float32)
            all_new.append(toks)
            min_margin = min(min_margin, min(margins))
            if num_mtp:
                block, extras = mtp_modules(built, vdir, variant, num_layers, device)
                mtp_logits, nxt = mtp_reference(model, block, extras, eps, ids, toks[0], h)
                if not torch.isfinite(mtp_logits).all():
                    raise RuntimeError(f"{variant} prompt {i}: non-finite MTP logits")
                ref[f"{variant}.mtp.{i}.ids"] = nxt.to(torch.int32).cpu().contiguous()
                ref[f"{variant}.mtp.{i}.logits"] = mtp_logits.float().cpu().contiguous()
        hook.remove()
        if variant == "fp8":
            meta["fp8.weights"] = ("the checkpoint in fp8/ dequantized (q * weight_scale_inv per 128x128 block, "
                                   "float32), every other tensor its bf16 value; computed in float32")
            meta["fp8.hf_fp8_check"] = hf_fp8_check(os.path.join(out_dir, "fp8"), model.state_dict(), num_mtp,
                                                    prompts[-1], ref[f"fp8.prompt.{len(prompts) - 1}.logits"])
        if positions:
            # Read by the Go parity test, which prints them beside its own.
            meta[f"{variant}.hf_self_err"] = repr(self_err)
            meta[f"{variant}.hf_self_top1"] = f"{self_top1}/{positions}"
            log(f"  {variant}: HF with float32 GEMM order vs HF: worst err {self_err:.2e}, top-1 {self_top1}/{positions}")
        distinct = len({t for toks in all_new for t in toks})
        log(f"  {variant}: min logit row std {min_std:.3f}, min greedy margin {min_margin:.2e}, "
            f"{distinct} distinct greedy tokens, cache vs full max diff {max_cache_diff:.1e}, "
            f"argmax disagreements {argmax_mismatch}")
        for i, toks in enumerate(all_new):
            log(f"    greedy {i}: {toks}")
        if min_std < 0.05:
            raise RuntimeError(f"{variant}: degenerate logits (row std {min_std:.3g})")
        if distinct < 4 or all(t == all_new[0] for t in all_new[1:]):
            raise RuntimeError(f"{variant}: degenerate greedy continuations ({distinct} distinct tokens)")
        summary[variant] = dict(min_std=min_std, min_margin=min_margin, distinct=distinct,
                                cache_diff=max_cache_diff, mismatch=argmax_mismatch)
        del model
    meta["init"] = "see tools/make_fixtures.py init_weights"
    if num_mtp:
        meta["mtp"] = ("mtp.<i>.ids = prompt[1:] + [greedy[0]]; x_t = eh_proj(cat(enorm(embed(ids_t)), hnorm(h_t))) "
                       "with h_t the final hidden state before the final norm; MTP decoder layer over t=0..L-1, "
                       "causal, RoPE positions t; logits = shared_head.head(shared_head.norm(out))")
    save_file(ref, os.path.join(out_dir, "reference.safetensors"), metadata=meta)
    # The file must hold what the Go side expects.
    back = load_file(os.path.join(out_dir, "reference.safetensors"))
    for variant in summary:
        for i, L in enumerate(prompt_lens):
            assert tuple(back[f"{variant}.prompt.{i}.ids"].shape) == (L,)
            assert tuple(back[f"{variant}.prompt.{i}.logits"].shape) == (L, vocab)
            assert tuple(back[f"{variant}.greedy.{i}.ids"].shape) == (NEW_TOKENS,)
            if num_mtp:
                assert tuple(back[f"{variant}.mtp.{i}.logits"].shape) == (L, vocab)
    return summary


def mtp_modules(built, vdir, variant, num_layers, device):
    """The MTP decoder layer (the built model's layer N, rounded to bf16 for
    the bf16 variant) and the MTP extras as stored in the variant's file."""
    from safetensors.torch import load_file

    key = (vdir, variant)
    cache = built.setdefault("mtp_cache", {})
    if key in cache:
        return cache[key]
    block = copy.deepcopy(built["model"].model.layers[num_layers]).float().to(device).eval()
    if variant == "fp8":
        # The MTP decoder layer's weights as the FP8 checkpoint holds them,
        # dequantized (fused experts stacked from the per-expert matrices).
        prefix = f"model.layers.{num_layers}."
        sd = block.state_dict()
        block.load_state_dict({k: module_tensor_from_hub(built["deq"], prefix + k, v.shape).to(v.device, v.dtype)
                               for k, v in sd.items()})
    elif variant == "bf16":
        with torch.no_grad():
            for name, p in block.named_parameters():
                if not keep_f32(name):
                    p.copy_(p.to(torch.bfloat16).float())
    stored = load_file(os.path.join(vdir, "model.safetensors"))
    prefix = f"model.layers.{num_layers}."
    extras = {k: stored[prefix + k].float().to(device) for k in MTP_EXTRAS}
    cache[key] = (block, extras)
    return cache[key]


def make_fixture(name, spec, out_root, args, attempt=0):
    from safetensors.torch import save_file

    t0 = time.time()
    out_dir = os.path.join(out_root, name)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    seed = args.seed + zlib.crc32(name.encode()) % 100000 + 1000 * attempt
    num_layers = spec["num_hidden_layers"]
    num_mtp = int(spec.get("num_nextn_predict_layers") or 0)
    if num_mtp and args.no_reference:
        log(f"  note: {name}: MTP layers are only built with references; writing none")
        num_mtp = 0
    variants = [v for v in (args.variants or DEFAULT_VARIANTS.get(name, "f32,bf16")).split(",") if v]
    bad = [v for v in variants if v not in ("f32", "bf16", "fp8")]
    if bad:
        raise RuntimeError(f"unknown variants {bad}: want f32, bf16, fp8")

    # The MTP decoder layer is built as one more decoder layer of the same
    # model, so transformers names and lays out its weights itself.
    build_spec = dict(spec)
    build_spec["num_hidden_layers"] = num_layers + num_mtp
    if "num_nextn_predict_layers" in spec or "num_mtp_layers" in spec:
        build_spec["num_nextn_predict_layers"] = 0
        build_spec["num_mtp_layers"] = 0
    device = args.device
    build_dtype = torch.float32 if (not args.no_reference or "f32" in variants or "fp8" in variants) else torch.bfloat16
    model = build_model(build_spec, build_dtype, device)
    if type(model).__name__ != spec["architectures"][0]:
        raise RuntimeError(f"transformers built {type(model).__name__}, want {spec['architectures'][0]}")
    init_weights(model, seed, args.std, args.embed_std)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"  built {type(model).__name__} ({type(model.config).__name__}), {n_params} parameters "
        f"({num_layers} layers + {num_mtp} MTP), seed {seed}")

    tmp = tempfile.mkdtemp()
    try:
        if args.no_reference:
            # Large models: let transformers shard and name the files.
            for variant in [v for v in variants if v != "fp8"]:
                vdir = os.path.join(out_dir, variant)
                model.to(variant_dtype(variant)).save_pretrained(vdir, max_shard_size="2GB")
                with open(os.path.join(vdir, "config.json")) as f:
                    cfg = json.load(f)
                with open(os.path.join(vdir, "config.json"), "w") as f:
                    json.dump(patch_config_json(cfg, variant, num_layers, num_mtp), f, indent=2, sort_keys=True)
                for extra in ("generation_config.json",):
                    if os.path.exists(os.path.join(vdir, extra)):
                        os.remove(os.path.join(vdir, extra))
                log(f"  wrote {vdir} ({dir_bytes(vdir) / 2**20:.1f} MiB)")
            if "fp8" not in variants:
                return {}
            # The FP8 checkpoint is quantized from the float32 tensors below
            # (one file).
            model.float()
            variants = ["fp8"]
        model.save_pretrained(tmp)
        with open(os.path.join(tmp, "config.json")) as f:
            written_cfg = json.load(f)
        raw = saved_tensors(tmp)
        moe_names = sorted(k for k in raw if layer_index(k) == num_layers - 1 and ("expert" in k or "gate." in k))
        saved_layout = ", ".join(moe_names[:4] + (["..."] if len(moe_names) > 4 else []))
        if moe_names:
            log(f"    save_pretrained wrote the MoE layer {num_layers - 1} as {len(moe_names)} tensors: {saved_layout}")
        tensors = unfuse_experts(raw, spec["hidden_size"])
        del raw
    finally:
        shutil.rmtree(tmp)
    renamed = to_hub_names(tensors, spec["architectures"][0])
    if set(renamed) != set(tensors):
        log(f"    note: {sum(1 for k in renamed if k not in tensors)} tensors renamed to the hub's layout")
    tensors = renamed

    hidden, vocab = spec["hidden_size"], spec["vocab_size"]
    if num_mtp:
        g = torch.Generator().manual_seed(seed + 1)
        for k in range(num_mtp):
            prefix = f"model.layers.{num_layers + k}."
            shapes = {
                "enorm.weight": (hidden,),
                "hnorm.weight": (hidden,),
                "eh_proj.weight": (hidden, 2 * hidden),
                "shared_head.norm.weight": (hidden,),
                "shared_head.head.weight": (vocab, hidden),
                "embed_tokens.weight": (vocab, hidden),
            }
            for extra in MTP_EXTRAS:
                z = torch.randn(shapes[extra], generator=g)
                if is_norm(extra):
                    val = 1.0 + 0.1 * z
                elif is_embed_or_head(extra):
                    val = args.embed_std * z
                else:
                    val = args.std * z
                tensors[prefix + extra] = val.contiguous()
    fp8_stored, deq = {}, None
    if "fp8" in variants:
        block = tuple(FP8_QUANT_CONFIG["weight_block_size"])
        fp8_stored, deq = to_fp8(tensors, block)
    for t in EXPECT_TENSORS.get(name, []):
        if t not in tensors and t not in fp8_stored:
            raise RuntimeError(f"checkpoint lacks {t}; has e.g. {sorted(tensors)[:12]}")
    for t in EXPECT_ABSENT.get(name, []):
        if t in tensors or t in fp8_stored:
            raise RuntimeError(f"checkpoint holds {t}, which it should not")
    deq_dir = None
    try:
        for variant in variants:
            vdir = os.path.join(out_dir, variant)
            os.makedirs(vdir)
            cfg = patch_config_json(written_cfg, variant, num_layers, num_mtp)
            path = os.path.join(vdir, "model.safetensors")
            if variant == "fp8":
                cfg["quantization_config"] = dict(FP8_QUANT_CONFIG)
                save_file(fp8_stored, path, metadata={"format": "pt"})
                check_fp8_file(path, fp8_stored)
                # The reference's weights: the same checkpoint dequantized,
                # every tensor float32, no quantization_config.
                deq_dir = tempfile.mkdtemp()
                save_file(deq, os.path.join(deq_dir, "model.safetensors"), metadata={"format": "pt"})
                with open(os.path.join(deq_dir, "config.json"), "w") as f:
                    json.dump(patch_config_json(written_cfg, "f32", num_layers, num_mtp), f, indent=2, sort_keys=True)
            else:
                save_file(to_variant(tensors, variant), path, metadata={"format": "pt"})
            with open(os.path.join(vdir, "config.json"), "w") as f:
                json.dump(cfg, f, indent=2, sort_keys=True)
                f.write("\n")

        summary = {}
        if not args.no_reference:
            built = {"model": model, "state_dict": {k: v.detach().float().cpu() for k, v in model.state_dict().items()},
                     "deq": deq}
            summary = reference(name, spec, out_dir, built, num_mtp, seed, device,
                                ref_dtype=REFERENCE_DTYPES[args.reference_dtype], prompt_lens=args.prompt_lens,
                                load_dirs={"fp8": deq_dir} if deq_dir else None)
            margin = min(s["min_margin"] for s in summary.values())
            if margin < args.min_margin:
                raise NearTie(f"{name}: a greedy step has top-2 margin {margin:.1e} < {args.min_margin:g} (seed {seed})")
    finally:
        if deq_dir:
            shutil.rmtree(deq_dir, ignore_errors=True)
    if moe_names:
        summary["saved_layout"] = saved_layout
    size = dir_bytes(out_dir)
    log(f"  {name}: {len(tensors)} tensors, {size} bytes in {out_dir}, {time.time() - t0:.1f}s")
    if args.max_dir_bytes and size > args.max_dir_bytes:
        raise RuntimeError(f"{out_dir} holds {size} bytes, over the limit of {args.max_dir_bytes}")
    summary["bytes"] = size
    summary["params"] = n_params
    return summary


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", help="input config.json (repeatable; default: the tiny fixtures)")
    p.add_argument("--name", help="output folder name for a single --config (default: the file's stem)")
    p.add_argument("--out", required=True, help="output root: one folder per model")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--std", type=float, default=0.1, help="std of projection, router and expert weights")
    p.add_argument("--embed-std", type=float, default=0.25, help="std of embeddings and LM heads")
    p.add_argument("--variants", default=None,
                   help="comma-separated: f32, bf16, fp8 (default: fp8 for the FP8 fixtures, else f32,bf16)")
    p.add_argument("--only", default=None,
                   help="comma-separated fixture names to write (default: all of " + ",".join(TINY + NEW) +
                        "); 'new' means " + ",".join(NEW))
    p.add_argument("--no-reference", action="store_true", help="write weights only (large real-shape configs)")
    p.add_argument("--device", default="cpu", help="where to build and run the models (cpu, cuda)")
    p.add_argument("--max-dir-bytes", type=int, default=2 * 1024 * 1024, help="fail a fixture over this size (0: no limit)")
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--min-margin", type=float, default=1e-3,
                   help="redraw the weights (next seed) while a greedy step's top-2 logit margin is below this")
    p.add_argument("--max-tries", type=int, default=4)
    p.add_argument("--tar", help="also pack every written folder into this .tar.gz")
    p.add_argument("--reference-dtype", choices=sorted(REFERENCE_DTYPES), default="float32",
                   help="dtype HF computes the references in: float32 (the weights as stored) or bfloat16 "
                        "(the model cast to bf16, as HF runs a bf16 checkpoint)")
    p.add_argument("--prompt-lens", type=prompt_lens_arg, default=PROMPT_LENS,
                   help="comma-separated prompt lengths of the references (default 1,7,23)")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.no_reference and args.max_dir_bytes == 2 * 1024 * 1024:
        args.max_dir_bytes = 0

    if args.config and args.only:
        p.error("--only picks among the built-in fixtures; not with --config")
    if args.config:
        configs = args.config
    else:
        names = TINY + NEW
        if args.only:
            want = []
            for n in args.only.split(","):
                want += NEW if n == "new" else [n] if n else []
            unknown = [n for n in want if n not in names]
            if unknown:
                p.error(f"--only: unknown fixtures {unknown}; known: {names}")
            names = [n for n in names if n in want]
        configs = [BUILTIN_CONFIGS[n] if n in BUILTIN_CONFIGS else os.path.join(HERE, "configs", n + ".json")
                   for n in names]
        if args.name:
            p.error("--name needs exactly one --config")
    if args.name and len(configs) != 1:
        p.error("--name needs exactly one --config")
    import transformers

    log(f"torch {torch.__version__}, transformers {transformers.__version__}, device {args.device}, "
        f"references in {args.reference_dtype}, prompt lengths {list(args.prompt_lens)}")
    os.makedirs(args.out, exist_ok=True)
    results, failed = {}, []
    for path in configs:
        if isinstance(path, dict):
            spec = copy.deepcopy(path)
            name = next(k for k, v in BUILTIN_CONFIGS.items() if v is path)
            path = "built-in config"
        else:
            name = args.name or os.path.splitext(os.path.basename(path))[0]
            with open(path) as f:
                spec = json.load(f)
        log(f"== {name} ({path})")
        try:
            for attempt in range(args.max_tries):
                try:
                    results[name] = make_fixture(name, spec, args.out, args, attempt)
                    break
                except NearTie as e:
                    log(f"  {e}; drawing new weights")
            else:
                raise RuntimeError(f"{name}: near ties in {args.max_tries} draws")
        except Exception:
            traceback.print_exc()
            failed.append(name)
            shutil.rmtree(os.path.join(args.out, name), ignore_errors=True)

    if args.tar:
        with tarfile.open(args.tar, "w:gz") as tar:
            for name in results:
                tar.add(os.path.join(args.out, name), arcname=name)
        log(f"packed {sorted(results)} into {args.tar} ({os.path.getsize(args.tar)} bytes)")

    log("")
    log(f"{'fixture':<16}{'params':>9}{'bytes':>10}  per variant: min row std / min margin / distinct / cache diff / argmax disagreements")
    for name, s in results.items():
        parts = []
        for v in ("f32", "bf16", "fp8"):
            if v in s:
                r = s[v]
                parts.append(f"{v}: {r['min_std']:.2f} / {r['min_margin']:.1e} / {r['distinct']} / "
                             f"{r['cache_diff']:.0e} / {r['mismatch']}")
            # weights-only runs have no per-variant figures
        log(f"{name:<16}{s.get('params', 0):>9}{s.get('bytes', 0):>10}  " + "; ".join(parts))
        if s.get("saved_layout"):
            log(f"{'':<16}save_pretrained's MoE tensors: {s['saved_layout']}")
    if failed:
        log(f"FAILED: {failed}")
        sys.exit(1)
    log("all fixtures OK")


if __name__ == "__main__":
    main()
