#!/usr/bin/env python3
"""Independent oracle for a real GGUF model run by sqkit (issue 37: Qwen2.5-Coder-1.5B).

Loads the GGUF with Hugging Face transformers (its own GGUF loader, which dequantizes every tensor
with the `gguf` package to FP32; never sqkit code), runs it in FP32 with eager attention on the CPU,
and writes one compact JSON file (tens of KB: no weights, no full logit rows) that
tests/gguf_qwen2_test.cpp compares sqkit with:

  tokens     the three shared texts of ../shared/data/reference/smollm2-135m/tokens.json
             (`wikitext2_head`, `mixed`, `story`) and their ids from the model's own tokenizer,
             add_special_tokens=False
  window     `ids`: the first 512 ids of `wikitext2_head` (the tokenizer adds no BOS for qwen2);
             `next_token_nll` [511] (nats, float64 of the FP32 logits' log-softmax) of ids[i+1]
             given ids[0..i]; `mean_nll`; at `positions` (0, 32, …, 480, 511) the `top` 32 logits
             (descending) as [id, value] pairs and the `logsumexp` of the whole row (float64)
  greedy     for each prompt: `prompt_ids`, 32 new ids by argmax (`new_ids`) and their decoded `text`

Run by hand (not by the build or the tests), outside the repository's environment, then commit the
JSON (scripts/test-qwen.sh runs the tests that read it):
    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install transformers==5.24.0 torch==2.15.0 gguf==0.19.0 numpy
    /tmp/refvenv/bin/python scripts/gguf_model_reference.py \
        models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf tests/data/qwen2.5-coder-1.5b.json
(models/ is filled by scripts/fetch-models.sh qwen2.5-coder-1.5b.) About 5 minutes and 16 GB of RAM
for the 1.5B model on 2 cores.
"""
import json
import os
import sys
from importlib.metadata import version

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED_TEXTS = os.path.join(HERE, "..", "..", "shared", "data", "reference", "smollm2-135m", "tokens.json")
WINDOW = 512
POSITIONS = list(range(0, WINDOW, 32)) + [WINDOW - 1]
TOP = 32
NEW_TOKENS = 32
PROMPTS = ["Once upon a time, there was", "def fibonacci(n):\n"]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    path, out_path = sys.argv[1], sys.argv[2]
    texts_path = os.environ.get("SQKIT_SHARED_TEXTS", SHARED_TEXTS)
    texts = json.load(open(texts_path))["texts"]
    d, f = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    torch.set_num_threads(os.cpu_count() or 1)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()

    out = {"generator": "scripts/gguf_model_reference.py", "file": f,
           "transformers_version": version("transformers"), "torch_version": version("torch"),
           "gguf_version": version("gguf"), "dtype": "float32", "attention": "eager"}
    out["tokens"] = {name: {"text": t, "ids": tok(t, add_special_tokens=False)["input_ids"]}
                     for name, t in texts.items()}

    ids = out["tokens"]["wikitext2_head"]["ids"][:WINDOW]
    assert len(ids) == WINDOW, f"wikitext2_head gives only {len(ids)} ids"
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].to(torch.float64)  # [512, vocab]
    logp = torch.log_softmax(logits, dim=-1)
    target = torch.tensor(ids[1:])
    nll = (-logp[:-1].gather(1, target[:, None])[:, 0]).tolist()
    lse = torch.logsumexp(logits, dim=-1)
    rows = []
    for p in POSITIONS:
        v, i = torch.topk(logits[p], TOP)
        rows.append({"position": p, "logsumexp": lse[p].item(),
                     "top": [[int(a), float(b)] for a, b in zip(i.tolist(), v.tolist())]})
    out["window"] = {"ids": ids, "next_token_nll": nll, "mean_nll": sum(nll) / len(nll), "rows": rows}

    greedy = []
    for prompt in PROMPTS:
        p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            g = model.generate(torch.tensor([p_ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                               min_new_tokens=NEW_TOKENS)
        new = g[0, len(p_ids):].tolist()
        greedy.append({"prompt": prompt, "prompt_ids": p_ids, "new_ids": new,
                       "text": tok.decode(new)})
    out["greedy"] = greedy
    with open(out_path, "w") as fh:
        json.dump(out, fh, ensure_ascii=False)
        fh.write("\n")


if __name__ == "__main__":
    main()
