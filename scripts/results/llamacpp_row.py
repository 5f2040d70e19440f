#!/usr/bin/env python3
"""Prints one Markdown row of a llama.cpp file for scripts/results/frontier4.sh.

Reads a `llama-perplexity --kl-divergence` log (its final statistics: "Mean PPL(Q)", "Mean KLD",
"99.0% KLD", "Same top p") and the GGUF file (its size; bits per weight over all elements from
sq-inspect --json). Columns: name, PPL ± stderr, KLD mean ± stderr, KLD p99, top-1 %, file bits/w,
file bytes.
"""
import argparse
import json
import os
import re
import subprocess


def grab(text, pattern):
    m = re.search(pattern, text, re.M)
    if not m:
        raise SystemExit("llamacpp_row.py: no match for %r in the log" % pattern)
    return m.groups()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    t = open(a.log, errors="replace").read()
    ppl, ppl_se = grab(t, r"^Mean PPL\(Q\)\s*:\s*([0-9.]+)\s*±\s*([0-9.]+)")
    kld, kld_se = grab(t, r"^Mean\s+KLD:\s*([0-9.]+)\s*±\s*([0-9.]+)")
    (p99,) = grab(t, r"^99\.0%\s+KLD:\s*([0-9.]+)")
    top1, _ = grab(t, r"^Same top p:\s*([0-9.]+)\s*±\s*([0-9.]+)")
    try:
        info = json.loads(subprocess.run(["build/bin/sq-inspect", "--json", a.model], check=True,
                                         capture_output=True, text=True).stdout)
        bpw = "%.2f" % info["bits_per_weight"]
    except (subprocess.CalledProcessError, json.JSONDecodeError, KeyError):
        bpw = "-"
    print("| %s | %.4f ± %.4f | %.4f ± %.4f | %.3f | %.1f | %s | %d |" % (
        a.name, float(ppl), float(ppl_se), float(kld), float(kld_se), float(p99), float(top1), bpw,
        os.path.getsize(a.model)))


if __name__ == "__main__":
    main()
