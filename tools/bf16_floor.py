#!/usr/bin/env python3
"""How far HF transformers in bfloat16 is from itself.

The real-shape parity check (tools/gpu/check.sh, phase parity) compares the
CUDA backend with HF run in bfloat16. This script asks what that comparison
can show at all: it runs the same random-weight model (make_fixtures'
initialisation) through HF in bfloat16 several times, changing one thing
each time, and prints each run's distance from the plain bf16 run in the
parity check's two metrics (worst max|logit - ref| / max|ref| over the
teacher-forced positions, and top-1 agreement).

  bf16          the reference: HF eager attention, cuBLAS bf16 GEMMs
  bf16-noredux  cuBLAS told not to reduce in bf16
                (allow_bf16_reduced_precision_reduction = False)
  bf16-f32gemm  every linear as a float32 GEMM of the same bf16 values,
                rounded to bf16 once (only the order of the float32 sums
                differs from the reference)
  f32           the same weights (bf16 values) computed in float32

Usage (GPU machine):
  python3 tools/bf16_floor.py [--config tools/configs/real/qwen3-0.6b.json ...]
"""

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as mf  # noqa: E402

DEFAULT_CONFIGS = ["qwen3-0.6b", "llama-3.2-1b", "deepseek-v2-lite-4layers"]


def logits_of(model, prompts):
    with torch.no_grad():
        return torch.cat([model(input_ids=ids[None, :]).logits[0].float() for ids in prompts])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", action="append")
    p.add_argument("--std", type=float, default=0.02)
    p.add_argument("--prompt-lens", default="1,7,23,100,250")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args()
    configs = args.config or [os.path.join(HERE, "configs", "real", n + ".json") for n in DEFAULT_CONFIGS]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    lens = [int(x) for x in args.prompt_lens.split(",")]
    rows = []
    for path in configs:
        with open(path) as f:
            spec = json.load(f)
        name = os.path.splitext(os.path.basename(path))[0]
        model = mf.build_model(spec, torch.float32, "cuda")
        mf.init_weights(model, args.seed, args.std, args.std)
        # Weights as a bf16 checkpoint holds them.
        with torch.no_grad():
            for prm in model.parameters():
                prm.copy_(prm.to(torch.bfloat16).float())
        g = torch.Generator().manual_seed(args.seed)
        vocab = spec["vocab_size"]
        prompts = [torch.randint(0, vocab, (n,), generator=g).cuda() for n in lens]
        exact = logits_of(model, prompts)
        # As from_pretrained in bf16 runs it: RoPE's frequencies stay float32.
        freqs = {n: b.clone() for n, b in model.named_buffers() if "inv_freq" in n}
        model = model.to(torch.bfloat16)
        for n, b in freqs.items():
            owner, _, attr = n.rpartition(".")
            setattr(model.get_submodule(owner), attr, b)
        ref = logits_of(model, prompts)
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        noredux = logits_of(model, prompts)
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
        with mf.f32_gemm_order():
            f32gemm = logits_of(model, prompts)
        for label, got in (("bf16-noredux", noredux), ("bf16-f32gemm", f32gemm), ("f32", exact)):
            e, same = mf.worst_err_top1(got, ref)
            rows.append((name, label, e, same, ref.shape[0]))
        del model
        torch.cuda.empty_cache()
    print(f"{'model':<26} {'run vs HF bf16':<14} {'worst err':>10} {'top-1':>14}")
    for name, label, e, same, n in rows:
        print(f"{name:<26} {label:<14} {e:10.2e} {same:5d}/{n} {100 * same / n:6.2f}%")


if __name__ == "__main__":
    main()
