// SQ_HD: marks the element-math functions that both nvcc (device and host code) and the host
// compiler compile (cuda/kv_device_math.h, cuda/decoder_element.h), so the CPU tests exercise the
// expressions the kernels evaluate. Under nvcc: __host__ __device__ __forceinline__; otherwise inline.
#pragma once

#if defined(__CUDACC__)
#define SQ_HD __host__ __device__ __forceinline__
#else
#define SQ_HD inline
#endif
