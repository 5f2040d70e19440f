// Linear layers: the one place where a model's matrix multiplications happen.
//
// Every projection of the decoder (q/k/v/o, gate/up/down, LM head) is a `Linear`, so quantized
// formats (W8A8, W4A16, ...) plug in by implementing this interface; the transformer code does not
// change.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "ops/weight_matmul.h"

namespace sq {

/// y = x · Wᵀ + b for a batch of rows.
class Linear {
 public:
  virtual ~Linear() = default;
  virtual int64_t in_features() const = 0;
  virtual int64_t out_features() const = 0;
  /// x: [n, in_features] row-major FP32; y: [n, out_features] row-major FP32 (overwritten; must not
  /// alias x). Safe to call concurrently from several threads.
  virtual void forward(const float* x, int64_t n, float* y) const = 0;
  /// Short description of the storage format, e.g. "f32".
  virtual std::string format() const = 0;
  /// Bytes of weight storage (incl. scales/zero points for quantized formats).
  virtual int64_t weight_bytes() const = 0;
};

/// Packed copies (DenseLinear::set_prepack) are kept for a loaded model only when its dense linears
/// hold at most this many FP32 bytes (load_model, model/model_loader.h): SmolLM2-135M's 0.54 GB and
/// Gemma 3 270M's 1.07 GB (its tied 262,144-row head included) keep them; Qwen2.5-Coder-1.5B's
/// 6.2 GB does not. The copy doubles the linears' memory for a few percent of prefill speed (the
/// matmul primitive on plain W runs 482–498 GFLOP/s where the packed copy runs 506–523 with W from
/// DRAM, SmolLM2 shapes, docs/benchmarks.md), a trade worth making only while the model is small;
/// above it sq-eval's peak stays near the FP32 weights (issue 37: ≤ 1.2× them).
constexpr int64_t kPrepackMaxModelBytes = int64_t(2) << 30;

/// FP32 linear. W: [out, in] row-major (PyTorch nn.Linear layout); optional bias b: [out].
///
/// Single rows (decode steps) run a GEMV on W (serial dot products for small W, OpenBLAS sgemv
/// otherwise). Several rows, on CPUs where ops::weight_matmul_pays() (oneDNN's brgemm kernels:
/// AVX-512), run oneDNN's matmul primitive (ops/weight_matmul.h), by default on a copy of W
/// reordered once, at the first multi-row call, into the primitive's blocked layout (faster than
/// sgemm on plain W, above all when W streams from DRAM, as a model's weights do); the copy holds
/// out·in more floats. set_prepack(false) runs the primitive on W itself (no copy; the same
/// kernels, bit-identical results). Products of fewer than 32 rows or below ops::kOneDnnMinMacs, row
/// counts without a primitive (WeightMatmul::kMaxShapes), and every product on CPUs where the
/// primitive does not pay (AVX2: no copy is made) use ops::linear_sgemm on W (a short prompt does
/// not pay for packing the model).
/// W's values must not change after the first multi-row forward (the packed copy would not see it).
class DenseLinear final : public Linear {
 public:
  /// Throws std::invalid_argument when W is not rank 2 or b's length differs from W's rows.
  explicit DenseLinear(Tensor weight, Tensor bias = {});

  int64_t in_features() const override { return weight_.dim(1); }
  int64_t out_features() const override { return weight_.dim(0); }
  void forward(const float* x, int64_t n, float* y) const override;
  std::string format() const override { return "f32"; }
  int64_t weight_bytes() const override { return (weight_.numel() + bias_.numel()) * 4; }

  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

  /// Whether multi-row products keep the packed copy of W (default true). Layer-by-layer work on
  /// models larger than memory turns it off (model/layer_stream.h): a copy of each streamed layer
  /// would add its size to the peak. Call before the first multi-row forward.
  void set_prepack(bool on) { prepack_ = on; }
  bool prepack() const { return prepack_; }
  /// Bytes of the packed copy made so far (0 before the first multi-row forward, when off, and on
  /// CPUs where !ops::weight_matmul_pays()).
  int64_t packed_bytes() const;

 private:
  struct Packed;  ///< the matmul (and packed copy), made on first use (mutex-guarded)
  /// The matmul on W (packed or plain per prepack_), made on the first call; nullptr when oneDNN has
  /// none for this shape.
  const ops::WeightMatmul* matmul(int64_t rows) const;

  Tensor weight_;
  Tensor bias_;
  bool prepack_ = true;
  std::shared_ptr<Packed> packed_;
};

}  // namespace sq
