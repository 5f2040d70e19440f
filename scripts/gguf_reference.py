#!/usr/bin/env python3
"""Independent oracle for sqkit's GGUF reader and dequantizer (tests/gguf_file_test.cpp).

Reads GGUF files with the `gguf` Python package (llama.cpp's reference reader, from PyPI: never
sqkit code) and writes, per file, a small JSON summary: header fields, every metadata key (type;
scalar value, or for long strings their length and CRC-32; for arrays the element type, count and
first element), and for every tensor its ggml type, dims, byte offset and size, and statistics of
its FP32 dequantization by gguf.quants.dequantize:
  n       element count
  sum     sum of the values, float64 (numpy pairwise summation)
  sumsq   sum of the squared values, float64
  crc32   zlib CRC-32 of the little-endian FP32 bytes of all values in row-major order
  samples [index, value] for indices 0, n-1 and (k * 2654435761) % n, k = 1, 2; value is the FP32
          value written as a float64 (exact)
No weights are written: the JSON is a few tens of KB per model.

Run by hand (not by the build or the tests), outside the repository's environment:
    python3 -m venv /tmp/ggufvenv && /tmp/ggufvenv/bin/pip install gguf numpy
    /tmp/ggufvenv/bin/python scripts/gguf_reference.py models/SmolLM2-135M-Instruct.Q4_1.gguf \
        tests/data/gguf_reference_smollm2.json
    /tmp/ggufvenv/bin/python scripts/gguf_reference.py models/gemma-3-270m-q4_k_m.gguf \
        tests/data/gguf_reference_gemma3.json
(models/ is filled by scripts/fetch-models.sh.)
"""
import json
import os
import sys
import zlib
from importlib.metadata import version

import numpy as np
import gguf
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize


def sample_indices(n):
    if n == 0:
        return []
    return [0, n - 1] + [(k * 2654435761) % n for k in range(1, 3)]


def describe_value(field):
    types = field.types
    t = types[0]
    out = {"type": t.name.lower()}
    if t == GGUFValueType.ARRAY:
        out["elem_type"] = types[1].name.lower() if len(types) > 1 else None
        out["count"] = len(field.data)
        if field.data and len(types) > 1 and types[1] != GGUFValueType.ARRAY:
            first = field.parts[field.data[0]]
            if types[1] == GGUFValueType.STRING:
                out["first"] = bytes(first).decode("utf-8", errors="replace")
            else:
                out["first"] = first[0].item()
        return out
    v = field.contents()
    if t == GGUFValueType.STRING:
        raw = bytes(field.parts[field.data[0]])
        if len(raw) <= 64:
            out["value"] = raw.decode("utf-8", errors="replace")
        else:
            out["length"] = len(raw)
            out["crc32"] = zlib.crc32(raw)
    elif t in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        out["value"] = float(v)
    elif t == GGUFValueType.BOOL:
        out["value"] = bool(v)
    else:
        out["value"] = int(v)
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    path, out_path = sys.argv[1], sys.argv[2]
    r = GGUFReader(path)
    meta = {}
    for name, field in r.fields.items():
        if name.startswith("GGUF."):
            continue  # the reader's pseudo-fields for the header
        meta[name] = describe_value(field)
    tensors = []
    for t in r.tensors:
        values = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)
        n = int(values.size)
        v64 = values.astype(np.float64)
        tensors.append({
            "name": t.name,
            "type": t.tensor_type.name,
            "dims": [int(d) for d in t.shape],  # ggml order, dims[0] contiguous
            "offset": int(t.data_offset) - int(r.data_offset),
            "nbytes": int(t.n_bytes),
            "n": n,
            "sum": float(np.sum(v64)),
            "sumsq": float(np.sum(v64 * v64)),
            "crc32": zlib.crc32(values.astype("<f4").tobytes()),
            "samples": [[i, float(values[i])] for i in sample_indices(n)],
        })
    doc = {
        "generator": "scripts/gguf_reference.py",
        "gguf_version": version("gguf"),
        "numpy_version": np.__version__,
        "file": os.path.basename(path),
        "file_size": os.path.getsize(path),
        "version": int(r.fields["GGUF.version"].contents()),
        "alignment": int(r.alignment),
        "data_offset": int(r.data_offset),
        "metadata": meta,
        "tensors": tensors,
    }
    with open(out_path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
