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

With --blocks OUT instead, writes random blocks of every type sqkit dequantizes (the types the
models above do not contain included) and their gguf.quants dequantization:
    /tmp/ggufvenv/bin/python scripts/gguf_reference.py --blocks tests/data/gguf_reference_blocks.json
Per type: "bytes", 2 blocks (64 values for F16 and BF16, see BLOCKS) as hex, random (numpy seed
1234) except the f16 scale fields, which are random finite values in [-2, 2] (a random bit
pattern could be inf / NaN, whose arithmetic is not what is being checked), and "values", the
FP32 results as hex of their little-endian bytes.
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


# type -> (number of blocks, byte offsets of the f16 scale fields inside one block)
BLOCKS = {
    "F16": (64, []), "BF16": (64, []),
    "Q8_0": (2, [0]), "Q4_0": (2, [0]), "Q4_1": (2, [0, 2]), "Q5_0": (2, [0]), "Q5_1": (2, [0, 2]),
    "Q2_K": (2, [80, 82]), "Q3_K": (2, [108]), "Q4_K": (2, [0, 2]), "Q5_K": (2, [0, 2]), "Q6_K": (2, [208]),
}


def write_blocks(out_path):
    rng = np.random.RandomState(1234)
    doc = {"generator": "scripts/gguf_reference.py --blocks", "gguf_version": version("gguf"),
           "numpy_version": np.__version__, "types": {}}
    for name, (n_blocks, scale_fields) in BLOCKS.items():
        qtype = gguf.GGMLQuantizationType[name]
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.randint(0, 256, size=(n_blocks, type_size)).astype(np.uint8)
        for off in scale_fields:
            raw[:, off:off + 2] = rng.uniform(-2, 2, size=(n_blocks, 1)).astype(np.float16).view(np.uint8)
        if name == "F16":
            raw = rng.uniform(-1000, 1000, size=n_blocks).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
        if name == "BF16":
            f = rng.standard_normal(n_blocks).astype(np.float32).view(np.uint32) >> 16
            raw = f.astype(np.uint16).view(np.uint8).reshape(n_blocks, 2)
        values = dequantize(raw.reshape(-1), qtype).astype("<f4").reshape(-1)
        assert values.size == n_blocks * block_size
        doc["types"][name] = {"bytes": raw.tobytes().hex(), "values": values.tobytes().hex()}
    with open(out_path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--blocks":
        return write_blocks(sys.argv[2])
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
