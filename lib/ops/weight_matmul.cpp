#include "ops/weight_matmul.h"

#include "ops/aligned_buffer.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace sq::ops {

namespace {
using dnnl::memory;

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

std::string shape_text(int64_t n, int64_t out, int64_t in) {
  return "x[" + std::to_string(n) + ", " + std::to_string(in) + "] · W[" + std::to_string(out) + ", " + std::to_string(in) + "]ᵀ";
}

// oneDNN's matmul computes dst[M, N] = src[M, K] · weights[K, N]; W[out, in] row-major is weights
// [K = in, N = out] in the "ba" tag (the K index moves fastest).
memory::desc rows_desc(int64_t n, int64_t width) { return {{n, width}, memory::data_type::f32, memory::format_tag::ab}; }
memory::desc plain_weights(int64_t out, int64_t in) { return {{in, out}, memory::data_type::f32, memory::format_tag::ba}; }

// Scratchpad supplied per call (from a buffer of the calling thread): the library-managed one is
// shared, and primitives run concurrently from the threads of an OpenMP region (sq-eval's chunks)
// corrupted each other's results through it.
dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr a;
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return a;
}

/// The calling thread's scratchpad of at least `bytes` bytes (64-byte aligned).
void* thread_scratchpad(size_t bytes) {
  thread_local std::vector<uint8_t> buf;
  return aligned_buffer(buf, static_cast<int64_t>(bytes));
}
}  // namespace

bool weight_matmul_pays() {
  static const bool pays = [] {
    try {
      const int64_t n = 512, in = 2048, out = 2048;
      const memory::desc any{{in, out}, memory::data_type::f32, memory::format_tag::any};
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(rows_desc(n, in), any, rows_desc(n, out)), user_scratchpad(),
                                            cpu_engine());
      return std::string(pd.impl_info_str()).rfind("brg", 0) == 0;
    } catch (const dnnl::error&) {
      return false;  // no matmul at all: ops::sgemm serves every product
    }
  }();
  return pays;
}

struct WeightMatmul::State {
  int64_t out = 0, in = 0;
  memory::desc wdesc;  ///< the layout every primitive of this matrix reads W in
  memory weights;      ///< W in that layout (Plain: the caller's storage)
  int64_t packed_bytes = 0;
  std::mutex mu;
  struct Primitive {
    dnnl::matmul matmul;
    memory::desc scratchpad;  ///< what it needs per call (user scratchpad mode)
  };
  std::map<int64_t, Primitive> prims;  ///< row count -> compiled primitive
  std::set<int64_t> refused;              ///< row counts oneDNN has no primitive for with wdesc

  /// The primitive for n rows reading W as wdesc; nullptr when none (see forward).
  const Primitive* primitive(int64_t n) {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = prims.find(n); it != prims.end()) return &it->second;
    if (refused.count(n) || static_cast<int>(prims.size()) >= kMaxShapes) return nullptr;
    try {
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(rows_desc(n, in), wdesc, rows_desc(n, out)), user_scratchpad(), cpu_engine());
      return &prims.emplace(n, Primitive{dnnl::matmul(pd), pd.scratchpad_desc()}).first->second;
    } catch (const dnnl::error&) {
      refused.insert(n);  // no implementation reads this layout at this row count
      return nullptr;
    }
  }
};

WeightMatmul::WeightMatmul(const float* w, int64_t out, int64_t in, WeightLayout layout, int64_t rows_hint)
    : s_(std::make_unique<State>()) {
  if (out <= 0 || in <= 0 || rows_hint <= 0)
    throw std::runtime_error("WeightMatmul: shape " + shape_text(rows_hint, out, in) + " must be positive");
  s_->out = out;
  s_->in = in;
  const memory::desc plain = plain_weights(out, in);
  try {
    memory user(plain, cpu_engine(), const_cast<float*>(w));  // read only: a reorder source or a primitive's weights
    if (layout == WeightLayout::Plain) {
      s_->wdesc = plain;
      s_->weights = user;
      return;
    }
    const memory::desc any{{in, out}, memory::data_type::f32, memory::format_tag::any};
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(rows_desc(rows_hint, in), any, rows_desc(rows_hint, out)), user_scratchpad(),
                                    cpu_engine());
    s_->wdesc = pd.weights_desc();
    s_->weights = memory(s_->wdesc, cpu_engine());
    dnnl::stream st(cpu_engine());
    dnnl::reorder(user, s_->weights).execute(st, user, s_->weights);
    st.wait();
    s_->packed_bytes = static_cast<int64_t>(s_->wdesc.get_size());
    if (rows_hint % kRowStep == 0) s_->prims.emplace(rows_hint, State::Primitive{dnnl::matmul(pd), pd.scratchpad_desc()});
  } catch (const dnnl::error& e) {
    throw std::runtime_error("WeightMatmul: oneDNN has no FP32 matmul for " + shape_text(rows_hint, out, in) + ": " + e.what());
  }
}

WeightMatmul::~WeightMatmul() = default;

bool WeightMatmul::forward(const float* x, int64_t n, float* y) const {
  if (n <= 0) return true;
  // The body, the largest multiple of kRowStep rows, runs on the caller's rows; the tail (fewer than
  // kRowStep rows) runs as a kRowStep-row product on zero-padded copies. So any row count needs at
  // most two primitives, from a set that depends on n alone (never on which counts came before).
  const int64_t body = n / kRowStep * kRowStep, tail = n - body;
  const State::Primitive* body_prim = body > 0 ? s_->primitive(body) : nullptr;
  const State::Primitive* tail_prim = tail > 0 ? s_->primitive(kRowStep) : nullptr;
  if ((body > 0 && !body_prim) || (tail > 0 && !tail_prim)) return false;
  const auto run = [&](const State::Primitive& prim, const float* src_rows, int64_t rows, float* dst_rows) {
    memory src(rows_desc(rows, s_->in), cpu_engine(), const_cast<float*>(src_rows));
    memory dst(rows_desc(rows, s_->out), cpu_engine(), dst_rows);
    memory scratch(prim.scratchpad, cpu_engine(), thread_scratchpad(prim.scratchpad.get_size()));
    dnnl::stream st(cpu_engine());
    prim.matmul.execute(st, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, s_->weights}, {DNNL_ARG_DST, dst}, {DNNL_ARG_SCRATCHPAD, scratch}});
    st.wait();
  };
  try {
    if (body > 0) run(*body_prim, x, body, y);
    if (tail > 0) {
      thread_local std::vector<float> src_pad, dst_pad;
      float* src = aligned_buffer(src_pad, kRowStep * s_->in);
      float* dst = aligned_buffer(dst_pad, kRowStep * s_->out);
      std::copy(x + body * s_->in, x + n * s_->in, src);
      std::fill(src + tail * s_->in, src + kRowStep * s_->in, 0.0f);
      run(*tail_prim, src, kRowStep, dst);
      std::copy(dst, dst + tail * s_->out, y + body * s_->out);
    }
  } catch (const dnnl::error& e) {
    throw std::runtime_error("WeightMatmul: oneDNN failed on " + shape_text(n, s_->out, s_->in) + ": " + e.what());
  }
  return true;
}

int64_t WeightMatmul::packed_bytes() const { return s_->packed_bytes; }

}  // namespace sq::ops
