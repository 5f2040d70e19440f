#include "core/rope_frequencies.h"

#include <cmath>

namespace sq {

template <typename T>
std::vector<T> rope_inv_freq(float theta, int head_dim, const RopeScaling& s) {
  const int half = head_dim > 0 ? head_dim / 2 : 0;
  std::vector<T> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i)
    inv[static_cast<size_t>(i)] = T(1) / std::pow(static_cast<T>(theta), static_cast<T>(2 * i) / static_cast<T>(head_dim));
  switch (s.type) {
    case RopeScalingType::Default:
      break;
    case RopeScalingType::Linear:
      for (T& f : inv) f /= static_cast<T>(s.factor);
      break;
    case RopeScalingType::Llama3: {
      // transformers computes the two thresholds in Python (double) and compares them with FP32
      // wavelengths; the blend runs on FP32 tensors.
      const double L = s.original_max_position_embeddings;
      const T low_freq_wavelen = static_cast<T>(L / double(s.low_freq_factor));
      const T high_freq_wavelen = static_cast<T>(L / double(s.high_freq_factor));
      const T two_pi = static_cast<T>(2.0 * 3.14159265358979323846);
      const T factor = static_cast<T>(s.factor), lo = static_cast<T>(s.low_freq_factor);
      const T span = static_cast<T>(double(s.high_freq_factor) - double(s.low_freq_factor));
      for (T& f : inv) {
        const T wavelen = two_pi / f;
        if (wavelen < high_freq_wavelen) continue;  // high frequencies: unchanged
        if (wavelen > low_freq_wavelen) {           // low frequencies: interpolated by factor
          f = f / factor;
          continue;
        }
        const T smooth = (static_cast<T>(L) / wavelen - lo) / span;
        const T scaled = (T(1) - smooth) * f / factor;
        const T kept = smooth * f;
        f = scaled + kept;
      }
      break;
    }
  }
  return inv;
}

template std::vector<float> rope_inv_freq<float>(float, int, const RopeScaling&);
template std::vector<double> rope_inv_freq<double>(float, int, const RopeScaling&);

std::vector<float> rope_inv_freq(const ModelConfig& c) { return rope_inv_freq<float>(c.rope_theta, c.rope_dim(), c.rope_scaling); }

template <typename T>
std::vector<T> rope_inv_freq(const ModelConfig& c, int layer) {
  if (c.spec.position != PositionKind::Rope) return {};
  if (c.spec.rope_local_theta > 0.0f && c.window(layer) > 0) return rope_inv_freq<T>(c.spec.rope_local_theta, c.rope_dim(), RopeScaling{});
  return rope_inv_freq<T>(c.rope_theta, c.rope_dim(), c.rope_scaling);
}

template std::vector<float> rope_inv_freq<float>(const ModelConfig&, int);
template std::vector<double> rope_inv_freq<double>(const ModelConfig&, int);

std::vector<float> rope_inv_freq(const ModelConfig& c, int layer) { return rope_inv_freq<float>(c, layer); }

}  // namespace sq
