// The CUDA backend's API in a build without CUDA (SQ_WITH_CUDA=OFF): no devices, and every call
// that would need one throws UnsupportedError with the same message.
#include <string>

#include "cuda/cuda_fp16_gemm.h"
#include "cuda/cuda_int8_gemm.h"
#include "cuda/cuda_int8_quantize.h"
#include "cuda/cuda_kv_kernels.h"
#include "cuda/cuda_ops.h"
#include "cuda/cuda_runtime.h"
#include "cuda/cuda_w4a16_linear.h"
#include "cuda/cuda_w8a8_linear.h"

namespace sq {

namespace {
[[noreturn]] void no_cuda(const std::string& what) {
  throw UnsupportedError(what + ": sqkit was built without CUDA (configure with -DSQ_WITH_CUDA=ON and a CUDA toolkit)");
}
}  // namespace

bool cuda_compiled() { return false; }
int cuda_device_count() { return 0; }
bool cuda_available() { return false; }
std::string cuda_device_name(int) { no_cuda("cuda_device_name"); }
void require_cuda(const std::string& what) { no_cuda(what); }

CudaStream::CudaStream() { no_cuda("CudaStream"); }
CudaStream::~CudaStream() = default;
void CudaStream::synchronize() const { no_cuda("CudaStream::synchronize"); }
void cuda_synchronize(Stream, const char* what) { no_cuda(what); }

void copy_device_to_device(void*, const void*, size_t, Stream) { no_cuda("copy_device_to_device"); }

DeviceBuffer::DeviceBuffer(size_t bytes) {
  if (bytes) no_cuda("DeviceBuffer");
}
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&&) noexcept { return *this; }
void DeviceBuffer::copy_from_host(const void*, size_t, size_t) { no_cuda("DeviceBuffer::copy_from_host"); }
void DeviceBuffer::copy_to_host(void*, size_t, size_t) const { no_cuda("DeviceBuffer::copy_to_host"); }
void DeviceBuffer::zero() {}

CudaEventTimer::CudaEventTimer() { no_cuda("CudaEventTimer"); }
CudaEventTimer::~CudaEventTimer() = default;
void CudaEventTimer::start(Stream) { no_cuda("CudaEventTimer::start"); }
void CudaEventTimer::stop(Stream) { no_cuda("CudaEventTimer::stop"); }
float CudaEventTimer::elapsed_ms() const { no_cuda("CudaEventTimer::elapsed_ms"); }

namespace cuda {
void rms_norm(const float*, const float*, float*, int64_t, int, float, Stream) { no_cuda("cuda::rms_norm"); }
void rope(float*, const int32_t*, int64_t, int, int, float, RopeLayout, Stream) { no_cuda("cuda::rope"); }
void rope(float*, const int32_t*, int64_t, int, int, const float*, RopeLayout, Stream) { no_cuda("cuda::rope"); }
void rope(float*, const int32_t*, int64_t, int, int, int, const float*, RopeLayout, Stream) { no_cuda("cuda::rope"); }
void norm(NormKind, const float*, const float*, const float*, float*, int64_t, int, float, Stream) { no_cuda("cuda::norm"); }
void swiglu(float*, const float*, int64_t, Stream) { no_cuda("cuda::swiglu"); }
void activation(Activation, float*, int64_t, Stream) { no_cuda("cuda::activation"); }
void gated_activation(Activation, float*, const float*, int64_t, Stream) { no_cuda("cuda::gated_activation"); }
void add_inplace(float*, const float*, int64_t, Stream) { no_cuda("cuda::add_inplace"); }
void softmax_rows(float*, int64_t, int64_t, int64_t, Stream) { no_cuda("cuda::softmax_rows"); }
void embedding(const float*, int64_t, int, const int32_t*, int64_t, float*, Stream) { no_cuda("cuda::embedding"); }
void linear_f32(const float*, int64_t, int64_t, const float*, int64_t, const float*, float*, Stream) {
  no_cuda("cuda::linear_f32");
}
void attention(const float*, const float*, const float*, int64_t, int64_t, int, int, int, float*, Stream) {
  no_cuda("cuda::attention");
}
void attention(const float*, const float*, const float*, int64_t, int64_t, int, int, int, float*, const AttentionOptions&, Stream) {
  no_cuda("cuda::attention");
}
void quantize_per_token_int8(const float*, int64_t, int64_t, int8_t*, float*, Stream) { no_cuda("cuda::quantize_per_token_int8"); }
void gather_rows(const float*, const int32_t*, int64_t, int, float*, Stream) { no_cuda("cuda::gather_rows"); }
void scatter_add_rows(float*, const float*, const int32_t*, const float*, int64_t, int, Stream) { no_cuda("cuda::scatter_add_rows"); }
void fill(float*, int64_t, float, Stream) { no_cuda("cuda::fill"); }

// Quantized linears (cuda_int8_gemm.h, cuda_int8_quantize.h, cuda_w8a8_linear.h, cuda_w4a16_linear.h).
struct CublasLtInt8Gemm::Impl {};
CublasLtInt8Gemm::CublasLtInt8Gemm(int64_t, int64_t) { no_cuda("CublasLtInt8Gemm"); }
CublasLtInt8Gemm::~CublasLtInt8Gemm() = default;
CublasLtInt8Gemm::CublasLtInt8Gemm(CublasLtInt8Gemm&&) noexcept = default;
CublasLtInt8Gemm& CublasLtInt8Gemm::operator=(CublasLtInt8Gemm&&) noexcept = default;
void CublasLtInt8Gemm::run(const int8_t*, const int8_t*, int64_t, int32_t*, void*, size_t, Stream) { no_cuda("CublasLtInt8Gemm::run"); }
void quantize_activations_int8(const float*, int64_t, int64_t, ActQuant, float, int8_t*, int64_t, float*, Stream) {
  no_cuda("cuda::quantize_activations_int8");
}
void dequantize_int8_gemm(const int32_t*, int64_t, int64_t, int64_t, const float*, bool, const float*, bool, const float*, float*,
                          Stream) {
  no_cuda("cuda::dequantize_int8_gemm");
}
std::unique_ptr<DeviceLinear> make_w8a8_device_linear(const W8A8HostWeights&) { no_cuda("cuda::make_w8a8_device_linear"); }
std::unique_ptr<DeviceLinear> make_w4a16_device_linear(const Int4Weights&, const std::string&) {
  no_cuda("cuda::make_w4a16_device_linear");
}

// Benchmark helper (cuda_fp16_gemm.h).
void gemm_f16(const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t, uint16_t*, Stream) { no_cuda("cuda::gemm_f16"); }

// KV cache kernels (cuda_kv_kernels.h).
void kv_encode(const KVLayerDeviceView&, const float*, const float*, int64_t, int64_t, unsigned long long*, Stream) {
  no_cuda("cuda::kv_encode");
}
void kv_dequantize(const KVLayerDeviceView&, int64_t, float*, float*, Stream) { no_cuda("cuda::kv_dequantize"); }
int64_t kv_decode_scratch_floats(const KVLayerDeviceView&, int, int64_t) { no_cuda("cuda::kv_decode_scratch_floats"); }
void kv_decode_attention(const KVLayerDeviceView&, const float*, int, int64_t, float*, float*, Stream) {
  no_cuda("cuda::kv_decode_attention");
}
}  // namespace cuda

}  // namespace sq
