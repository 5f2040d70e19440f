#include "model/observer.h"

namespace sq {

const char* activation_site_name(ActivationSite site) {
  switch (site) {
    case ActivationSite::AttnInput: return "attn_input";
    case ActivationSite::AttnOutput: return "attn_output";
    case ActivationSite::FfnInput: return "ffn_input";
    case ActivationSite::FfnHidden: return "ffn_hidden";
  }
  return "?";
}

const char* projection_name(Projection p) {
  static const char* names[kProjections] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return names[static_cast<int>(p)];
}

ActivationSite projection_input_site(Projection p) {
  switch (p) {
    case Projection::Q:
    case Projection::K:
    case Projection::V: return ActivationSite::AttnInput;
    case Projection::O: return ActivationSite::AttnOutput;
    case Projection::Gate:
    case Projection::Up: return ActivationSite::FfnInput;
    case Projection::Down: return ActivationSite::FfnHidden;
  }
  return ActivationSite::AttnInput;
}

}  // namespace sq
