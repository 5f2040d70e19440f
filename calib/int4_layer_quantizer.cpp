#include "calib/int4_layer_quantizer.h"

#include "calib/q4k_quantize.h"

#include "core/error.h"
#include "model/decoder_linears.h"

namespace sq {

void validate_int4_options(const Int4Options& o) {
  if (o.group_size != 32 && o.group_size != 64 && o.group_size != 128)
    throw UsageError("--group-size must be 32, 64 or 128, got " + std::to_string(o.group_size));
  if (!(o.damp >= 0.0 && o.damp < 1e6)) throw UsageError("--damp must be a finite value ≥ 0, got " + std::to_string(o.damp));
  if (o.k_quant && (o.group_size != 32 || !o.asym))
    throw UsageError("--k-quant (GGML's Q4_K layout) has groups of 32 with a minimum each: it needs --group-size 32 --asym");
}

Int4Projection quantize_linear_int4(const Tensor& W, const std::string& name, const Int4Options& o, const std::vector<double>* H,
                                    const std::vector<double>* importance) {
  const int64_t rows = W.dim(0), in = W.dim(1);
  GptqOptions g;
  g.bits = 4;
  g.group_size = o.group_size;
  g.symmetric = !o.asym;
  g.damp = o.damp;
  g.act_order = o.act_order;
  // With act_order, groups must be fixed before the permutation (static); without it, each group's
  // scale comes from the error-updated weights when GPTQ reaches it (the reference default):
  // static scales from the original weights clip the updated ones.
  g.static_groups = o.act_order;
  g.fp16_scales = true;
  g.scale_search = o.scale_search;
  g.name = name;
  if (H && static_cast<int64_t>(H->size()) != in * in)
    throw InputError(name + ": the input Hessian has " + std::to_string(H->size()) + " entries, expected " + std::to_string(in) +
                     "² = " + std::to_string(in * in));
  Int4Projection p;
  p.name = name;
  if (o.gptq && !H) throw InputError(name + ": GPTQ needs the input Hessian of this layer (calibrate with --hessian)");
  // The columns' importance is diag(H): for RTN's search when no calibration importance is given,
  // and always for the Q4_K grid under GPTQ (as the flat layout's GPTQ scale search, which
  // gptq_quantize weighs by diag(H) itself)
  std::vector<double> diag;
  if (H && (o.k_quant || o.scale_search) && (o.gptq ? o.k_quant : !importance)) {
    diag = hessian_diagonal(*H, in);
    importance = &diag;
  }
  if (o.k_quant) {
    try {
      p.weights = quantize_q4k(W.data(), rows, in, importance ? importance->data() : nullptr, name);
    } catch (const std::invalid_argument& e) {
      throw InputError(e.what());
    }
    if (o.gptq) {
      // GPTQ on the Q4_K grid: the two-level scales and minimums are fixed first (the RTN search
      // above, from the original weights), then GPTQ chooses the codes with error feedback.
      const Int4Weights& q = p.weights;
      const int64_t ng = int4_groups_per_row(q);
      std::vector<float> scales(static_cast<size_t>(rows * ng)), mins(scales.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < ng; ++j) {
          scales[static_cast<size_t>(r * ng + j)] = int4_scale(q, r, j);
          mins[static_cast<size_t>(r * ng + j)] = int4_offset(q, r, j);
        }
      g.static_groups = true;
      g.scale_search = false;
      g.grid_scales = &scales;
      g.grid_mins = &mins;
      const GptqResult r = gptq_quantize(W.data(), rows, in, *H, g);
      p.weights.packed.assign(static_cast<size_t>(rows * in / 2), 0);
      uint8_t* const packed = p.weights.packed.mutable_data();
      for (int64_t row = 0; row < rows; ++row)
        for (int64_t c = 0; c < in; ++c) {
          const uint8_t u = r.codes[static_cast<size_t>(row * in + c)];
          packed[row * (in / 2) + c / 2] |= static_cast<uint8_t>((c & 1) ? u << 4 : u);
        }
      p.hessian_error = r.hessian_error;
      return p;
    }
    if (H) {
      std::vector<float> deq(static_cast<size_t>(rows * in));
      dequantize_int4(p.weights, deq.data());
      p.hessian_error = hessian_weighted_error(W.data(), deq.data(), rows, in, *H);
    }
    return p;
  }
  if (o.gptq) {
    GptqResult r = gptq_quantize(W.data(), rows, in, *H, g);
    p.hessian_error = r.hessian_error;
    p.weights = to_int4_weights(r, !o.asym);
  } else {
    if (o.scale_search) g.importance = importance;
    GptqResult r = rtn_quantize(W.data(), rows, in, g);
    if (H) p.hessian_error = hessian_weighted_error(W.data(), r.dequantized.data(), rows, in, *H);
    p.weights = to_int4_weights(r, !o.asym);
  }
  return p;
}

std::vector<Int4Projection> quantize_layer_int4(const Checkpoint& ck, int layer, const Int4Options& o,
                                                const std::array<const std::vector<double>*, kActivationSites>& hessians) {
  validate_int4_options(o);
  std::vector<Int4Projection> out;
  for (const LinearSlot& s : decoder_layer_linears(ck.config, layer)) {
    if (!s.quantize) continue;
    out.push_back(quantize_linear_int4(ck.tensors.at(s.name + ".weight"), s.name, o, hessians[static_cast<size_t>(s.site)]));
  }
  return out;
}

}  // namespace sq
