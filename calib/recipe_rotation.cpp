#include "calib/recipe_rotation.h"

#include <string>

#include "core/error.h"
#include "ops/hadamard.h"

namespace sq {

namespace {

/// A writable copy of w.tensors' `name` (transforms clone what they touch: the tensors may be views
/// of the source model's).
Tensor& own(LayerWork& w, const std::string& name) {
  Tensor& t = w.tensors.tensors.at(name);
  t = t.clone();
  return t;
}

}  // namespace

RotationStep::RotationStep(const ConvertInputs& in) : enabled_(in.o.rotate) {
  if (!enabled_) return;
  const ConvertOptions& o = in.o;
  if (o.scheme == ConvertScheme::W4A4Atom) {
    // W4A4 without outlier channels on rotated activations is QuaRot's W4A4 (§4): what the rotation
    // is for. Outlier channels, GPTQ's Hessians and --clip search come from unrotated calibration data.
    if (o.atom.outlier_channels != 0 || o.atom.gptq || o.atom.clip == "search")
      throw UsageError("--rotate hadamard with --scheme w4a4-atom needs --outlier-channels 0 and no --gptq or --clip search: outlier "
                       "channels, Hessians and clipping searches come from the unrotated calibration activations");
  } else if (!is_float_scheme(o.scheme) && o.scheme != ConvertScheme::W8A8) {
    throw UsageError(std::string("--rotate hadamard supports --scheme w8a8, w4a4-atom (--outlier-channels 0) and the float schemes so "
                                 "far, not ") + scheme_name(o.scheme) +
                     ": its calibration data (Σx² importance, Hessians) describe the unrotated activations");
  }
  if (o.scheme == ConvertScheme::W8A8 && o.act == ActQuant::PerTensorStatic)
    throw UsageError("--rotate hadamard needs dynamic activation steps (per-token or per-tensor-dynamic): the calibrated static "
                     "steps (O3) are of the unrotated activations");
  if (o.kv.spec.kind == KVKind::Nuq)
    throw UsageError("--rotate hadamard rotates the values of the KV cache; --kv " + kv_spec_name(o.kv.spec) +
                     " tables are fitted to the unrotated ones (use a uniform --kv format)");
  const ModelConfig& c = in.config;
  online_[ActivationSite::AttnInput] = ops::hadamard_block(c.dim);
  online_[ActivationSite::FfnInput] = ops::hadamard_block(c.dim);
  online_[ActivationSite::FfnHidden] = ops::hadamard_block(c.hidden_dim);
  head_block_ = ops::hadamard_block(c.head_dim);
}

void RotationStep::apply(LayerWork& w) const {
  if (!enabled_) return;
  for (const LinearSlot& s : w.linears) {
    // Every linear of an online site, the FP32 router included (the runner rotates the site's
    // activation for all of its readers); v (also an online site's reader) and o offline.
    const auto online = online_.find(s.site);
    const bool v = s.role == LinearRole::V, o = s.role == LinearRole::O;
    if (online == online_.end() && !v && !o) continue;
    Tensor& W = own(w, s.name + ".weight");  // one copy, whichever rotations it gets
    if (online != online_.end()) {  // W ← W·R (R symmetric)
      ops::hadamard_rows(W.mutable_data(), s.out, s.in, online->second);
      w.rotation[s.site] = online->second;
    }
    if (v) {  // v ← R·v per KV head (rows; blocks never straddle heads)
      ops::hadamard_columns(W.mutable_data(), s.out, s.in, head_block_);
      if (s.bias) ops::hadamard_rows(own(w, s.name + ".bias").mutable_data(), 1, s.out, head_block_);
    } else if (o) {  // o_proj reads the rotated heads: W ← W·R
      ops::hadamard_rows(W.mutable_data(), s.out, s.in, head_block_);
      w.rotation[s.site] = head_block_;
    }
  }
}

nlohmann::json RotationStep::describe() const {
  if (!enabled_) return nullptr;
  nlohmann::json online = nlohmann::json::object();
  for (const auto& [site, block] : online_) online[activation_site_name(site)] = block;
  return {{"method", "hadamard"},
          {"online", online},
          {"offline", {{activation_site_name(ActivationSite::AttnOutput), head_block_}}},
          {"kv_keys", head_block_}};
}

}  // namespace sq
