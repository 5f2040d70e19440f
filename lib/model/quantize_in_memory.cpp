#include "model/quantize_in_memory.h"

#include "core/error.h"
#include "model/w4a16_linear.h"
#include "model/w8a8_linear.h"

namespace sq {

namespace {
/// Calls f(slot) for every linear slot (std::unique_ptr<Linear>&) of the model: each layer's
/// q/k/v/o/gate/up/down projections, each MoE expert's gate/up/down when `experts`, and the LM head
/// when `head`.
template <typename F>
void for_each_linear_slot(Decoder& model, bool experts, bool head, const F& f) {
  for (DecoderLayer& L : model.mutable_layers()) {
    for (auto* lin : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj, &L.down_proj}) f(*lin);
    if (experts)
      for (Expert& e : L.experts)
        for (auto* lin : {&e.gate_proj, &e.up_proj, &e.down_proj}) f(*lin);
  }
  if (head) {
    std::unique_ptr<Linear> h = model.release_lm_head();
    f(h);
    model.set_lm_head(std::move(h));
  }
}

/// Calls `make(dense)` for every DenseLinear projection (and the LM head when `include_head`) and
/// puts its result in that linear's place.
template <typename Make>
void replace_dense(Decoder& model, bool include_head, const Make& make) {
  for_each_linear_slot(model, false, include_head, [&](std::unique_ptr<Linear>& lin) {
    if (const auto* dense = dynamic_cast<const DenseLinear*>(lin.get())) lin = make(*dense);
  });
}
}  // namespace

void quantize_linears_w8a8(Decoder& model, WeightGranularity weight, ActQuant act, bool include_head) {
  if (act == ActQuant::PerTensorStatic)
    throw UsageError("in-memory W8A8 supports dynamic activations only (static scales need calibration: use sq-convert)");
  replace_dense(model, include_head, [&](const DenseLinear& d) -> std::unique_ptr<Linear> {
    return std::make_unique<W8A8Linear>(d.weight(), weight, act, 0.0f, d.bias());
  });
}

void quantize_linears_w4a16(Decoder& model, int64_t group, bool asym, bool include_head) {
  replace_dense(model, include_head, [&](const DenseLinear& d) -> std::unique_ptr<Linear> {
    if (d.bias().numel() == 0) return std::make_unique<W4A16Linear>(d.weight(), group, asym);
    W4A16Linear rtn(d.weight(), group, asym);
    return std::make_unique<W4A16Linear>(rtn.weights(), d.bias());
  });
}

int set_w4a16_decode_activations(Decoder& model, W4DecodeActivations a) {
  int count = 0;
  for_each_linear_slot(model, true, true, [&](std::unique_ptr<Linear>& lin) {
    if (auto* w4 = dynamic_cast<W4A16Linear*>(lin.get())) {
      w4->set_decode_activations(a);
      count += w4->decode_activations() == a;
    }
  });
  return count;
}

void apply_w4a16_act_option(Decoder& model, const std::string& act, const std::string& model_path) {
  if (act == "fp32") return;
  if (act != "int8") throw UsageError("--w4a16-act: expected fp32 or int8, got '" + act + "'");
  if (!w4_int8_decode_supported())
    throw UsageError("--w4a16-act int8 needs AVX512-VNNI and AVX512-VBMI, which this CPU or build lacks");
  if (set_w4a16_decode_activations(model, W4DecodeActivations::Int8) == 0)
    throw UsageError("--w4a16-act int8: " + model_path + " has no W4A16 linear the INT8 kernel can run");
}

}  // namespace sq
