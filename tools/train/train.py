#!/usr/bin/env python3
"""Trains the shipped default model, assets/deepseek-tiny, on the GPU machine.

One run, from the corpus that tools/train/make_corpus.py assembled:

  1. tokenizer: a byte-level BPE (HF tokenizers, --vocab ids, special tokens
     <|bos|> <|eos|> <|pad|> <|system|> <|user|> <|assistant|> <|end|> at ids 0-6,
     a TemplateProcessing post-processor that prepends <|bos|>, a small chat
     template) trained on the training documents;
  2. smoke: a tiny model of the same architecture goes through every later step
     (a few training steps, export, reload, every reference) so that an API
     mismatch fails in seconds, not after the training budget;
  3. model: DeepseekV3ForCausalLM built by transformers (MLA with q_lora, MoE
     with 1 shared and 8 routed experts, top-2 noaux_tc routing in 4 groups,
     layer 0 dense) plus one MTP layer (DeepSeek-V3's: enorm, hnorm, eh_proj, a
     decoder layer of transformers' own class, the shared head) trained with
     the next-next-token loss (weight --mtp-weight); the router's
     e_score_correction_bias is meant to follow DeepSeek-V3's auxiliary-loss-free
     update (bias += --bias-rate * sign(mean load - load) after every step), but
     only where transformers exposes its routing decisions (a
     route_tokens_to_experts method or a router returning indices); with
     transformers 5.17 it does neither, the update is inactive (logged) and the
     bias stays 0, as in the shipped model;
     AdamW, bf16 autocast, a fixed seed; the step count is fixed from the
     measured step time so that training fits --train-seconds, and the
     schedule (linear warm-up, cosine to 10%) is a function of the step alone:
     rerunning with --steps N reproduces the run's curve;
  4. export: OUT_MODEL/ in the hub layout (config.json, model.safetensors in
     bf16 with e_score_correction_bias in f32, the MTP layer as
     model.layers.<num_hidden_layers>.* with copies of the embedding and head,
     generation_config.json, tokenizer.json, tokenizer_config.json); reloaded
     with from_pretrained and checked weight by weight, the MTP layer too;
  5. references, from the reloaded bf16 checkpoint computed in float32 (TF32
     off): held-out loss per source, the committed held-out sample's
     perplexity (the text encoded without special tokens, cut into chunks of
     --window - 1 tokens, each scored as [<|bos|>] + chunk: every chunk token
     is scored), greedy continuations of the committed prompts, the MTP layer's
     held-out accuracy, HF tokenizers' ids of a few strings, the chat template
     rendered by transformers, sample generations;
  6. reproducibility: the first --repro-steps steps are run again from the
     same seed and their losses compared with the main run's.

Usage (repository root, GPU machine):
  python3 tools/train/train.py --corpus .train/corpus --out $OUT --train-seconds 180

Files under --out: model.safetensors.part<i> (the safetensors file cut into
15 MiB pieces: cat them in order), folder.tar.gz (every other file of the
model folder, reference.json, train_log.json), log.txt is the caller's tee.
"""
import argparse
import copy
import gzip
import io
import json
import math
import os
import shutil
import sys
import tarfile
import tempfile
import time
import traceback

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
import make_fixtures as mf  # noqa: E402  (tools/make_fixtures.py: HF loading and checkpoint helpers)

SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
BOS, EOS, PAD = 0, 1, 2
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
CHAT_EXAMPLE = [
    {"role": "system", "content": "You are a small model."},
    {"role": "user", "content": "Write a Go function."},
    {"role": "assistant", "content": "func add(a, b int) int { return a + b }"},
    {"role": "user", "content": "Now a line of a play."},
]
TOKENIZER_CASES = [
    "ROMEO:",
    "func main() {",
    "func main() {\n\tfmt.Println(\"h\u00e9llo, \u4e16\u754c \U0001F30D\")\n}\n",
    "  two leading spaces,\ttabs\t\tand\n\n\nthree newlines   ",
    "<|user|>\nhi there<|end|>\n<|assistant|>\n",
    "x := []int{1, 2, 3} // 12345678 and 3.14159",
    "O Romeo, Romeo! wherefore art thou Romeo?",
    "",
]

# The shipped model. moe_intermediate_size differs from hidden_size so that a
# fused expert tensor's layout is never ambiguous when split per expert.
MODEL_SPEC = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 8192,
    "hidden_size": 256,
    "intermediate_size": 1024,
    "moe_intermediate_size": 192,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "q_lora_rank": 128,
    "kv_lora_rank": 128,
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
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "pad_token_id": PAD,
}

# The smoke model: same architecture, tiny.
SMOKE_SPEC = dict(MODEL_SPEC, hidden_size=64, intermediate_size=128, moe_intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=32,
                  qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)

T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


# ---------------------------------------------------------------- corpus and tokenizer


def read_jsonl_gz(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def train_tokenizer(texts, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    for i, s in enumerate(SPECIALS):
        if tok.token_to_id(s) != i:
            raise RuntimeError(f"special token {s} has id {tok.token_to_id(s)}, want {i}")
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", BOS)]
    )
    return tok


def tokenizer_config():
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "pad_token": "<|pad|>",
        "model_max_length": MODEL_SPEC["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def write_tokenizer(tok, d):
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(), f, indent=2)
        f.write("\n")


def encode_docs(tok, docs):
    """Token ids of each document followed by <|eos|>, grouped by source."""
    encs = tok.encode_batch([d["text"] for d in docs], add_special_tokens=False)
    out = {}
    for d, e in zip(docs, encs):
        out.setdefault(d["src"], []).append(e.ids + [EOS])
    return out


class Stream:
    """All training tokens on the device, one tensor, with a sampling weight per source."""

    def __init__(self, by_src, weights, device):
        self.names, starts, lens, flat = [], [], [], []
        n = 0
        for name in sorted(by_src):
            ids = [t for doc in by_src[name] for t in doc]
            self.names.append(name)
            starts.append(n)
            lens.append(len(ids))
            flat.extend(ids)
            n += len(ids)
        self.tokens = torch.tensor(flat, dtype=torch.int64, device=device)
        self.starts = torch.tensor(starts, dtype=torch.int64)
        self.lens = torch.tensor(lens, dtype=torch.int64)
        self.weights = torch.tensor([weights(nm, ln) for nm, ln in zip(self.names, lens)], dtype=torch.float64)
        self.weights /= self.weights.sum()

    def describe(self):
        return {nm: {"tokens": int(ln), "weight": round(float(w), 4)}
                for nm, ln, w in zip(self.names, self.lens, self.weights)}

    def batch(self, g, batch_size, seq_len):
        """[batch_size, seq_len + 2]: <|bos|> then seq_len + 1 consecutive tokens of one source,
        the source drawn by weight and the offset uniformly, both from generator g."""
        src = torch.multinomial(self.weights, batch_size, replacement=True, generator=g)
        span = (self.lens[src] - (seq_len + 1)).clamp(min=1)
        off = self.starts[src] + (torch.rand(batch_size, generator=g, dtype=torch.float64) * span).long()
        idx = off[:, None] + torch.arange(seq_len + 1)[None]
        body = self.tokens[idx.to(self.tokens.device)]
        bos = torch.full((batch_size, 1), BOS, dtype=body.dtype, device=body.device)
        return torch.cat([bos, body], dim=1)


def source_weight(go_weight, play_weight):
    """Sampling weights: go sources share go_weight, the play play_weight, the other books the
    rest in proportion to their size."""

    def w(name, n):
        if name == "go":
            return go_weight
        if name == "book:as-you-like-it":
            return play_weight
        return None

    def weights(names_lens):
        other = {nm: ln for nm, ln in names_lens if w(nm, ln) is None}
        total = sum(other.values()) or 1
        rest = 1.0 - go_weight - play_weight
        return {nm: (w(nm, ln) if w(nm, ln) is not None else rest * ln / total) for nm, ln in names_lens}

    return weights


# ---------------------------------------------------------------- model


class MTP(nn.Module):
    """DeepSeek-V3's multi-token-prediction layer: position t combines the normalised
    embedding of token t+1 with the main model's hidden state at t (before the final
    norm), runs one decoder layer (block: a layer transformers built, causal over the
    sequence, RoPE positions t) and predicts token t+2 through the shared output head.
    The embedding and the head are the main model's (shared, as in DeepSeek-V3); the
    export writes copies of them under the MTP layer's names."""

    def __init__(self, model, block):
        super().__init__()
        cfg = model.config
        norm_cls = type(model.model.norm)
        eps = cfg.rms_norm_eps
        h = cfg.hidden_size
        self.enorm = norm_cls(h, eps=eps)
        self.hnorm = norm_cls(h, eps=eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.block = block
        self.head_norm = norm_cls(h, eps=eps)

    def forward(self, model, hidden, next_ids, mask=None):
        t = next_ids.shape[1]
        e = model.model.embed_tokens(next_ids)
        x = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(hidden)], dim=-1))
        pos = torch.arange(t, device=next_ids.device)[None]
        pe = model.model.rotary_emb(x, pos)
        out = self.block(x, attention_mask=mask, position_ids=pos, position_embeddings=pe)
        if isinstance(out, tuple):
            out = out[0]
        return model.lm_head(self.head_norm(out))

    def extras(self, model):
        """The MTP layer's tensors besides the decoder layer's, under DeepSeek's names."""
        return {
            "enorm.weight": self.enorm.weight,
            "hnorm.weight": self.hnorm.weight,
            "eh_proj.weight": self.eh_proj.weight,
            "shared_head.norm.weight": self.head_norm.weight,
            "shared_head.head.weight": model.lm_head.weight,
            "embed_tokens.weight": model.model.embed_tokens.weight,
        }


def causal_mask(impl, t, device):
    """The mask to hand a decoder layer called alone: None lets SDPA attend causally;
    eager attention adds this float mask."""
    if impl == "sdpa":
        return None
    return torch.full((t, t), float("-inf"), device=device).triu(1)[None, None]


def attn_impl(model):
    return getattr(model.config, "_attn_implementation", "?")


def build(spec, seed, device, experts_impl):
    """The main model (transformers, SDPA attention) and its MTP layer, seeded. transformers
    builds num_hidden_layers + 1 decoder layers; the last one becomes the MTP layer's block,
    so that its class, shapes, initialisation and attention/experts settings are transformers'
    own, and the model keeps the first num_hidden_layers."""
    from transformers import AutoModelForCausalLM

    n = spec["num_hidden_layers"]
    config = mf.make_config(dict(spec, num_hidden_layers=n + 1, num_nextn_predict_layers=0))
    torch.manual_seed(seed)
    model = mf.call_with_optional(
        AutoModelForCausalLM.from_config,
        (config,),
        dict(dtype=torch.float32, attn_implementation="sdpa", experts_implementation=experts_impl),
        ["experts_implementation", "dtype"],
    )
    if attn_impl(model) != "sdpa" and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("sdpa")
    if attn_impl(model) != "sdpa":
        raise RuntimeError(f"attention implementation is {attn_impl(model)}, want sdpa")
    set_experts_impl(model, experts_impl)
    if type(model).__name__ != spec["architectures"][0]:
        raise RuntimeError(f"transformers built {type(model).__name__}")
    fix_init(model, seed + 7, "model")
    layers = list(model.model.layers)
    if len(layers) != n + 1:
        raise RuntimeError(f"transformers built {len(layers)} layers, want {n + 1}")
    block = layers[n]
    model.model.layers = nn.ModuleList(layers[:n])
    model.config.num_hidden_layers = n
    for k, v in list(vars(model.config).items()):
        if isinstance(v, list) and len(v) == n + 1 and k.endswith("layer_types"):
            setattr(model.config, k, v[:n])
    mtp = MTP(model, block)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        mtp.eh_proj.weight.copy_(torch.randn(mtp.eh_proj.weight.shape, generator=g) * spec["initializer_range"])
    return model.to(device), mtp.to(device)


@torch.no_grad()
def fix_init(model, seed, what):
    """Every parameter finite and, for matrices, not constant; a matrix that is
    (an uninitialised tensor) is drawn again from N(0, initializer_range)."""
    g = torch.Generator().manual_seed(seed)
    std = model.config.initializer_range
    redrawn = []
    for name, p in model.named_parameters():
        bad = not torch.isfinite(p).all()
        if p.dim() >= 2 and (bad or float(p.float().std()) == 0.0):
            p.copy_(torch.randn(p.shape, generator=g) * std)
            redrawn.append(name)
        elif bad:
            raise RuntimeError(f"{what}: parameter {name} is not finite after init")
    if redrawn:
        log(f"  note: {what}: redrew {len(redrawn)} uninitialised matrices, e.g. {redrawn[:3]}")


def set_experts_impl(model, impl):
    fn = getattr(model, "set_experts_implementation", None)
    if fn is not None:
        try:
            fn(impl)
            return
        except Exception as e:  # noqa: BLE001
            log(f"  note: set_experts_implementation({impl!r}): {e}")
    model.config._experts_implementation = impl


class PreNorm:
    """Captures the input of the final norm: the last hidden state the MTP layer reads."""

    def __init__(self, model):
        self.h = None
        self.handle = model.model.norm.register_forward_pre_hook(self._hook)

    def _hook(self, mod, args):
        self.h = args[0]

    def remove(self):
        self.handle.remove()


class LoadBalancer:
    """DeepSeek-V3's auxiliary-loss-free balancing: counts the tokens each routed expert
    receives and moves e_score_correction_bias against the imbalance after each step."""

    def __init__(self, modules, num_experts, rate):
        self.rate = rate
        self.num_experts = num_experts
        self.moes = [m for m in modules if hasattr(m, "gate") and hasattr(m.gate, "e_score_correction_bias")]
        self.how = "none"
        for m in self.moes:
            m._load = torch.zeros(num_experts, device=m.gate.e_score_correction_bias.device)
            if hasattr(m, "route_tokens_to_experts"):
                orig = m.route_tokens_to_experts

                def wrapped(*a, _orig=orig, _m=m, **k):
                    idx, w = _orig(*a, **k)
                    _m._load += torch.bincount(idx.reshape(-1), minlength=self.num_experts).float()
                    return idx, w

                m.route_tokens_to_experts = wrapped
                self.how = "route_tokens_to_experts"
            else:
                def hook(mod, inp, out, _m=m):
                    if isinstance(out, tuple) and not out[0].is_floating_point():
                        _m._load += torch.bincount(out[0].reshape(-1), minlength=self.num_experts).float()

                m.gate.register_forward_hook(hook)
                self.how = "gate output"

    def reset(self):
        for m in self.moes:
            m._load.zero_()

    def active(self):
        """Whether any routing decision was counted (transformers versions whose router
        exposes none leave the bias at zero)."""
        return any(float(m._load.sum()) > 0 for m in self.moes)

    @torch.no_grad()
    def step(self):
        for m in self.moes:
            load = m._load
            if float(load.sum()) == 0:
                continue
            m.gate.e_score_correction_bias += self.rate * torch.sign(load.mean() - load)
            load.zero_()

    def imbalance(self):
        """max/mean load per MoE layer over what was counted since the last step()."""
        out = []
        for m in self.moes:
            load = m._load
            out.append(round(float(load.max() / load.mean().clamp(min=1e-9)), 3))
        return out


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def losses(model, mtp, prenorm, seq, mtp_mask):
    """Main next-token loss and MTP next-next-token loss of a batch [B, T+2]."""
    x, y1, y2 = seq[:, :-2], seq[:, 1:-1], seq[:, 2:]
    out = model.model(input_ids=x, use_cache=False)
    h = prenorm.h
    logits = model.lm_head(out.last_hidden_state)
    v = logits.shape[-1]
    l1 = F.cross_entropy(logits.float().reshape(-1, v), y1.reshape(-1))
    l2 = F.cross_entropy(mtp(model, h, y1, mtp_mask).float().reshape(-1, v), y2.reshape(-1))
    return l1, l2


def lr_at(step, args, total):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def make_optimizer(model, mtp, args):
    decay, no_decay = [], []
    for p in list(model.parameters()) + list(mtp.parameters()):
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    except Exception:  # noqa: BLE001
        return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


@torch.no_grad()
def check_causal(model, mtp, device):
    """The MTP layer, called alone, attends causally: changing the last position's
    input changes no earlier output."""
    was = mtp.training
    mtp.eval()
    g = torch.Generator(device="cpu").manual_seed(0)
    t, h = 12, model.config.hidden_size
    hid = torch.randn(2, t, h, generator=g).to(device)
    ids = torch.randint(7, model.config.vocab_size, (2, t), generator=g).to(device)
    mask = causal_mask(attn_impl(model), t, device)
    a = mtp(model, hid, ids, mask).float()
    hid2 = hid.clone()
    hid2[:, -1] += 1.0
    b = mtp(model, hid2, ids, mask).float()
    early = float((a[:, :-1] - b[:, :-1]).abs().max())
    last = float((a[:, -1] - b[:, -1]).abs().max())
    mtp.train(was)
    if early > 1e-4 or last < 1e-6:
        raise RuntimeError(f"MTP layer is not causal: earlier outputs moved {early:.2e}, last {last:.2e}")
    return early, last


def probe_experts(spec, args, device, stream):
    """Times a forward+backward step with each experts implementation transformers offers and
    returns the fastest one whose loss matches the eager loop's."""
    g = torch.Generator().manual_seed(1)
    seq = stream.batch(g, args.batch, args.seq_len)
    results = {}
    for impl in ("eager", "grouped_mm", "batched_mm"):
        try:
            model, mtp = build(spec, args.seed, device, impl)
            prenorm = PreNorm(model)
            mask = causal_mask(attn_impl(model), args.seq_len, device)
            times = []
            loss0 = None
            for i in range(4):
                torch.cuda.synchronize()
                t = time.time()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    l1, l2 = losses(model, mtp, prenorm, seq, mask)
                (l1 + args.mtp_weight * l2).backward()
                torch.cuda.synchronize()
                times.append(time.time() - t)
                if loss0 is None:
                    loss0 = float(l1)
                model.zero_grad(set_to_none=True)
                mtp.zero_grad(set_to_none=True)
            results[impl] = (min(times[1:]), loss0)
            log(f"  experts {impl}: step {min(times[1:]) * 1000:.1f} ms, loss {loss0:.5f}")
            prenorm.remove()
            del model, mtp
        except Exception as e:  # noqa: BLE001
            log(f"  experts {impl}: unavailable ({type(e).__name__}: {str(e)[:200]})")
    torch.cuda.empty_cache()
    if "eager" not in results:
        raise RuntimeError("the eager experts loop failed")
    ref = results["eager"][1]
    ok = {k: v for k, v in results.items() if abs(v[1] - ref) <= 2e-2 * max(1.0, abs(ref))}
    best = min(ok, key=lambda k: ok[k][0])
    return best, {k: {"step_ms": round(v[0] * 1000, 2), "loss": v[1]} for k, v in results.items()}


def train(spec, args, device, stream, experts_impl, total_steps=None, max_steps=None, deadline=None):
    """Trains from the seed. total_steps fixes the schedule; when None it is set from the step
    time measured over the first steps so that training ends by deadline."""
    model, mtp = build(spec, args.seed, device, experts_impl)
    model.train()
    mtp.train()
    prenorm = PreNorm(model)
    balancer = LoadBalancer(list(model.modules()) + list(mtp.modules()), spec["n_routed_experts"], args.bias_rate)
    mask = causal_mask(attn_impl(model), args.seq_len, device)
    opt = make_optimizer(model, mtp, args)
    g = torch.Generator().manual_seed(args.seed + 2)
    hist = {"step": [], "loss": [], "mtp_loss": [], "lr": [], "time": [], "imbalance": []}
    pending = []
    step, t_start, t_measure = 0, time.time(), None
    limit = max_steps if max_steps is not None else (total_steps if total_steps is not None else 10**9)
    planned = total_steps

    def flush():
        if not pending:
            return
        vals = torch.stack([torch.stack([a, b]) for _, a, b, _ in pending]).float().cpu().tolist()
        for (s, _, _, lr), (a, b) in zip(pending, vals):
            hist["step"].append(s)
            hist["loss"].append(a)
            hist["mtp_loss"].append(b)
            hist["lr"].append(lr)
        pending.clear()

    while step < limit:
        if planned is None and step == args.measure_steps:
            sync(device)
            t_measure = time.time()
        if planned is None and step == 2 * args.measure_steps:
            sync(device)
            per_step = (time.time() - t_measure) / args.measure_steps
            left = deadline - time.time()
            planned = step + max(1, int(0.97 * left / per_step))
            limit = planned if max_steps is None else min(max_steps, planned)
            log(f"  {per_step * 1000:.1f} ms/step: {planned} steps planned "
                f"({planned * args.batch * args.seq_len / 1e6:.1f}M tokens)")
        total = planned if planned is not None else 10**9
        lr = lr_at(step, args, total)
        for gr in opt.param_groups:
            gr["lr"] = lr
        seq = stream.batch(g, args.batch, args.seq_len)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            l1, l2 = losses(model, mtp, prenorm, seq, mask)
        (l1 + args.mtp_weight * l2).backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()) + list(mtp.parameters()), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % args.log_every == 0:
            hist["imbalance"].append([step] + balancer.imbalance())
        if step == 0 and not balancer.active():
            log(f"  NOTE: no routing decisions counted ({balancer.how}): the auxiliary-loss-free bias update "
                f"is inactive, e_score_correction_bias stays 0")
            balancer.how = "inactive: no routing decisions were counted, e_score_correction_bias stayed 0"
        balancer.step()
        pending.append((step, l1.detach(), l2.detach(), lr))
        step += 1
        if step % args.log_every == 0:
            flush()
            hist["time"].append([step, round(time.time() - t_start, 2)])
            if step % (args.log_every * 8) == 0:
                log(f"  step {step}/{planned or '?'}: loss {hist['loss'][-1]:.4f}, mtp {hist['mtp_loss'][-1]:.4f}, "
                    f"lr {lr:.2e}, router max/mean {hist['imbalance'][-1][1:]}")
        if deadline is not None and time.time() > deadline + 5:
            log(f"  stopped at the deadline after {step} steps")
            break
    flush()
    sync(device)
    hist["steps"] = step
    hist["planned_steps"] = planned
    hist["seconds"] = round(time.time() - t_start, 2)
    hist["balancer"] = balancer.how
    hist["bias"] = [m.gate.e_score_correction_bias.detach().float().cpu().tolist() for m in balancer.moes]
    prenorm.remove()
    return model, mtp, hist


# ---------------------------------------------------------------- export and reload


def export(model, mtp, spec, tok, out_dir):
    """Writes the hub-layout folder; returns the main model's state dict (f32, CPU) for
    the reload check."""
    from safetensors.torch import save_file

    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    n_layers = spec["num_hidden_layers"]
    hidden = spec["hidden_size"]
    tmp = tempfile.mkdtemp()
    try:
        model.save_pretrained(tmp)
        with open(os.path.join(tmp, "config.json")) as f:
            written = json.load(f)
        tensors = mf.unfuse_experts(mf.saved_tensors(tmp), hidden)
    finally:
        shutil.rmtree(tmp)
    prefix = f"model.layers.{n_layers}."
    block = {prefix + k: v.detach().float().cpu() for k, v in mtp.block.state_dict().items()}
    tensors.update(mf.unfuse_experts(block, hidden))
    for k, v in mtp.extras(model).items():
        tensors[prefix + k] = v.detach().float().cpu().clone()
    tensors = {k: v.detach().float().cpu().contiguous() for k, v in tensors.items()}
    save_file(mf.to_variant(tensors, "bf16"), os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    cfg = mf.patch_config_json(written, "bf16", n_layers, 1)
    cfg["architectures"] = spec["architectures"]
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        cfg[k] = spec[k]
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    import transformers

    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD,
                   "transformers_version": transformers.__version__}, f, indent=2)
        f.write("\n")
    write_tokenizer(tok, out_dir)
    n_params = sum(v.numel() for v in tensors.values())
    log(f"  exported {len(tensors)} tensors, {n_params} parameters, {mf.dir_bytes(out_dir)} bytes to {out_dir}")
    return {k: v.detach().float().cpu() for k, v in model.state_dict().items()}, n_params


def mtp_for_reference(d, spec, mtp, device):
    """The MTP layer as loaded from the file (reload_mtp); if transformers cannot load it,
    the trained layer rounded to bf16 and the extras as stored."""
    try:
        return reload_mtp(d, spec, mtp, device)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        log(f"  ERROR: MTP reload through transformers failed ({e}); using the trained layer rounded to bf16")
    from safetensors.torch import load_file

    block = copy.deepcopy(mtp.block).float().eval()
    with torch.no_grad():
        for name, p in block.named_parameters():
            if not mf.keep_f32(name):
                p.copy_(p.to(torch.bfloat16).float())
    n = spec["num_hidden_layers"]
    stored = load_file(os.path.join(d, "model.safetensors"))
    extras = {k: stored[f"model.layers.{n}.{k}"].float().to(device) for k in mf.MTP_EXTRAS}
    return block.to(device), extras


def reload_main(d, spec, built_sd, device):
    model, n_unexpected = mf.load_variant(d, spec, 1)
    n = mf.check_roundtrip(model, built_sd, "bf16", spec["num_hidden_layers"])
    log(f"  reloaded {type(model).__name__}: {n} weights equal the trained ones rounded to bf16; "
        f"{n_unexpected} MTP tensors left to the engine")
    return model.to(device).eval()


@torch.no_grad()
def reload_mtp(d, spec, mtp, device):
    """The MTP layer as transformers loads it from the file (the checkpoint read as a model of
    num_hidden_layers + 1 layers), checked against the trained layer; plus the extras."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    n = spec["num_hidden_layers"]
    big, info = mf.call_with_optional(
        AutoModelForCausalLM.from_pretrained, (d,),
        dict(dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
             num_hidden_layers=n + 1, num_nextn_predict_layers=0, output_loading_info=True),
        ["experts_implementation", "dtype"],
    )
    missing = mf.loading_info_get(info, "missing_keys")
    if missing:
        raise RuntimeError(f"MTP reload: missing {missing[:6]}")
    block = big.model.layers[n].float().eval()
    want = mtp.block.state_dict()
    got = block.state_dict()
    if set(want) != set(got):
        raise RuntimeError(f"MTP reload: keys differ: {sorted(set(want) ^ set(got))[:6]}")
    for k, v in want.items():
        w = v.detach().float().cpu()
        if not mf.keep_f32(k):
            w = w.to(torch.bfloat16).float()
        if not torch.equal(got[k].float().cpu(), w):
            raise RuntimeError(f"MTP reload: {k} differs from the trained tensor")
    stored = load_file(os.path.join(d, "model.safetensors"))
    extras = {k: stored[f"model.layers.{n}.{k}"].float().to(device) for k in mf.MTP_EXTRAS}
    log(f"  MTP layer reloaded through transformers as layer {n}: {len(want)} tensors equal the trained ones")
    block = block.to(device)
    del big
    return block, extras


# ---------------------------------------------------------------- references


def windows(ids, window):
    """[<|bos|>] + each consecutive chunk of window - 1 ids."""
    step = window - 1
    return [[BOS] + ids[i:i + step] for i in range(0, len(ids), step)]


@torch.no_grad()
def score(model, wins, device, batch=64):
    """Per window: (sum of -log p(token) over every token after <|bos|>, count)."""
    out = [None] * len(wins)
    by_len = {}
    for i, w in enumerate(wins):
        by_len.setdefault(len(w), []).append(i)
    for L, idxs in by_len.items():
        for s in range(0, len(idxs), batch):
            part = idxs[s:s + batch]
            x = torch.tensor([wins[i] for i in part], device=device)
            logits = model(input_ids=x, use_cache=False).logits.double()
            lp = torch.log_softmax(logits[:, :-1], dim=-1)
            nll = -lp.gather(-1, x[:, 1:, None])[..., 0]
            for j, i in enumerate(part):
                out[i] = (float(nll[j].sum()), L - 1)
    return out


def summarize(scored):
    nll = sum(s for s, _ in scored)
    n = sum(c for _, c in scored)
    return {"tokens": n, "nll": nll, "loss": nll / n, "ppl": math.exp(nll / n)}


@torch.no_grad()
def greedy_batch(model, prompts, n, device):
    """n greedy tokens per prompt (equal lengths, one batch, KV cache, EOS ignored), the top-1
    minus top-2 margin per step, and the number of steps where one uncached pass over
    prompt + tokens picks a different argmax."""
    x = torch.tensor(prompts, device=device)
    out = model(input_ids=x, use_cache=True)
    past = out.past_key_values
    logits = out.logits[:, -1].float()
    toks, margins = [], []
    for k in range(n):
        top2 = logits.topk(2, dim=-1)
        tok = logits.argmax(-1)
        toks.append(tok)
        margins.append(top2.values[:, 0] - top2.values[:, 1])
        if k == n - 1:
            break
        out = model(input_ids=tok[:, None], past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[:, -1].float()
    toks = torch.stack(toks, 1)
    margins = torch.stack(margins, 1)
    full = model(input_ids=torch.cat([x, toks[:, :-1]], 1), use_cache=False).logits[:, x.shape[1] - 1:].argmax(-1)
    return toks.cpu().tolist(), margins.cpu().tolist(), int((full != toks).sum())


@torch.no_grad()
def mtp_eval(model, block, extras, wins, device, eps):
    """The MTP layer's held-out loss and top-1 accuracy on token t+2, with the layer and
    extras as loaded from the file (float32), next to the main model's on token t+1."""
    n_tok, nll2, hit2, n1, nll1, hit1 = 0, 0.0, 0, 0, 0.0, 0
    captured = {}
    hook = model.model.norm.register_forward_pre_hook(lambda m, a: captured.__setitem__("h", a[0]))
    try:
        for w in wins:
            if len(w) < 3:
                continue
            x = torch.tensor([w], device=device)
            logits = model(input_ids=x, use_cache=False).logits[0].double()
            h = captured["h"][0].float()
            t = len(w) - 1  # positions 0..t-1 predict t+1 from the main model
            lp1 = torch.log_softmax(logits[:-1], -1)
            tgt1 = x[0, 1:]
            nll1 += float(-lp1.gather(-1, tgt1[:, None]).sum())
            hit1 += int((lp1.argmax(-1) == tgt1).sum())
            n1 += t
            # MTP at positions 0..t-2: embedding of token p+1, hidden p, predicts token p+2.
            L = t - 1
            emb = F.embedding(x[0, 1:L + 1], extras["embed_tokens.weight"])
            z = torch.cat([mf.rms_norm(emb, extras["enorm.weight"], eps), mf.rms_norm(h[:L], extras["hnorm.weight"], eps)], -1)
            z = (z @ extras["eh_proj.weight"].T)[None]
            pos = torch.arange(L, device=device)[None]
            pe = model.model.rotary_emb(z, pos)
            y = block(z, attention_mask=causal_mask("eager", L, device), position_ids=pos, position_embeddings=pe)
            if isinstance(y, tuple):
                y = y[0]
            lg = (mf.rms_norm(y[0], extras["shared_head.norm.weight"], eps) @ extras["shared_head.head.weight"].T).double()
            lp2 = torch.log_softmax(lg, -1)
            tgt2 = x[0, 2:L + 2]
            nll2 += float(-lp2.gather(-1, tgt2[:, None]).sum())
            hit2 += int((lp2.argmax(-1) == tgt2).sum())
            n_tok += L
    finally:
        hook.remove()
    return {"tokens": n_tok, "mtp_loss": nll2 / n_tok, "mtp_top1": hit2 / n_tok,
            "main_top1": hit1 / n1, "main_loss": nll1 / n1}


def hf_tokenizer(d):
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(d)
    except Exception as e:  # noqa: BLE001
        log(f"  note: transformers could not load the tokenizer: {e}")
        return None


def references(model_dir, model, block, extras, tok, spec, heldout, sample_text, prompts, args, device, quick=False):
    ref = {"window": args.window,
           "scoring": ("text encoded without special tokens, cut into consecutive chunks of window-1 tokens; "
                       "each chunk scored as [<|bos|>] + chunk; every chunk token is scored; "
                       "nll is the sum of -ln p over scored tokens, ppl = exp(nll / tokens)"),
           "compute": "transformers, bf16 checkpoint loaded with dtype float32, eager attention, TF32 off, on "
                      + str(device)}
    ref["errors"] = {}

    def attempt(name, fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            ref["errors"][name] = f"{type(e).__name__}: {e}"
            log(f"  ERROR in {name}: {e}")

    ids = tok.encode(sample_text, add_special_tokens=False).ids
    wins = windows(ids, args.window)

    def sample():
        sc = score(model, wins, device)
        ref["sample"] = dict(summarize(sc), ids=ids, window_nll=[s for s, _ in sc], window_tokens=[c for _, c in sc])
        log(f"  sample: {len(ids)} tokens in {len(wins)} windows, loss {ref['sample']['loss']:.4f}, "
            f"ppl {ref['sample']['ppl']:.4f}")

    def greedy():
        ptoks = [tok.encode(p["text"], add_special_tokens=True).ids[:args.prompt_tokens] for p in prompts]
        short = [i for i, p in enumerate(ptoks) if len(p) < args.prompt_tokens]
        if short:
            raise RuntimeError(f"prompts {short} have fewer than {args.prompt_tokens} tokens")
        toks, margins, disagree = greedy_batch(model, ptoks, args.greedy_tokens, device)
        ref["greedy"] = {"new_tokens": args.greedy_tokens, "eos_ignored": True,
                         "cache_vs_uncached_argmax_disagreements": disagree,
                         "prompts": [{"src": p["src"], "ids": pt, "greedy": t, "margins": [round(m, 5) for m in mg]}
                                     for p, pt, t, mg in zip(prompts, ptoks, toks, margins)]}
        log(f"  greedy: {len(ptoks)} prompts x {args.greedy_tokens}, min margin {min(min(m) for m in margins):.2e}, "
            f"cache/uncached disagreements {disagree}")

    def held():
        # Held-out documents, per source (each document's ids followed by <|eos|>).
        enc = encode_docs(tok, heldout)
        ref["heldout"] = {}
        all_sc = []
        for src in sorted(enc):
            flat = [t for doc in enc[src] for t in doc]
            if quick:
                flat = flat[:2000]
            s = score(model, windows(flat, args.window), device)
            all_sc.extend(s)
            ref["heldout"][src] = summarize(s)
        ref["heldout"]["all"] = summarize(all_sc)
        log("  held-out loss: " + ", ".join(f"{k} {v['loss']:.3f}" for k, v in ref["heldout"].items()))

    def mtp():
        ref["mtp"] = mtp_eval(model, block, extras, wins, device, spec["rms_norm_eps"])
        log(f"  mtp on the sample: {ref['mtp']}")

    def tokenizer():
        cases = TOKENIZER_CASES + [p["text"] for p in prompts]
        ref["tokenizer"] = [{"text": s, "ids": tok.encode(s, add_special_tokens=True).ids} for s in cases]
        hf = hf_tokenizer(model_dir)
        if hf is None:
            return
        bad = [c["text"] for c in ref["tokenizer"] if list(hf(c["text"])["input_ids"]) != c["ids"]]
        ref["tokenizer_transformers_mismatches"] = len(bad)
        if bad:
            log(f"  note: transformers' tokenizer differs from tokenizers on {len(bad)} strings, e.g. {bad[:2]!r}")
        ref["chat"] = {"messages": CHAT_EXAMPLE,
                       "rendered": hf.apply_chat_template(CHAT_EXAMPLE, tokenize=False, add_generation_prompt=True)}

    def samples():
        ref["samples"] = {}
        for text in ("ROMEO:", "func main() {"):
            ids_p = tok.encode(text, add_special_tokens=True).ids
            t, _, _ = greedy_batch(model, [ids_p], args.greedy_tokens, device)
            ref["samples"][text] = {"ids": t[0], "text": tok.decode(ids_p[1:] + t[0], skip_special_tokens=False)}
            log(f"  greedy from {text!r}: {ref['samples'][text]['text']!r}")

    for name, fn in (("sample", sample), ("greedy", greedy), ("heldout", held), ("mtp", mtp),
                     ("tokenizer", tokenizer), ("samples", samples)):
        if name == "mtp" and block is None:
            continue
        attempt(name, fn)
    return ref


# ---------------------------------------------------------------- the run


def write_outputs(out, model_dir, extra_files, split=True):
    """model.safetensors in 15 MiB parts, everything else in folder.tar.gz."""
    os.makedirs(out, exist_ok=True)
    if split:
        part = 15 * 2**20
        with open(os.path.join(model_dir, "model.safetensors"), "rb") as f:
            i = 0
            while True:
                b = f.read(part)
                if not b:
                    break
                with open(os.path.join(out, f"model.safetensors.part{i}"), "wb") as g:
                    g.write(b)
                i += 1
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in sorted(os.listdir(model_dir)):
            if name != "model.safetensors":
                tar.add(os.path.join(model_dir, name), arcname=name)
        for name, data in extra_files.items():
            raw = json.dumps(data, indent=1).encode()
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    with open(os.path.join(out, "folder.tar.gz"), "wb") as f:
        f.write(buf.getvalue())


def run(args):
    import transformers

    device = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "tokenizers": __import__("tokenizers").__version__, "gpu": torch.cuda.get_device_name(0)}
    log(f"versions {versions}")
    train_docs = read_jsonl_gz(os.path.join(args.corpus, "train.jsonl.gz"))
    heldout = read_jsonl_gz(os.path.join(args.corpus, "heldout.jsonl.gz"))
    with open(os.path.join(args.corpus, "manifest.json")) as f:
        manifest = json.load(f)
    with open(args.sample, encoding="utf-8") as f:
        sample_text = f.read()
    with open(args.prompts, encoding="utf-8") as f:
        prompts = json.load(f)["prompts"]
    log(f"corpus: {len(train_docs)} training documents, {len(heldout)} held out")

    tok = train_tokenizer([d["text"] for d in train_docs], MODEL_SPEC["vocab_size"])
    log(f"tokenizer: {tok.get_vocab_size()} ids")
    enc = encode_docs(tok, train_docs)
    counts = {k: sum(len(d) for d in v) for k, v in enc.items()}
    weigh = source_weight(args.go_weight, args.play_weight)(sorted(counts.items()))
    stream = Stream(enc, lambda nm, ln: weigh[nm], device)
    n_bytes = sum(len(d["text"].encode()) for d in train_docs)
    log(f"training tokens {sum(counts.values())} ({n_bytes / sum(counts.values()):.2f} bytes/token): {stream.describe()}")

    work = tempfile.mkdtemp()
    # Smoke: every later step on a tiny model, in seconds.
    if not args.no_smoke:
        t = time.time()
        log("== smoke")
        sargs = argparse.Namespace(**vars(args))
        sargs.batch, sargs.seq_len, sargs.measure_steps, sargs.log_every = 4, 64, 2, 2
        spec = SMOKE_SPEC
        m, mtp, hist = train(spec, sargs, device, stream, "eager", total_steps=6)
        check_causal(m, mtp, device)
        sd, _ = export(m, mtp, spec, tok, os.path.join(work, "smoke"))
        write_outputs(os.path.join(work, "smoke_out"), os.path.join(work, "smoke"), {"x.json": {}})
        try:
            rm = reload_main(os.path.join(work, "smoke"), spec, sd, device)
            blk, ext = mtp_for_reference(os.path.join(work, "smoke"), spec, mtp, device)
            sargs.greedy_tokens = 4
            r = references(os.path.join(work, "smoke"), rm, blk, ext, tok, spec, heldout[:3], sample_text, prompts,
                           sargs, device, quick=True)
            if r["errors"]:
                log(f"  SMOKE reference errors: {r['errors']}")
            del rm, blk
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            log("  SMOKE: reload failed; the main run goes on (its model is written before the reload)")
        del m, mtp
        torch.cuda.empty_cache()
        log(f"== smoke passed in {time.time() - t:.1f}s (losses {[round(x, 3) for x in hist['loss']]})")

    spec = MODEL_SPEC
    log("== probe experts implementations")
    impl, probe = probe_experts(spec, args, device, stream)
    log(f"  using experts implementation {impl!r}")
    log("== train")
    deadline = time.time() + args.train_seconds if args.steps is None else None
    model, mtp, hist = train(spec, args, device, stream, impl, total_steps=args.steps, deadline=deadline)
    check_causal(model, mtp, device)
    log(f"  {hist['steps']} steps in {hist['seconds']}s, final loss {hist['loss'][-1]:.4f}, mtp {hist['mtp_loss'][-1]:.4f}")
    model_dir = os.path.join(work, "deepseek-tiny")
    built_sd, n_params = export(model, mtp, spec, tok, model_dir)
    recorded = {k: (os.path.relpath(v, ROOT) if k in ("corpus", "sample", "prompts") and os.path.isabs(v) else v)
                for k, v in vars(args).items()}
    recorded["out"] = "$OUT"
    train_log = {"versions": versions, "spec": spec, "args": recorded, "experts_probe": probe, "experts": impl,
                 "sources": stream.describe(), "manifest": manifest, "hist": hist, "params_stored": n_params,
                 "params_trained": sum(p.numel() for p in model.parameters()) + sum(p.numel() for p in mtp.parameters()),
                 "tokens_per_step": args.batch * args.seq_len}
    write_outputs(args.out, model_dir, {"train_log.json": train_log})
    log(f"  wrote the model to {args.out}")

    log("== reload and references")
    ref = {"errors": {}}
    try:
        rmodel = reload_main(model_dir, spec, built_sd, device)
        block, extras = mtp_for_reference(model_dir, spec, mtp, device)
        ref = references(model_dir, rmodel, block, extras, tok, spec, heldout, sample_text, prompts, args, device)
        del rmodel, block
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        ref["errors"]["reload"] = f"{type(e).__name__}: {e}"
    ref["versions"] = versions
    ref["train"] = {"steps": hist["steps"], "tokens": hist["steps"] * args.batch * args.seq_len,
                    "seconds": hist["seconds"], "final_loss": hist["loss"][-1], "final_mtp_loss": hist["mtp_loss"][-1]}
    write_outputs(args.out, model_dir, {"train_log.json": train_log, "reference.json": ref}, split=False)
    torch.cuda.empty_cache()

    if args.repro_steps > 0 and time.time() - T0 < args.repro_before:
        log(f"== reproducibility: first {args.repro_steps} steps again")
        del model, mtp
        torch.cuda.empty_cache()
        _, _, h2 = train(spec, args, device, stream, impl, total_steps=hist["planned_steps"], max_steps=args.repro_steps)
        a = hist["loss"][:args.repro_steps]
        b = h2["loss"][:args.repro_steps]
        diff = max(abs(x - y) for x, y in zip(a, b))
        same3 = all(f"{x:.3g}" == f"{y:.3g}" for x, y in zip(a, b))
        train_log["repro"] = {"steps": args.repro_steps, "first": a, "second": b, "max_abs_diff": diff,
                              "same_to_3_significant_digits": same3}
        log(f"  max |loss difference| over {args.repro_steps} steps: {diff:.2e}; same to 3 digits: {same3}")
        write_outputs(args.out, model_dir, {"train_log.json": train_log, "reference.json": ref}, split=False)

    log("== summary")
    held = ref.get("heldout", {}).get("all", {})
    log(f"params stored {n_params}, trained {train_log['params_trained']}, steps {hist['steps']}, "
        f"tokens {ref['train']['tokens'] / 1e6:.1f}M, {hist['seconds']}s, experts {impl}")
    log(f"final train loss {hist['loss'][-1]:.4f} (mtp {hist['mtp_loss'][-1]:.4f}); held-out loss "
        f"{held.get('loss', float('nan')):.4f} ppl {held.get('ppl', float('nan')):.3f}; "
        f"sample ppl {ref.get('sample', {}).get('ppl', float('nan')):.4f}")
    log(f"reference errors: {ref.get('errors')}")
    log(f"model folder {mf.dir_bytes(model_dir)} bytes; outputs {sorted(os.listdir(args.out))}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=os.path.join(ROOT, ".train", "corpus"))
    p.add_argument("--sample", default=os.path.join(ROOT, "testdata", "deepseek-tiny", "heldout_sample.txt"))
    p.add_argument("--prompts", default=os.path.join(ROOT, "testdata", "deepseek-tiny", "prompts.json"))
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--train-seconds", type=float, default=180)
    p.add_argument("--steps", type=int, help="fix the step count (and schedule) instead of timing it")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--mtp-weight", type=float, default=0.3)
    p.add_argument("--bias-rate", type=float, default=1e-3)
    p.add_argument("--go-weight", type=float, default=0.7)
    p.add_argument("--play-weight", type=float, default=0.02)
    p.add_argument("--measure-steps", type=int, default=20)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--greedy-tokens", type=int, default=64)
    p.add_argument("--repro-steps", type=int, default=30)
    p.add_argument("--repro-before", type=float, default=330, help="skip the rerun past this many seconds")
    p.add_argument("--no-smoke", action="store_true")
    args = p.parse_args()
    try:
        run(args)
    except Exception:
        traceback.print_exc()
        sys.exit(1)


if __name__ == "__main__":
    main()
