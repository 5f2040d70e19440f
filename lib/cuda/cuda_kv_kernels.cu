// CUDA implementation of cuda/cuda_kv_kernels.h: KV row encoding (one block per row and K/V),
// dequantization, and split-K decode attention over packed rows. The element math is the shared
// host/device code of cuda/kv_device_math.h (unit-tested on the CPU against the CPU codecs).
// Pre-RoPE keys are rotated over the view's rope_dim channels per head (partial rotary), channel
// pairs from kvdev::rope_channel_pair; rope_dim = head_dim is the full rotation of LLaMA.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/cuda_kv_kernels.h"
#include "cuda/kv_device_math.h"

namespace sq::cuda {

using cuda_detail::check;
using cuda_detail::check_launch;
using cuda_detail::stream_of;
namespace kd = sq::kvdev;

namespace {

constexpr int kEncodeThreads = 256;   ///< threads per encoded row (multiple of 32)
constexpr int kDecodeThreads = 128;   ///< threads per decode block: 4 warps
constexpr int kQB = 4;                ///< query heads per decode block (GQA: heads sharing one KV head)
constexpr int kMaxCodebook = 256;     ///< 2^8 signposts at most
constexpr int64_t kMinChunk = 64;     ///< fewest keys per decode block
constexpr int kSortMaxWidth = 8192;   ///< per-token percentile rows are sorted in shared memory

int64_t pow2_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// ---- encode ---------------------------------------------------------------------------------------

/// Block-wide arg-min (kMin) / arg-max of one (value, index) candidate per thread with
/// std::minmax_element's ties: the first smallest and the last largest index win. Every thread
/// gets the result. blockDim.x must be a multiple of 32.
template <bool kMin>
__device__ void block_arg_extreme(float& v, int& idx) {
  __shared__ float sv[32];
  __shared__ int si[32];
  __shared__ float rv;
  __shared__ int ri;
  auto better = [](float ov, int oi, float cv, int ci) {
    return kMin ? (ov < cv || (ov == cv && oi < ci)) : (ov > cv || (ov == cv && oi > ci));
  };
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, off);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, off);
    if (better(ov, oi, v, idx)) {
      v = ov;
      idx = oi;
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = idx;
  }
  __syncthreads();
  if (warp == 0) {
    float w = lane < warps ? sv[lane] : (kMin ? INFINITY : -INFINITY);
    int wi = lane < warps ? si[lane] : (kMin ? INT_MAX : -1);
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, w, off);
      const int oi = __shfl_xor_sync(0xffffffffu, wi, off);
      if (better(ov, oi, w, wi)) {
        w = ov;
        wi = oi;
      }
    }
    if (lane == 0) {
      rv = w;
      ri = wi;
    }
  }
  __syncthreads();
  v = rv;
  idx = ri;
  __syncthreads();
}

struct EncodeArgs {
  KVDeviceRows rows[2];  ///< [0] keys, [1] values
  const float* x[2];     ///< [n, width] input rows of K and V
  int64_t width, p0;
  int n_sinks;
  int64_t codes_bytes;   ///< shared bytes of the code buffer (width rounded up to 16)
  int64_t sort_n;        ///< power of two ≥ width when some rows sort for percentiles, else 0
  unsigned long long* overflow;
};

/// Block (row i, K or V): encodes row p0 + i. Shared memory: codes [width] bytes, then the sort
/// buffer [sort_n] floats.
__global__ void __launch_bounds__(kEncodeThreads) encode_kernel(EncodeArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float tok_scale, tok_offset;
  const KVDeviceRows R = blockIdx.y == 0 ? a.rows[0] : a.rows[1];
  const int64_t W = a.width, r = a.p0 + int64_t(blockIdx.x);
  const float* x = (blockIdx.y == 0 ? a.x[0] : a.x[1]) + int64_t(blockIdx.x) * W;
  const int tid = threadIdx.x, bd = blockDim.x;
  if (r < a.n_sinks) {  // attention sink: FP16 row (KVQuant §3.6)
    for (int64_t c = tid; c < W; c += bd) R.sinks[r * W + c] = kd::float_to_half(x[c]);
    if (R.outlier_count && tid == 0) R.outlier_count[r] = 0;
    return;
  }
  uint8_t* dst = R.dense + r * R.row_bytes;
  if (R.format == KVRowFormat::F32) {
    float* d = reinterpret_cast<float*>(dst);
    for (int64_t c = tid; c < W; c += bd) d[c] = x[c];
    return;
  }
  uint8_t* codes = smem;
  const int bits = R.bits;
  if (R.format == KVRowFormat::Int) {
    // One thread per group, sequentially over its channels (the CPU's order, so ±0 ties agree).
    const float qmax = float((1 << bits) - 1);
    const int64_t G = W / R.group;
    for (int64_t g = tid; g < G; g += bd) {
      const int64_t c0 = g * R.group, c1 = c0 + R.group;
      float lo = INFINITY, hi = -INFINITY;
      for (int64_t c = c0; c < c1; ++c) {
        const float xc = x[c];
        if (!kd::is_finite(xc)) continue;
        lo = xc < lo ? xc : lo;  // std::min(lo, x): keeps lo unless x < lo
        hi = hi < xc ? xc : hi;  // std::max(hi, x): keeps hi unless hi < x
      }
      const kd::UniformGroup p = kd::uniform_group(lo, hi, qmax);
      uint8_t* meta = dst + R.code_bytes + 4 * g;
      kd::store_u16(meta, p.d16);
      kd::store_u16(meta + 2, p.z16);
      for (int64_t c = c0; c < c1; ++c) codes[c] = uint8_t(kd::uniform_code(x[c], p, qmax));
    }
    __syncthreads();
    for (int64_t b = tid; b < R.code_bytes; b += bd) dst[b] = kd::pack_byte(codes, W, bits, b);
    return;
  }
  // Nuq (KVQuant §3.3–3.4, §3.7).
  const bool outliers = R.outliers != nullptr;
  if (!R.per_channel) {
    float lo = 0.0f, hi = 0.0f;
    if (outliers) {
      // Percentiles p/2 and 1 − p/2 of the finite values: sort them (non-finite → +inf padding).
      float* buf = reinterpret_cast<float*>(smem + a.codes_bytes);
      const int64_t N = a.sort_n;  // power of two ≥ W
      int finite = 0;
      for (int64_t base = 0; base < N; base += bd) {
        const int64_t e = base + tid;
        const bool f = e < W && kd::is_finite(x[e]);
        if (e < N) buf[e] = f ? x[e] : INFINITY;
        finite += __syncthreads_count(f);
      }
      for (int64_t k = 2; k <= N; k <<= 1)
        for (int64_t j = k >> 1; j > 0; j >>= 1) {
          for (int64_t e = tid; e < N; e += bd) kd::bitonic_step(buf, e, k, j);
          __syncthreads();
        }
      if (tid == 0 && finite > 0) {
        lo = kd::sorted_percentile(buf, finite, R.q_lo);
        hi = kd::sorted_percentile(buf, finite, R.q_hi);
      }
    } else {
      // min / max of the finite values with std::minmax_element's ties (first min, last max).
      float mn = INFINITY, mx = -INFINITY;
      int imn = INT_MAX, imx = -1;
      for (int64_t c = tid; c < W; c += bd) {
        const float xc = x[c];
        if (!kd::is_finite(xc)) continue;
        if (xc < mn) {
          mn = xc;
          imn = int(c);
        }
        if (!(xc < mx)) {
          mx = xc;
          imx = int(c);
        }
      }
      block_arg_extreme<true>(mn, imn);
      block_arg_extreme<false>(mx, imx);
      if (imx >= 0) {  // some finite value
        lo = mn;
        hi = mx;
      }
    }
    if (tid == 0) {
      float o, s;
      kd::token_scaling(lo, hi, o, s);
      tok_offset = o;
      tok_scale = s;
      kd::store_u16(dst + R.code_bytes, kd::float_to_half(s));
      kd::store_u16(dst + R.code_bytes + 2, kd::float_to_half(o));
    }
    __syncthreads();
  }
  const int K = 1 << bits;
  for (int64_t c = tid; c < W; c += bd) {
    const float oc = R.per_channel ? R.channel_offset[c] : tok_offset;
    const float sc = R.per_channel ? R.channel_scale[c] : tok_scale;
    const float a_ = kd::nuq_normalize(kd::nuq_input(x[c]), oc, sc);
    codes[c] = (outliers && fabsf(a_) > 1.0f) ? kd::kOutlierMark
                                              : uint8_t(kd::nearest_signpost(kd::clamp_unit(a_), R.midpoints, R.first_of, K));
  }
  __syncthreads();
  if (outliers) {
    // Ordered compaction of the marked channels into the row's sparse entries (channel ascending).
    __shared__ int warp_count[32];
    __shared__ int running;
    if (tid == 0) running = 0;
    __syncthreads();
    const int lane = tid & 31, warp = tid >> 5, warps = bd >> 5;
    for (int64_t base = 0; base < W; base += bd) {
      const int64_t c = base + tid;
      const bool marked = c < W && codes[c] == kd::kOutlierMark;
      const unsigned ballot = __ballot_sync(0xffffffffu, marked);
      if (lane == 0) warp_count[warp] = __popc(ballot);
      __syncthreads();
      if (marked) {
        int pos = running + __popc(ballot & ((1u << lane) - 1u));
        for (int w = 0; w < warp; ++w) pos += warp_count[w];
        const float v = kd::nuq_input(x[c]);
        if (pos < R.outlier_cap) {
          R.outliers[r * R.outlier_cap + pos] = kd::outlier_entry(unsigned(c), kd::float_to_half(v));
          codes[c] = 0;  // the CPU codec leaves the dense code of an outlier at 0
        } else {
          const float oc = R.per_channel ? R.channel_offset[c] : tok_offset;
          const float sc = R.per_channel ? R.channel_scale[c] : tok_scale;
          codes[c] = uint8_t(kd::nearest_signpost(kd::clamp_unit(kd::nuq_normalize(v, oc, sc)), R.midpoints, R.first_of, K));
          atomicAdd(a.overflow, 1ull);
        }
      }
      __syncthreads();
      if (tid == 0) {
        int total = 0;
        for (int w = 0; w < warps; ++w) total += warp_count[w];
        running += total;
      }
      __syncthreads();
    }
    if (tid == 0) R.outlier_count[r] = running < R.outlier_cap ? running : R.outlier_cap;
    __syncthreads();
  }
  for (int64_t b = tid; b < R.code_bytes; b += bd) dst[b] = kd::pack_byte(codes, W, bits, b);
}

// ---- reading packed rows ----------------------------------------------------------------------------

/// What a reader needs of row j once: where it is and its per-token parameters.
struct RowRef {
  const uint8_t* row = nullptr;    ///< dense row, null for a sink row
  const uint16_t* sink = nullptr;  ///< FP16 sink row, or null
  float s = 1.0f, o = 0.0f;        ///< nuq per-token scale and offset
  const uint32_t* out = nullptr;   ///< sparse outliers of the row
  int n_out = 0;
};

template <int FMT>
__device__ __forceinline__ RowRef row_ref(const KVDeviceRows& R, int64_t j, int n_sinks, int64_t W) {
  RowRef f;
  if (j < n_sinks) {
    f.sink = R.sinks + j * W;
    return f;
  }
  f.row = R.dense + j * R.row_bytes;
  if (FMT == int(KVRowFormat::Nuq)) {
    if (!R.per_channel) {
      f.s = kd::half_to_float(kd::load_u16(f.row + R.code_bytes));
      f.o = kd::half_to_float(kd::load_u16(f.row + R.code_bytes + 2));
    }
    if (R.outliers) {
      f.out = R.outliers + j * R.outlier_cap;
      f.n_out = R.outlier_count[j];
    }
  }
  return f;
}

/// Channel c of a row: FP16 sink, FP32/FP16 element, Int z + q·Δ of its group, or Nuq
/// cb[q]·scale + offset (scale/offset: per-channel cs/co or the row's per-token s/o), replaced by
/// its sparse outlier when the row has one for c. BITS = 0: R.bits at run time.
template <int FMT, int BITS>
__device__ __forceinline__ float load_elem(const KVDeviceRows& R, const RowRef& f, int64_t c, const float* cb, float cs,
                                           float co) {
  if (f.sink) return kd::half_to_float(f.sink[c]);
  if (FMT == int(KVRowFormat::F32)) return reinterpret_cast<const float*>(f.row)[c];
  if (FMT == int(KVRowFormat::F16)) return kd::half_to_float(reinterpret_cast<const uint16_t*>(f.row)[c]);
  const int bits = BITS ? BITS : R.bits;
  const unsigned code = kd::packed_code(f.row, c, bits);
  if (FMT == int(KVRowFormat::Int)) {
    const uint8_t* meta = f.row + R.code_bytes + 4 * (c / R.group);
    return kd::half_to_float(kd::load_u16(meta + 2)) + float(code) * kd::half_to_float(kd::load_u16(meta));
  }
  float x = R.per_channel ? cb[code] * cs + co : cb[code] * f.s + f.o;
  if (f.n_out > 0) {
    const int e = kd::find_outlier(f.out, f.n_out, unsigned(c));
    if (e >= 0) x = kd::half_to_float(kd::outlier_value(f.out[e]));
  }
  return x;
}

/// Channels ca and cb = ca + 1 (ca even: an interleaved RoPE pair) of a dense FP32/FP16 row with one
/// 8- or 4-byte load; other formats and sink rows element by element.
template <int FMT, int BITS>
__device__ __forceinline__ void load_pair(const KVDeviceRows& R, const RowRef& f, int64_t ca, int64_t cb_, bool adjacent,
                                          const float* cb, float csa, float coa, float csb, float cob, float& xa, float& xb) {
  if (adjacent && !f.sink && FMT == int(KVRowFormat::F32)) {
    const float2 p = reinterpret_cast<const float2*>(f.row)[ca >> 1];
    xa = p.x;
    xb = p.y;
    return;
  }
  if (adjacent && !f.sink && FMT == int(KVRowFormat::F16)) {
    const uint32_t p = reinterpret_cast<const uint32_t*>(f.row)[ca >> 1];
    xa = kd::half_to_float(uint16_t(p & 0xffffu));
    xb = kd::half_to_float(uint16_t(p >> 16));
    return;
  }
  xa = load_elem<FMT, BITS>(R, f, ca, cb, csa, coa);
  xb = load_elem<FMT, BITS>(R, f, cb_, cb, csb, cob);
}

// ---- dequantize ------------------------------------------------------------------------------------

struct DequantArgs {
  KVLayerDeviceView view;
  int64_t rows;
  float* keys;
  float* values;
};

/// Block per row j, one thread per (KV head, channel pair of kvdev::rope_channel_pair): both
/// channels of the pair of K (rotated by j when stored before RoPE and the pair is inside rope_dim)
/// and of V.
template <int FMT>
__global__ void dequant_kernel(DequantArgs a) {
  const KVLayerDeviceView& V = a.view;
  const int64_t j = blockIdx.x, W = int64_t(V.n_kv_heads) * V.head_dim;
  const int half = V.head_dim / 2, rot_half = V.rope_dim / 2;
  const bool inter = V.rope_layout == RopeLayout::Interleaved;
  const RowRef fk = row_ref<FMT>(V.k, j, V.n_sinks, W), fv = row_ref<FMT>(V.v, j, V.n_sinks, W);
  for (int p = threadIdx.x; p < V.n_kv_heads * half; p += blockDim.x) {
    const int g = p / half, i = p % half;
    int a_, b_;
    const bool rotated = kd::rope_channel_pair(inter, i, rot_half, a_, b_);
    const int64_t ca = int64_t(g) * V.head_dim + a_, cb = int64_t(g) * V.head_dim + b_;
    const bool pck = V.k.per_channel && V.k.channel_scale;
    float ka = load_elem<FMT, 0>(V.k, fk, ca, V.k.codebook, pck ? V.k.channel_scale[ca] : 1.0f, pck ? V.k.channel_offset[ca] : 0.0f);
    float kb = load_elem<FMT, 0>(V.k, fk, cb, V.k.codebook, pck ? V.k.channel_scale[cb] : 1.0f, pck ? V.k.channel_offset[cb] : 0.0f);
    if (V.keys_pre_rope && rotated) {  // RoPE after dequantization at the cache position (KVQuant §3.2)
      float s, c;
      sincosf(kd::rope_angle(j, V.inv_freq[i]), &s, &c);
      const float x0 = ka, x1 = kb;
      ka = x0 * c - x1 * s;
      kb = x0 * s + x1 * c;
    }
    a.keys[j * W + ca] = ka;
    a.keys[j * W + cb] = kb;
    a.values[j * W + ca] = load_elem<FMT, 0>(V.v, fv, ca, V.v.codebook, 1.0f, 0.0f);
    a.values[j * W + cb] = load_elem<FMT, 0>(V.v, fv, cb, V.v.codebook, 1.0f, 0.0f);
  }
}

// ---- decode attention ----------------------------------------------------------------------------------

struct DecodeArgs {
  KVLayerDeviceView view;
  const float* q;
  int n_heads, group, n_qchunks, lk;
  int64_t rows, chunk;
  float scale;
  float* part;  ///< [splits, n_heads, head_dim + 2]: accumulator, running max m, denominator l
};

/// Block (KV head g, query chunk, key chunk). Lanes form segments of lk lanes; a segment scores one
/// key at a time, lane sl owning RoPE pairs sl + lk·t (t < PPL) of the head, i.e. channels
/// (a, b) of each pair, for K (dequantized, rotated) and V. Each segment keeps an online softmax
/// (m, l, acc) per query head over its keys; segments are merged in shared memory at the end and
/// the block writes its partial (acc, m, l) per query head.
template <int FMT, int BITS, int PPL>
__global__ void __launch_bounds__(kDecodeThreads) decode_kernel(DecodeArgs a) {
  extern __shared__ float sm[];  // [n_seg, kQB, head_dim + 2]
  __shared__ float cbk[kMaxCodebook], cbv[kMaxCodebook];
  const KVLayerDeviceView& V = a.view;
  const int hd = V.head_dim, lk = a.lk;
  const int64_t W = int64_t(V.n_kv_heads) * hd;
  const int g = blockIdx.x / a.n_qchunks, qc = blockIdx.x % a.n_qchunks;
  const int h0 = g * a.group + qc * kQB;
  const int nq = min(kQB, a.group - qc * kQB);
  const int64_t j0 = int64_t(blockIdx.y) * a.chunk;
  const int64_t j1 = min(a.rows, j0 + a.chunk);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kpw = 32 / lk, seg_in_warp = lane / lk, sl = lane % lk;
  const int n_seg = (blockDim.x >> 5) * kpw, seg = warp * kpw + seg_in_warp;
  if (FMT == int(KVRowFormat::Nuq)) {
    const int K = 1 << (BITS ? BITS : V.k.bits);
    for (int e = threadIdx.x; e < K; e += blockDim.x) {
      cbk[e] = V.k.codebook[e];
      cbv[e] = V.v.codebook[e];
    }
  }
  __syncthreads();
  const bool inter = V.rope_layout == RopeLayout::Interleaved;
  const bool pck = FMT == int(KVRowFormat::Nuq) && V.k.per_channel;
  const int rot_half = V.rope_dim / 2;
  int la[PPL], lb[PPL];  // channels within the head
  bool rot[PPL], adj[PPL];  // pair rotated (inside rope_dim, keys pre-RoPE); channels adjacent (one vector load)
  float invf[PPL], ksa[PPL], koa[PPL], ksb[PPL], kob[PPL];
  float qa[kQB][PPL], qb[kQB][PPL], acc_a[kQB][PPL], acc_b[kQB][PPL], m[kQB], l[kQB];
#pragma unroll
  for (int t = 0; t < PPL; ++t) {
    const int i = sl + lk * t;
    rot[t] = kd::rope_channel_pair(inter, i, rot_half, la[t], lb[t]) && V.keys_pre_rope;
    adj[t] = lb[t] == la[t] + 1;  // la even then
    invf[t] = rot[t] && V.inv_freq ? V.inv_freq[i] : 0.0f;
    const int64_t ca = int64_t(g) * hd + la[t], cb = int64_t(g) * hd + lb[t];
    ksa[t] = pck ? V.k.channel_scale[ca] : 1.0f;
    koa[t] = pck ? V.k.channel_offset[ca] : 0.0f;
    ksb[t] = pck ? V.k.channel_scale[cb] : 1.0f;
    kob[t] = pck ? V.k.channel_offset[cb] : 0.0f;
#pragma unroll
    for (int qq = 0; qq < kQB; ++qq) {
      const bool on = qq < nq;
      qa[qq][t] = on ? a.q[int64_t(h0 + qq) * hd + la[t]] * a.scale : 0.0f;
      qb[qq][t] = on ? a.q[int64_t(h0 + qq) * hd + lb[t]] * a.scale : 0.0f;
      acc_a[qq][t] = acc_b[qq][t] = 0.0f;
    }
  }
#pragma unroll
  for (int qq = 0; qq < kQB; ++qq) {
    m[qq] = -INFINITY;
    l[qq] = 0.0f;
  }
  const int64_t gbase = int64_t(g) * hd;
  // The loop bound depends on the warp only, so every lane of a warp runs every iteration and the
  // segment shuffles below always have the whole warp.
  for (int64_t jb = j0 + int64_t(warp) * kpw; jb < j1; jb += n_seg) {
    const int64_t j = jb + seg_in_warp;
    const bool valid = j < j1;
    float part[kQB];
#pragma unroll
    for (int qq = 0; qq < kQB; ++qq) part[qq] = 0.0f;
    if (valid) {
      const RowRef fk = row_ref<FMT>(V.k, j, V.n_sinks, W);
#pragma unroll
      for (int t = 0; t < PPL; ++t) {
        float ka, kb;
        load_pair<FMT, BITS>(V.k, fk, gbase + la[t], gbase + lb[t], adj[t], cbk, ksa[t], koa[t], ksb[t], kob[t], ka, kb);
        if (rot[t]) {  // on-the-fly RoPE of the pre-RoPE key at its cache position j
          float s, c;
          sincosf(kd::rope_angle(j, invf[t]), &s, &c);
          const float x0 = ka, x1 = kb;
          ka = x0 * c - x1 * s;
          kb = x0 * s + x1 * c;
        }
#pragma unroll
        for (int qq = 0; qq < kQB; ++qq) part[qq] += qa[qq][t] * ka + qb[qq][t] * kb;
      }
    }
    for (int off = lk >> 1; off > 0; off >>= 1)
#pragma unroll
      for (int qq = 0; qq < kQB; ++qq) part[qq] += __shfl_xor_sync(0xffffffffu, part[qq], off);
    if (valid) {
      const RowRef fv = row_ref<FMT>(V.v, j, V.n_sinks, W);
      float va[PPL], vb[PPL];
#pragma unroll
      for (int t = 0; t < PPL; ++t)
        load_pair<FMT, BITS>(V.v, fv, gbase + la[t], gbase + lb[t], adj[t], cbv, 1.0f, 0.0f, 1.0f, 0.0f, va[t], vb[t]);
#pragma unroll
      for (int qq = 0; qq < kQB; ++qq) {
        if (qq >= nq) break;
        const float s = part[qq];
        if (s > m[qq]) {
          const float corr = expf(m[qq] - s);  // 0 for the first key (m = −inf)
          l[qq] *= corr;
#pragma unroll
          for (int t = 0; t < PPL; ++t) {
            acc_a[qq][t] *= corr;
            acc_b[qq][t] *= corr;
          }
          m[qq] = s;
        }
        const float p = expf(s - m[qq]);
        l[qq] += p;
#pragma unroll
        for (int t = 0; t < PPL; ++t) {
          acc_a[qq][t] += p * va[t];
          acc_b[qq][t] += p * vb[t];
        }
      }
    }
  }
  // Merge the segments of the block.
  const int stride = hd + 2;
#pragma unroll
  for (int qq = 0; qq < kQB; ++qq) {
    if (qq >= nq) break;
    float* base = sm + (int64_t(seg) * kQB + qq) * stride;
#pragma unroll
    for (int t = 0; t < PPL; ++t) {
      base[la[t]] = acc_a[qq][t];
      base[lb[t]] = acc_b[qq][t];
    }
    if (sl == 0) {
      base[hd] = m[qq];
      base[hd + 1] = l[qq];
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < nq * hd; e += blockDim.x) {
    const int qq = e / hd, c = e % hd;
    float M = -INFINITY;
    for (int s = 0; s < n_seg; ++s) M = fmaxf(M, sm[(int64_t(s) * kQB + qq) * stride + hd]);
    float L = 0.0f, A = 0.0f;
    if (M != -INFINITY)
      for (int s = 0; s < n_seg; ++s) {
        const float* b = sm + (int64_t(s) * kQB + qq) * stride;
        if (b[hd] == -INFINITY) continue;  // a segment without keys
        const float w = expf(b[hd] - M);
        L += w * b[hd + 1];
        A += w * b[c];
      }
    float* P = a.part + (int64_t(blockIdx.y) * a.n_heads + h0 + qq) * stride;
    P[c] = A;
    if (c == 0) {
      P[hd] = M;
      P[hd + 1] = L;
    }
  }
}

/// Merges the key chunks: block per query head, thread per channel.
__global__ void decode_combine_kernel(const float* part, int64_t splits, int n_heads, int hd, float* out) {
  const int h = blockIdx.x;
  const int stride = hd + 2;
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    float M = -INFINITY;
    for (int64_t s = 0; s < splits; ++s) M = fmaxf(M, part[(s * n_heads + h) * stride + hd]);
    float L = 0.0f, A = 0.0f;
    for (int64_t s = 0; s < splits; ++s) {
      const float* P = part + (s * n_heads + h) * stride;
      if (P[hd] == -INFINITY) continue;  // an empty chunk
      const float w = expf(P[hd] - M);
      L += w * P[hd + 1];
      A += w * P[c];
    }
    out[int64_t(h) * hd + c] = A / L;
  }
}

struct DecodePlan {
  int lk = 0, ppl = 0, n_qchunks = 0;
  int64_t splits = 0, chunk = 0;
};

int sm_count() {
  static const int count = [] {
    int dev = 0, n = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute(multiprocessor count)");
    return n > 0 ? n : 1;
  }();
  return count;
}

DecodePlan plan_decode(const KVLayerDeviceView& v, int n_heads, int64_t rows) {
  if (!kv_decode_supported(v, n_heads))
    throw std::invalid_argument("cuda::kv_decode_attention: unsupported shape (head_dim " + std::to_string(v.head_dim) +
                                ", heads " + std::to_string(n_heads) + "/" + std::to_string(v.n_kv_heads) + ")");
  if (rows < 1) throw std::invalid_argument("cuda::kv_decode_attention: rows must be >= 1, got " + std::to_string(rows));
  DecodePlan p;
  const int half = v.head_dim / 2;
  p.lk = half < 32 ? half : 32;
  p.ppl = half / p.lk;
  const int group = n_heads / v.n_kv_heads;
  p.n_qchunks = (group + kQB - 1) / kQB;
  // Enough blocks to fill the GPU about four times over, each with at least kMinChunk keys.
  const int64_t base_blocks = int64_t(v.n_kv_heads) * p.n_qchunks;
  const int64_t want = std::max<int64_t>(1, (4 * int64_t(sm_count()) + base_blocks - 1) / base_blocks);
  p.chunk = std::max<int64_t>(kMinChunk, (rows + want - 1) / want);
  p.splits = (rows + p.chunk - 1) / p.chunk;
  return p;
}

template <int FMT, int BITS>
void launch_decode(const DecodePlan& p, const DecodeArgs& a, size_t shared, cudaStream_t s) {
  const dim3 grid(unsigned(a.view.n_kv_heads * p.n_qchunks), unsigned(p.splits));
  switch (p.ppl) {
    case 1: decode_kernel<FMT, BITS, 1><<<grid, kDecodeThreads, shared, s>>>(a); break;
    case 2: decode_kernel<FMT, BITS, 2><<<grid, kDecodeThreads, shared, s>>>(a); break;
    case 4: decode_kernel<FMT, BITS, 4><<<grid, kDecodeThreads, shared, s>>>(a); break;
    default: throw std::invalid_argument("cuda::kv_decode_attention: pairs per lane must be 1, 2 or 4");
  }
}

void check_view(const KVLayerDeviceView& v, const char* op) {
  if (v.n_kv_heads <= 0 || v.head_dim <= 0 || v.head_dim % 2 != 0 || v.head_dim > 1024)
    throw std::invalid_argument(std::string(op) + ": need n_kv_heads > 0 and an even head_dim <= 1024, got " +
                                std::to_string(v.n_kv_heads) + " x " + std::to_string(v.head_dim));
  if (v.k.format != v.v.format) throw std::invalid_argument(std::string(op) + ": keys and values must share one format");
  if (v.rope_dim < 0 || v.rope_dim % 2 != 0 || v.rope_dim > v.head_dim)
    throw std::invalid_argument(std::string(op) + ": rope_dim must be even and in [0, head_dim = " + std::to_string(v.head_dim) +
                                "], got " + std::to_string(v.rope_dim));
  if (v.keys_pre_rope && v.rope_dim > 0 && !v.inv_freq) throw std::invalid_argument(std::string(op) + ": pre-RoPE keys need inv_freq");
}

}  // namespace

void kv_encode(const KVLayerDeviceView& view, const float* k, const float* v, int64_t n, int64_t p0, unsigned long long* overflow,
               Stream stream) {
  check_view(view, "cuda::kv_encode");
  if (n < 0 || p0 < 0) throw std::invalid_argument("cuda::kv_encode: negative size");
  if (view.k.format == KVRowFormat::F16) throw std::invalid_argument("cuda::kv_encode: F16 rows are a benchmark format only");
  if (n == 0) return;
  if (n > INT_MAX) throw std::invalid_argument("cuda::kv_encode: too many rows for one launch");
  const int64_t W = view.width();
  EncodeArgs a{};
  a.rows[0] = view.k;
  a.rows[1] = view.v;
  a.x[0] = k;
  a.x[1] = v;
  a.width = W;
  a.p0 = p0;
  a.n_sinks = view.n_sinks;
  a.overflow = overflow;
  a.codes_bytes = (W + 15) / 16 * 16;
  bool sorts = false;
  for (const KVDeviceRows* R : {&view.k, &view.v})
    sorts = sorts || (R->format == KVRowFormat::Nuq && !R->per_channel && R->outliers);
  if (sorts && W > kSortMaxWidth)
    throw std::invalid_argument("cuda::kv_encode: per-token outlier percentiles sort rows of at most " +
                                std::to_string(kSortMaxWidth) + " channels, got " + std::to_string(W));
  a.sort_n = sorts ? pow2_at_least(W) : 0;
  const bool quantized = view.k.format == KVRowFormat::Int || view.k.format == KVRowFormat::Nuq;
  const size_t shared = quantized ? size_t(a.codes_bytes + 4 * a.sort_n) : 0;
  if (shared > 48 * 1024) throw std::invalid_argument("cuda::kv_encode: rows of " + std::to_string(W) + " channels need too much shared memory");
  encode_kernel<<<dim3(unsigned(n), 2), kEncodeThreads, shared, stream_of(stream)>>>(a);
  check_launch("cuda::kv_encode");
}

void kv_dequantize(const KVLayerDeviceView& view, int64_t rows, float* keys, float* values, Stream stream) {
  check_view(view, "cuda::kv_dequantize");
  if (rows < 0) throw std::invalid_argument("cuda::kv_dequantize: negative rows");
  if (rows == 0) return;
  if (rows > INT_MAX) throw std::invalid_argument("cuda::kv_dequantize: too many rows for one launch");
  const DequantArgs a{view, rows, keys, values};
  const int pairs = view.n_kv_heads * view.head_dim / 2;
  const int threads = pairs < 256 ? (pairs + 31) / 32 * 32 : 256;
  const cudaStream_t s = stream_of(stream);
  switch (view.k.format) {
    case KVRowFormat::F32: dequant_kernel<int(KVRowFormat::F32)><<<unsigned(rows), threads, 0, s>>>(a); break;
    case KVRowFormat::F16: dequant_kernel<int(KVRowFormat::F16)><<<unsigned(rows), threads, 0, s>>>(a); break;
    case KVRowFormat::Int: dequant_kernel<int(KVRowFormat::Int)><<<unsigned(rows), threads, 0, s>>>(a); break;
    case KVRowFormat::Nuq: dequant_kernel<int(KVRowFormat::Nuq)><<<unsigned(rows), threads, 0, s>>>(a); break;
  }
  check_launch("cuda::kv_dequantize");
}

int64_t kv_decode_scratch_floats(const KVLayerDeviceView& view, int n_heads, int64_t rows) {
  const DecodePlan p = plan_decode(view, n_heads, rows);
  return p.splits * n_heads * (view.head_dim + 2);
}

void kv_decode_attention(const KVLayerDeviceView& view, const float* q, int n_heads, int64_t rows, float* scratch, float* out,
                         Stream stream) {
  check_view(view, "cuda::kv_decode_attention");
  const DecodePlan p = plan_decode(view, n_heads, rows);
  if (p.splits > 65535) throw std::invalid_argument("cuda::kv_decode_attention: too many key chunks");
  DecodeArgs a{};
  a.view = view;
  a.q = q;
  a.n_heads = n_heads;
  a.group = n_heads / view.n_kv_heads;
  a.n_qchunks = p.n_qchunks;
  a.lk = p.lk;
  a.rows = rows;
  a.chunk = p.chunk;
  a.scale = 1.0f / std::sqrt(static_cast<float>(view.head_dim));
  a.part = scratch;
  const int n_seg = (kDecodeThreads / 32) * (32 / p.lk);
  const size_t shared = size_t(n_seg) * kQB * size_t(view.head_dim + 2) * sizeof(float);
  const cudaStream_t s = stream_of(stream);
  const int bits = view.k.bits;
  switch (view.k.format) {
    case KVRowFormat::F32: launch_decode<int(KVRowFormat::F32), 0>(p, a, shared, s); break;
    case KVRowFormat::F16: launch_decode<int(KVRowFormat::F16), 0>(p, a, shared, s); break;
    case KVRowFormat::Int: launch_decode<int(KVRowFormat::Int), 0>(p, a, shared, s); break;
    case KVRowFormat::Nuq:
      if (bits == 4) launch_decode<int(KVRowFormat::Nuq), 4>(p, a, shared, s);
      else launch_decode<int(KVRowFormat::Nuq), 0>(p, a, shared, s);
      break;
  }
  check_launch("cuda::kv_decode_attention");
  decode_combine_kernel<<<unsigned(n_heads), view.head_dim < 256 ? view.head_dim : 256, 0, s>>>(scratch, p.splits, n_heads,
                                                                                                view.head_dim, out);
  check_launch("cuda::kv_decode_attention (combine)");
}

}  // namespace sq::cuda
