#include "cuda/cuda_kv_bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "core/error.h"
#include "core/rope_frequencies.h"
#include "cuda/cuda_kv_kernels.h"
#include "cuda/cuda_runtime.h"
#include "formats/safetensors.h"  // float_to_half

namespace sq::bench {
namespace {

constexpr int kHeads = 32, kKvHeads = 32, kHeadDim = 128;
constexpr int64_t kWidth = int64_t(kKvHeads) * kHeadDim;
constexpr double kColdBytes = 256e6;  ///< layer copies per format: ≥ 5× the 50 MB L2 of an H100/H200

/// One format's device storage: `layers` copies of T rows of K and V, and the shared tables.
struct Contender {
  std::string name;
  cuda::KVRowFormat format;
  int64_t row_bytes = 0;
  int layers = 1;
  std::vector<DeviceArray<uint8_t>> k, v;
  DeviceArray<uint16_t> sink_k, sink_v;
  DeviceArray<float> cb, ch_scale, ch_offset;
  std::vector<cuda::KVLayerDeviceView> views;
  double bytes_per_call = 0;
};

/// Random row bytes of one format: nuq4 codes are any bytes followed (values) by a finite FP16
/// scale/offset; FP16/FP32 rows hold N(0, 1) values.
std::vector<uint8_t> random_rows(cuda::KVRowFormat f, int64_t rows, int64_t row_bytes, bool per_token, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint8_t> out(static_cast<size_t>(rows * row_bytes));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = out.data() + r * row_bytes;
    if (f == cuda::KVRowFormat::Nuq) {
      const int64_t codes = kWidth / 2;
      for (int64_t b = 0; b < codes; ++b) row[b] = static_cast<uint8_t>(rng());
      if (per_token) {
        const uint16_t s = float_to_half(0.5f + 0.1f * std::fabs(nd(rng))), o = float_to_half(0.1f * nd(rng));
        std::memcpy(row + codes, &s, 2);
        std::memcpy(row + codes + 2, &o, 2);
      }
    } else if (f == cuda::KVRowFormat::F16) {
      for (int64_t c = 0; c < kWidth; ++c) {
        const uint16_t h = float_to_half(nd(rng));
        std::memcpy(row + 2 * c, &h, 2);
      }
    } else {
      for (int64_t c = 0; c < kWidth; ++c) {
        const float x = nd(rng);
        std::memcpy(row + 4 * c, &x, 4);
      }
    }
  }
  return out;
}

/// Uploads `layers` copies of T rows (a random block of up to 1024 rows repeated).
std::vector<DeviceArray<uint8_t>> upload_layers(cuda::KVRowFormat f, int64_t T, int64_t row_bytes, bool per_token, int layers,
                                                uint32_t seed) {
  const int64_t block = std::min<int64_t>(T, 1024);
  const std::vector<uint8_t> rows = random_rows(f, block, row_bytes, per_token, seed);
  std::vector<DeviceArray<uint8_t>> out;
  for (int l = 0; l < layers; ++l) {
    out.emplace_back(static_cast<size_t>(T * row_bytes));
    for (int64_t r = 0; r < T; r += block) {
      const int64_t n = std::min(block, T - r);
      out.back().upload(rows.data(), static_cast<size_t>(n * row_bytes), static_cast<size_t>(r * row_bytes));
    }
  }
  return out;
}

std::unique_ptr<Contender> make_contender(const std::string& name, cuda::KVRowFormat f, int64_t T, const DeviceArray<float>& inv_freq) {
  auto c = std::make_unique<Contender>();
  c->name = name;
  c->format = f;
  const bool nuq = f == cuda::KVRowFormat::Nuq;
  const int64_t code_bytes = kWidth / 2;
  const int64_t k_row = nuq ? code_bytes : (f == cuda::KVRowFormat::F16 ? 2 : 4) * kWidth;
  const int64_t v_row = nuq ? code_bytes + 4 : k_row;
  const int sinks = nuq ? 1 : 0;
  c->row_bytes = k_row + v_row;
  c->bytes_per_call = double(T - sinks) * double(k_row + v_row) + double(sinks) * 2.0 * 2.0 * double(kWidth);
  c->layers = std::max(1, static_cast<int>(std::ceil(kColdBytes / (double(T) * double(k_row + v_row)))));
  c->k = upload_layers(f, T, k_row, false, c->layers, 1);
  c->v = upload_layers(f, T, v_row, nuq, c->layers, 2);
  if (nuq) {
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f), sc(0.5f, 2.0f);
    std::vector<float> cb(16), scale(static_cast<size_t>(kWidth)), offset(static_cast<size_t>(kWidth));
    for (float& x : cb) x = u(rng);
    std::sort(cb.begin(), cb.end());
    for (size_t i = 0; i < scale.size(); ++i) {
      scale[i] = sc(rng);
      offset[i] = 0.1f * u(rng);
    }
    c->cb = DeviceArray<float>(cb);
    c->ch_scale = DeviceArray<float>(scale);
    c->ch_offset = DeviceArray<float>(offset);
    std::vector<uint16_t> sink(static_cast<size_t>(kWidth));
    for (auto& h : sink) h = float_to_half(u(rng));
    c->sink_k = DeviceArray<uint16_t>(sink);
    c->sink_v = DeviceArray<uint16_t>(sink);
  }
  for (int l = 0; l < c->layers; ++l) {
    cuda::KVLayerDeviceView v;
    v.n_kv_heads = kKvHeads;
    v.head_dim = kHeadDim;
    v.n_sinks = sinks;
    v.keys_pre_rope = nuq;  // KVQuant keys are stored before RoPE and rotated on the fly
    v.rope_layout = RopeLayout::Interleaved;
    v.rope_dim = kHeadDim;  // full rotation, as LLaMA
    v.inv_freq = inv_freq.data();
    for (cuda::KVDeviceRows* R : {&v.k, &v.v}) {
      const bool value = R == &v.v;
      R->format = f;
      R->dense = value ? c->v[size_t(l)].data() : c->k[size_t(l)].data();
      R->row_bytes = value ? v_row : k_row;
      if (nuq) {
        R->code_bytes = code_bytes;
        R->bits = 4;
        R->codebook = c->cb.data();
        R->per_channel = !value;
        R->channel_scale = value ? nullptr : c->ch_scale.data();
        R->channel_offset = value ? nullptr : c->ch_offset.data();
        R->sinks = value ? c->sink_v.data() : c->sink_k.data();
      }
    }
    c->views.push_back(v);
  }
  return c;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

nlohmann::json run_cuda_kv_decode_bench(const std::vector<int64_t>& contexts, int reps) {
  require_cuda("sq-bench --suite cuda-kv-decode");
  for (const int64_t T : contexts)
    if (T < 2) throw UsageError("--cuda-kv-contexts: every context must be >= 2 tokens, got " + std::to_string(T));
  if (reps < 20) throw UsageError("--cuda-kv-reps must be >= 20, got " + std::to_string(reps));
  const std::string device = cuda_device_name(0);
  std::printf("== CUDA KV decode attention on %s: 32 heads x 128, 32 KV heads, interleaved RoPE, one layer ==\n", device.c_str());
  std::printf("split-K decode kernel, median of %d CUDA-event-timed calls after 3 warm-up calls, layers cycled past L2\n", reps);
  std::printf("%-7s %-6s %7s %10s %10s %10s %10s\n", "tokens", "cache", "layers", "us/step", "MB read", "GB/s", "x nuq4");
  const DeviceArray<float> inv_freq(rope_inv_freq<float>(10000.0f, kHeadDim, RopeScaling{}));  // plain RoPE, θ = 10⁴
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(size_t(kHeads) * kHeadDim);
  for (float& x : q) x = nd(rng);
  const DeviceArray<float> dq(q);
  DeviceArray<float> out(q.size());
  nlohmann::json results = nlohmann::json::array();
  CudaEventTimer timer;
  for (const int64_t T : contexts) {
    std::vector<std::unique_ptr<Contender>> cs;
    cs.push_back(make_contender("nuq4", cuda::KVRowFormat::Nuq, T, inv_freq));
    cs.push_back(make_contender("fp16", cuda::KVRowFormat::F16, T, inv_freq));
    cs.push_back(make_contender("fp32", cuda::KVRowFormat::F32, T, inv_freq));
    std::vector<double> med(cs.size());
    for (size_t i = 0; i < cs.size(); ++i) {
      Contender& c = *cs[i];
      DeviceArray<float> scratch(static_cast<size_t>(cuda::kv_decode_scratch_floats(c.views[0], kHeads, T)));
      auto call = [&](int r) {
        cuda::kv_decode_attention(c.views[size_t(r % c.layers)], dq.data(), kHeads, T, scratch.data(), out.data());
      };
      for (int r = 0; r < 3; ++r) call(r);
      std::vector<double> ms;
      for (int r = 0; r < reps; ++r) {
        timer.start();
        call(r + 3);
        timer.stop();
        ms.push_back(timer.elapsed_ms());
      }
      med[i] = median(ms) * 1e-3;  // seconds
    }
    nlohmann::json jt;
    jt["tokens"] = T;
    for (size_t i = 0; i < cs.size(); ++i) {
      const Contender& c = *cs[i];
      const double ratio = med[i] / med[0];
      std::printf("%-7lld %-6s %7d %10.1f %10.2f %10.1f %10.2f\n", static_cast<long long>(T), c.name.c_str(), c.layers, med[i] * 1e6,
                  c.bytes_per_call / 1e6, c.bytes_per_call / med[i] / 1e9, ratio);
      jt[c.name] = {{"median_seconds", med[i]}, {"bytes_read", c.bytes_per_call}, {"gb_per_s", c.bytes_per_call / med[i] / 1e9},
                    {"layers", c.layers}, {"ratio_to_nuq4", ratio}};
    }
    const double speedup = med[1] / med[0];
    std::printf("        acceptance (nuq4 >= 1.2x faster than fp16 at %lld tokens): %.2fx %s\n", static_cast<long long>(T), speedup,
                speedup >= 1.2 ? "MET" : "NOT MET");
    jt["nuq4_speedup_over_fp16"] = speedup;
    results.push_back(jt);
  }
  return {{"device", device}, {"heads", kHeads}, {"kv_heads", kKvHeads}, {"head_dim", kHeadDim}, {"reps", reps}, {"contexts", results}};
}

}  // namespace sq::bench
