#!/usr/bin/env python3
"""Peer measurement for issue 19: Hugging Face transformers' FP32 perplexity throughput on a GGUF
model under llama.cpp's protocol (what `llama-perplexity -c CTX` and `sq-eval --protocol llamacpp`
compute), so that the three run side by side on the same tokens.

Protocol (docs/protocols.md, "llamacpp"): the text is tokenized once (with BOS when the tokenizer
adds one), cut into consecutive chunks of CTX tokens; each chunk's first token is replaced by BOS
(when the tokenizer adds one); the model runs on the whole chunk (logits of every position, as
transformers computes them) and the predictions of positions CTX/2 … CTX−2 are scored. PPL is
exp(mean NLL); tokens/s is chunks · CTX divided by the time of the forward passes and the scoring
(tokenization and loading excluded, as sq-eval and llama-perplexity report it).

Run by hand (never by the build or the tests), in a venv with torch, transformers and gguf:
    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install torch transformers gguf numpy accelerate
    /tmp/hfvenv/bin/python scripts/peers/hf_perplexity.py models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        ../shared/data/wikitext2/wiki.test.raw --ctx 512 --chunks 20 --threads 2
transformers dequantizes the GGUF to FP32 when it loads it (gguf_file=). Prints one JSON line.
"""
import argparse
import json
import math
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", help="GGUF model file")
    ap.add_argument("text", help="text file (e.g. WikiText-2 test)")
    ap.add_argument("--ctx", type=int, default=512, help="chunk length (llama-perplexity -c)")
    ap.add_argument("--chunks", type=int, default=0, help="first N chunks (0 = all)")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument("--batch", type=int, default=1, help="chunks per forward pass")
    a = ap.parse_args()
    if a.ctx < 3:
        sys.exit("hf_perplexity.py: --ctx must be >= 3")
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(a.threads)
    d, f = os.path.split(os.path.abspath(a.gguf))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32).eval()
    with open(a.text, encoding="utf-8") as fh:
        text = fh.read()
    add_bos = bool(getattr(tok, "add_bos_token", False)) and tok.bos_token_id is not None
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if add_bos:
        ids = [tok.bos_token_id] + ids
    n_chunks = len(ids) // a.ctx
    if a.chunks > 0:
        n_chunks = min(n_chunks, a.chunks)
    if n_chunks == 0:
        sys.exit("hf_perplexity.py: the text is shorter than one chunk")
    first = a.ctx // 2
    nll_sum, count = 0.0, 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        for c0 in range(0, n_chunks, a.batch):
            rows = []
            for c in range(c0, min(c0 + a.batch, n_chunks)):
                chunk = ids[c * a.ctx:(c + 1) * a.ctx]
                if add_bos:
                    chunk = [tok.bos_token_id] + chunk[1:]
                rows.append(chunk)
            x = torch.tensor(rows, dtype=torch.long)
            logits = model(x).logits.float()  # [batch, ctx, vocab]
            logp = torch.log_softmax(logits[:, first:a.ctx - 1, :], dim=-1)
            target = x[:, first + 1:a.ctx]
            nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
            nll_sum += float(nll.double().sum())
            count += nll.numel()
    seconds = time.perf_counter() - t0
    print(json.dumps({"model": a.gguf, "text": a.text, "ctx": a.ctx, "chunks": n_chunks, "threads": a.threads,
                      "batch": a.batch, "tokens_scored": count, "ppl": math.exp(nll_sum / count),
                      "seconds": seconds, "tokens_per_second": n_chunks * a.ctx / seconds,
                      "torch": torch.__version__, "transformers": transformers.__version__}))


if __name__ == "__main__":
    main()
