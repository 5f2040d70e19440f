// A reusable scratch area at a 64-byte boundary inside a growable std::vector (per-thread scratch
// of the kernels: W4A16 activations, oneDNN scratchpads).
#pragma once

#include <cstdint>
#include <vector>

namespace sq::ops {

/// `count` elements of `buf` starting at a 64-byte boundary (buf grown on demand, reused; the
/// pointer is valid until buf grows again). Throws std::bad_alloc when buf cannot grow.
template <typename T>
T* aligned_buffer(std::vector<T>& buf, int64_t count) {
  if (static_cast<int64_t>(buf.size()) < count + 64) buf.resize(static_cast<size_t>(count + 64));
  const auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64) / sizeof(T);
}

}  // namespace sq::ops
