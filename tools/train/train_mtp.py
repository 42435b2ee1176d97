#!/usr/bin/env python3
"""Fine-tunes the MTP layer of the shipped default model (assets/deepseek-tiny) by
self-distillation, chained as the engine chains it, on the GPU machine.

The MTP layer that tools/train/train.py trains learns the corpus's token t+2. As a
drafter it is judged on something else: whether its argmax equals the target's own
greedy token at t+2 after the target's own greedy token at t+1, and, for k > 1,
whether it still does when it is fed its own output (the engine chains drafts 2..k
through the same layer with the layer's output as the hidden state, as vLLM and
SGLang do). This script trains it for that:

  data     greedy continuations of random training-corpus windows by the target
           (float32, TF32 off, argmax, EOS ignored), as tools/train/train_dspark.py
           makes them; --book-fraction of the batches take their windows from the
           corpus's books, the rest from its Go source (books are 16% of the corpus's
           bytes; a negative fraction draws from the whole corpus as one stream);
  passes   depth 1 is the MTP layer over every position i: the target's hidden
           state at i (before the final norm) and the token at i+1, RoPE position i,
           causal attention. Depth d > 1 at anchor i (RoPE position i + d - 1) takes
           depth d-1's output at i and the token at i + d, and attends to depth 1's
           keys at positions <= i and to depths 2..d's rows of the same anchor: the
           keys the engine's MTP cache holds when it chains (its first pass wrote
           every position, its chain writes the lookahead slots). One call of the
           decoder layer per depth over the depths so far, with that mask;
  loss     per depth, the cross-entropy against the target's distribution of the
           token the depth predicts (soft labels, temperature 1), at the anchors
           whose token at i+1 the target generated; depth d weighted
           --depth-decay^(d-1). The shared embedding and head stay frozen (the
           export's copies must equal the main model's); everything else of the
           layer trains, starting from the shipped weights;
  eval     on greedy continuations of held-out windows, Go and books apart (half
           of --heldout each): per depth, the share of anchors whose draft equals
           the target's greedy token given every earlier draft accepted, and the
           mean accepted length at k = 1..depths, before and after; the
           held-out-sample MTP figures of reference.json ("mtp"), as train.py
           computes them, after.
  export   OUT/model.safetensors: the shipped file with the MTP layer's trained
           tensors replaced (bf16; every other tensor byte for byte), cut into
           15 MiB pieces (model.safetensors.part<i>, cat them in order);
           OUT/train_mtp.json: arguments, data, the loss curve, the evaluations.

Usage (repository root, GPU machine, the corpus of tools/train/make_corpus.py carried):
  python3 tools/train/train_mtp.py --corpus .train/corpus --out $OUT
"""
import argparse
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
# train_dspark first: it sets the environment (cuBLAS workspace, offline hub)
# before torch is imported, and its helpers make the greedy data.
import train_dspark as td  # noqa: E402
import make_fixtures as mf  # noqa: E402
import train as tr  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

T0 = time.time()
PIECE = 15 << 20


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


class ChainedMTP(nn.Module):
    """The shipped MTP layer: its decoder layer (as transformers loads it) and its
    extras; the embedding and head are frozen buffers."""

    def __init__(self, block, extras, eps, rotary):
        super().__init__()
        self.block = block
        self.eps = eps
        self.rotary = rotary
        self.enorm = nn.Parameter(extras["enorm.weight"].float().clone())
        self.hnorm = nn.Parameter(extras["hnorm.weight"].float().clone())
        self.eh_proj = nn.Parameter(extras["eh_proj.weight"].float().clone())
        self.head_norm = nn.Parameter(extras["shared_head.norm.weight"].float().clone())
        self.register_buffer("embed", extras["embed_tokens.weight"].float().clone())
        self.register_buffer("head", extras["shared_head.head.weight"].float().clone())

    def inputs(self, hidden, ids):
        e = F.embedding(ids, self.embed)
        z = torch.cat([mf.rms_norm(e, self.enorm, self.eps), mf.rms_norm(hidden, self.hnorm, self.eps)], -1)
        return z @ self.eh_proj.t()

    def logits(self, y):
        return mf.rms_norm(y, self.head_norm, self.eps) @ self.head.t()

    def forward(self, hidden, seq, depths, masks):
        """Outputs of depths 1..depths at every anchor: a list of [B, L, H]."""
        B, L = seq.shape
        ar = torch.arange(L, device=seq.device)
        zs, outs, prev = [], [], hidden
        for d in range(1, depths + 1):
            tok = seq[:, (ar + d).clamp(max=L - 1)]
            zs.append(self.inputs(prev, tok))
            x = torch.cat(zs, 1)
            pos = torch.cat([ar + j for j in range(d)])[None]
            pe = self.rotary(x, pos)
            y = self.block(x, attention_mask=masks[d - 1], position_ids=pos, position_embeddings=pe)
            if isinstance(y, tuple):
                y = y[0]
            prev = y[:, (d - 1) * L:]
            outs.append(prev)
        return outs

    def trained(self, n):
        """The trained tensors under the checkpoint's names (float32, CPU)."""
        p = f"model.layers.{n}."
        out = {p + k: v.detach().float().cpu() for k, v in self.block.state_dict().items()}
        out = mf.unfuse_experts(out, self.eh_proj.shape[0])
        out[p + "enorm.weight"] = self.enorm.detach().float().cpu()
        out[p + "hnorm.weight"] = self.hnorm.detach().float().cpu()
        out[p + "eh_proj.weight"] = self.eh_proj.detach().float().cpu()
        out[p + "shared_head.norm.weight"] = self.head_norm.detach().float().cpu()
        return out


def chain_masks(depths, L, device):
    """masks[d-1]: [1, 1, dL, dL] bool (True: attend) for the pass of depth d."""
    i = torch.arange(L, device=device)
    causal = i[None, :] <= i[:, None]
    eye = torch.eye(L, dtype=torch.bool, device=device)
    out = []
    for d in range(1, depths + 1):
        m = torch.zeros(d * L, d * L, dtype=torch.bool, device=device)
        for a in range(d):
            m[a * L:(a + 1) * L, :L] = causal
            for b in range(1, a + 1):
                m[a * L:(a + 1) * L, b * L:(b + 1) * L] = eye
        out.append(m[None, None])
    return out


class TargetPass:
    """The target's pre-norm hidden states and logits of a batch of sequences."""

    def __init__(self, target):
        self.target = target
        self.h = None
        target.model.norm.register_forward_pre_hook(self._hook)

    def _hook(self, mod, args):
        self.h = args[0]

    @torch.no_grad()
    def __call__(self, seq):
        td.set_experts(self.target, "eager")
        logits = self.target(input_ids=seq, use_cache=False).logits.float()
        return self.h.float(), logits


def load_block(d, n, device):
    """The checkpoint read as num_hidden_layers + 1 layers: the last one is the MTP layer's
    decoder layer, SDPA attention (it takes the chain's boolean masks)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    big, info = mf.call_with_optional(
        AutoModelForCausalLM.from_pretrained, (d,),
        dict(dtype=torch.float32, attn_implementation="sdpa", num_hidden_layers=n + 1,
             num_nextn_predict_layers=0, output_loading_info=True),
        ["dtype", "num_nextn_predict_layers"])
    missing = [k for k in mf.loading_info_get(info, "missing_keys") if f"layers.{n}." in k]
    if missing:
        raise RuntimeError(f"MTP layer not in the checkpoint: {missing[:6]}")
    block = big.model.layers[n].float().to(device)
    rotary = big.model.rotary_emb.to(device)
    stored = load_file(os.path.join(d, "model.safetensors"))
    extras = {k: stored[f"model.layers.{n}.{k}"].to(device) for k in mf.MTP_EXTRAS}
    return block, rotary, extras, stored


def is_book(doc):
    """Whether a corpus document is a book's (tools/train/make_corpus.py's src "book:NAME")."""
    return doc["src"].startswith("book")


def valid_anchors(plens, L, depth):
    """[B, L] bool: anchor i drafts at this depth in a real step (the token at i+1 was
    generated) and the depth's label exists (i + depth <= L - 1)."""
    i = torch.arange(L, device=plens.device)[None]
    return (i + 1 >= plens[:, None]) & (i + depth <= L - 1)


@torch.no_grad()
def evaluate(mtp, tpass, seqs, plens, depths, masks, chunk=64):
    """Acceptance per depth along greedy sequences (teacher-forced chain = the engine's
    greedy verification: a depth's input token is the accepted draft)."""
    L = seqs.shape[1]
    hits, live = [], None
    for s in range(0, seqs.shape[0], chunk):
        seq, pl = seqs[s:s + chunk], plens[s:s + chunk]
        h, logits = tpass(seq)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            outs = mtp(h, seq, depths, masks)
        ar = torch.arange(L, device=seq.device)
        hd = []
        for d, y in enumerate(outs, 1):
            label = logits[:, (ar + d).clamp(max=L - 1)].argmax(-1)
            hd.append(mtp.logits(y.float()).argmax(-1) == label)
        ok = valid_anchors(pl, L, depths)
        hits.append(torch.stack(hd, -1)[ok])
    hit = torch.cat(hits).float()
    cum = torch.cumprod(hit, 1)
    given = []
    for d in range(depths):
        prev = cum[:, d - 1] if d else torch.ones_like(hit[:, 0])
        given.append(round(float((hit[:, d] * prev).sum() / prev.sum().clamp(min=1)), 4))
    return {
        "anchors": int(hit.shape[0]),
        "acceptance_given_previous": given,
        "acceptance_cumulative": [round(float(cum[:, d].mean()), 4) for d in range(depths)],
        "mean_accepted_length": [round(1 + float(cum[:, :k].sum(1).mean()), 4) for k in range(1, depths + 1)],
    }


def make_data(target, streams, g, seconds, max_seqs, total_len, prompt_lens, batch):
    """Greedy sequences from random windows; streams is one token stream, or a list of
    (stream, share) from which each batch draws its windows by share."""
    if not isinstance(streams, list):
        streams = [(streams, 1.0)]
    shares = torch.tensor([w for _, w in streams], dtype=torch.float64)
    seqs, plens = [], []
    t = time.time()
    n = 0
    while n < max_seqs and (time.time() - t < seconds or not seqs):
        plen = prompt_lens[int(torch.randint(len(prompt_lens), (1,), generator=g))]
        stream = streams[int(torch.multinomial(shares, 1, generator=g))][0]
        p = td.random_prompts(stream, g, batch, plen)
        seqs.append(td.greedy_sequences(target, p, total_len - plen))
        plens.append(torch.full((batch,), plen, dtype=torch.int64, device=p.device))
        n += batch
    torch.cuda.synchronize()
    return torch.cat(seqs), torch.cat(plens), time.time() - t


def train(mtp, tpass, seqs, plens, args, masks, deadline=None, steps=None):
    params = [p for p in mtp.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    w = [args.depth_decay ** d for d in range(args.depths)]
    g = torch.Generator().manual_seed(args.seed + 11)
    L = seqs.shape[1]
    hist = {"step": [], "loss": [], "ce_depth": []}
    step, t_start, planned = 0, None, steps
    if steps is not None:
        deadline = None
    acc = torch.zeros(args.depths, device="cuda")
    acc_n = 0
    mtp.train()
    while planned is None or step < planned:
        if deadline is not None and step >= args.measure_steps and step % args.measure_steps == 0:
            # (Re)plan from the rate so far: the first steps' rate can be off
            # by a third on a shared machine, and the deadline must hold.
            torch.cuda.synchronize()
            per = (time.time() - t_start) / (step - 1)
            was = planned
            planned = max(step + 1, step + int((deadline - time.time()) / per))
            if was is None:
                log(f"  {per * 1000:.1f} ms/step: {planned} steps")
        lr_total = planned or 10**9
        for group in opt.param_groups:
            group["lr"] = td.lr_at(step, args, lr_total)
        rows = torch.randint(seqs.shape[0], (args.batch,), generator=g).to(seqs.device)
        seq, pl = seqs[rows], plens[rows]
        h, logits = tpass(seq)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            outs = mtp(h, seq, args.depths, masks)
        ar = torch.arange(L, device=seq.device)
        loss = 0.0
        ces = []
        for d, y in enumerate(outs, 1):
            ok = valid_anchors(pl, L, d)
            p = torch.softmax(logits[:, (ar + d).clamp(max=L - 1)][ok], -1)
            lq = torch.log_softmax(mtp.logits(y[ok].float()), -1)
            ce = -(p * lq).sum(-1).mean()
            ces.append(ce.detach())
            loss = loss + w[d - 1] * ce
        loss = loss / sum(w)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step == 1:
            torch.cuda.synchronize()
            t_start = time.time()
        acc += torch.stack(ces)
        acc_n += 1
        if (step + 1) % args.log_every == 0 or (planned is not None and step + 1 == planned):
            c = (acc / acc_n).tolist()
            hist["step"].append(step + 1)
            hist["ce_depth"].append([round(x, 4) for x in c])
            hist["loss"].append(round(sum(x * wi for x, wi in zip(c, w)) / sum(w), 4))
            acc.zero_()
            acc_n = 0
            if len(hist["step"]) % 5 == 1:
                log(f"  step {step + 1}: loss {hist['loss'][-1]:.4f} ce/depth {hist['ce_depth'][-1]}")
        step += 1
    torch.cuda.synchronize()
    mtp.eval()
    hist["steps"] = step
    hist["seconds"] = round(time.time() - t_start, 2) if t_start else 0.0
    return hist


@torch.no_grad()
def round_bf16(mtp):
    for name, p in mtp.named_parameters():
        if not mf.keep_f32(name):
            p.copy_(p.bfloat16().float())


def export(stored, trained, out):
    """The shipped tensors with the trained ones replaced, in the stored dtypes, cut into
    pieces; returns the replaced names."""
    from safetensors.torch import save_file

    new = dict(stored)
    for k, v in trained.items():
        if k not in stored:
            raise RuntimeError(f"trained tensor {k} is not in the checkpoint")
        if tuple(v.shape) != tuple(stored[k].shape):
            raise RuntimeError(f"{k}: trained shape {tuple(v.shape)}, stored {tuple(stored[k].shape)}")
        new[k] = v.to(stored[k].dtype).contiguous()
    path = os.path.join(out, "model.safetensors")
    save_file({k: v.cpu().contiguous() for k, v in new.items()}, path, metadata={"format": "pt"})
    with open(path, "rb") as f:
        data = f.read()
    os.remove(path)
    for i in range(0, len(data), PIECE):
        with open(f"{path}.part{i // PIECE}", "wb") as f:
            f.write(data[i:i + PIECE])
    changed = sorted(k for k in trained if not torch.equal(new[k].cpu(), stored[k].cpu()))
    log(f"  exported {len(new)} tensors, {len(data)} bytes, {len(changed)} changed")
    return changed


def run(args):
    from tokenizers import Tokenizer

    device = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    target = td.load_target(args.target, device)
    td.pick_decode_experts(target, device)
    n = target.config.num_hidden_layers
    eps = target.config.rms_norm_eps
    block, rotary, extras, stored = load_block(args.target, n, device)
    if not torch.equal(extras["embed_tokens.weight"].float(), target.model.embed_tokens.weight.float()):
        raise RuntimeError("the MTP layer's embedding is not the main model's")
    mtp = ChainedMTP(block, extras, eps, rotary).to(device)
    tpass = TargetPass(target)
    tok = Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))
    train_docs = td.read_jsonl_gz(os.path.join(args.corpus, "train.jsonl.gz"))
    held_docs = td.read_jsonl_gz(os.path.join(args.corpus, "heldout.jsonl.gz"))
    stream = td.token_stream(tok, train_docs, device)
    by_src = {src: (td.token_stream(tok, [d for d in train_docs if is_book(d) == book], device),
                    td.token_stream(tok, [d for d in held_docs if is_book(d) == book], device))
              for src, book in (("go", False), ("book", True))}
    if args.book_fraction < 0:
        sources = stream
    else:
        sources = [(by_src["book"][0], args.book_fraction), (by_src["go"][0], 1 - args.book_fraction)]
    log(f"target {n} layers; corpus {stream.numel()} training tokens "
        f"({by_src['book'][0].numel()} in books), held out: "
        f"{by_src['go'][1].numel()} Go, {by_src['book'][1].numel()} books; "
        f"MTP layer {sum(p.numel() for p in mtp.parameters() if p.requires_grad)} trainable parameters")
    prompt_lens = [int(x) for x in args.prompt_lens.split(",")]
    L = args.total_len
    masks = chain_masks(args.depths, L, device)

    # Smoke: every step on a little data, so an API mismatch fails in seconds.
    g = torch.Generator().manual_seed(args.seed)
    s_seqs, s_pl, _ = make_data(target, stream, g, 0, 8, L, prompt_lens, 8)
    evaluate(mtp, tpass, s_seqs, s_pl, args.depths, masks)
    saved = {k: v.detach().clone() for k, v in mtp.state_dict().items()}
    train(mtp, tpass, s_seqs, s_pl, argparse.Namespace(**{**vars(args), "batch": 4}), masks, steps=2)
    mtp.load_state_dict(saved)
    unknown = [k for k in mtp.trained(n) if k not in stored]
    if unknown:
        raise RuntimeError(f"tensors the export would write are not in the checkpoint: {unknown[:6]}")
    log("smoke passed")

    hg = torch.Generator().manual_seed(args.seed + 99)
    held = {}
    for src in ("go", "book"):
        hs, hp, _ = make_data(target, by_src[src][1], hg, 0, args.heldout // 2, L, prompt_lens, args.heldout // 2)
        held[src] = (hs, hp)

    def evaluate_held():
        return {src: evaluate(mtp, tpass, hs, hp, args.depths, masks) for src, (hs, hp) in held.items()}

    before = evaluate_held()
    log(f"held out, shipped layer: {before}")
    seqs, plens, gen_s = make_data(target, sources, g, args.gen_seconds, 10**9, L, prompt_lens, args.gen_batch)
    log(f"data: {seqs.shape[0]} greedy sequences of {L} tokens in {gen_s:.1f}s")
    seen = evaluate(mtp, tpass, seqs[:512], plens[:512], args.depths, masks)
    hist = train(mtp, tpass, seqs, plens, args, masks, deadline=time.time() + args.train_seconds, steps=args.steps)
    log(f"trained {hist['steps']} steps in {hist['seconds']}s")
    round_bf16(mtp)
    after = evaluate_held()
    log(f"held out, trained layer (bf16): {after}")

    # reference.json's "mtp" figures, as train.py computes them, for the new layer.
    ref_mtp = None
    if args.sample and os.path.exists(args.sample):
        with open(args.sample, encoding="utf-8") as f:
            ids = tok.encode(f.read(), add_special_tokens=False).ids
        ex = {"enorm.weight": mtp.enorm, "hnorm.weight": mtp.hnorm, "eh_proj.weight": mtp.eh_proj,
              "shared_head.norm.weight": mtp.head_norm, "shared_head.head.weight": mtp.head,
              "embed_tokens.weight": mtp.embed}
        with torch.no_grad():
            ref_mtp = tr.mtp_eval(target, mtp.block, {k: v.detach().float() for k, v in ex.items()},
                                  tr.windows(ids, 256), device, eps)
        log(f"held-out sample (reference.json mtp): {ref_mtp}")
    changed = export(stored, mtp.trained(n), args.out)
    import transformers

    def rel(v):
        return os.path.relpath(v, ROOT) if isinstance(v, str) and os.path.isabs(v) else v

    result = {
        "args": {k: ("OUT" if k == "out" else rel(v)) for k, v in vars(args).items()},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "gpu": torch.cuda.get_device_name(0)},
        "data": {"sequences": int(seqs.shape[0]), "tokens_each": L, "generation_seconds": round(gen_s, 1),
                 "heldout_sequences": {src: int(hs.shape[0]) for src, (hs, _) in held.items()},
                 "book_fraction": args.book_fraction},
        "train": hist,
        "heldout_before": before,
        "heldout_after": after,
        "train_split_before": seen,
        "reference_mtp": ref_mtp,
        "changed_tensors": len(changed),
    }
    with open(os.path.join(args.out, "train_mtp.json"), "w") as f:
        json.dump(result, f, indent=1)
    for src in held:
        log("mean accepted length k=1..%d, held-out %s: before %s, after %s" % (
            args.depths, src, before[src]["mean_accepted_length"], after[src]["mean_accepted_length"]))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=os.path.join(ROOT, ".train", "corpus"))
    p.add_argument("--target", default=os.path.join(ROOT, "assets", "deepseek-tiny"))
    p.add_argument("--sample", default=os.path.join(ROOT, "testdata", "deepseek-tiny", "heldout_sample.txt"),
                   help="held-out sample for reference.json's mtp figures (skipped when absent)")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=4321)
    p.add_argument("--depths", type=int, default=3, help="chain depths trained and evaluated")
    p.add_argument("--depth-decay", type=float, default=0.7)
    p.add_argument("--gen-seconds", type=float, default=90)
    p.add_argument("--gen-batch", type=int, default=1024)
    p.add_argument("--heldout", type=int, default=512, help="held-out greedy sequences, half Go, half books")
    p.add_argument("--book-fraction", type=float, default=0.5,
                   help="share of the data's batches drawn from the books (negative: the whole corpus)")
    p.add_argument("--total-len", type=int, default=256)
    p.add_argument("--prompt-lens", default="8,16,32,64,128")
    p.add_argument("--train-seconds", type=float, default=240)
    p.add_argument("--steps", type=int, help="fix the step count instead of timing it")
    p.add_argument("--measure-steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=64, help="sequences a step")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--log-every", type=int, default=25)
    args = p.parse_args()
    try:
        run(args)
    except Exception:
        traceback.print_exc()
        sys.exit(1)


if __name__ == "__main__":
    main()
