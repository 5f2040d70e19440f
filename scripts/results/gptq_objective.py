#!/usr/bin/env python3
"""GPTQ's own objective per linear, for table 2's finding that GPTQ loses to RTN on SmolLM2.

For every linear of a llama-family model, the Hessian-weighted error GPTQ minimizes,
    e = tr((W - Q) H (W - Q)^T) / tr(W H W^T),   H = the calibration file's 2 X^T X of that input,
of each quantized model Q against the FP32 weights W (Frantar et al., GPTQ, Eq. 1; the ratio makes
layers comparable). Prints each model's sum over linears and, for every later model against the
first, the median ratio and the number of linears where it is larger.
Inputs: the sq-calibrate --hessian file and `sq-export --format hf` directories (dequantized FP32
weights) of the FP32 model and of each quantized model.
Usage: gptq_objective.py CALIB.h5 FP32_DIR Q_DIR [Q_DIR...]   (needs numpy, h5py, safetensors:
       build/export-venv/bin/pip install h5py, after scripts/test-exports.sh made that venv)
"""
import os
import sys

import h5py
import numpy as np
from safetensors.numpy import load_file

# The calibration site recording each linear's input (docs/formats.md, calibration file).
SITES = {"self_attn.q_proj": "attn_input", "self_attn.k_proj": "attn_input", "self_attn.v_proj": "attn_input",
         "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_input", "mlp.up_proj": "ffn_input",
         "mlp.down_proj": "ffn_hidden"}


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    calib, ref_dir, q_dirs = sys.argv[1], sys.argv[2], sys.argv[3:]
    f = h5py.File(calib, "r")
    ref = load_file(os.path.join(ref_dir, "model.safetensors"))
    qs = [load_file(os.path.join(d, "model.safetensors")) for d in q_dirs]
    names = [os.path.basename(d.rstrip("/")) for d in q_dirs]
    layers = sorted(k for k in f.keys() if k.startswith("layer_"))
    err = np.zeros((len(qs), len(layers) * len(SITES)))
    for li, layer in enumerate(layers):
        for si, (lin, site) in enumerate(SITES.items()):
            H = f[f"{layer}/{site}/hessian"][:]
            d = int(round(len(H) ** 0.5))
            H = H.reshape(d, d)
            key = f"model.layers.{int(layer[6:])}.{lin}.weight"
            W = ref[key].astype(np.float64)
            base = np.sum((W @ H) * W)
            for qi, q in enumerate(qs):
                D = W - q[key].astype(np.float64)
                err[qi, li * len(SITES) + si] = np.sum((D @ H) * D) / base
    for qi, n in enumerate(names):
        print(f"{n}: sum of relative errors over {err.shape[1]} linears {err[qi].sum():.4f}")
    for qi in range(1, len(qs)):
        r = err[qi] / err[0]
        print(f"{names[qi]} / {names[0]}: median ratio {np.median(r):.3f}, larger on {int(np.sum(r > 1))} of {len(r)} linears")


if __name__ == "__main__":
    main()
