// A standard allocator whose blocks start at a 64-byte (cache-line, one AVX-512 register) boundary,
// for containers that kernels stream with full-width loads (packed INT4 weights).
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace sq::ops {

/// std::allocator-compatible; every allocation is aligned to `Align` bytes (operator new with
/// std::align_val_t). Throws std::bad_alloc like std::allocator.
template <typename T, std::size_t Align = 64>
struct AlignedAllocator {
  using value_type = T;
  template <typename U>
  struct rebind {
    using other = AlignedAllocator<U, Align>;
  };
  AlignedAllocator() noexcept = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U, Align>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(Align))); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t(Align)); }
  template <typename U>
  bool operator==(const AlignedAllocator<U, Align>&) const noexcept { return true; }
};

/// A byte vector whose data() is 64-byte aligned.
using AlignedBytes = std::vector<unsigned char, AlignedAllocator<unsigned char>>;

}  // namespace sq::ops
