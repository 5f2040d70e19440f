// CUDA implementation of cuda/cuda_runtime.h (device discovery, streams, device memory).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <stdexcept>

#include "cuda/cuda_check.h"
#include "cuda/cuda_runtime.h"

namespace sq {

using cuda_detail::check;

bool cuda_compiled() { return true; }

namespace {
/// cudaGetDeviceCount's result, and its error when it failed (no driver, no device, ...).
cudaError_t device_count(int& count) {
  count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    count = 0;
    cudaGetLastError();  // clear the (non-sticky) error so that later calls do not report it
  }
  return err;
}
}  // namespace

int cuda_device_count() {
  int count = 0;
  device_count(count);
  return count;
}

bool cuda_available() { return cuda_device_count() > 0; }

void require_cuda(const std::string& what) {
  int count = 0;
  const cudaError_t err = device_count(count);
  if (count > 0) return;
  const std::string why = err != cudaSuccess ? std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err)
                                             : std::string("0 devices");
  throw UnsupportedError(what + ": no CUDA device is available (cudaGetDeviceCount: " + why + ")");
}

std::string cuda_device_name(int device) {
  require_cuda("cuda_device_name");
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties(" + std::to_string(device) + ")");
  char buf[64];
  std::snprintf(buf, sizeof buf, " (sm_%d%d, %.1f GiB)", p.major, p.minor, double(p.totalGlobalMem) / double(1 << 30));
  return std::string(p.name) + buf;
}

CudaStream::CudaStream() {
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  handle_ = s;
}

CudaStream::~CudaStream() {
  if (handle_) cudaStreamDestroy(static_cast<cudaStream_t>(handle_));
}

void CudaStream::synchronize() const { cuda_synchronize(get()); }

void cuda_synchronize(Stream stream, const char* what) {
  check(cudaStreamSynchronize(cuda_detail::stream_of(stream)), what);
}

void copy_device_to_device(void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_detail::stream_of(stream)),
        "cudaMemcpyAsync(device to device, " + std::to_string(bytes) + " bytes)");
}

CudaEventTimer::CudaEventTimer() {
  cudaEvent_t a = nullptr, b = nullptr;
  check(cudaEventCreate(&a), "cudaEventCreate");
  const cudaError_t err = cudaEventCreate(&b);
  if (err != cudaSuccess) {
    cudaEventDestroy(a);
    check(err, "cudaEventCreate");
  }
  start_ = a;
  stop_ = b;
}

CudaEventTimer::~CudaEventTimer() {
  if (start_) cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  if (stop_) cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}

void CudaEventTimer::start(Stream stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(start_), cuda_detail::stream_of(stream)), "cudaEventRecord(start)");
}

void CudaEventTimer::stop(Stream stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(stop_), cuda_detail::stream_of(stream)), "cudaEventRecord(stop)");
}

float CudaEventTimer::elapsed_ms() const {
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)), "cudaEventSynchronize");
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_)), "cudaEventElapsedTime");
  return ms;
}

DeviceBuffer::DeviceBuffer(size_t bytes) {
  if (bytes == 0) return;
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    require_cuda("DeviceBuffer");  // no device at all: UnsupportedError rather than CudaError
    check(err, "cudaMalloc(" + std::to_string(bytes) + " bytes)");
  }
  ptr_ = p;
  bytes_ = bytes;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

namespace {
void check_range(size_t offset, size_t bytes, size_t size, const char* what) {
  if (offset > size || bytes > size - offset)
    throw std::out_of_range(std::string(what) + ": bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                            ") outside a device buffer of " + std::to_string(size) + " bytes");
}
}  // namespace

void DeviceBuffer::copy_from_host(const void* src, size_t bytes, size_t offset) {
  check_range(offset, bytes, bytes_, "DeviceBuffer::copy_from_host");
  if (bytes == 0) return;
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (before a host-to-device copy)");
  check(cudaMemcpy(static_cast<char*>(ptr_) + offset, src, bytes, cudaMemcpyHostToDevice),
        "cudaMemcpy(host to device, " + std::to_string(bytes) + " bytes)");
  // From pageable memory cudaMemcpy may return before the DMA to the device has finished, and it
  // runs on the legacy default stream, which non-blocking streams (CudaStream) do not wait for:
  // wait here so a kernel enqueued next on any stream sees the data.
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (after a host-to-device copy)");
}

void DeviceBuffer::copy_to_host(void* dst, size_t bytes, size_t offset) const {
  check_range(offset, bytes, bytes_, "DeviceBuffer::copy_to_host");
  if (bytes == 0) return;
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (before a device-to-host copy)");
  check(cudaMemcpy(dst, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost),
        "cudaMemcpy(device to host, " + std::to_string(bytes) + " bytes)");
}

void DeviceBuffer::zero() {
  if (!bytes_) return;
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (before cudaMemset)");
  check(cudaMemset(ptr_, 0, bytes_), "cudaMemset(" + std::to_string(bytes_) + " bytes)");
  // cudaMemset is asynchronous (legacy default stream): wait, as after a host-to-device copy.
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (after cudaMemset)");
}

}  // namespace sq
