#!/usr/bin/env python3
"""Independent checks of sq-export's outputs (issue 18) with the reference readers.

The C++ tools never depend on Python; this script, run by scripts/test-exports.sh inside a venv it
creates, reads sqkit's exports with the implementations serving engines use and compares them with
sqkit's own numbers:

  ct   DIR     compressed-tensors directory. Every quantized module is decompressed with
               compressed_tensors' own compressor (BaseCompressor registry, the class transformers and
               vLLM use) and compared with `--dequantized HFDIR` (sq-export --format hf: the weights
               sqkit's runner multiplies with), which must agree exactly (0 difference). Then
               transformers.AutoModelForCausalLM loads DIR on CPU and its logits on `--token-ids` are
               compared with sqkit's (`sq-run --logits`). A file with online Hadamard rotations
               (quantization_config.transform_config) has no plain export to compare weights with
               (omit --dequantized): its modules are decompressed and checked finite, and its
               transforms are applied after loading with compressed_tensors' apply_transform_config
               (transformers 5.24 does not apply them itself; vLLM does) before the logit comparison.
  gguf FILE    GGUF file. gguf.GGUFReader parses every key and tensor; gguf.quants.dequantize of every
               tensor is compared with `--dequantized F32FILE` (sq-export --format gguf --outtype f32),
               which must agree to FP16 scale rounding (`--weight-tol`); transformers loads the GGUF
               (gguf_file=) and its logits are compared with sqkit's.
  ppl  DIR     transformers' perplexity of a directory (or GGUF with --gguf-file) under sq-eval's
               `windows` protocol on token ids: non-overlapping windows of -c tokens, every one of the
               c-1 next-token predictions scored, first --chunks windows.

Every subcommand prints one JSON object on stdout (figures) and exits 1 when a bound is broken, so
the calling script can stop.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np


def load_ids(path):
    text = open(path, encoding="utf-8").read().strip()
    ids = json.loads(text) if text.startswith("[") else [int(t) for t in text.split()]
    return [int(i) for i in ids]


def fail(msg, report):
    report["ok"] = False
    report.setdefault("failures", []).append(msg)


def logits_of(model, ids):
    import torch
    with torch.no_grad():
        out = model(torch.tensor([ids], dtype=torch.long))
    return out.logits[0].float().numpy()


def compare_logits(theirs, sqkit_npy, tol, report, what):
    mine = np.load(sqkit_npy)
    if mine.shape != theirs.shape:
        fail(f"{what}: logits shape {theirs.shape} vs sqkit {mine.shape}", report)
        return
    d = np.abs(mine.astype(np.float64) - theirs.astype(np.float64))
    report[what] = {
        "max_abs_diff": float(d.max()),
        "mean_abs_diff": float(d.mean()),
        "logit_range": float(np.abs(mine).max()),
        "argmax_agreement": float(np.mean(mine.argmax(-1) == theirs.argmax(-1))),
        "tolerance": tol,
    }
    if not d.max() <= tol:
        fail(f"{what}: max |Δlogit| {d.max():.3g} > {tol:.3g}", report)


def simulate_w8a8(hf_dir, ct_tensors, act, ids, qmax, qmin, div, threads, transform_config=None):
    """Logits of the plain FP32 checkpoint `hf_dir` with every quantized linear's input fake-quantized:
    per token (dynamic), per token and group of inputs (dynamic GROUP strategy) or per tensor
    (dynamic: one absmax over the call; static: the export's input_scale),
    q = clamp(round(x / Δ), qmin, qmax), x' = Δ·q (torch.round: half to even).
    With `transform_config` (a compressed-tensors directory with online rotations, loaded
    decompressed) its transforms are applied first, so each input is rotated, then rounded."""
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(threads)
    kwargs = {"dtype": torch.float32}
    if transform_config is not None:
        from transformers import CompressedTensorsConfig
        kwargs["quantization_config"] = CompressedTensorsConfig(run_compressed=False)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, **kwargs)
    model.eval()
    if transform_config is not None:
        from compressed_tensors.transform import TransformConfig, apply_transform_config
        apply_transform_config(model, TransformConfig.model_validate(transform_config))
        # The decompressed model still fake-quantizes activations itself (compressed-tensors'
        # forward); switch that off so only the sqkit-style rounding below is applied.
        for m in model.modules():
            if hasattr(m, "quantization_enabled"):
                m.quantization_enabled = False
    quantized = {k[: -len(".weight_scale")] for k in ct_tensors if k.endswith(".weight_scale")}
    hooks = []
    for name, mod in model.named_modules():
        if name not in quantized:
            continue
        static = ct_tensors.get(name + ".input_scale")

        def pre(m, inputs, static=static):
            x = inputs[0]
            if act.get("strategy") == "group":
                # one step per token and block of group_size inputs (sqkit's per-token-group; the
                # last block of a row may be shorter: zero padding leaves its absmax unchanged)
                g = int(act["group_size"])
                k = x.shape[-1]
                pad = (-k) % g
                xp = torch.nn.functional.pad(x, (0, pad)).reshape(*x.shape[:-1], (k + pad) // g, g)
                step = xp.abs().amax(dim=-1, keepdim=True) / div
                step = torch.where(step == 0, torch.ones_like(step), step)
                xq = torch.clamp(torch.round(xp / step), qmin, qmax) * step
                return (xq.reshape(*x.shape[:-1], k + pad)[..., :k],) + tuple(inputs[1:])
            if static is not None and act.get("dynamic") is False:
                step = static.float().reshape(())
            elif act.get("strategy") == "token" and div == 127.0:
                step = x.abs().amax(dim=-1, keepdim=True) / div  # sqkit: one step per row (token)
            elif act.get("strategy") == "token":
                # compressed-tensors' TOKEN strategy keeps dims 0 and 1 and reduces the rest
                # (calculate_qparams); a 2-D input (OPT flattens tokens before fc1/fc2) thus gets one
                # step for the whole tensor (amax over dim=() reduces every dim).
                step = x.abs().amax(dim=tuple(range(2, x.ndim)), keepdim=True) / div
            else:
                step = x.abs().amax() / div
            step = torch.where(step == 0, torch.ones_like(step), step)
            return (torch.clamp(torch.round(x / step), qmin, qmax) * step,) + tuple(inputs[1:])
        hooks.append(mod.register_forward_pre_hook(pre))
    if len(hooks) != len(quantized):
        raise SystemExit(f"simulate_w8a8: found {len(hooks)} of {len(quantized)} quantized modules in {hf_dir}")
    return logits_of(model, ids)


def cmd_ct(args):
    import torch
    from safetensors.torch import load_file
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme

    torch.set_num_threads(args.threads)
    report = {"ok": True, "dir": args.dir}
    config = json.load(open(os.path.join(args.dir, "config.json")))
    qc = config.get("quantization_config")
    tensors = load_file(os.path.join(args.dir, "model.safetensors"))
    ref = load_file(os.path.join(args.dequantized, "model.safetensors")) if args.dequantized else None
    if qc is None:
        fail("config.json has no quantization_config", report)
    else:
        groups = qc["config_groups"]
        # One group targeting "Linear", plus (W4A16 with the INT8 head) groups naming modules: a
        # module takes the group that names it, as compressed-tensors' most specific target.
        by_name, by_class = {}, None
        for g in groups.values():
            g = dict(g)
            entry = (QuantizationScheme.model_validate(g), BaseCompressor.get_value_from_registry(g.get("format") or qc["format"]))
            for t in g["targets"]:
                if t == "Linear":
                    by_class = entry
                else:
                    by_name[t] = entry
        if by_class is None:
            fail("no config group targets Linear", report)
        modules = sorted({k[: -len(".weight_scale")] for k in tensors if k.endswith(".weight_scale")})
        worst, count = 0.0, 0
        for m in modules:
            scheme, compressor = by_name.get(m, by_class)
            local = {k[len(m) + 1:]: v for k, v in tensors.items() if k.startswith(m + ".") and k[len(m) + 1:].startswith(("weight", "input"))}
            out = compressor.decompress(local, scheme)
            w = out["weight"].float()
            if ref is None:  # rotated: no plain export to compare with (the logits check the weights)
                if not torch.isfinite(w).all():
                    fail(f"{m}: decompressed weights are not finite", report)
                count += 1
                continue
            # A tied head (the INT8 embedding run as lm_head) is the embedding in the plain export,
            # named by the architecture (model.embed_tokens, OPT's model.decoder.embed_tokens,
            # GPT-2's transformer.wte, BLOOM's word_embeddings, GPT-NeoX's embed_in).
            if m + ".weight" in ref:
                r = ref[m + ".weight"].float()
            else:
                tied = [k for k in ref if k.endswith(".weight") and tuple(ref[k].shape) == tuple(w.shape)
                        and any(s in k for s in ("embed_tokens", "wte", "word_embeddings", "embed_in"))]
                if len(tied) != 1:
                    fail(f"{m}: no single embedding in the plain export to compare with (candidates {tied})", report)
                    continue
                r = ref[tied[0]].float()
            if w.shape != r.shape:
                fail(f"{m}: decompressed shape {tuple(w.shape)} vs sqkit {tuple(r.shape)}", report)
                continue
            worst = max(worst, float((w - r).abs().max()))
            count += 1
        # Tensors that are not quantized are copied: they must equal the dequantized export too.
        plain_worst = 0.0
        for k, v in tensors.items():
            if ref is not None and k in ref and v.is_floating_point() and not k.endswith(("_scale", "_zero_point")):
                plain_worst = max(plain_worst, float((v.float() - ref[k].float()).abs().max()))
        report["decompressed_modules"] = count
        report["decompress_max_abs_diff"] = worst if ref is not None else "not compared (no plain export)"
        report["unquantized_max_abs_diff"] = plain_worst
        if count == 0:
            fail("no quantized module found", report)
        if worst != 0.0:
            fail(f"compressed_tensors decompression differs from sqkit's dequantized weights by {worst:.3g}", report)
        if plain_worst != 0.0:
            fail(f"unquantized tensors differ by {plain_worst:.3g}", report)
    if args.no_transformers:
        args.token_ids = None
        report["transformers"] = "not loaded: " + args.no_transformers
    if args.token_ids and not args.dequantized and qc is not None and qc.get("transform_config"):
        # Online rotations: the sqkit-style simulation on the decompressed export with its
        # transforms applied must reproduce sqkit's runner (rotate, round per token with absmax/127,
        # multiply by the stored W·R).
        group = next(iter(qc["config_groups"].values()))
        act = group.get("input_activations") or {}
        sim = simulate_w8a8(args.dir, tensors, act, load_ids(args.token_ids), 127, -127, 127.0, args.threads, qc["transform_config"])
        sub = {}
        compare_logits(sim, args.sqkit_logits, args.sqkit_sim_tol, sub, "simulated_sqkit_vs_sqkit")
        report["simulated_sqkit_vs_sqkit"] = sub["simulated_sqkit_vs_sqkit"]
        for f in sub.get("failures", []):
            fail(f, report)
    if args.token_ids and args.dequantized and qc is not None and qc.get("format") == "int-quantized":
        # W8A8: run the dequantized export (--dequantized) with activations fake-quantized two ways.
        # sqkit: q = clamp(round(x/Δ), −127, 127), Δ = absmax/127 (lib/quant/int8_quantize.h);
        # compressed-tensors' simulation (quantization/utils/helpers.py calculate_qparams): Δ =
        # absmax/127.5 (bit range 255 / 2), q clamped to [−128, 127]. The first must reproduce
        # sqkit's runner, the second transformers' logits on the export: that pins the W8A8 logit
        # difference between the two on the activation step alone.
        group = next(iter(qc["config_groups"].values()))
        act = group.get("input_activations") or {}
        ids = load_ids(args.token_ids)
        report["activation_quantization"] = {"strategy": act.get("strategy"), "dynamic": act.get("dynamic")}
        report["simulated_sqkit_vs_sqkit"] = None
        for style, qmax, qmin, div in (("sqkit", 127, -127, 127.0), ("compressed_tensors", 127, -128, 127.5)):
            sim = simulate_w8a8(args.dequantized, tensors, act, ids, qmax, qmin, div, args.threads)
            report["simulated_" + style] = sim
        sub = {}
        compare_logits(report.pop("simulated_sqkit"), args.sqkit_logits, args.sqkit_sim_tol, sub, "simulated_sqkit_vs_sqkit")
        report["simulated_sqkit_vs_sqkit"] = sub["simulated_sqkit_vs_sqkit"]
        for f in sub.get("failures", []):
            fail(f, report)
        report["_simulated_ct"] = report.pop("simulated_compressed_tensors")
    if args.token_ids:
        from transformers import AutoModelForCausalLM
        kwargs = {"dtype": torch.float32}
        if args.ct_dequantize:
            from transformers import CompressedTensorsConfig
            kwargs["quantization_config"] = CompressedTensorsConfig(run_compressed=False)
        t0 = time.time()
        model = AutoModelForCausalLM.from_pretrained(args.dir, **kwargs)
        model.eval()
        if qc is not None and qc.get("transform_config"):
            from compressed_tensors.transform import TransformConfig, apply_transform_config
            tc = TransformConfig.model_validate(qc["transform_config"])
            apply_transform_config(model, tc)
            report["transforms"] = {k: {"head_dim": g.head_dim, "modules": sum(len(a.targets) for a in g.apply)} for k, g in tc.config_groups.items()}
        report["transformers_class"] = type(model).__name__
        report["transformers_load_seconds"] = round(time.time() - t0, 2)
        theirs = logits_of(model, load_ids(args.token_ids))
        compare_logits(theirs, args.sqkit_logits, args.logit_tol, report, "logits_vs_sqkit")
        if "_simulated_ct" in report:
            d = np.abs(report.pop("_simulated_ct").astype(np.float64) - theirs.astype(np.float64))
            report["simulated_ct_vs_transformers_max_abs_diff"] = float(d.max())
            if d.max() > args.sim_tol:
                fail(f"the compressed-tensors simulation does not reproduce transformers' logits ({d.max():.3g})", report)
    report.pop("_simulated_ct", None)
    print(json.dumps(report))
    return 0 if report["ok"] else 1


def cmd_gguf(args):
    import gguf
    from gguf.quants import dequantize

    report = {"ok": True, "file": args.file}
    r = gguf.GGUFReader(args.file)
    keys = {}
    for name, f in r.fields.items():
        keys[name] = f.contents()  # parses every value (raises on a malformed field)
    report["keys"] = len(keys)
    report["file_type"] = keys.get("general.file_type")
    report["architecture"] = keys.get("general.architecture")
    report["sqkit_keys"] = sorted(k for k in keys if k.startswith("sqkit."))
    types = {}
    deq = {}
    for t in r.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
        deq[t.name] = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(tuple(int(d) for d in reversed(t.shape)))
    report["tensor_types"] = types
    report["tensors"] = len(deq)
    if args.dequantized:
        ref = {t.name: np.asarray(t.data, dtype=np.float32).reshape(tuple(int(d) for d in reversed(t.shape)))
               for t in gguf.GGUFReader(args.dequantized).tensors}
        if sorted(ref) != sorted(deq):
            fail(f"tensor names differ from the F32 export: {sorted(set(ref) ^ set(deq))[:8]}", report)
        worst_abs, worst_rel = 0.0, 0.0
        for name, w in deq.items():
            if name not in ref:
                continue
            if w.shape != ref[name].shape:
                fail(f"{name}: shape {w.shape} vs F32 export {ref[name].shape}", report)
                continue
            d = np.abs(w.astype(np.float64) - ref[name].astype(np.float64))
            worst_abs = max(worst_abs, float(d.max()))
            scale = float(np.abs(ref[name]).max()) or 1.0
            worst_rel = max(worst_rel, float(d.max()) / scale)
        report["dequantize_max_abs_diff"] = worst_abs
        report["dequantize_max_diff_over_tensor_absmax"] = worst_rel
        if worst_rel > args.weight_tol:
            fail(f"gguf.quants.dequantize differs from sqkit's weights by {worst_rel:.3g} of a tensor's absmax > {args.weight_tol}", report)
    if args.no_transformers:
        report["transformers"] = "not loaded: " + args.no_transformers
    elif args.token_ids:
        import torch
        from transformers import AutoModelForCausalLM
        torch.set_num_threads(args.threads)
        t0 = time.time()
        overrides = json.loads(args.config_override) if args.config_override else {}
        report["config_override"] = overrides
        model = AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(args.file)), gguf_file=os.path.basename(args.file),
                                                     dtype=torch.float32, **overrides)
        model.eval()
        report["transformers_class"] = type(model).__name__
        report["transformers_load_seconds"] = round(time.time() - t0, 2)
        compare_logits(logits_of(model, load_ids(args.token_ids)), args.sqkit_logits, args.logit_tol, report, "logits_vs_sqkit")
    print(json.dumps(report, default=str))
    return 0 if report["ok"] else 1


def cmd_ppl(args):
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(args.threads)
    kwargs = {"dtype": torch.float32}
    if args.gguf_file:
        kwargs["gguf_file"] = args.gguf_file
    if args.ct_dequantize:
        from transformers import CompressedTensorsConfig
        kwargs["quantization_config"] = CompressedTensorsConfig(run_compressed=False)
    model = AutoModelForCausalLM.from_pretrained(args.dir, **kwargs)
    model.eval()
    ids = load_ids(args.token_ids)
    c = args.ctx
    n_windows = len(ids) // c
    if args.chunks:
        n_windows = min(n_windows, args.chunks)
    nll_sum, nll_sq, count = 0.0, 0.0, 0
    t0 = time.time()
    with torch.no_grad():
        for w in range(n_windows):
            x = torch.tensor([ids[w * c:(w + 1) * c]], dtype=torch.long)
            logp = torch.log_softmax(model(x).logits[0].double(), dim=-1)
            nll = -logp[:-1].gather(1, x[0, 1:, None]).squeeze(1)
            nll_sum += float(nll.sum())
            nll_sq += float((nll * nll).sum())
            count += nll.numel()
    secs = time.time() - t0
    mean = nll_sum / count
    ppl = math.exp(mean)
    var = nll_sq / count - mean * mean
    print(json.dumps({"ppl": ppl, "ppl_err": ppl * math.sqrt(max(var, 0.0) / (count - 1)), "nll_mean": mean,
                      "windows": n_windows, "ctx": c, "tokens_scored": count, "seconds": round(secs, 2),
                      "tokens_per_second": round(n_windows * c / secs, 1), "threads": args.threads,
                      "class": type(model).__name__}))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--token-ids", help="token ids (sq-run --token-ids format) for the logit comparison")
    common.add_argument("--sqkit-logits", help="sq-run --logits output on the same ids")
    common.add_argument("--logit-tol", type=float, default=1e-4, help="bound on max |Δlogit| vs sqkit")
    common.add_argument("--threads", type=int, default=2)
    common.add_argument("--sim-tol", type=float, default=2e-3, help="W8A8: bound on max |Δlogit| of the compressed-tensors simulation vs transformers")
    common.add_argument("--sqkit-sim-tol", type=float, default=2e-3, help="W8A8: bound on max |Δlogit| of the sqkit-style simulation vs sqkit's runner")
    common.add_argument("--no-transformers", metavar="REASON", help="check the files only; do not load them in transformers (a known limitation, named)")
    common.add_argument("--ct-dequantize", action="store_true", help="load with CompressedTensorsConfig(run_compressed=False)")
    a = sub.add_parser("ct", parents=[common])
    a.add_argument("dir")
    a.add_argument("--dequantized", help="sq-export --format hf of the same .sqm (required unless the file has online rotations)")
    g = sub.add_parser("gguf", parents=[common])
    g.add_argument("file")
    g.add_argument("--dequantized", help="sq-export --format gguf --outtype f32 of the same .sqm")
    g.add_argument("--config-override", help="JSON object of config values transformers' GGUF loader does not read (passed to from_pretrained)")
    g.add_argument("--weight-tol", type=float, default=0.0, help="bound on max |Δw| / max |w| per tensor (FP16 scale rounding)")
    q = sub.add_parser("ppl", parents=[common])
    q.add_argument("dir")
    q.add_argument("--gguf-file")
    q.add_argument("-c", "--ctx", type=int, default=512)
    q.add_argument("--chunks", type=int, default=0)
    args = p.parse_args()
    return {"ct": cmd_ct, "gguf": cmd_gguf, "ppl": cmd_ppl}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
