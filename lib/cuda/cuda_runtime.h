// CUDA runtime wrappers of the CUDA backend: device discovery, streams, and RAII device memory.
//
// This header is plain C++ (no CUDA headers), so device-neutral code and tests include it in every
// build. With SQ_WITH_CUDA=1 the functions are implemented in cuda_runtime.cu; without it,
// cuda_stub.cpp implements them: `cuda_device_count()` returns 0, `cuda_available()` false, and
// everything that would touch a device throws UnsupportedError("sqkit was built without CUDA ...").
//
// Errors: a failing CUDA runtime or cuBLAS call throws `CudaError`, whose message names the call,
// the error code's name and its description ("cudaMalloc(1048576 bytes): cudaErrorMemoryAllocation:
// out of memory").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace sq {

/// A CUDA runtime, driver or cuBLAS call failed on a device that exists (out of device memory, an
/// illegal address in a kernel, ...). Tools exit with status 1 for it (lib/core/tool_main.h).
class CudaError : public Error {
 public:
  using Error::Error;
};

/// True when sqkit was compiled with the CUDA backend (SQ_WITH_CUDA=ON).
bool cuda_compiled();

/// Number of CUDA devices usable by this process. Returns 0, never throws, when sqkit was built
/// without CUDA, when no driver is installed, or when cudaGetDeviceCount reports any error
/// (cudaErrorNoDevice, cudaErrorInsufficientDriver, ...).
int cuda_device_count();

/// cuda_device_count() > 0.
bool cuda_available();

/// "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)" for device `device`; throws like `require_cuda`.
std::string cuda_device_name(int device = 0);

/// Throws UnsupportedError naming `what` (e.g. "--device cuda") when sqkit was built without CUDA
/// ("... sqkit was built without CUDA (configure with -DSQ_WITH_CUDA=ON and a CUDA toolkit)") or when
/// no CUDA device is usable ("... no CUDA device is available (cudaGetDeviceCount: ...)").
void require_cuda(const std::string& what);

/// Opaque CUDA stream handle (a cudaStream_t); the default-constructed value is the legacy default
/// stream. Every op in cuda_ops.h is asynchronous with respect to the host on its stream.
struct Stream {
  void* handle = nullptr;
};

/// Owns one non-blocking CUDA stream (cudaStreamCreateWithFlags / cudaStreamDestroy).
class CudaStream {
 public:
  /// Throws CudaError / UnsupportedError (no CUDA).
  CudaStream();
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  Stream get() const { return Stream{handle_}; }
  /// cudaStreamSynchronize: waits for the stream's work; throws CudaError for an asynchronous
  /// failure of an earlier kernel on it.
  void synchronize() const;

 private:
  void* handle_ = nullptr;
};

/// Waits for all work on `stream` (cudaStreamSynchronize); throws CudaError naming `what` when a
/// kernel launched earlier failed.
void cuda_synchronize(Stream stream, const char* what = "cudaStreamSynchronize");

/// Enqueues a device-to-device copy of `bytes` bytes on `stream` (cudaMemcpyAsync); dst and src
/// are device pointers. Throws CudaError naming the call.
void copy_device_to_device(void* dst, const void* src, size_t bytes, Stream stream = {});

/// Device time between two points of a stream, measured with a pair of CUDA events
/// (cudaEventRecord / cudaEventElapsedTime: resolution about 0.5 µs). Not copyable.
class CudaEventTimer {
 public:
  /// Creates the two events. Throws CudaError / UnsupportedError (no CUDA).
  CudaEventTimer();
  ~CudaEventTimer();
  CudaEventTimer(const CudaEventTimer&) = delete;
  CudaEventTimer& operator=(const CudaEventTimer&) = delete;
  /// Records the start (stop) event on `stream`.
  void start(Stream stream = {});
  void stop(Stream stream = {});
  /// Waits for the stop event and returns the milliseconds between start and stop.
  float elapsed_ms() const;

 private:
  void* start_ = nullptr;
  void* stop_ = nullptr;
};

/// RAII device allocation of `bytes` bytes (cudaMalloc / cudaFree). Move-only. Copies and zero()
/// wait for the whole device (cudaDeviceSynchronize) before and after the copy (cudaMemcpy) or
/// memset, so they are ordered after every op enqueued earlier and before every op enqueued later,
/// on any stream, and host buffers may be reused as soon as they return: simple and safe rather
/// than fast (the reference runner's transfers are small).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// Allocates `bytes` (nothing for 0). Throws CudaError naming the size when cudaMalloc fails on
  /// a device, UnsupportedError without CUDA or without a usable device.
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  /// Copies `bytes` from host `src` to the start of this buffer (+ `offset` bytes). Throws
  /// std::out_of_range when offset + bytes exceeds the allocation, CudaError on failure.
  void copy_from_host(const void* src, size_t bytes, size_t offset = 0);
  /// Copies `bytes` from this buffer (+ `offset`) to host `dst`; throws like copy_from_host.
  void copy_to_host(void* dst, size_t bytes, size_t offset = 0) const;
  /// Sets every byte to zero (cudaMemset).
  void zero();

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// A typed device array of `size()` elements of trivially copyable T on top of DeviceBuffer.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t count) : buf_(count * sizeof(T)), count_(count) {}
  /// Allocates host.size() elements and uploads them.
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.data(), host.size()) {}
  DeviceArray(const T* host, size_t count) : buf_(count * sizeof(T)), count_(count) {
    if (count) buf_.copy_from_host(host, count * sizeof(T));
  }
  T* data() const { return static_cast<T*>(buf_.data()); }
  size_t size() const { return count_; }
  /// Uploads `count` elements to elements [first, first + count).
  void upload(const T* host, size_t count, size_t first = 0) {
    if (count) buf_.copy_from_host(host, count * sizeof(T), first * sizeof(T));
  }
  /// Downloads elements [first, first + count) into `host`.
  void download(T* host, size_t count, size_t first = 0) const {
    if (count) buf_.copy_to_host(host, count * sizeof(T), first * sizeof(T));
  }
  /// The whole array as a host vector.
  std::vector<T> to_host() const {
    std::vector<T> out(count_);
    download(out.data(), count_);
    return out;
  }
  void zero() { buf_.zero(); }

 private:
  DeviceBuffer buf_;
  size_t count_ = 0;
};

}  // namespace sq
