#include "formats/npy_file.h"

#include <stdexcept>

#include "formats/atomic_file.h"

namespace sq {

std::string npy_header_f32(const std::vector<int64_t>& shape) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) throw std::invalid_argument("npy: negative dimension " + std::to_string(shape[i]));
    dict += std::to_string(shape[i]);
    // A one-element tuple needs its trailing comma, as Python writes it: (5,).
    if (shape.size() == 1 || i + 1 < shape.size()) dict += shape.size() == 1 ? "," : ", ";
  }
  dict += "), }";
  // 6 magic + 2 version + 2 length bytes; the dict, space padding and '\n' fill to a multiple of 64.
  size_t total = 10 + dict.size() + 1;
  const size_t padded = (total + 63) / 64 * 64;
  dict.append(padded - total, ' ');
  dict += '\n';
  const size_t hlen = dict.size();
  if (hlen > 65535) throw std::invalid_argument("npy: header of " + std::to_string(hlen) + " bytes does not fit format 1.0");
  std::string out = "\x93NUMPY";
  out += static_cast<char>(1);
  out += static_cast<char>(0);
  out += static_cast<char>(hlen & 0xFF);
  out += static_cast<char>((hlen >> 8) & 0xFF);
  return out + dict;
}

void write_npy_f32(const std::string& path, const std::vector<int64_t>& shape, const std::vector<float>& data) {
  uint64_t count = 1;
  for (int64_t d : shape) count *= static_cast<uint64_t>(d < 0 ? 0 : d);
  const std::string header = npy_header_f32(shape);  // throws for a negative dimension
  if (count != data.size())
    throw std::invalid_argument("npy: " + std::to_string(data.size()) + " values for a shape of " + std::to_string(count));
  static_assert(sizeof(float) == 4, "float32");
  AtomicFile f(path);
  f.write(header.data(), header.size());
  f.write(data.data(), data.size() * sizeof(float));  // x86-64 and aarch64 are little-endian, as '<f4' says
  f.commit();
}

}  // namespace sq
