#!/usr/bin/env python3
"""Prints one Markdown row of a docs/results.md table (scripts/results/common.sh `row`).

Reads the sq-eval JSON of a run with --reference-model (PPL, the reference's PPL, KL divergence,
top-1 agreement) and of its speed run (tokens/s of the model alone), and the model file (sq-inspect
for bits per weight). Columns, in order: name, PPL ± stderr, ΔPPL vs the reference's PPL on the same
tokens, mean KLD ± stderr, KLD p99, top-1 agreement %, the --columns asked for, tokens/s.
Extra columns: lbpw (bits per weight of the quantized linears), bpw (the whole file), bytes (file
size), kv (KV-cache bytes per token measured by sq-eval), dprev (PPL minus the previous row's PPL of
the same --state file). With --hellaswag, a HellaSwag column before tokens/s: the accuracy ± its
standard error from that sq-eval --task hellaswag JSON.
"""
import argparse
import json
import os
import subprocess


def inspect(path, cache=None):
    """sq-inspect --json of a model file, plus its size as "file_bytes" ({} when it cannot be read).

    With `cache`: the result is written there, and read from there when the model file is gone
    (common.sh's DISCARD=1 deletes each converted file once its row is measured)."""
    if cache and not os.path.exists(path) and os.path.exists(cache):
        return json.load(open(cache))
    try:
        info = json.loads(subprocess.run(["build/bin/sq-inspect", "--json", path], check=True,
                                         capture_output=True, text=True).stdout)
    except (subprocess.CalledProcessError, json.JSONDecodeError):
        return {}
    info["file_bytes"] = os.path.getsize(path)
    if cache:
        json.dump(info, open(cache, "w"))
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--json", required=True, help="sq-eval --reference-model JSON")
    ap.add_argument("--speed", required=True, help="sq-eval JSON of the speed run")
    ap.add_argument("--model", required=True, help="the evaluated model file")
    ap.add_argument("--columns", nargs="*", default=[])
    ap.add_argument("--state", help="file keeping the previous row's PPL (for dprev)")
    ap.add_argument("--inspect-cache", help="where sq-inspect's answer is kept (read when the model file is gone)")
    ap.add_argument("--hellaswag", help="sq-eval --task hellaswag JSON (adds the HellaSwag column)")
    a = ap.parse_args()
    j = json.load(open(a.json))
    s = json.load(open(a.speed))
    kld = j["kl_divergence"]
    cells = [a.name, "%.4f ± %.4f" % (j["ppl"], j["ppl_stderr"]),
             "%+.2f%%" % (100 * (j["ppl"] / j["reference"]["ppl"] - 1)),
             "%.4f ± %.4f" % (kld["mean"], kld["stderr"]), "%.3f" % kld["p99"],
             "%.1f" % (100 * j["top1_agreement"])]
    info = None
    for c in a.columns:
        if c in ("lbpw", "bpw", "bytes"):
            info = info if info is not None else inspect(a.model, a.inspect_cache)
        if c in ("lbpw", "bpw"):
            v = info.get("quantized_linear_bits_per_weight" if c == "lbpw" else "bits_per_weight")
            cells.append("%.2f" % v if v else "-")
        elif c == "bytes":
            cells.append("%d" % info["file_bytes"] if "file_bytes" in info else "-")
        elif c == "kv":
            cells.append("%.1f" % j["kv_cache"]["bytes_per_token"])
        elif c == "dprev":
            prev = open(a.state).read().strip() if a.state and os.path.exists(a.state) else ""
            cells.append("%+.3f" % (j["ppl"] - float(prev)) if prev else "-")
        else:
            raise SystemExit("row.py: unknown column " + c)
    if a.state:
        open(a.state, "w").write("%r\n" % j["ppl"])
    if a.hellaswag:
        h = json.load(open(a.hellaswag))
        cells.append("%.4f ± %.4f" % (h["accuracy"], h["accuracy_stderr"]))
    cells.append("%.0f" % s["tokens_per_second"])
    print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
