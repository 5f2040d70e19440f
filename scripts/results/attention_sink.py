#!/usr/bin/env python3
"""Attention mass on the first tokens of a text (StreamingLLM §3.1's "attention sink"), per layer.

The check behind table 5 of docs/results.md (issue #17): window attention degrades by as much as the
attention the evicted first tokens were receiving. Runs Hugging Face transformers (the independent
implementation; eager attention, FP32) on the first N tokens of TEXT (the model's own tokenizer,
with BOS where it adds one, as sq-eval does: Gemma 3 yes, SmolLM2 no; --no-bos: without it) and
prints, per layer, the mean over heads and over query positions [N/2, N) of the attention
probability on token 0 and on tokens 0-3, then their means over all layers; then, over the layers
where token 0 receives at least 20% ("sink layers"), the five other key positions that receive the
most attention from those queries (mean over sink layers, heads and queries): the secondary sinks
that window attention keeps when token 0 is evicted.
Needs torch, transformers and gguf in the Python running it (not installed by CI).
Usage: attention_sink.py [--no-bos] MODEL.gguf TEXT [N=1024]
"""
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

args = [a for a in sys.argv[1:] if a != "--no-bos"]
bos = len(args) == len(sys.argv) - 1
if len(args) < 2:
    sys.exit(__doc__)
path, text = args[0], args[1]
n = int(args[2]) if len(args) > 2 else 1024
d, f = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32, attn_implementation="eager")
ids = tok(open(text, encoding="utf-8").read()[: 20 * n], add_special_tokens=bos).input_ids[:n]
if len(ids) < n:
    sys.exit(f"{text}: only {len(ids)} tokens, {n} needed")
with torch.no_grad():
    att = model(torch.tensor([ids]), output_attentions=True).attentions  # per layer [1, heads, n, n]
first, first4 = [], []
print(f"{f}: {n} tokens of {os.path.basename(text)}; attention probability on token 0 / tokens 0-3, "
      f"mean over heads and queries [{n // 2}, {n})")
print("layer  token0  tokens0-3")
for layer, a in enumerate(att):
    q = a[0, :, n // 2:, :]
    first.append(q[:, :, 0].mean().item())
    first4.append(q[:, :, :4].sum(-1).mean().item())
    print(f"{layer:5d}  {first[-1]:.4f}  {first4[-1]:.4f}")
print(f"mean   {sum(first) / len(first):.4f}  {sum(first4) / len(first4):.4f}")
sink_layers = [i for i, m in enumerate(first) if m >= 0.2]
if sink_layers:
    # [n] mean attention each key receives from queries [n/2, n), over sink layers and heads
    recv = sum(att[i][0, :, n // 2:, :].mean(dim=(0, 1)) for i in sink_layers) / len(sink_layers)
    top = torch.topk(recv[1:n // 2], 5)
    print(f"sink layers {sink_layers[0]}..{sink_layers[-1]} ({len(sink_layers)}): token 0 receives {recv[0].item():.3f}; "
          f"the 5 other keys receiving the most (position, token, mass): " +
          ", ".join(f"{j + 1} {tok.decode([ids[j + 1]])!r} {m:.3f}" for m, j in zip(top.values.tolist(), top.indices.tolist())) +
          f"; together {top.values.sum().item():.3f}")
