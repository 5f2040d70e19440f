#!/usr/bin/env python3
"""Independent oracle for sqkit's --special (parse special-token text into ids; issue 39 point 7).

Loads each model's tokenizer with Hugging Face transformers from the GGUF file itself
(AutoTokenizer.from_pretrained(dir, gguf_file=...), transformers' own GGUF tokenizer conversion:
never sqkit code) and writes, for a few chat-formatted prompts, the ids transformers gives with
special tokens parsed (its default) and without BOS/EOS added (add_special_tokens=False), plus the
ids of each model's chat template applied to a short conversation. tests/gguf_tokenizer_test.cpp
compares `sq-tokenize --special --no-bos` and Tokenizer::encode_special with them.

Run by hand (not by the build or the tests), outside the repository's environment:
    python3 -m venv /tmp/tokvenv
    /tmp/tokvenv/bin/pip install transformers==5.24.0 gguf==0.19.0 tokenizers sentencepiece protobuf numpy
    /tmp/tokvenv/bin/python scripts/special_tokens_reference.py tests/data/special_tokens_reference.json \
        smollm2=models/SmolLM2-135M-Instruct.Q4_1.gguf qwen2.5=models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        gemma3=models/gemma-3-270m-q4_k_m.gguf
(models/ is filled by scripts/fetch-models.sh smollm2-135m / qwen2.5-coder-1.5b / gemma3-270m.)
"""
import json
import os
import sys
from importlib.metadata import version

from transformers import AutoTokenizer

PROMPTS = [
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWrite hello world in C.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|><|im_start|>assistant\n4<|im_end|><|endoftext|>",
    "no special tokens here, just text <|im_start",
    "<|endoftext|><|endoftext|>x<|im_end|>\n\n<|im_start|> spaced",
    "<bos><start_of_turn>user\nWrite hello world in C.<end_of_turn>\n<start_of_turn>model\n",
]
CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write a function that adds two numbers."},
]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out = {"generator": "scripts/special_tokens_reference.py", "transformers_version": version("transformers"),
           "gguf_version": version("gguf"), "models": {}}
    for arg in sys.argv[2:]:
        name, path = arg.split("=", 1)
        tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path))
        cases = [{"text": p, "ids": tok(p, add_special_tokens=False)["input_ids"]} for p in PROMPTS]
        entry = {"file": os.path.basename(path), "cases": cases}
        if tok.chat_template:
            text = tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
            entry["chat_template"] = {"text": text, "ids": tok(text, add_special_tokens=False)["input_ids"]}
        out["models"][name] = entry
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
