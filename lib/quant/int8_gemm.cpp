#include "quant/int8_gemm.h"

#include <omp.h>

#include <cpuid.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "quant/gemm_common.h"
#include "quant/int8_gemm_amx.h"
#include "quant/int8_gemm_avx2.h"
#include "quant/int8_gemm_grouped.h"
#include "quant/int8_quantize.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define SQ_INT8_VNNI 1
#include "core/immintrin_quiet.h"
#include "quant/int8_gemm_epilogue.h"
#include "quant/int8_vnni_steps.h"
#else
#define SQ_INT8_VNNI 0
#endif

namespace sq {

namespace {

using gemm::AlignedBytes;
using gemm::for_each_output;
using gemm::kParallelMinMacs;
using gemm::round_up;
using gemm::thread_scratch;

void check_gemm_sizes(const char* what, int64_t m, int64_t n, int64_t k) {
  if (m < 0 || n < 0 || k < 0)
    throw std::invalid_argument(std::string(what) + ": negative size m=" + std::to_string(m) + " n=" + std::to_string(n) +
                                " k=" + std::to_string(k));
  if (k > kInt8GemmMaxK)
    throw std::invalid_argument(std::string(what) + ": k = " + std::to_string(k) + " exceeds " + std::to_string(kInt8GemmMaxK) +
                                " (INT32 accumulators could overflow)");
}


// ---------------------------------------------------------------------------------------------
// VNNI backend
// ---------------------------------------------------------------------------------------------

constexpr int kMR = 8;             // rows of A per micro-kernel call
constexpr int kNV = 3;             // 16-column vectors per panel
constexpr int kNR = 16 * kNV;      // panel width (columns of B / C)
constexpr int64_t kMC = 512;       // rows of A per outer block (A block stays in L3)

#if SQ_INT8_VNNI

/// The register-blocked core: acc[r][v] (16 int32 lanes = 16 output columns) for MR rows × NV
/// vectors, accumulated over kq groups of 4 k with vpdpbusd, plus the u8-shift compensation, stored as int32 to dst (row stride ldd; the last vector masked by last_mask).
/// a: biased u8 rows (stride lda); b: panel [kq][NV·16][4] s8; comp: [NV·16] = −128·colsum.
/// Kept out of line so that the accumulators get registers of their own (inlined together with
/// the FP32 epilogue, GCC spills them).
template <int MR, int NV>
__attribute__((noinline)) void vnni_accumulate(const uint8_t* a, int64_t lda, const int8_t* b, int64_t kq, const int32_t* comp,
                                               int32_t* dst, int64_t ldd, __mmask16 last_mask) {
  __m512i acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      acc[r][v] = _mm512_setzero_si512();
      // Opaque to the optimizer: with 24 provably equal initial values GCC's register allocator
      // coalesces them badly and spills accumulators inside the loop.
      asm("" : "+v"(acc[r][v]));
    }
  int8_vnni::steps<MR, NV, 0>(a, lda, b, 0, kq, acc);
  __m512i cv[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) cv[v] = _mm512_loadu_si512(comp + 16 * v);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      acc[r][v] = _mm512_add_epi32(acc[r][v], cv[v]);
      if (v == NV - 1) _mm512_mask_storeu_epi32(dst + r * ldd + 16 * v, last_mask, acc[r][v]);
      else _mm512_storeu_si512(dst + r * ldd + 16 * v, acc[r][v]);
    }
}

/// One MR × (NV·16) output tile: int32 straight into C, or through a small on-stack tile and the
/// fused dequantization (Int8Dequant) into y.
template <int MR, int NV, bool kF32>
void vnni_kernel(const uint8_t* a, int64_t lda, const int8_t* b, int64_t kq, const int32_t* comp, __mmask16 last_mask, void* out,
                 int64_t ldo, int64_t i0, int64_t j0, const Int8Dequant& dq) {
  if constexpr (!kF32) {
    vnni_accumulate<MR, NV>(a, lda, b, kq, comp, static_cast<int32_t*>(out) + i0 * ldo + j0, ldo, last_mask);
  } else {
    alignas(64) int32_t tile[MR][NV * 16];
    vnni_accumulate<MR, NV>(a, lda, b, kq, comp, &tile[0][0], NV * 16, __mmask16(0xFFFF));
    int8_epilogue::store_tile<true>(&tile[0][0], NV * 16, MR, NV, nullptr, last_mask, out, ldo, i0, j0, dq);
  }
}

using KernelFn = void (*)(const uint8_t*, int64_t, const int8_t*, int64_t, const int32_t*, __mmask16, void*, int64_t, int64_t,
                          int64_t, const Int8Dequant&);

template <bool kF32, int MR>
constexpr std::array<KernelFn, kNV> kernel_row() {
  return {&vnni_kernel<MR, 1, kF32>, &vnni_kernel<MR, 2, kF32>, &vnni_kernel<MR, 3, kF32>};
}

template <bool kF32>
constexpr std::array<std::array<KernelFn, kNV>, kMR> kernel_table() {
  return {kernel_row<kF32, 1>(), kernel_row<kF32, 2>(), kernel_row<kF32, 3>(), kernel_row<kF32, 4>(),
          kernel_row<kF32, 5>(), kernel_row<kF32, 6>(), kernel_row<kF32, 7>(), kernel_row<kF32, 8>()};
}

#endif  // SQ_INT8_VNNI

bool cpu_has_vnni() {
#if SQ_INT8_VNNI
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

// ---------------------------------------------------------------------------------------------
// oneDNN backend helpers
// ---------------------------------------------------------------------------------------------

using dnnl_dt = dnnl::memory::data_type;
/// Bound on cached oneDNN primitives per weight matrix (one per distinct row count m).
constexpr size_t kMaxCachedPrimitives = 64;
using dnnl_tag = dnnl::memory::format_tag;

dnnl::engine& dnnl_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

dnnl::stream& dnnl_stream() {
  static thread_local dnnl::stream s(dnnl_engine());
  return s;
}

}  // namespace

bool cpu_has_int8_dot_product() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool avx512_vnni = (c >> 11) & 1u, amx_int8 = (d >> 25) & 1u;
  bool avx_vnni = false;
  if (a >= 1) {  // leaf 7 sub-leaf 1 exists
    unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) avx_vnni = (a1 >> 4) & 1u;
  }
  return avx512_vnni || avx_vnni || amx_int8;
}

const char* to_string(Int8Backend b) {
  switch (b) {
    case Int8Backend::Auto: return "auto";
    case Int8Backend::Vnni: return "vnni";
    case Int8Backend::Amx: return "amx";
    case Int8Backend::OneDnn: return "onednn";
    case Int8Backend::Avx2: return "avx2";
    case Int8Backend::Reference: return "reference";
  }
  return "unknown";
}

bool int8_backend_available(Int8Backend b) {
  if (b == Int8Backend::Vnni) return cpu_has_vnni();
  if (b == Int8Backend::Amx) return cpu_has_vnni() && int8_amx::available();  // row tails run on VNNI
  if (b == Int8Backend::OneDnn) return cpu_has_int8_dot_product();
  if (b == Int8Backend::Avx2) return int8_avx2::available();
  return true;
}

namespace {

/// SQ_INT8_BACKEND, read once: Auto when unset or empty. Throws UsageError for an unknown name or a
/// backend that cannot run here (every later resolution throws the same).
Int8Backend backend_from_environment() {
  static const std::pair<Int8Backend, std::string> chosen = [] {
    const char* env = std::getenv("SQ_INT8_BACKEND");
    const std::string name = env ? env : "";
    if (name.empty() || name == "auto") return std::make_pair(Int8Backend::Auto, std::string());
    for (Int8Backend b : {Int8Backend::Vnni, Int8Backend::Amx, Int8Backend::OneDnn, Int8Backend::Avx2, Int8Backend::Reference})
      if (name == to_string(b))
        return int8_backend_available(b) ? std::make_pair(b, std::string())
                                         : std::make_pair(Int8Backend::Auto, "SQ_INT8_BACKEND=" + name + ": that INT8 GEMM backend is not available on this machine/build");
    return std::make_pair(Int8Backend::Auto, "SQ_INT8_BACKEND='" + name + "' is not one of auto, amx, vnni, onednn, avx2, reference");
  }();
  if (!chosen.second.empty()) throw UsageError(chosen.second);
  return chosen.first;
}

}  // namespace

Int8Backend resolve_int8_backend(Int8Backend b) {
  if (b != Int8Backend::Auto) return b;
  if (const Int8Backend env = backend_from_environment(); env != Int8Backend::Auto) return env;
  if (int8_backend_available(Int8Backend::Amx)) return Int8Backend::Amx;
  if (cpu_has_vnni()) return Int8Backend::Vnni;
  if (cpu_has_int8_dot_product()) return Int8Backend::OneDnn;
  return int8_avx2::available() ? Int8Backend::Avx2 : Int8Backend::Reference;
}

namespace {

/// Σ_t a[t]·b[t] of k int8 pairs in int32 (exact: check_gemm_sizes bounds k so that |Σ| < 2³¹).
/// Written for the compiler's vectorizer (int16 products summed in int32: vpmaddwd on AVX2).
inline int32_t dot_s8(const int8_t* a, const int8_t* b, int64_t k) {
  int32_t acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t t = 0; t < k; ++t) acc += int32_t(int16_t(a[t]) * int16_t(b[t]));
  return acc;
}

/// As dot_s8 with the activations stored biased, a[t] = x[t] + 128 (u8).
inline int32_t dot_u8_biased_s8(const uint8_t* a, const int8_t* b, int64_t k) {
  int32_t acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t t = 0; t < k; ++t) acc += int32_t(int16_t(int16_t(a[t]) - 128) * int16_t(b[t]));
  return acc;
}

}  // namespace

void int8_gemm_reference(const int8_t* A, const int8_t* B, int32_t* C, int64_t m, int64_t n, int64_t k) {
  check_gemm_sizes("int8_gemm_reference", m, n, k);
  for_each_output(m, n, k, [&](int64_t i, int64_t j) { C[i * n + j] = dot_s8(A + i * k, B + j * k, k); });
}

namespace {

/// Whether dq asks for per-token-group steps; throws std::invalid_argument for a group size other
/// than kActGroupSize or missing activation steps.
bool grouped(const Int8Dequant& dq, const char* what) {
  if (dq.a_group == 0) return false;
  if (dq.a_group != kActGroupSize)
    throw std::invalid_argument(std::string(what) + ": activation group size " + std::to_string(dq.a_group) + " is not supported (only " +
                                std::to_string(kActGroupSize) + ")");
  if (!dq.a_scales) throw std::invalid_argument(std::string(what) + ": per-token-group dequantization without activation steps");
  return true;
}

}  // namespace

void int8_gemm_dequant_reference(const int8_t* A, const int8_t* B, const Int8Dequant& dq, float* y, int64_t m, int64_t n,
                                 int64_t k) {
  check_gemm_sizes("int8_gemm_dequant_reference", m, n, k);
  if (grouped(dq, "int8_gemm_dequant_reference")) return int8_grouped::run_plain(B, n, k, A, m, dq, y);
  for_each_output(m, n, k, [&](int64_t i, int64_t j) { y[i * n + j] = int8_dequant_one(dot_s8(A + i * k, B + j * k, k), i, j, dq); });
}

// ---------------------------------------------------------------------------------------------
// PackedInt8Weights
// ---------------------------------------------------------------------------------------------

struct PackedInt8Weights::Impl {
  Int8Backend backend = Int8Backend::Reference;
  int64_t n = 0, k = 0;
  int64_t kq = 0;        // ceil(k / 4): groups of 4 along k
  int64_t kpad = 0;      // padded_k(): row stride of biased-u8 activations
  int64_t nr = kNR;      // panel width: kNR (VNNI), 32 (AMX: whole 2 × 2 tile blocks)
  int64_t panels = 0;    // VNNI / AMX: ceil(n / nr)
  std::vector<int32_t> comp;  // −128 · Σ_k B[j, k], [panels·nr] (VNNI / AMX) or [n]
  AlignedBytes packed;        // VNNI / AMX panels, or the plain copy (Avx2, Reference)

  // Per-token-group products (quant/int8_gemm_grouped.h), made on first use: the block
  // compensation terms (VNNI / AMX; [panels][G][nr], an eighth of the weight bytes) or a plain copy
  // of B (OneDnn, whose reordered weights the scalar definition cannot read).
  mutable std::once_flag grouped_once;
  mutable std::vector<int32_t> group_comp;
  mutable std::vector<int8_t> plain;

  // oneDNN
  dnnl::memory::desc dnnl_weights_md;
  dnnl::memory dnnl_weights;
  mutable std::mutex dnnl_mutex;
  mutable std::map<std::tuple<int64_t, bool, int64_t>, dnnl::matmul> dnnl_cache;

  /// The packed panels' geometry (VNNI / AMX; quant/int8_gemm_grouped.h), group_comp as made so far.
  int8_grouped::Panels layout() const {
    int8_grouped::Panels w;
    w.data = packed.data;
    w.n = n, w.k = k, w.kpad = kpad, w.nr = nr, w.panels = panels;
    w.group_comp = group_comp.data();
    return w;
  }
  int64_t panel_width(int64_t p) const { return layout().width(p); }
  uint16_t panel_mask(int64_t p) const { return layout().mask(p); }
  const int8_t* panel(int64_t p) const { return layout().panel(p); }

  void pack_vnni(const int8_t* B);
  void prepare_onednn(const int8_t* B);
  dnnl::matmul onednn_primitive(int64_t m, bool biased_u8, int64_t lda) const;
  void run_onednn(const void* A, bool biased_u8, int64_t lda, int64_t m, int32_t* C) const;
  template <bool kF32>
  void run_vnni(const uint8_t* Au, int64_t lda, int64_t m, void* out, const Int8Dequant& dq) const;
  template <bool kF32>
  void run_amx(const uint8_t* Au, int64_t lda, int64_t m, void* out, const Int8Dequant& dq) const;
  /// run_amx or run_vnni, by backend.
  template <bool kF32>
  void run_packed(const uint8_t* Au, int64_t lda, int64_t m, void* out, const Int8Dequant& dq) const {
    if (backend == Int8Backend::Amx) run_amx<kF32>(Au, lda, m, out, dq);
    else run_vnni<kF32>(Au, lda, m, out, dq);
  }
  const uint8_t* to_biased(const int8_t* A, int64_t m) const;
  /// y = the per-token-group product of biased u8 activations (row stride lda, a multiple of 4 for
  /// the packed backends) — the one entry of gemm_f32 and gemm_f32_biased for dq.a_group > 0.
  void run_grouped(const uint8_t* Au, int64_t lda, int64_t m, const Int8Dequant& dq, float* y) const;
};

void PackedInt8Weights::Impl::run_grouped(const uint8_t* Au, int64_t lda, int64_t m, const Int8Dequant& dq, float* y) const {
  const bool packed_panels = backend == Int8Backend::Vnni || backend == Int8Backend::Amx;
  std::call_once(grouped_once, [&] {
    if (packed_panels) {
      group_comp = int8_grouped::group_compensation(layout());
    } else if (backend == Int8Backend::OneDnn) {
      plain.resize(static_cast<size_t>(n * k));
      const dnnl::memory::desc plain_md({k, n}, dnnl_dt::s8, dnnl_tag::ba);
      dnnl::memory user(plain_md, dnnl_engine(), plain.data());
      dnnl::memory reordered = dnnl_weights;
      dnnl::reorder(reordered, user).execute(dnnl_stream(), reordered, user);
      dnnl_stream().wait();
    }
  });
  if (packed_panels) {
    const int8_grouped::Panels w = layout();
    if (backend == Int8Backend::Amx) return int8_grouped::run_amx(w, Au, lda, m, dq, y);
    return int8_grouped::run_vnni(w, Au, lda, m, dq, y);
  }
  const int8_t* B = backend == Int8Backend::OneDnn ? plain.data() : packed.data;
  int8_grouped::run_plain_biased(B, n, k, Au, lda, m, dq, y);
}

void PackedInt8Weights::Impl::pack_vnni(const int8_t* B) {
  panels = (n + nr - 1) / nr;
  packed.resize(panels * (kpad / 4) * nr * 4);
  comp.assign(static_cast<size_t>(panels * nr), 0);
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t w = panel_width(p);
    int8_t* dst = const_cast<int8_t*>(panel(p));
    for (int64_t c = 0; c < w; ++c) {
      const int64_t j = p * nr + c;
      if (j >= n) break;
      const int8_t* row = B + j * k;
      int64_t colsum = 0;
      for (int64_t t = 0; t < k; ++t) {
        dst[((t / 4) * w + c) * 4 + t % 4] = row[t];
        colsum += row[t];
      }
      comp[static_cast<size_t>(j)] = static_cast<int32_t>(-128 * colsum);
    }
  }
}

void PackedInt8Weights::Impl::prepare_onednn(const int8_t* B) {
  comp.assign(static_cast<size_t>(n), 0);
  for (int64_t j = 0; j < n; ++j) {
    int64_t colsum = 0;
    for (int64_t t = 0; t < k; ++t) colsum += B[j * k + t];
    comp[static_cast<size_t>(j)] = static_cast<int32_t>(-128 * colsum);
  }
  try {
    // Let oneDNN choose its blocked weight layout for a prefill-sized product; the same layout is
    // reused for every row count (the brgemm kernels' weight layout depends on n and k only).
    const dnnl::memory::desc src({512, k}, dnnl_dt::s8, dnnl_tag::ab);
    const dnnl::memory::desc wany({k, n}, dnnl_dt::s8, dnnl_tag::any);
    const dnnl::memory::desc dst({512, n}, dnnl_dt::s32, dnnl_tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wany, dst), dnnl_engine());
    dnnl_weights_md = pd.weights_desc();
    // B[n, k] row-major is the [k, n] matrix with strides (1, k): format tag "ba".
    const dnnl::memory::desc plain({k, n}, dnnl_dt::s8, dnnl_tag::ba);
    dnnl::memory user(plain, dnnl_engine(), const_cast<int8_t*>(B));
    dnnl_weights = dnnl::memory(dnnl_weights_md, dnnl_engine());
    dnnl::reorder(user, dnnl_weights).execute(dnnl_stream(), user, dnnl_weights);
    dnnl_stream().wait();
  } catch (const dnnl::error& e) {
    throw UnsupportedError(std::string("INT8 GEMM: oneDNN cannot prepare s8 weights [") + std::to_string(n) + ", " +
                           std::to_string(k) + "]: " + e.what());
  }
}

/// The cached matmul primitive for (m, src type, lda), created on first use (creation costs far
/// more than a small product). Returned by value: the handle is reference-counted, so a
/// concurrent cache reset cannot free a primitive that is executing.
dnnl::matmul PackedInt8Weights::Impl::onednn_primitive(int64_t m, bool biased_u8, int64_t lda) const {
  std::lock_guard<std::mutex> lock(dnnl_mutex);
  const auto key = std::make_tuple(m, biased_u8, lda);
  auto it = dnnl_cache.find(key);
  if (it != dnnl_cache.end()) return it->second;
  if (dnnl_cache.size() >= kMaxCachedPrimitives) dnnl_cache.clear();  // e.g. many distinct prompt lengths
  try {
    const dnnl::memory::desc src({m, k}, biased_u8 ? dnnl_dt::u8 : dnnl_dt::s8, dnnl::memory::dims{lda, 1});
    const dnnl::memory::desc dst({m, n}, dnnl_dt::s32, dnnl_tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, dnnl_weights_md, dst), dnnl_engine());
    return dnnl_cache.emplace(key, dnnl::matmul(pd)).first->second;
  } catch (const dnnl::error& e) {
    throw UnsupportedError("INT8 GEMM: oneDNN has no matmul for m=" + std::to_string(m) + " n=" + std::to_string(n) +
                           " k=" + std::to_string(k) + ": " + e.what());
  }
}

void PackedInt8Weights::Impl::run_onednn(const void* A, bool biased_u8, int64_t lda, int64_t m, int32_t* C) const {
  dnnl::matmul mm = onednn_primitive(m, biased_u8, lda);
  const dnnl::memory::desc src({m, k}, biased_u8 ? dnnl_dt::u8 : dnnl_dt::s8, dnnl::memory::dims{lda, 1});
  const dnnl::memory::desc dst({m, n}, dnnl_dt::s32, dnnl_tag::ab);
  dnnl::memory a(src, dnnl_engine(), const_cast<void*>(A));
  dnnl::memory c(dst, dnnl_engine(), C);
  mm.execute(dnnl_stream(), {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, dnnl_weights}, {DNNL_ARG_DST, c}});
  dnnl_stream().wait();
}

template <bool kF32>
void PackedInt8Weights::Impl::run_vnni(const uint8_t* Au, int64_t lda, int64_t m, void* out, const Int8Dequant& dq) const {
#if SQ_INT8_VNNI
  static constexpr auto table = kernel_table<kF32>();
  const bool par = m * n * k >= kParallelMinMacs && panels > 1 && omp_get_max_threads() > 1;
#pragma omp parallel if (par)
  for (int64_t ic = 0; ic < m; ic += kMC) {
    const int64_t iend = std::min(m, ic + kMC);
    // Panels are handed out dynamically: when other processes take CPU time from one thread the
    // other picks up its share. Each panel is computed entirely by one thread in a fixed order, so
    // the results do not depend on which thread ran it.
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t w = panel_width(p);
      const int nv = static_cast<int>(w / 16);
      const __mmask16 mask = panel_mask(p);
      const int8_t* bp = panel(p);
      const int32_t* cp = comp.data() + p * nr;
      for (int64_t i = ic; i < iend; i += kMR) {
        const int mr = static_cast<int>(std::min<int64_t>(kMR, iend - i));
        table[static_cast<size_t>(mr - 1)][static_cast<size_t>(nv - 1)](Au + i * lda, lda, bp, kq, cp, mask, out, n, i, p * nr, dq);
      }
    }
  }
#else
  (void)Au, (void)lda, (void)m, (void)out, (void)dq;
  throw UnsupportedError("INT8 GEMM: this build has no AVX-512-VNNI kernel");
#endif
}

template <bool kF32>
void PackedInt8Weights::Impl::run_amx(const uint8_t* Au, int64_t lda, int64_t m, void* out, const Int8Dequant& dq) const {
#if SQ_INT8_VNNI
  // Whole 16-row tiles on AMX; the last m mod 16 rows (and rows whose stride cannot hold the
  // padded 64-deep chunks) on the VNNI kernel.
  const int64_t m16 = lda >= kpad ? m / 16 * 16 : 0;
  if (m16 > 0) {
    const bool par = m16 * n * k >= kParallelMinMacs && panels > 1 && omp_get_max_threads() > 1;
    const int64_t kchunks = kpad / 64;
#pragma omp parallel if (par)
    {
      const int8_amx::TileScope tiles;
      for (int64_t ic = 0; ic < m16; ic += kMC) {
        const int64_t iend = std::min(m16, ic + kMC);
        // As run_vnni: panels handed out dynamically, each computed by one thread in a fixed order.
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t p = 0; p < panels; ++p) {
          const int64_t w = panel_width(p);
          for (int64_t i = ic; i < iend; i += 32)
            int8_amx::block<kF32>(Au + i * lda, lda, static_cast<int>(std::min<int64_t>(32, iend - i)), panel(p), w * 4, kchunks,
                                  static_cast<int>(w / 16), comp.data() + p * nr, panel_mask(p), out, n, i, p * nr, dq);
        }
      }
    }
  }
  if (m16 == m) return;
  Int8Dequant rest = dq;  // rows m16 … m−1: their activation scales and outputs
  if (rest.a_scales && rest.a_per_row) rest.a_scales += m16;
  void* out_rest = kF32 ? static_cast<void*>(static_cast<float*>(out) + m16 * n) : static_cast<void*>(static_cast<int32_t*>(out) + m16 * n);
  run_vnni<kF32>(Au + m16 * lda, lda, m - m16, out_rest, rest);
#else
  (void)Au, (void)lda, (void)m, (void)out, (void)dq;
  throw UnsupportedError("INT8 GEMM: this build has no AVX-512-VNNI kernel for AMX's row tails");
#endif
}

const uint8_t* PackedInt8Weights::Impl::to_biased(const int8_t* A, int64_t m) const {
  uint8_t* Au = thread_scratch<uint8_t>(m * kpad);
  for (int64_t i = 0; i < m; ++i) {  // a few MB at most: not worth a parallel region
    const int8_t* src = A + i * k;
    uint8_t* dst = Au + i * kpad;
#pragma omp simd
    for (int64_t t = 0; t < k; ++t) dst[t] = static_cast<uint8_t>(static_cast<uint8_t>(src[t]) ^ 0x80u);
    for (int64_t t = k; t < kpad; ++t) dst[t] = 0x80;
  }
  return Au;
}

PackedInt8Weights::PackedInt8Weights(const int8_t* B, int64_t n, int64_t k, Int8Backend backend) : impl_(std::make_unique<Impl>()) {
  if (n <= 0 || k <= 0) throw std::invalid_argument("PackedInt8Weights: empty weight [" + std::to_string(n) + ", " + std::to_string(k) + "]");
  check_gemm_sizes("PackedInt8Weights", 0, n, k);
  Impl& w = *impl_;
  w.backend = resolve_int8_backend(backend);
  if (!int8_backend_available(w.backend))
    throw UnsupportedError(std::string("INT8 GEMM backend '") + to_string(w.backend) + "' is not available on this machine/build");
  w.n = n;
  w.k = k;
  w.kq = (k + 3) / 4;
  w.kpad = round_up(k, 64);
  switch (w.backend) {
    case Int8Backend::Vnni: w.pack_vnni(B); break;
    case Int8Backend::Amx:
      w.nr = 32;
      w.pack_vnni(B);
      break;
    case Int8Backend::OneDnn: w.prepare_onednn(B); break;
    default:
      w.packed.resize(n * k);
      std::memcpy(w.packed.data, B, static_cast<size_t>(n * k));
      break;
  }
}

PackedInt8Weights::~PackedInt8Weights() = default;
PackedInt8Weights::PackedInt8Weights(PackedInt8Weights&&) noexcept = default;
PackedInt8Weights& PackedInt8Weights::operator=(PackedInt8Weights&&) noexcept = default;

int64_t PackedInt8Weights::n() const { return impl_->n; }
int64_t PackedInt8Weights::k() const { return impl_->k; }
Int8Backend PackedInt8Weights::backend() const { return impl_->backend; }
int64_t PackedInt8Weights::padded_k() const { return impl_->kpad; }

int64_t PackedInt8Weights::packed_bytes() const {
  const Impl& w = *impl_;
  const int64_t dnnl_bytes = w.backend == Int8Backend::OneDnn ? static_cast<int64_t>(w.dnnl_weights_md.get_size()) : 0;
  return w.packed.size + dnnl_bytes + static_cast<int64_t>(w.comp.size() * sizeof(int32_t));
}

void PackedInt8Weights::unpack(int8_t* B) const {
  const Impl& w = *impl_;
  switch (w.backend) {
    case Int8Backend::Vnni:
    case Int8Backend::Amx:
      for (int64_t j = 0; j < w.n; ++j) {
        const int64_t p = j / w.nr, c = j % w.nr, width = w.panel_width(p);
        const int8_t* src = w.panel(p);
        for (int64_t t = 0; t < w.k; ++t) B[j * w.k + t] = src[((t / 4) * width + c) * 4 + t % 4];
      }
      break;
    case Int8Backend::OneDnn: {
      const dnnl::memory::desc plain({w.k, w.n}, dnnl_dt::s8, dnnl_tag::ba);
      dnnl::memory user(plain, dnnl_engine(), B);
      dnnl::memory packed = w.dnnl_weights;
      dnnl::reorder(packed, user).execute(dnnl_stream(), packed, user);
      dnnl_stream().wait();
      break;
    }
    default: std::memcpy(B, w.packed.data, static_cast<size_t>(w.n * w.k)); break;
  }
}

void PackedInt8Weights::gemm_s32(const int8_t* A, int64_t m, int32_t* C) const {
  const Impl& w = *impl_;
  check_gemm_sizes("PackedInt8Weights::gemm_s32", m, w.n, w.k);
  if (m == 0) return;
  switch (w.backend) {
    case Int8Backend::Vnni:
    case Int8Backend::Amx: w.run_packed<false>(w.to_biased(A, m), w.kpad, m, C, Int8Dequant{}); break;
    case Int8Backend::OneDnn: w.run_onednn(A, false, w.k, m, C); break;
    case Int8Backend::Avx2: int8_avx2::gemm_s32(A, w.k, w.packed.data, m, w.n, w.k, C); break;
    default: int8_gemm_reference(A, w.packed.data, C, m, w.n, w.k); break;
  }
}

namespace {

/// In-place dequantization of an s32 result stored in y's memory (oneDNN backend): y[i, j] =
/// dequant(acc[i, j] + comp[j]) with comp null meaning 0.
void dequant_inplace(float* y, int64_t m, int64_t n, const int32_t* comp, const Int8Dequant& dq) {
#pragma omp parallel for schedule(dynamic, 16) if (m * n >= (int64_t(1) << 22))
  for (int64_t i = 0; i < m; ++i) {
    float* row = y + i * n;
    for (int64_t j = 0; j < n; ++j) {
      int32_t acc;
      std::memcpy(&acc, row + j, sizeof acc);
      if (comp) acc += comp[j];
      row[j] = int8_dequant_one(acc, i, j, dq);
    }
  }
}

}  // namespace

void PackedInt8Weights::gemm_f32(const int8_t* A, int64_t m, const Int8Dequant& dq, float* y) const {
  const Impl& w = *impl_;
  check_gemm_sizes("PackedInt8Weights::gemm_f32", m, w.n, w.k);
  if (m == 0) return;
  if (grouped(dq, "PackedInt8Weights::gemm_f32")) return w.run_grouped(w.to_biased(A, m), w.kpad, m, dq, y);
  switch (w.backend) {
    case Int8Backend::Vnni:
    case Int8Backend::Amx: w.run_packed<true>(w.to_biased(A, m), w.kpad, m, y, dq); break;
    case Int8Backend::OneDnn:
      static_assert(sizeof(float) == sizeof(int32_t));
      w.run_onednn(A, false, w.k, m, reinterpret_cast<int32_t*>(y));
      dequant_inplace(y, m, w.n, nullptr, dq);
      break;
    case Int8Backend::Avx2: int8_avx2::gemm_f32(A, w.k, w.packed.data, m, w.n, w.k, dq, y); break;
    default: int8_gemm_dequant_reference(A, w.packed.data, dq, y, m, w.n, w.k); break;
  }
}

void PackedInt8Weights::gemm_f32_biased(const uint8_t* Au, int64_t lda, int64_t m, const Int8Dequant& dq, float* y) const {
  const Impl& w = *impl_;
  check_gemm_sizes("PackedInt8Weights::gemm_f32_biased", m, w.n, w.k);
  if (lda < w.k) throw std::invalid_argument("PackedInt8Weights::gemm_f32_biased: lda " + std::to_string(lda) + " < k " + std::to_string(w.k));
  if (m == 0) return;
  const bool is_grouped = grouped(dq, "PackedInt8Weights::gemm_f32_biased");
  if (is_grouped && (lda % 4 == 0 || (w.backend != Int8Backend::Vnni && w.backend != Int8Backend::Amx)))
    return w.run_grouped(Au, lda, m, dq, y);
  switch (w.backend) {
    case Int8Backend::Vnni:
    case Int8Backend::Amx:
      if (lda % 4 == 0) {
        w.run_packed<true>(Au, lda, m, y, dq);
      } else {
        uint8_t* copy = thread_scratch<uint8_t>(m * w.kpad);
        for (int64_t i = 0; i < m; ++i) {
          std::memcpy(copy + i * w.kpad, Au + i * lda, static_cast<size_t>(w.k));
          std::memset(copy + i * w.kpad + w.k, 0x80, static_cast<size_t>(w.kpad - w.k));
        }
        if (is_grouped) w.run_grouped(copy, w.kpad, m, dq, y);
        else w.run_packed<true>(copy, w.kpad, m, y, dq);
      }
      break;
    case Int8Backend::OneDnn:
      w.run_onednn(Au, true, lda, m, reinterpret_cast<int32_t*>(y));
      dequant_inplace(y, m, w.n, w.comp.data(), dq);
      break;
    case Int8Backend::Avx2: int8_avx2::gemm_f32_biased(Au, lda, w.packed.data, m, w.n, w.k, dq, y); break;
    default: {
      const int8_t* B = w.packed.data;
      const int64_t n = w.n, k = w.k;
      for_each_output(m, n, k, [&](int64_t i, int64_t j) {
        y[i * n + j] = int8_dequant_one(dot_u8_biased_s8(Au + i * lda, B + j * k, k), i, j, dq);
      });
      break;
    }
  }
}

void int8_gemm(const int8_t* A, const int8_t* B, int32_t* C, int64_t m, int64_t n, int64_t k, Int8Backend backend) {
  check_gemm_sizes("int8_gemm", m, n, k);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(C, C + m * n, 0);
    return;
  }
  if (resolve_int8_backend(backend) == Int8Backend::Reference) return int8_gemm_reference(A, B, C, m, n, k);
  PackedInt8Weights(B, n, k, backend).gemm_s32(A, m, C);
}

void int8_gemm_dequant(const int8_t* A, const int8_t* B, const Int8Dequant& dq, float* y, int64_t m, int64_t n, int64_t k,
                       Int8Backend backend) {
  check_gemm_sizes("int8_gemm_dequant", m, n, k);
  if (m == 0 || n == 0) return;
  if (k == 0 || resolve_int8_backend(backend) == Int8Backend::Reference) return int8_gemm_dequant_reference(A, B, dq, y, m, n, k);
  PackedInt8Weights(B, n, k, backend).gemm_f32(A, m, dq, y);
}

}  // namespace sq
