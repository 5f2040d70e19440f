// NumPy .npy files (format version 1.0), the array format every Python tool reads with numpy.load:
// sqkit writes logits with it (`sq-run --logits FILE.npy`) so that independent implementations
// (transformers, llama.cpp) can be compared with sqkit's runner on the same tokens.
//
// Layout (numpy's "NEP 1 / format.py" specification, version 1.0):
//   magic "\x93NUMPY", major 1, minor 0, uint16 little-endian header length HLEN,
//   HLEN bytes of an ASCII Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (…), }
//   padded with spaces and terminated by '\n' so that 10 + HLEN is a multiple of 64,
//   then the data, C order (row-major), little-endian.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sq {

/// The 10 + HLEN header bytes of a version-1.0 .npy file holding a C-order little-endian float32
/// ('<f4') array of `shape` (any rank, including 0 = a scalar). Throws std::invalid_argument for a
/// negative dimension or a header that would not fit the 16-bit length (rank above ~2,000).
std::string npy_header_f32(const std::vector<int64_t>& shape);

/// Writes `data` (row-major float32, product(shape) values) as a .npy file at `path`, via a temporary
/// file and an atomic rename (formats/atomic_file.h: never a partial file). The caller checks
/// beforehand whether `path` may be replaced (core/tool_main.h check_output_path). Throws
/// std::invalid_argument when data.size() differs from product(shape), OutputError naming `path`
/// when writing fails.
void write_npy_f32(const std::string& path, const std::vector<int64_t>& shape, const std::vector<float>& data);

}  // namespace sq
