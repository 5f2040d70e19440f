#include "quant/w4a4_gemm.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/safetensors.h"
#include "quant/gemm_common.h"
#include "quant/int8_gemm.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define SQ_W4A4_VNNI 1
#include "core/immintrin_quiet.h"
#else
#define SQ_W4A4_VNNI 0
#endif

namespace sq {

namespace {

using gemm::round_up;

constexpr int kMR = 8;         // tokens per micro-kernel call
constexpr int kNV = 3;         // 16-column vectors per panel
constexpr int kNR = 16 * kNV;  // panel width (output columns)
constexpr int64_t kMC = 512;   // tokens per outer block

void check_shapes(const char* what, const W4A4Activations& a, int64_t in, int64_t n_outlier, int64_t group) {
  if (a.in != in || a.n_outlier != n_outlier || a.group != group || a.m < 0)
    throw std::invalid_argument(std::string(what) + ": activations quantized for in = " + std::to_string(a.in) +
                                ", n_outlier = " + std::to_string(a.n_outlier) + ", g = " + std::to_string(a.group) +
                                " but the weights have in = " + std::to_string(in) + ", n_outlier = " + std::to_string(n_outlier) +
                                ", g = " + std::to_string(group));
  if (a.ld != w4a4_activation_stride(in, n_outlier) || static_cast<int64_t>(a.q.size()) < a.m * a.ld ||
      static_cast<int64_t>(a.scales.size()) < a.m * (a.groups() + 1) || static_cast<int64_t>(a.sums.size()) < a.m * (a.groups() + 1))
    throw std::invalid_argument(std::string(what) + ": inconsistent W4A4Activations buffers");
}

void check_outliers(const char* what, int64_t n_outlier) {
  if (n_outlier > kW4A4MaxOutliers)
    throw std::invalid_argument(std::string(what) + ": n_outlier = " + std::to_string(n_outlier) + " exceeds " +
                                std::to_string(kW4A4MaxOutliers) + " (INT32 outlier sums could overflow)");
}

#if SQ_W4A4_VNNI

/// Everything one micro-kernel call needs: an MR-token × (NV·16)-column output tile of one panel.
struct TileArgs {
  const int8_t* a = nullptr;   ///< s8 activation rows of the MR tokens (stride lda)
  int64_t lda = 0;
  const uint8_t* b4 = nullptr; ///< the panel's INT4 part [in_normal/8][NV·16][4]
  int64_t ng = 0;              ///< INT4 groups G
  int64_t pairs = 0;           ///< 8-k blocks per group, g/8
  const uint8_t* b8 = nullptr; ///< the panel's INT8 part [oq][NV·16][4]
  int64_t oq = 0;              ///< 4-k blocks of outliers, ceil(n_outlier/4) (0: none)
  const int32_t* sums = nullptr;  ///< Σqa of the MR tokens, [MR][ns] (stride ns)
  const float* scales = nullptr;  ///< Δa of the MR tokens, [MR][ns]
  int64_t ns = 0;                 ///< G + 1
  const float* sw = nullptr;      ///< the panel's weight steps [G + 1][kNR], 64-byte aligned
  float* f = nullptr;             ///< output tile [kMR][kNR] FP32, 64-byte aligned (overwritten)
  int32_t* acc = nullptr;         ///< INT32 tile [kMR][kNR] of one group, 64-byte aligned (scratch)
};

/// Stores the accumulators to an INT32 tile [kMR][kNR].
template <int MR, int NV>
inline void store_acc(const __m512i (&acc)[MR][NV], int32_t* dst) {
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm512_store_si512(dst + r * kNR + 16 * v, acc[r][v]);
}

/// Accumulators start at −off·Σqa[r] (the unsigned-weight compensation, see the file comment of
/// w4a4_gemm.h); the asm makes the values opaque so that GCC's register allocator does not
/// coalesce them and spill accumulators inside the loop (as in quant/int8_gemm.cpp).
template <int MR, int NV>
inline void init_acc(__m512i (&acc)[MR][NV], const int32_t* sums, int64_t ns, int64_t j, int32_t off) {
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      acc[r][v] = _mm512_set1_epi32(-off * sums[r * ns + j]);
      asm("" : "+v"(acc[r][v]));
    }
}

/// The epilogue step of one group (or the outliers): f[r][v] = fma(float(acc[r][v]), Δa[r, j] ·
/// Δw[v, j], f[r][v]), the order of w4a4_gemm.h's epilogue.
template <int MR, int NV>
inline void rescale(const int32_t* acc, const float* scales, int64_t ns, int64_t j, const float* swj, float* f) {
  __m512 vsw[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) vsw[v] = _mm512_load_ps(swj + 16 * v);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    const __m512 sa = _mm512_set1_ps(scales[r * ns + j]);
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      float* fp = f + r * kNR + 16 * v;
      const __m512 x = _mm512_cvtepi32_ps(_mm512_load_si512(acc + r * kNR + 16 * v));
      _mm512_store_ps(fp, _mm512_fmadd_ps(x, _mm512_mul_ps(sa, vsw[v]), _mm512_load_ps(fp)));
    }
  }
}

/// The high nibble of every byte, as a byte value 0..15: vpsrlw 4 + vpandd 0x0F (the 16-bit shift
/// drags the next byte's low bits into bits 4..7, which the mask removes). (A single GFNI
/// vgf2p8affineqb would do, but it competes with vpdpbusd for the same pipes and measured 5% slower
/// on this machine.)
inline __m512i high_nibbles(__m512i v, __m512i low4) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), low4); }

/// The register-blocked micro-kernel for INT4 group j: acc[r][v] (16 int32 lanes = 16 output
/// columns) over g/4 vpdpbusd steps — one 64-byte load per (8 k, 16 columns), whose low nibbles
/// (k..k+3) and high nibbles (k+4..k+7) are unpacked with vpandd / `high_nibbles` —, stored as
/// INT32 to t.acc. One group per call and out of line, without the FP32 rescaling: with either
/// inside, GCC spills the MR·NV accumulators in the inner loop.
template <int MR, int NV>
__attribute__((noinline)) void w4a4_group(const TileArgs& t, int64_t j) {
  const int64_t lda = t.lda, pairs = t.pairs;
  const uint8_t* bj = t.b4 + j * pairs * NV * 64;
  const int8_t* aj = t.a + j * pairs * 8;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512i acc[MR][NV];
  init_acc<MR, NV>(acc, t.sums, t.ns, j, 8);
  for (int64_t p = 0; p < pairs; ++p) {
    const uint8_t* bp = bj + p * NV * 64;
    __m512i bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_and_si512(_mm512_loadu_si512(bp + v * 64), low4);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      int32_t a4;
      std::memcpy(&a4, aj + r * lda + 8 * p, 4);
      const __m512i av = _mm512_set1_epi32(a4);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], bv[v], av);
    }
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = high_nibbles(_mm512_loadu_si512(bp + v * 64), low4);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      int32_t a4;
      std::memcpy(&a4, aj + r * lda + 8 * p + 4, 4);
      const __m512i av = _mm512_set1_epi32(a4);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], bv[v], av);
    }
  }
  store_acc<MR, NV>(acc, t.acc);
}

/// The INT8 outlier part (u8 weights loaded as they are), stored as INT32 to t.acc.
template <int MR, int NV>
__attribute__((noinline)) void w4a4_outliers(const TileArgs& t) {
  const int64_t lda = t.lda;
  const int8_t* ao = t.a + t.ng * t.pairs * 8;
  __m512i acc[MR][NV];
  init_acc<MR, NV>(acc, t.sums, t.ns, t.ng, 128);
  for (int64_t q = 0; q < t.oq; ++q) {
    __m512i bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_si512(t.b8 + (q * NV + v) * 64);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      int32_t a4;
      std::memcpy(&a4, ao + r * lda + 4 * q, 4);
      const __m512i av = _mm512_set1_epi32(a4);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], bv[v], av);
    }
  }
  store_acc<MR, NV>(acc, t.acc);
}

/// One MR × (NV·16) output tile into t.f: the FP32 tile is zeroed, then every group and the
/// outliers are accumulated into it in the epilogue's order.
template <int MR, int NV>
void w4a4_tile(const TileArgs& t) {
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) _mm512_store_ps(t.f + r * kNR + 16 * v, _mm512_setzero_ps());
  for (int64_t j = 0; j < t.ng; ++j) {
    w4a4_group<MR, NV>(t, j);
    rescale<MR, NV>(t.acc, t.scales, t.ns, j, t.sw + j * kNR, t.f);
  }
  if (t.oq > 0) {
    w4a4_outliers<MR, NV>(t);
    rescale<MR, NV>(t.acc, t.scales, t.ns, t.ng, t.sw + t.ng * kNR, t.f);
  }
}

using TileFn = void (*)(const TileArgs&);

template <int MR>
constexpr std::array<TileFn, kNV> tile_row() {
  return {&w4a4_tile<MR, 1>, &w4a4_tile<MR, 2>, &w4a4_tile<MR, 3>};
}

constexpr std::array<std::array<TileFn, kNV>, kMR> kTileTable = {tile_row<1>(), tile_row<2>(), tile_row<3>(), tile_row<4>(),
                                                                 tile_row<5>(), tile_row<6>(), tile_row<7>(), tile_row<8>()};

#endif  // SQ_W4A4_VNNI

}  // namespace

const char* to_string(W4A4Backend b) {
  switch (b) {
    case W4A4Backend::Auto: return "auto";
    case W4A4Backend::Vnni: return "vnni";
    case W4A4Backend::Reference: return "reference";
  }
  return "unknown";
}

bool w4a4_backend_available(W4A4Backend b) {
  return b != W4A4Backend::Vnni || (SQ_W4A4_VNNI && int8_backend_available(Int8Backend::Vnni));
}

W4A4Backend resolve_w4a4_backend(W4A4Backend b) {
  if (b != W4A4Backend::Auto) return b;
  return w4a4_backend_available(W4A4Backend::Vnni) ? W4A4Backend::Vnni : W4A4Backend::Reference;
}

void w4a4_gemm_reference(const W4A4Activations& a, const W4A4Weights& w, const float* bias, float* y) {
  check_shapes("w4a4_gemm_reference", a, w.in, w.n_outlier, w.group);
  check_outliers("w4a4_gemm_reference", w.n_outlier);
  const int64_t g = w.group, ng = w.groups(), ns = ng + 1, inn = w.in_normal();
  for (int64_t i = 0; i < a.m; ++i) {
    const int8_t* qa = a.q.data() + i * a.ld;
    const float* sa = a.scales.data() + i * ns;
    for (int64_t o = 0; o < w.out; ++o) {
      float acc_f = 0.0f;
      for (int64_t j = 0; j < ng; ++j) {
        int64_t acc = 0;
        for (int64_t k = j * g; k < (j + 1) * g; ++k) acc += int64_t(qa[k]) * int64_t(w4a4_code(w, o, k));
        acc_f = std::fma(static_cast<float>(static_cast<int32_t>(acc)), sa[j] * w4a4_scale(w, o, j), acc_f);
      }
      if (w.n_outlier > 0) {
        int64_t acc = 0;
        const int8_t* qw = w.outlier.data() + o * w.n_outlier;
        for (int64_t k = 0; k < w.n_outlier; ++k) acc += int64_t(qa[inn + k]) * int64_t(qw[k]);
        acc_f = std::fma(static_cast<float>(static_cast<int32_t>(acc)), sa[ng] * w.outlier_scales[static_cast<size_t>(o)], acc_f);
      }
      if (bias) acc_f = acc_f + bias[o];
      y[i * w.out + o] = acc_f;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// PackedW4A4Weights
// ---------------------------------------------------------------------------------------------

struct PackedW4A4Weights::Impl {
  W4A4Backend backend = W4A4Backend::Reference;
  int64_t out = 0, in = 0, n_outlier = 0, group = 0;
  int64_t inn = 0, ng = 0, oq = 0;  // normal columns, groups, ceil(n_outlier / 4)
  int64_t panels = 0;
  W4A4Weights plain;        // Reference: the container itself
  gemm::AlignedBytes p4;    // Vnni: INT4 panels [panels][inn/8][kNR][4]
  gemm::AlignedBytes p8;    // Vnni: INT8 panels [panels][oq][kNR][4]
  std::vector<float> sw;    // Vnni: [panels][ng + 1][kNR] FP32 steps (group steps, then Δo); padding 0
  int64_t sw_pad_ = 0;

  int64_t panel_width(int64_t p) const { return std::min<int64_t>(kNR, round_up(out - p * kNR, 16)); }
  const uint8_t* panel4(int64_t p) const { return reinterpret_cast<const uint8_t*>(p4.data) + p * (inn / 8) * kNR * 4; }
  const uint8_t* panel8(int64_t p) const { return reinterpret_cast<const uint8_t*>(p8.data) + p * oq * kNR * 4; }
  const float* panel_scales(int64_t p) const { return sw.data() + sw_pad_ + p * (ng + 1) * kNR; }

  void pack(const W4A4Weights& w);
  void run_vnni(const W4A4Activations& a, const float* bias, float* y) const;
};

// Panel byte layouts (a panel of width w ≤ kNR uses the first w·4 bytes of each kNR·4 step; the
// micro-kernel reads NV = w/16 vectors):
//   INT4: byte ((P · w + c) · 4 + t) = u[c, 8P + t] | u[c, 8P + 4 + t] << 4, u = q + 8
//   INT8: byte ((Q · w + c) · 4 + t) = q[c, 4Q + t] + 128 (k ≥ n_outlier: 128)
void PackedW4A4Weights::Impl::pack(const W4A4Weights& w) {
  panels = (out + kNR - 1) / kNR;
  p4.resize(panels * (inn / 8) * kNR * 4);
  p8.resize(panels * oq * kNR * 4);
  std::memset(p4.data, 0x88, static_cast<size_t>(p4.size));
  std::memset(p8.data, 0x80, static_cast<size_t>(p8.size));
  // 64-byte alignment of the scale panels for aligned loads.
  sw.assign(static_cast<size_t>(panels * (ng + 1) * kNR + 16), 0.0f);
  sw_pad_ = static_cast<int64_t>(((64 - reinterpret_cast<uintptr_t>(sw.data()) % 64) % 64) / sizeof(float));
#pragma omp parallel for schedule(dynamic, 1) if (out * in >= (int64_t(1) << 22))
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t width = panel_width(p);
    uint8_t* d4 = reinterpret_cast<uint8_t*>(p4.data) + p * (inn / 8) * kNR * 4;
    uint8_t* d8 = reinterpret_cast<uint8_t*>(p8.data) + p * oq * kNR * 4;
    float* s = sw.data() + sw_pad_ + p * (ng + 1) * kNR;
    for (int64_t c = 0; c < width; ++c) {
      const int64_t o = p * kNR + c;
      if (o >= out) break;
      for (int64_t k = 0; k < inn; ++k) {
        const uint8_t u = static_cast<uint8_t>(w4a4_code(w, o, k) + 8);
        const int64_t P = k / 8, t = k % 8;
        uint8_t& byte = d4[(P * width + c) * 4 + t % 4];
        byte = t < 4 ? static_cast<uint8_t>((byte & 0xF0) | u) : static_cast<uint8_t>((byte & 0x0F) | (u << 4));
      }
      for (int64_t k = 0; k < w.n_outlier; ++k)
        d8[((k / 4) * width + c) * 4 + k % 4] = static_cast<uint8_t>(int(w.outlier[static_cast<size_t>(o * w.n_outlier + k)]) + 128);
      for (int64_t j = 0; j < ng; ++j) s[j * kNR + c] = w4a4_scale(w, o, j);
      s[ng * kNR + c] = w.outlier_scales[static_cast<size_t>(o)];
    }
  }
}

void PackedW4A4Weights::Impl::run_vnni(const W4A4Activations& a, const float* bias, float* y) const {
#if SQ_W4A4_VNNI
  const int64_t m = a.m, lda = a.ld, ns = ng + 1, g = group;
  const bool par = m * out * in >= gemm::kParallelMinMacs && panels > 1 && omp_get_max_threads() > 1;
  const __mmask16 tail_mask = out % 16 ? static_cast<__mmask16>((1u << (out % 16)) - 1) : __mmask16(0xFFFF);
#pragma omp parallel if (par)
  {
    alignas(64) float ftile[kMR * kNR];
    alignas(64) int32_t itile[kMR * kNR];
    for (int64_t ic = 0; ic < m; ic += kMC) {
      const int64_t iend = std::min(m, ic + kMC);
      // Dynamic panels: a thread preempted on a shared machine does not stall the others; each
      // panel is computed by one thread in a fixed order, so results do not depend on the schedule.
#pragma omp for schedule(dynamic, 1) nowait
      for (int64_t p = 0; p < panels; ++p) {
        const int64_t width = panel_width(p);
        const int nv = static_cast<int>(width / 16);
        const __mmask16 last_mask = p == panels - 1 ? tail_mask : __mmask16(0xFFFF);
        const int64_t o0 = p * kNR;
        TileArgs t;
        t.lda = lda;
        t.b4 = panel4(p);
        t.ng = ng;
        t.pairs = g / 8;
        t.b8 = panel8(p);
        t.oq = oq;
        t.ns = ns;
        t.sw = panel_scales(p);
        t.f = ftile;
        t.acc = itile;
        for (int64_t i = ic; i < iend; i += kMR) {
          const int mr = static_cast<int>(std::min<int64_t>(kMR, iend - i));
          t.a = a.q.data() + i * lda;
          t.sums = a.sums.data() + i * ns;
          t.scales = a.scales.data() + i * ns;
          kTileTable[static_cast<size_t>(mr - 1)][static_cast<size_t>(nv - 1)](t);
          for (int r = 0; r < mr; ++r) {
            float* yr = y + (i + r) * out + o0;
            for (int v = 0; v < nv; ++v) {
              const __mmask16 mk = v == nv - 1 ? last_mask : __mmask16(0xFFFF);
              __m512 res = _mm512_load_ps(ftile + r * kNR + 16 * v);
              if (bias) res = _mm512_add_ps(res, _mm512_maskz_loadu_ps(mk, bias + o0 + 16 * v));
              _mm512_mask_storeu_ps(yr + 16 * v, mk, res);
            }
          }
        }
      }
    }
  }
#else
  (void)a, (void)bias, (void)y;
  throw UnsupportedError("W4A4 GEMM: this build has no AVX-512-VNNI kernel");
#endif
}

PackedW4A4Weights::PackedW4A4Weights(const W4A4Weights& w, W4A4Backend backend) : impl_(std::make_unique<Impl>()) {
  validate_w4a4(w);
  check_outliers("PackedW4A4Weights", w.n_outlier);
  Impl& p = *impl_;
  p.backend = resolve_w4a4_backend(backend);
  if (!w4a4_backend_available(p.backend))
    throw UnsupportedError(std::string("W4A4 GEMM backend '") + to_string(p.backend) + "' is not available on this machine/build");
  p.out = w.out;
  p.in = w.in;
  p.n_outlier = w.n_outlier;
  p.group = w.group;
  p.inn = w.in_normal();
  p.ng = w.groups();
  p.oq = (w.n_outlier + 3) / 4;
  if (p.backend == W4A4Backend::Vnni) p.pack(w);
  else p.plain = w;
}

PackedW4A4Weights::~PackedW4A4Weights() = default;
PackedW4A4Weights::PackedW4A4Weights(PackedW4A4Weights&&) noexcept = default;
PackedW4A4Weights& PackedW4A4Weights::operator=(PackedW4A4Weights&&) noexcept = default;

int64_t PackedW4A4Weights::out() const { return impl_->out; }
int64_t PackedW4A4Weights::in() const { return impl_->in; }
int64_t PackedW4A4Weights::n_outlier() const { return impl_->n_outlier; }
int64_t PackedW4A4Weights::group() const { return impl_->group; }
W4A4Backend PackedW4A4Weights::backend() const { return impl_->backend; }

int64_t PackedW4A4Weights::packed_bytes() const {
  const Impl& p = *impl_;
  if (p.backend != W4A4Backend::Vnni) return w4a4_storage_bytes(p.plain);
  return p.p4.size + p.p8.size + static_cast<int64_t>(p.sw.size() * sizeof(float));
}

W4A4Weights PackedW4A4Weights::unpack() const {
  const Impl& p = *impl_;
  if (p.backend != W4A4Backend::Vnni) return p.plain;
  W4A4Weights w;
  w.out = p.out;
  w.in = p.in;
  w.n_outlier = p.n_outlier;
  w.group = p.group;
  w.packed.assign(static_cast<size_t>(p.out * p.inn / 2), 0);
  w.scales_f16.resize(static_cast<size_t>(p.out * p.ng));
  w.outlier.resize(static_cast<size_t>(p.out * p.n_outlier));
  w.outlier_scales.resize(static_cast<size_t>(p.out));
  for (int64_t o = 0; o < p.out; ++o) {
    const int64_t pi = o / kNR, c = o % kNR, width = p.panel_width(pi);
    const uint8_t* b4 = p.panel4(pi);
    const uint8_t* b8 = p.panel8(pi);
    const float* s = p.panel_scales(pi);
    for (int64_t k = 0; k < p.inn; ++k) {
      const uint8_t byte = b4[((k / 8) * width + c) * 4 + k % 4];
      const int q = ((k % 8) < 4 ? (byte & 0x0F) : (byte >> 4)) - 8;
      w.packed[static_cast<size_t>(o * (p.inn / 2) + k / 2)] |= static_cast<uint8_t>((k & 1) ? (q & 0xF) << 4 : (q & 0xF));
    }
    for (int64_t k = 0; k < p.n_outlier; ++k)
      w.outlier[static_cast<size_t>(o * p.n_outlier + k)] = static_cast<int8_t>(int(b8[((k / 4) * width + c) * 4 + k % 4]) - 128);
    for (int64_t j = 0; j < p.ng; ++j) w.scales_f16[static_cast<size_t>(o * p.ng + j)] = float_to_half(s[j * kNR + c]);
    w.outlier_scales[static_cast<size_t>(o)] = s[p.ng * kNR + c];
  }
  return w;
}

void PackedW4A4Weights::gemm(const W4A4Activations& a, const float* bias, float* y) const {
  const Impl& p = *impl_;
  check_shapes("PackedW4A4Weights::gemm", a, p.in, p.n_outlier, p.group);
  if (a.m == 0) return;
  if (p.backend == W4A4Backend::Vnni) p.run_vnni(a, bias, y);
  else w4a4_gemm_reference(a, p.plain, bias, y);
}

}  // namespace sq
