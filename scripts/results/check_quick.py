#!/usr/bin/env python3
"""Checks a reduced table 1 run (scripts/test-results.sh) against definitions and recorded figures.

Usage: check_quick.py OUT_DIR EXPECTED.json [--record]
OUT_DIR holds the sq-eval JSON files (NAME.llamacpp-CHUNKS.json, with --reference-model) that
scripts/results/smoothquant.sh --quick wrote. EXPECTED.json maps each NAME to its PPL and mean KLD,
per CPU class ("rows": AVX-512, "rows_avx2": AVX2 only; see rows_key), with the relative tolerances
under "tolerance". --record rewrites this CPU class's figures from OUT_DIR.
Exits 1 naming every failed check.
"""
import glob
import json
import math
import os
import subprocess
import sys


def rows_key():
    """The key of EXPECTED.json holding this CPU's figures: "rows" where the CPU reports AVX-512 F and
    BW (oneDNN's brgemm FP32 matmul on packed weights, sqkit's AVX-512 kernels), "rows_avx2" elsewhere
    (ops::linear_sgemm, the AVX2 INT8 kernel). The two run other FP32 summation orders, hence other
    calibration statistics and other INT8 roundings of this chaotic model, so each is recorded."""
    try:
        flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    except OSError:
        flags = []
    return "rows" if "avx512f" in flags and "avx512bw" in flags else "rows_avx2"


def main():
    out, expected_path = sys.argv[1], sys.argv[2]
    record = "--record" in sys.argv[3:]
    runs = {os.path.basename(p).split(".llamacpp-")[0]: json.load(open(p))
            for p in sorted(glob.glob(os.path.join(out, "*.llamacpp-*.json")))}
    failures = []
    if "FP32" not in runs or len(runs) < 2:
        sys.exit(f"check_quick.py: {out} lacks the FP32 row or the quantized rows ({sorted(runs)})")
    for name, j in runs.items():
        kld, top1, ppl, ref = j["kl_divergence"], j["top1_agreement"], j["ppl"], j["reference"]["ppl"]
        if not math.isfinite(ppl) or ppl <= 1:
            failures.append(f"{name}: PPL {ppl} is not a finite value > 1")
        if name == "FP32":  # the FP32 conversion against the original it was converted from
            if kld["mean"] != 0 or kld["p99"] != 0 or kld["max"] != 0 or top1 != 1 or ppl != ref:
                failures.append(f"FP32 vs itself: KLD {kld}, top-1 {top1}, PPL {ppl} vs {ref} (expected exactly 0 / 1 / equal)")
        elif not (kld["mean"] > 0 and 0 < top1 < 1):
            failures.append(f"{name}: KLD {kld['mean']} and top-1 {top1} (a quantized model must differ: KLD > 0, top-1 < 1)")
    if record:
        rec = json.load(open(expected_path)) if os.path.exists(expected_path) else {"tolerance": {}}
        rec[rows_key()] = {n: {"ppl": j["ppl"], "kld": j["kl_divergence"]["mean"]} for n, j in runs.items()}
        json.dump(rec, open(expected_path, "w"), indent=2, ensure_ascii=False)
        open(expected_path, "a").write("\n")
        print(f"check_quick.py: recorded {len(runs)} rows into {expected_path} ({rows_key()})")
    else:
        exp = json.load(open(expected_path))
        tol, key = exp["tolerance"], rows_key()
        if key not in exp:
            sys.exit(f"check_quick.py: {expected_path} has no figures for this CPU ({key}); record them with --record")
        if sorted(exp[key]) != sorted(runs):
            failures.append(f"rows {sorted(runs)} differ from the recorded {sorted(exp[key])} ({key})")
        for name, e in exp[key].items():
            if name not in runs:
                continue
            j = runs[name]
            for what, got, want in (("ppl", j["ppl"], e["ppl"]), ("kld", j["kl_divergence"]["mean"], e["kld"])):
                if abs(got - want) > tol[what] * abs(want) + 1e-12:
                    failures.append(f"{name}: {what} {got:.6g}, recorded {want:.6g} (relative tolerance {tol[what]}, {key})")
    # The quality gate: a bound below the measured KLD exits 3, one above it exits 0.
    name = next(n for n in runs if n != "FP32")
    j = runs[name]
    base = ["build/bin/sq-eval", "-m", j["model"]["path"], "-f", j["text"]["path"], "--protocol", "llamacpp",
            "-c", str(j["protocol"]["ctx"]), "--chunks", str(j["protocol"]["chunks"]),
            "--reference-model", j["reference"]["model"]["path"], "-q"]
    for bound, want in ((j["kl_divergence"]["mean"] / 2, 3), (j["kl_divergence"]["mean"] * 2, 0)):
        rc = subprocess.run(base + ["--max-kld", repr(bound)], capture_output=True).returncode
        if rc != want:
            failures.append(f"{name}: sq-eval --max-kld {bound:.6g} exited {rc}, expected {want}")
    for f in failures:
        print("check_quick.py: FAIL " + f, file=sys.stderr)
    if failures:
        sys.exit(1)
    print(f"check_quick.py: {len(runs)} rows, all checks hold")


if __name__ == "__main__":
    main()
