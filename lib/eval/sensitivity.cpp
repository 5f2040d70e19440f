#include "eval/sensitivity.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "core/error.h"
#include "model/decoder_linears.h"
#include "model/w4a16_linear.h"
#include "model/w8a8_linear.h"
#include "quant/int4_quantize.h"

namespace sq {

const char* sensitivity_scheme_name(SensitivityScheme s) { return s == SensitivityScheme::W8A8 ? "w8a8" : "w4a16"; }

SensitivityScheme parse_sensitivity_scheme(const std::string& name) {
  if (name == "w8a8") return SensitivityScheme::W8A8;
  if (name == "w4a16") return SensitivityScheme::W4A16;
  throw UsageError("--sensitivity-scheme must be 'w8a8' or 'w4a16', got '" + name + "'");
}

namespace {

/// "q", "k", ... for a linear's role ("" for the router, never quantized here).
std::string kind_of(LinearRole r) {
  switch (r) {
    case LinearRole::Q: return "q";
    case LinearRole::K: return "k";
    case LinearRole::V: return "v";
    case LinearRole::O: return "o";
    case LinearRole::Gate:
    case LinearRole::ExpertGate: return "gate";
    case LinearRole::Up:
    case LinearRole::ExpertUp: return "up";
    case LinearRole::Down:
    case LinearRole::ExpertDown: return "down";
    default: return "";
  }
}

/// The quantized replacement of an FP32 linear.
std::unique_ptr<Linear> quantized(const DenseLinear& d, SensitivityScheme s) {
  if (s == SensitivityScheme::W8A8)
    return std::make_unique<W8A8Linear>(d.weight(), WeightGranularity::PerChannel, ActQuant::PerToken, 0.0f, d.bias());
  const Tensor& w = d.weight();
  return std::make_unique<W4A16Linear>(quantize_int4(w.data(), w.dim(0), w.dim(1), 128, false), d.bias());
}

/// Quantized linears swapped into a model; the FP32 ones are put back on destruction.
class Swap {
 public:
  Swap(Decoder& model, const std::vector<LinearSlot>& slots, SensitivityScheme scheme) {
    for (const LinearSlot& s : slots) {
      std::unique_ptr<Linear>& p = linear_slot(model.mutable_layers()[size_t(s.layer)], s);
      const auto* dense = dynamic_cast<const DenseLinear*>(p.get());
      if (!dense) continue;
      std::unique_ptr<Linear> q = quantized(*dense, scheme);
      saved_.emplace_back(&p, std::move(p));
      p = std::move(q);
    }
  }
  ~Swap() {
    for (auto& [p, orig] : saved_) *p = std::move(orig);
  }
  Swap(const Swap&) = delete;
  Swap& operator=(const Swap&) = delete;
  int count() const { return int(saved_.size()); }

 private:
  std::vector<std::pair<std::unique_ptr<Linear>*, std::unique_ptr<Linear>>> saved_;
};

}  // namespace

SensitivityResult evaluate_sensitivity(Decoder& model, const Decoder& reference, const std::vector<int32_t>& tokens,
                                       PerplexityOptions o, SensitivityScheme scheme, bool by_layer, bool by_kind,
                                       const std::function<void(int, int)>& on_unit) {
  const ModelConfig& c = model.config();
  o.reference = &reference;
  o.on_progress = nullptr;
  // The units: per layer, then per kind (in q, k, v, o, gate, up, down order).
  struct Unit {
    SensitivityRow row;
    std::vector<LinearSlot> slots;
  };
  std::vector<Unit> units;
  const std::vector<std::string> kinds = {"q", "k", "v", "o", "gate", "up", "down"};
  std::vector<std::vector<LinearSlot>> per_kind(kinds.size());
  for (int l = 0; l < c.n_layers; ++l) {
    Unit u;
    u.row.unit = "layer " + std::to_string(l);
    u.row.layer = l;
    for (const LinearSlot& s : decoder_layer_linears(c, l)) {
      const std::string k = kind_of(s.role);
      if (!s.quantize || k.empty()) continue;
      u.slots.push_back(s);
      per_kind[size_t(std::find(kinds.begin(), kinds.end(), k) - kinds.begin())].push_back(s);
    }
    if (by_layer) units.push_back(std::move(u));
  }
  if (by_kind)
    for (size_t k = 0; k < kinds.size(); ++k)
      if (!per_kind[k].empty()) {
        Unit u;
        u.row.unit = u.row.kind = kinds[k];
        u.slots = per_kind[k];
        units.push_back(std::move(u));
      }
  const auto t0 = std::chrono::steady_clock::now();
  SensitivityResult r;
  int done = 0;
  for (Unit& u : units) {
    Swap swap(model, u.slots, scheme);
    if (swap.count() == 0)
      throw UsageError("--sensitivity: " + u.row.unit + " has no FP32 linear to quantize (give an FP32 model, not a quantized one)");
    const PerplexityResult p = evaluate_perplexity(model, tokens, o);
    u.row.linears = swap.count();
    u.row.kld_mean = p.comparison->kld_mean;
    u.row.kld_p99 = p.comparison->kld_p99;
    u.row.top1_agreement = p.comparison->top1_agreement;
    u.row.ppl = p.ppl;
    u.row.delta_ppl = p.ppl - p.comparison->ppl_ref;
    r.ppl_ref = p.comparison->ppl_ref;
    r.tokens_scored = p.tokens_scored;
    (u.row.layer >= 0 ? r.layers : r.kinds).push_back(u.row);
    if (on_unit) on_unit(++done, int(units.size()));
  }
  auto by_kld = [](const SensitivityRow& a, const SensitivityRow& b) { return a.kld_mean > b.kld_mean; };
  std::stable_sort(r.layers.begin(), r.layers.end(), by_kld);
  std::stable_sort(r.kinds.begin(), r.kinds.end(), by_kld);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace sq
