#!/usr/bin/env python3
"""Massive activations and outlier channels in a calibration file: per input site, the largest
per-token absmax over the median token's absmax (docs/results.md §2, issue #17), and the largest
per-channel absmax over the median channel's (SmoothQuant §3's channel outliers; issue #37).

Reads the `token_absmax_percentiles` dataset of every site of an `sq-calibrate` file (docs/formats.md:
per-token absmax max_c |x[t, c]| at the 50th ... 100th percentiles; the 100th exact, the others the
upper edge of a 2^(1/32)-wide histogram bin, so within 2.2%) and prints the sites with the largest
ratio max / median, largest first; then the same from the `absmax` dataset (per-channel absmax
max_t |x[t, c]|, exact): max over channels / median channel.
Needs h5py in the Python running it (not installed by CI).
Usage: token_absmax.py CALIB.h5 [TOP=8]
"""
import sys

import h5py

if len(sys.argv) < 2:
    sys.exit(__doc__)
top = int(sys.argv[2]) if len(sys.argv) > 2 else 8
rows = []
channels = []


def visit(name, obj):
    if name.endswith("/token_absmax_percentiles"):
        v = obj[()]
        rows.append((v[-1] / max(float(v[0]), 1e-30), name.rsplit("/", 1)[0], float(v[0]), float(v[-1])))
    elif name.rsplit("/", 2)[-2:-1] in (["attn_input"], ["attn_output"], ["ffn_input"], ["ffn_hidden"]) and name.endswith("/absmax"):
        v = sorted(float(x) for x in obj[()])
        med = v[len(v) // 2]
        channels.append((v[-1] / max(med, 1e-30), name.rsplit("/", 1)[0], med, v[-1]))


with h5py.File(sys.argv[1], "r") as f:
    f.visititems(visit)
if not rows:
    sys.exit(f"{sys.argv[1]}: no token_absmax_percentiles datasets (not an sq-calibrate file?)")
rows.sort(reverse=True)
print(f"{len(rows)} sites; the {min(top, len(rows))} with the largest max / median token absmax:")
print("site                       median       max    ratio")
for ratio, site, med, mx in rows[:top]:
    print(f"{site:24s} {med:9.3g} {mx:9.4g} {ratio:8.0f}")
channels.sort(reverse=True)
print(f"\n{len(channels)} sites; the {min(top, len(channels))} with the largest max / median channel absmax:")
print("site                       median       max    ratio")
for ratio, site, med, mx in channels[:top]:
    print(f"{site:24s} {med:9.3g} {mx:9.4g} {ratio:8.0f}")
