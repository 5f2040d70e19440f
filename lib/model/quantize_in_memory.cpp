#include "model/quantize_in_memory.h"

#include "core/error.h"
#include "model/w8a8_linear.h"

namespace sq {

namespace {
void replace(std::unique_ptr<Linear>& lin, WeightGranularity w, ActQuant a) {
  if (const auto* dense = dynamic_cast<const DenseLinear*>(lin.get()))
    lin = std::make_unique<W8A8Linear>(dense->weight(), w, a, 0.0f, dense->bias());
}
}  // namespace

void quantize_linears_w8a8(Decoder& model, WeightGranularity weight, ActQuant act, bool include_head) {
  if (act == ActQuant::PerTensorStatic)
    throw UsageError("in-memory W8A8 supports dynamic activations only (static scales need calibration: use sq-convert)");
  for (DecoderLayer& L : model.mutable_layers())
    for (auto* lin : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj, &L.down_proj}) replace(*lin, weight, act);
  if (include_head) {
    std::unique_ptr<Linear> head = model.release_lm_head();
    replace(head, weight, act);
    model.set_lm_head(std::move(head));
  }
}

}  // namespace sq
