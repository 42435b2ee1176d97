#!/usr/bin/env python3
"""Trains the DSpark drafter of the shipped default model (assets/dspark-tiny) on the GPU machine.

DSpark is a block drafter: from the target's hidden state at the last accepted
position (its last hidden state before the final norm, the row whose output is
the sequence's last token) and the last token's embedding, one parallel pass
over a block of k positions guesses the next k tokens; a tiny sequential
(Markov) correction makes position i depend on the token drafted at i-1, and a
confidence head predicts, per position, the probability that the target
accepts the draft there given that every earlier one was accepted.

Architecture (names as stored in model.safetensors; D = the target's hidden size):
  context   c = ctx.proj([RMSNorm_l(h_l) for l in target_layer_ids])        [D]
  block     x_0 = E[last] + block.embed[0], x_j = block.embed[j] (j > 0)     [k, D]
            E is the target's embedding (shared, frozen)
  layers    pre-norm blocks: attention of the k block rows over the k rows
            (bidirectional) and the context (one key/value per sequence,
            k/v projections of RMSNorm(c; context_norm)), no positional
            rotation (block.embed carries the positions); SwiGLU MLP
  Markov    g_j = x_j + markov.up(silu(a) * b), [a b] = markov.down(E[d_{j-1}]),
            d_{-1} = last, d_{j-1} the token drafted (training: the label) at j-1
  logits    the target's final norm and LM head over g_j (shared, frozen)
  confidence z_j = confidence.fc2(silu(a) * b), [a b] = confidence.fc1(RMSNorm(g_j)),
            p_j = sigmoid(confidence_scale * z_j + confidence_bias), the scale
            and bias fit on held-out data after training (Platt scaling)

Data (self-distillation): the target continues corpus windows greedily (float32,
TF32 off, the engine's argmax); along a greedy sequence S every anchor T past the
prompt has the target's greedy continuation S[T+1..T+k] as labels, the hidden
state at T-1 and the last token S[T]. Loss: per-position cross-entropy (weights
decay^j, normalised) + conf_weight * binary cross-entropy of z_j against the
measured acceptance (argmax == label) with g detached.

Steps in one call:
  1. smoke: every later step on a few sequences and steps (seconds), so that an
     API mismatch fails fast;
  2. data: greedy continuations of random training-corpus windows for
     --gen-seconds; 5% of the sequences kept apart for calibration;
  3. train: AdamW, bf16 autocast; the step count fixed after --measure-steps
     from the measured step time so that training fits --train-seconds
     (--steps fixes it instead); weights rounded to bf16 afterwards (what ships);
  4. calibrate the confidence head (Platt) on the calibration split, over the
     positions whose earlier drafts were all accepted (what gating sees);
  5. evaluate on held-out prompts (greedy continuations of held-out corpus
     windows, and the 20 committed prompts of testdata/deepseek-tiny): acceptance
     per position, mean accepted length, the reliability table (10 bins) and its
     expected calibration error, what confidence gating would verify;
  6. export OUT/config.json + OUT/model.safetensors (bf16), OUT/train_log.json
     (losses, data, evaluation), OUT/reference.json (drafts and confidences of
     the shipped drafter on the committed prompts, for the Go parity test) and
     OUT/loss.png when matplotlib is present.

Usage (repository root, GPU machine, the corpus of tools/train/make_corpus.py carried):
  python3 tools/train/train_dspark.py --corpus .train/corpus --out $OUT
"""
import argparse
import gzip
import json
import math
import os
import sys
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
import make_fixtures as mf  # noqa: E402  (tools/make_fixtures.py: HF loading helpers)

BOS, EOS = 0, 1
ARCH = "DSparkDrafter"
T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


# ---------------------------------------------------------------- target


def load_target(d, device):
    """The shipped target in float32 (its bf16 weights upcast), SDPA attention; experts
    through batched matmuls when transformers offers them (falls back to the loop)."""
    from transformers import AutoModelForCausalLM

    kwargs = dict(dtype=torch.float32, attn_implementation="sdpa", num_nextn_predict_layers=0)
    model = mf.call_with_optional(AutoModelForCausalLM.from_pretrained, (d,), kwargs,
                                  ["dtype", "num_nextn_predict_layers"])
    model = model.float().eval().to(device)
    for p in model.parameters():
        p.requires_grad_(False)
    mf.patch_moe(model)
    return model


def set_experts(model, impl):
    fn = getattr(model, "set_experts_implementation", None)
    if fn is None:
        return False
    try:
        fn(impl)
        return True
    except Exception as e:  # noqa: BLE001
        log(f"  note: set_experts_implementation({impl!r}): {e}")
        return False


class Taps:
    """Captures the outputs of the target's decoder layers in ids (the hidden state after
    the layer, before the final norm for the last one)."""

    def __init__(self, model, ids):
        self.ids = ids
        self.h = {}
        self.handles = [model.model.layers[i].register_forward_hook(self._hook(i)) for i in ids]

    def _hook(self, i):
        def f(mod, args, out):
            self.h[i] = out[0] if isinstance(out, tuple) else out
        return f

    def features(self):
        return torch.cat([self.h[i] for i in self.ids], dim=-1)

    def remove(self):
        for h in self.handles:
            h.remove()


# The experts implementation of one-token decode steps: transformers' batched_mm gathers
# each token's expert weights (fast at a token a sequence, too large for a prefill), which
# runs the per-expert loop.
DECODE_EXPERTS = "eager"


def pick_decode_experts(target, device):
    """Sets DECODE_EXPERTS to batched_mm when transformers offers it and it runs on target
    (else eager), leaves target on eager, and returns the choice."""
    global DECODE_EXPERTS
    impl = "eager"
    if set_experts(target, "batched_mm"):
        try:
            target(input_ids=torch.randint(10, 100, (4, 8), device=device), use_cache=False)
            impl = "batched_mm"
        except Exception as e:  # noqa: BLE001
            log(f"  experts batched_mm: {type(e).__name__}: {str(e)[:160]}")
    DECODE_EXPERTS = impl
    set_experts(target, "eager")
    return impl


@torch.no_grad()
def greedy_sequences(target, prompts, n_new):
    """prompts [B, P] -> [B, P + n_new]: plain argmax with the KV cache, EOS ignored."""
    set_experts(target, "eager")
    out = target(input_ids=prompts, use_cache=True)
    past = out.past_key_values
    tok = out.logits[:, -1].argmax(-1)
    toks = [tok]
    set_experts(target, DECODE_EXPERTS)
    for _ in range(n_new - 1):
        out = target(input_ids=tok[:, None], past_key_values=past, use_cache=True)
        past = out.past_key_values
        tok = out.logits[:, -1].argmax(-1)
        toks.append(tok)
    return torch.cat([prompts, torch.stack(toks, 1)], 1)


@torch.no_grad()
def hidden_of(target, taps, seqs, chunk=256):
    """The tapped features of every position of seqs [B, L] (bf16 [B, L, F])."""
    hs = []
    set_experts(target, "eager")
    for i in range(0, seqs.shape[0], chunk):
        x = seqs[i:i + chunk]
        target.model(input_ids=x, use_cache=False)
        hs.append(taps.features().to(torch.bfloat16))
    return torch.cat(hs, 0)


def read_jsonl_gz(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def token_stream(tok, docs, device):
    encs = tok.encode_batch([d["text"] for d in docs], add_special_tokens=False)
    flat = [t for e in encs for t in e.ids + [EOS]]
    return torch.tensor(flat, dtype=torch.int64, device=device)


def random_prompts(stream, g, batch, plen):
    """[batch, plen]: <|bos|> then plen-1 consecutive tokens from a uniform offset."""
    off = (torch.rand(batch, generator=g, dtype=torch.float64) * (stream.numel() - plen)).long()
    idx = off[:, None] + torch.arange(plen - 1)[None]
    body = stream[idx.to(stream.device)]
    return torch.cat([torch.full((batch, 1), BOS, dtype=body.dtype, device=body.device), body], 1)


def generate_data(target, taps, stream, args, g, seconds, max_batches, total_len, prompt_lens, batch):
    """Greedy sequences of total_len tokens from random windows (prompt length drawn from
    prompt_lens per batch), their features, and each sequence's prompt length. stream is one
    token stream, or a list of (stream, share): each batch's windows come from one of them,
    drawn by share."""
    seqs, feats, plens = [], [], []
    t = time.time()
    while len(seqs) < max_batches and (time.time() - t < seconds or not seqs):
        plen = prompt_lens[int(torch.randint(len(prompt_lens), (1,), generator=g))]
        src = stream
        if isinstance(stream, list):
            u, src = float(torch.rand(1, generator=g)), stream[-1][0]
            for st, share in stream:
                if u < share:
                    src = st
                    break
                u -= share
        p = random_prompts(src, g, batch, plen)
        s = greedy_sequences(target, p, total_len - plen)
        seqs.append(s)
        feats.append(hidden_of(target, taps, s))
        plens.append(torch.full((batch,), plen, dtype=torch.int64, device=s.device))
    torch.cuda.synchronize()
    return torch.cat(seqs), torch.cat(feats), torch.cat(plens), time.time() - t


# ---------------------------------------------------------------- drafter


def rms(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return rms(x, self.weight, self.eps)


class MLP(nn.Module):
    def __init__(self, d, inter):
        super().__init__()
        self.gate_up_proj = nn.Linear(d, 2 * inter, bias=False)
        self.down_proj = nn.Linear(inter, d, bias=False)

    def forward(self, x):
        a, b = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(a) * b)


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, nh, hd, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"], cfg["rms_norm_eps"]
        self.nh, self.hd = nh, hd
        self.input_norm = RMSNorm(d, eps)
        self.context_norm = RMSNorm(d, eps)
        self.q_proj = nn.Linear(d, nh * hd, bias=False)
        self.k_proj = nn.Linear(d, nh * hd, bias=False)
        self.v_proj = nn.Linear(d, nh * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, d, bias=False)
        self.post_norm = RMSNorm(d, eps)
        self.mlp = MLP(d, cfg["intermediate_size"])

    def forward(self, x, c):
        b, k, _ = x.shape
        h = self.input_norm(x)
        cn = self.context_norm(c)[:, None]  # [B, 1, D]
        q = self.q_proj(h).view(b, k, self.nh, self.hd).transpose(1, 2)
        keys = torch.cat([self.k_proj(cn), self.k_proj(h)], 1).view(b, k + 1, self.nh, self.hd).transpose(1, 2)
        vals = torch.cat([self.v_proj(cn), self.v_proj(h)], 1).view(b, k + 1, self.nh, self.hd).transpose(1, 2)
        att = torch.softmax((q.float() @ keys.float().transpose(-1, -2)) * self.hd ** -0.5, dim=-1)
        o = (att @ vals.float()).to(x.dtype).transpose(1, 2).reshape(b, k, self.nh * self.hd)
        x = x + self.o_proj(o)
        return x + self.mlp(self.post_norm(x))


class DSpark(nn.Module):
    """The drafter; the target's embedding, final norm and LM head are used, not owned."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d, ht, eps = cfg["hidden_size"], cfg["target_hidden_size"], cfg["rms_norm_eps"]
        n = len(cfg["target_layer_ids"])
        self.ctx_norms = nn.ModuleList(RMSNorm(ht, eps) for _ in range(n))
        self.ctx_proj = nn.Linear(n * ht, d, bias=False)
        self.block_embed = nn.Parameter(torch.randn(cfg["block_size"], d) * 0.02)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg["num_hidden_layers"]))
        r, ch = cfg["markov_rank"], cfg["confidence_hidden_size"]
        self.markov_down = nn.Linear(ht, 2 * r, bias=False)
        self.markov_up = nn.Linear(r, d, bias=False)
        nn.init.zeros_(self.markov_up.weight)
        self.conf_norm = RMSNorm(d, eps)
        self.conf_fc1 = nn.Linear(d, 2 * ch, bias=False)
        self.conf_fc2 = nn.Linear(ch, 1, bias=True)

    def context(self, feats):
        ht = self.cfg["target_hidden_size"]
        parts = [norm(feats[..., i * ht:(i + 1) * ht]) for i, norm in enumerate(self.ctx_norms)]
        return self.ctx_proj(torch.cat(parts, -1))

    def block(self, target, feats, last):
        """The block's hidden states before the Markov correction: [B, k, D]."""
        c = self.context(feats)
        e = target.model.embed_tokens(last)
        x = self.block_embed[None].expand(last.shape[0], -1, -1)
        x = torch.cat([x[:, :1] + e[:, None].to(x.dtype), x[:, 1:]], 1)
        for ly in self.layers:
            x = ly(x, c)
        return x

    def correct(self, target, x, prev):
        """g = x + Markov(prev): prev [B, k'] the token before each of the first k' positions."""
        a, b = self.markov_down(target.model.embed_tokens(prev)).chunk(2, dim=-1)
        return x[:, :prev.shape[1]] + self.markov_up(F.silu(a) * b)

    def confidence(self, g):
        a, b = self.conf_fc1(self.conf_norm(g)).chunk(2, dim=-1)
        return self.conf_fc2(F.silu(a) * b)[..., 0]

    def teacher_forced(self, target, feats, last, labels):
        """Logits [B, k, V] and confidence logits [B, k] with the labels as earlier drafts."""
        x = self.block(target, feats, last)
        prev = torch.cat([last[:, None], labels[:, :-1]], 1)
        g = self.correct(target, x, prev)
        logits = target.lm_head(target.model.norm(g))
        return logits, self.confidence(g.detach())

    @torch.no_grad()
    def draft(self, target, feats, last):
        """Inference: drafts [B, k] (each position's argmax after the correction by the
        position before's draft), confidence logits [B, k], top-1 minus top-2 logit margins."""
        x = self.block(target, feats, last)
        prev = last
        toks, zs, margins = [], [], []
        for j in range(x.shape[1]):
            g = self.correct(target, x[:, j:j + 1], prev[:, None])
            logits = target.lm_head(target.model.norm(g))[:, 0].float()
            top = logits.topk(2, dim=-1)
            prev = logits.argmax(-1)
            toks.append(prev)
            margins.append(top.values[:, 0] - top.values[:, 1])
            zs.append(self.confidence(g)[:, 0].float())
        return torch.stack(toks, 1), torch.stack(zs, 1), torch.stack(margins, 1)

    def tensors(self):
        """Parameters under their stored names."""
        out = {"ctx.proj.weight": self.ctx_proj.weight, "block.embed": self.block_embed,
               "markov.down.weight": self.markov_down.weight, "markov.up.weight": self.markov_up.weight,
               "confidence.norm.weight": self.conf_norm.weight, "confidence.fc1.weight": self.conf_fc1.weight,
               "confidence.fc2.weight": self.conf_fc2.weight, "confidence.fc2.bias": self.conf_fc2.bias}
        for i, n in enumerate(self.ctx_norms):
            out[f"ctx.norm.{i}.weight"] = n.weight
        for i, ly in enumerate(self.layers):
            p = f"layers.{i}."
            out.update({p + "input_norm.weight": ly.input_norm.weight, p + "context_norm.weight": ly.context_norm.weight,
                        p + "q_proj.weight": ly.q_proj.weight, p + "k_proj.weight": ly.k_proj.weight,
                        p + "v_proj.weight": ly.v_proj.weight, p + "o_proj.weight": ly.o_proj.weight,
                        p + "post_norm.weight": ly.post_norm.weight,
                        p + "mlp.gate_up_proj.weight": ly.mlp.gate_up_proj.weight,
                        p + "mlp.down_proj.weight": ly.mlp.down_proj.weight})
        return out


def drafter_config(args, target_cfg):
    return {
        "architectures": [ARCH],
        "model_type": "dspark",
        "target_architectures": list(target_cfg.architectures),
        "target_hidden_size": target_cfg.hidden_size,
        "target_num_hidden_layers": target_cfg.num_hidden_layers,
        "target_layer_ids": [int(x) for x in args.target_layers.split(",")],
        "vocab_size": target_cfg.vocab_size,
        "hidden_size": target_cfg.hidden_size,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "head_dim": args.head_dim,
        "intermediate_size": args.intermediate,
        "rms_norm_eps": target_cfg.rms_norm_eps,
        "block_size": args.block,
        "markov_rank": args.markov_rank,
        "confidence_hidden_size": args.conf_hidden,
        "confidence_scale": 1.0,
        "confidence_bias": 0.0,
        "dtype": "bfloat16",
    }


# ---------------------------------------------------------------- training


class Anchors:
    """Random (sequence, anchor) pairs of a data set: anchor T in [plen, L-1-k]."""

    def __init__(self, seqs, feats, plens, k):
        self.seqs, self.feats, self.plens, self.k = seqs, feats, plens, k
        self.L = seqs.shape[1]

    def count(self):
        return int((self.L - self.k - self.plens).clamp(min=0).sum())

    def take(self, rows, t):
        k = self.k
        idx = t[:, None] + torch.arange(1, k + 1, device=t.device)[None]
        labels = self.seqs[rows[:, None], idx]
        return self.feats[rows, t - 1].float(), self.seqs[rows, t], labels

    def sample(self, g, n):
        rows = torch.randint(self.seqs.shape[0], (n,), generator=g).to(self.seqs.device)
        span = (self.L - self.k - self.plens[rows]).clamp(min=1)
        u = torch.rand(n, generator=g, dtype=torch.float64).to(self.seqs.device)
        t = self.plens[rows] + (u * span).long()
        return self.take(rows, t)

    def all(self):
        """Every anchor, in order (for evaluation)."""
        rows, ts = [], []
        for r in range(self.seqs.shape[0]):
            p = int(self.plens[r])
            t = torch.arange(p, self.L - self.k, device=self.seqs.device)
            rows.append(torch.full_like(t, r))
            ts.append(t)
        return torch.cat(rows), torch.cat(ts)


def lr_at(step, args, total):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train(drafter, target, data, args, total_steps=None, deadline=None):
    decay, no_decay = [], []
    for p in drafter.parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    k = args.block
    w = torch.tensor([args.pos_decay ** j for j in range(k)], device="cuda")
    w = w / w.sum()
    g = torch.Generator().manual_seed(args.seed + 11)
    hist = {"step": [], "loss": [], "ce": [], "bce": [], "ce_pos": [], "acc_pos": []}
    step, t_start, planned = 0, None, total_steps
    acc_bce, acc_n, acc_pos, acc_acc = 0.0, 0, torch.zeros(k, device="cuda"), torch.zeros(k, device="cuda")
    while True:
        if planned is not None and step >= planned:
            break
        if step == args.measure_steps and planned is None:
            torch.cuda.synchronize()
            per = (time.time() - t_start) / (args.measure_steps - 1)
            left = deadline - time.time()
            planned = max(step + 1, step + int(left / per))
            log(f"  {per * 1000:.1f} ms/step: {planned} steps")
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args, planned or 10**9)
        feats, last, labels = data.sample(g, args.batch)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits, z = drafter.teacher_forced(target, feats, last, labels)
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
                             reduction="none").view(labels.shape)
        acc = (logits.argmax(-1) == labels).float()
        bce = F.binary_cross_entropy_with_logits(z.float(), acc, reduction="none")
        loss = (ce * w).sum(1).mean() + args.conf_weight * bce.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        if step == 1:
            torch.cuda.synchronize()
            t_start = time.time()
        with torch.no_grad():
            acc_pos += ce.mean(0).detach()
            acc_acc += acc.mean(0)
            acc_n += 1
            acc_bce += bce.mean().detach()
        if (step + 1) % args.log_every == 0 or (planned is not None and step + 1 == planned):
            n = acc_n
            hist["step"].append(step + 1)
            cep = (acc_pos / n).tolist()
            hist["ce_pos"].append([round(x, 4) for x in cep])
            hist["acc_pos"].append([round(x, 4) for x in (acc_acc / n).tolist()])
            hist["ce"].append(round(sum(c * float(wi) for c, wi in zip(cep, w)), 4))
            hist["bce"].append(round(float(acc_bce) / n, 4))
            hist["loss"].append(round(hist["ce"][-1] + args.conf_weight * hist["bce"][-1], 4))
            acc_pos.zero_()
            acc_acc.zero_()
            acc_bce, acc_n = 0.0, 0
            if len(hist["step"]) % 10 == 1:
                log(f"  step {step + 1}: ce {hist['ce'][-1]:.4f} bce {hist['bce'][-1]:.4f} "
                    f"acc/pos {hist['acc_pos'][-1]}")
        step += 1
    torch.cuda.synchronize()
    hist["steps"] = step
    hist["seconds"] = round(time.time() - t_start, 2) if t_start else 0.0
    return hist


@torch.no_grad()
def round_bf16(drafter):
    for p in drafter.parameters():
        p.copy_(p.bfloat16().float())


# ---------------------------------------------------------------- evaluation


@torch.no_grad()
def run_drafts(drafter, target, data, chunk=8192):
    """Drafts, confidence logits and margins of every anchor of data, and the labels."""
    rows, ts = data.all()
    out = {"tok": [], "z": [], "margin": [], "labels": []}
    for i in range(0, rows.numel(), chunk):
        feats, last, labels = data.take(rows[i:i + chunk], ts[i:i + chunk])
        tok, z, m = drafter.draft(target, feats, last)
        out["tok"].append(tok)
        out["z"].append(z)
        out["margin"].append(m)
        out["labels"].append(labels)
    return {k: torch.cat(v) for k, v in out.items()}


def realistic(d):
    """hit [N, k]: draft j equals the label; live [N, k]: drafts 0..j-1 were all accepted
    (the positions confidence gating ever looks at)."""
    hit = (d["tok"] == d["labels"]).float()
    live = torch.cat([torch.ones_like(hit[:, :1]), torch.cumprod(hit, 1)[:, :-1]], 1)
    return hit, live


def fit_platt(z, y, iters=200):
    """scale, bias minimising the binary cross-entropy of sigmoid(scale*z + bias) against y."""
    a = torch.ones((), device=z.device, requires_grad=True)
    b = torch.zeros((), device=z.device, requires_grad=True)
    opt = torch.optim.LBFGS([a, b], lr=0.5, max_iter=iters, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(a * z + b, y)
        loss.backward()
        return loss

    opt.step(closure)
    return float(a.detach()), float(b.detach())


def reliability(p, y, bins=10):
    """The 10-bin reliability table of predicted p against outcomes y, and the ECE."""
    rows, ece, n = [], 0.0, p.numel()
    for i in range(bins):
        lo, hi = i / bins, (i + 1) / bins
        m = (p >= lo) & ((p < hi) if i < bins - 1 else (p <= hi))
        c = int(m.sum())
        if c == 0:
            rows.append({"bin": [lo, hi], "count": 0})
            continue
        pm, ym = float(p[m].mean()), float(y[m].mean())
        ece += c / n * abs(pm - ym)
        rows.append({"bin": [lo, hi], "count": c, "predicted": round(pm, 4), "measured": round(ym, 4)})
    return rows, ece


def evaluate(d, scale, bias, k):
    hit, live = realistic(d)
    p = torch.sigmoid(scale * d["z"] + bias)
    cum = torch.cumprod(hit, 1)
    m = live.bool()
    table, ece = reliability(p[m], hit[m])
    res = {
        "anchors": int(hit.shape[0]),
        "acceptance_given_previous": [round(float(hit[:, j][live[:, j].bool()].mean()), 4) for j in range(k)],
        "acceptance_cumulative": [round(float(cum[:, j].mean()), 4) for j in range(k)],
        "mean_accepted_length_ungated": round(1 + float(cum.sum(1).mean()), 4),
        "reliability": table,
        "ece": round(ece, 4),
        "predictions": int(m.sum()),
    }
    # What gating would verify: the longest prefix whose cumulative confidence clears c.
    gates = []
    cp = torch.cumprod(p, 1)  # non-increasing: (cp >= c) is a prefix
    ar = torch.arange(k, device=cp.device)[None]
    for c in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
        n = (cp >= c).float().sum(1)
        acc = (cum * (ar < n[:, None]).float()).sum(1)
        gates.append({"threshold": c, "verified_per_step": round(float(n.mean()), 4),
                      "accepted_per_step": round(float(acc.mean()), 4),
                      "accepted_per_verified": round(float(acc.sum() / n.sum().clamp(min=1)), 4)})
    res["gating"] = gates
    return res


def committed_prompts(path, device):
    """The 20 prompts (32 ids) and 64 greedy tokens transformers produced for
    testdata/deepseek-tiny/reference.json."""
    with open(path) as f:
        ref = json.load(f)
    ps = ref["greedy"]["prompts"]
    seqs = torch.tensor([p["ids"] + p["greedy"] for p in ps], device=device)
    return seqs, len(ps[0]["ids"])


# ---------------------------------------------------------------- export


def export(drafter, cfg, out):
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    tensors = {}
    for name, p in drafter.tensors().items():
        t = p.detach().float().cpu().contiguous()
        tensors[name] = t if name == "confidence.fc2.bias" else t.to(torch.bfloat16)
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    return sum(t.numel() for t in tensors.values())


def plot(hist, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        log(f"  no loss curve PNG here ({e}): train_log.json holds the curve")
        return False
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    ax[0].plot(hist["step"], hist["ce"], label="cross-entropy (position-weighted)")
    ax[0].plot(hist["step"], hist["bce"], label="confidence BCE")
    ax[0].set_xlabel("step")
    ax[0].set_yscale("log")
    ax[0].legend()
    ax[0].set_title("DSpark drafter training loss")
    acc = list(zip(*hist["acc_pos"]))
    for j, a in enumerate(acc):
        ax[1].plot(hist["step"], a, label=f"position {j + 1}")
    ax[1].set_xlabel("step")
    ax[1].set_title("teacher-forced top-1 accuracy per position")
    ax[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


# ---------------------------------------------------------------- the run


def run(args):
    import transformers
    from tokenizers import Tokenizer

    device = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(args.seed)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "gpu": torch.cuda.get_device_name(0)}
    log(f"versions {versions}")
    target = load_target(args.target, device)
    impl = pick_decode_experts(target, device)
    log(f"target: {type(target).__name__}, {target.config.num_hidden_layers} layers, decode experts {impl}")
    taps = Taps(target, [int(x) for x in args.target_layers.split(",")])
    tok = Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))
    train_docs = read_jsonl_gz(os.path.join(args.corpus, "train.jsonl.gz"))
    held_docs = read_jsonl_gz(os.path.join(args.corpus, "heldout.jsonl.gz"))
    stream = token_stream(tok, train_docs, device)
    held_stream = token_stream(tok, held_docs, device)
    log(f"corpus: {stream.numel()} training tokens, {held_stream.numel()} held-out tokens")
    # Per source kind (Go files, book chunks): the held-out evaluation reports each, and
    # --book-share draws the training windows from the books with that probability a batch
    # (without it, windows are uniform over all training tokens: mostly Go).
    def kind(d):
        return "books" if d["src"].startswith("book") else "go"
    held_by_kind = {k: token_stream(tok, [d for d in held_docs if kind(d) == k], device) for k in ("go", "books")}
    gen_stream = stream
    if args.book_share is not None:
        if not 0 <= args.book_share <= 1:
            raise ValueError(f"--book-share must be in [0, 1], got {args.book_share}")
        by_kind = {k: token_stream(tok, [d for d in train_docs if kind(d) == k], device) for k in ("books", "go")}
        gen_stream = [(by_kind["books"], args.book_share), (by_kind["go"], 1 - args.book_share)]
        log(f"  windows: books {args.book_share} ({by_kind['books'].numel()} tokens), "
            f"go {1 - args.book_share} ({by_kind['go'].numel()} tokens)")
    committed, committed_plen = committed_prompts(args.reference, device)

    # Cached greedy equals uncached argmax (the labels are the target's greedy tokens).
    g0 = torch.Generator().manual_seed(3)
    p0 = random_prompts(stream, g0, 8, 16)
    s0 = greedy_sequences(target, p0, 24)
    full = target(input_ids=s0[:, :-1], use_cache=False).logits[:, 15:].argmax(-1)
    log(f"  cached vs uncached greedy: {int((full != s0[:, 16:]).sum())} of {full.numel()} differ")
    # The committed greedy continuations come back from this target.
    c_re = greedy_sequences(target, committed[:, :committed_plen], committed.shape[1] - committed_plen)
    log(f"  committed greedy tokens reproduced: {int((c_re == committed).sum())} of {committed.numel()}")

    def one(a, seconds_gen, max_batches, gen_batch, deadline_s, out_dir, steps=None):
        g = torch.Generator().manual_seed(a.seed)
        prompt_lens = [int(x) for x in a.prompt_lens.split(",")]
        seqs, feats, plens, gen_s = generate_data(target, taps, gen_stream, a, g, seconds_gen, max_batches,
                                                  a.total_len, prompt_lens, gen_batch)
        n_cal = max(1, int(seqs.shape[0] * 0.05))
        train_set = Anchors(seqs[n_cal:], feats[n_cal:], plens[n_cal:], a.block)
        cal_set = Anchors(seqs[:n_cal], feats[:n_cal], plens[:n_cal], a.block)
        log(f"  data: {seqs.shape[0]} greedy sequences of {a.total_len} tokens in {gen_s:.1f}s, "
            f"{train_set.count()} training anchors, {cal_set.count()} calibration anchors")
        cfg = drafter_config(a, target.config)
        torch.manual_seed(a.seed + 5)
        drafter = DSpark(cfg).to(device)
        n_params = sum(p.numel() for p in drafter.parameters())
        log(f"  drafter: {n_params} parameters")
        hist = train(drafter, target, train_set, a, total_steps=steps,
                     deadline=None if steps else time.time() + deadline_s)
        log(f"  trained {hist['steps']} steps in {hist['seconds']}s, final ce {hist['ce'][-1]}, bce {hist['bce'][-1]}")
        round_bf16(drafter)
        drafter.eval()
        cal = run_drafts(drafter, target, cal_set)
        hit, live = realistic(cal)
        m = live.bool()
        scale, bias = fit_platt(cal["z"][m], hit[m])
        cfg["confidence_scale"], cfg["confidence_bias"] = round(scale, 6), round(bias, 6)
        log(f"  Platt scaling: scale {scale:.4f} bias {bias:.4f}")
        ev = {"calibration_split": evaluate(cal, scale, bias, a.block)}
        # Held-out: greedy continuations of held-out corpus windows.
        gh = torch.Generator().manual_seed(a.seed + 99)
        hs, hf, hp, _ = generate_data(target, taps, held_stream, a, gh, 0, a.heldout_batches, 96 + 32, [32],
                                      a.heldout_batch)
        ev["heldout"] = evaluate(run_drafts(drafter, target, Anchors(hs, hf, hp, a.block)), scale, bias, a.block)
        for k, st in held_by_kind.items():
            gk = torch.Generator().manual_seed(a.seed + 99)
            ks, kf, kp, _ = generate_data(target, taps, st, a, gk, 0, a.heldout_batches, 96 + 32, [32],
                                          a.heldout_batch)
            ev["heldout_" + k] = evaluate(run_drafts(drafter, target, Anchors(ks, kf, kp, a.block)), scale, bias,
                                          a.block)
        cf = hidden_of(target, taps, committed)
        cd_set = Anchors(committed, cf, torch.full((committed.shape[0],), committed_plen, device=device), a.block)
        cd = run_drafts(drafter, target, cd_set)
        ev["committed_prompts"] = evaluate(cd, scale, bias, a.block)
        for name, e in ev.items():
            log(f"  {name}: acceptance {e['acceptance_given_previous']}, mean accepted length "
                f"{e['mean_accepted_length_ungated']}, ECE {e['ece']} over {e['predictions']}")
        n_stored = export(drafter, cfg, out_dir)
        rows, ts = cd_set.all()
        per = ts.numel() // committed.shape[0]
        ref = {"target": "assets/deepseek-tiny", "prompts_from": "testdata/deepseek-tiny/reference.json greedy",
               "compute": "torch float32 (TF32 off), the bf16 weights of model.safetensors upcast",
               "prompt_tokens": committed_plen, "block_size": a.block,
               "confidence_scale": cfg["confidence_scale"], "confidence_bias": cfg["confidence_bias"],
               "anchors": []}
        for i in range(min(4, committed.shape[0])):
            for j in range(per):
                r = i * per + j
                ref["anchors"].append({"prompt": i, "anchor": int(ts[r]),
                                       "drafts": cd["tok"][r].tolist(),
                                       "z": [round(float(x), 5) for x in cd["z"][r]],
                                       "margins": [round(float(x), 5) for x in cd["margin"][r]]})
        return cfg, hist, ev, ref, n_stored, n_params, {"sequences": int(seqs.shape[0]), "seconds": round(gen_s, 1),
                                                         "train_anchors": train_set.count(),
                                                         "calibration_anchors": cal_set.count()}

    if not args.no_smoke:
        t = time.time()
        log("== smoke")
        s = argparse.Namespace(**vars(args))
        s.batch, s.measure_steps, s.log_every, s.total_len, s.heldout_batches, s.heldout_batch = 64, 3, 2, 48, 1, 8
        s.prompt_lens = "8,16"
        d = tempfile.mkdtemp()
        cfg, hist, ev, ref, *_ = one(s, 0, 1, 16, 0, d, steps=6)
        # The export reloads and drafts the same tokens.
        from safetensors.torch import load_file
        loaded = load_file(os.path.join(d, "model.safetensors"))
        if sorted(loaded) != sorted(DSpark(cfg).tensors()):
            raise RuntimeError("smoke: exported tensor names differ")
        json.dumps([cfg, hist, ev, ref])
        log(f"== smoke passed in {time.time() - t:.1f}s")

    log("== data + train")
    cfg, hist, ev, ref, n_stored, n_params, data = one(args, args.gen_seconds, 10**6, args.gen_batch,
                                                       args.train_seconds, args.out, steps=args.steps)
    recorded = {k: v for k, v in vars(args).items()}
    recorded["out"] = "$OUT"
    for k in ("corpus", "target", "reference"):
        if os.path.isabs(recorded[k]):
            recorded[k] = os.path.relpath(recorded[k], ROOT)
    train_log = {"versions": versions, "args": recorded, "config": cfg, "data": data, "experts": impl,
                 "params": n_params, "params_stored": n_stored, "hist": hist, "eval": ev,
                 "seconds_total": round(time.time() - T0, 1)}
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(train_log, f, indent=1)
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    plot(hist, os.path.join(args.out, "loss.png"))
    log(f"== done: {sorted(os.listdir(args.out))}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=os.path.join(ROOT, ".train", "corpus"))
    p.add_argument("--target", default=os.path.join(ROOT, "assets", "deepseek-tiny"))
    p.add_argument("--reference", default=os.path.join(ROOT, "testdata", "deepseek-tiny", "reference.json"))
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--target-layers", default="5", help="target decoder layers whose outputs condition the drafter")
    p.add_argument("--block", type=int, default=6, help="block size k")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--markov-rank", type=int, default=128)
    p.add_argument("--conf-hidden", type=int, default=128)
    p.add_argument("--gen-seconds", type=float, default=150)
    p.add_argument("--gen-batch", type=int, default=1024)
    p.add_argument("--total-len", type=int, default=256)
    p.add_argument("--prompt-lens", default="8,16,32,64,128")
    p.add_argument("--book-share", type=float,
                   help="draw each generation batch's windows from the book chunks with this probability, "
                        "else from the Go files (default: uniform over all training tokens, about 84%% Go)")
    p.add_argument("--train-seconds", type=float, default=200)
    p.add_argument("--steps", type=int, help="fix the step count instead of timing it")
    p.add_argument("--measure-steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--pos-decay", type=float, default=0.8)
    p.add_argument("--conf-weight", type=float, default=0.5)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--heldout-batches", type=int, default=1)
    p.add_argument("--heldout-batch", type=int, default=512)
    p.add_argument("--no-smoke", action="store_true")
    args = p.parse_args()
    try:
        run(args)
    except Exception:
        traceback.print_exc()
        sys.exit(1)


if __name__ == "__main__":
    main()
