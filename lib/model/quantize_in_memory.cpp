#include "model/quantize_in_memory.h"

#include "core/error.h"
#include "model/w4a16_linear.h"
#include "model/w8a8_linear.h"

namespace sq {

namespace {
/// Calls `make(dense)` for every DenseLinear projection (and the LM head when `include_head`) and
/// puts its result in that linear's place.
template <typename Make>
void replace_dense(Decoder& model, bool include_head, const Make& make) {
  auto replace = [&](std::unique_ptr<Linear>& lin) {
    if (const auto* dense = dynamic_cast<const DenseLinear*>(lin.get())) lin = make(*dense);
  };
  for (DecoderLayer& L : model.mutable_layers())
    for (auto* lin : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj, &L.down_proj}) replace(*lin);
  if (include_head) {
    std::unique_ptr<Linear> head = model.release_lm_head();
    replace(head);
    model.set_lm_head(std::move(head));
  }
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
  auto set = [&](Linear* lin) {
    if (auto* w4 = dynamic_cast<W4A16Linear*>(lin)) {
      w4->set_decode_activations(a);
      count += w4->decode_activations() == a;
    }
  };
  for (DecoderLayer& L : model.mutable_layers()) {
    for (auto* lin : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj, &L.down_proj}) set(lin->get());
    for (Expert& e : L.experts)
      for (auto* lin : {&e.gate_proj, &e.up_proj, &e.down_proj}) set(lin->get());
  }
  std::unique_ptr<Linear> head = model.release_lm_head();
  set(head.get());
  model.set_lm_head(std::move(head));
  return count;
}

}  // namespace sq
