// Per-linear quantizer of the plain re-encodings (--scheme f32 / f16 / bf16): every tensor in the
// scheme's float dtype, nothing quantized.
#include "calib/recipe_schemes.h"

namespace sq {

namespace {
class FloatQuantizer final : public LinearQuantizer {
 public:
  explicit FloatQuantizer(ConvertScheme scheme) : scheme_(scheme) {}
  ConvertScheme float_encoding() const override { return scheme_; }
  void convert_layer(ConvertInputs&, LayerWork& w, SqmWriter& out, ConvertSummary&) override {
    for (const LinearSlot& s : w.linears) write_float_linear(out, w.tensors, s, scheme_);
  }
  nlohmann::json describe(const ConvertInputs&, const ConvertSummary&) const override { return {{"scheme", scheme_name(scheme_)}}; }

 private:
  ConvertScheme scheme_;
};
}  // namespace

std::unique_ptr<LinearQuantizer> make_float_quantizer(ConvertScheme scheme) { return std::make_unique<FloatQuantizer>(scheme); }

}  // namespace sq
