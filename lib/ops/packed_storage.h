// Storage for a quantized weight's codes that either owns them (a 64-byte aligned vector) or borrows
// them from a read-only mapping that outlives it (a .sqm file's tensor bytes, formats/sqm_file.h),
// so that a model loaded from a packed file runs on the file's pages instead of a copy of them
// (issue 37: sq-run holds the packed model mapped).
//
// Reading (data(), operator[], begin()/end(): all const) never copies. Writing goes through
// mutable_data(), resize, assign or pop_back, which first copy borrowed bytes into owned storage
// (copy on write): the mapping is never written, and a write is always visible as such at the call
// site. Copies of a borrowed buffer borrow the same bytes (and share the keep-alive).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ops/aligned_allocator.h"

namespace sq::ops {

/// Codes of element type T (uint8_t packed nibbles, int8_t INT8 codes): owned (in a
/// std::vector<T, Alloc>; the default allocator aligns to 64 bytes) or borrowed read-only from
/// memory kept alive by a shared_ptr. Not thread-safe against concurrent writes (as std::vector);
/// concurrent reads are safe.
template <typename T, typename Alloc = AlignedAllocator<T>>
class PackedStorage {
 public:
  using value_type = T;
  using Owned = std::vector<T, Alloc>;

  PackedStorage() = default;
  /// Owned storage taking over `v`.
  PackedStorage(Owned v) : owned_(std::move(v)) {}  // NOLINT(google-explicit-constructor)

  /// Borrows `n` elements at `data` (which must stay valid and unchanged while `keep_alive` lives).
  /// Kernels need 64-byte aligned codes: a `data` that is not 64-byte aligned is copied into owned
  /// storage instead (borrowed() then says false).
  static PackedStorage borrow(const T* data, size_t n, std::shared_ptr<const void> keep_alive) {
    PackedStorage s;
    if (n != 0 && reinterpret_cast<uintptr_t>(data) % 64 != 0) {
      s.owned_.assign(data, data + n);
      return s;
    }
    s.borrowed_ = data;
    s.borrowed_n_ = n;
    s.keep_ = std::move(keep_alive);
    return s;
  }

  /// True while the codes are read from borrowed memory (no copy made).
  bool borrowed() const { return keep_ != nullptr; }

  size_t size() const { return borrowed() ? borrowed_n_ : owned_.size(); }
  bool empty() const { return size() == 0; }
  const T* data() const { return borrowed() ? borrowed_ : owned_.data(); }
  const T& operator[](size_t i) const { return data()[i]; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size(); }
  /// Writable codes (borrowed ones are copied into owned storage first).
  T* mutable_data() { return own().data(); }

  void resize(size_t n) { own().resize(n); }
  void assign(size_t n, const T& v) { release_borrow(); owned_.assign(n, v); }
  template <typename It>
  void assign(It first, It last) { release_borrow(); owned_.assign(first, last); }
  void pop_back() { own().pop_back(); }

  /// Element-wise equality (whatever the storage).
  friend bool operator==(const PackedStorage& a, const PackedStorage& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
  }

 private:
  void release_borrow() {
    borrowed_ = nullptr;
    borrowed_n_ = 0;
    keep_.reset();
  }
  Owned& own() {
    if (borrowed()) {
      Owned copy(borrowed_, borrowed_ + borrowed_n_);
      release_borrow();
      owned_ = std::move(copy);
    }
    return owned_;
  }

  Owned owned_;
  const T* borrowed_ = nullptr;
  size_t borrowed_n_ = 0;
  std::shared_ptr<const void> keep_;
};

/// INT8 codes (W8A16 linears, the INT8 token embedding): no alignment needed by their kernels.
using Int8Codes = PackedStorage<int8_t, std::allocator<int8_t>>;

}  // namespace sq::ops
