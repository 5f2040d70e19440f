// The ggml tensor element types that GGUF files name, with their block geometry.
//
// Source: ggml's `enum ggml_type` and its type traits (ggml/include/ggml.h, ggml/src/ggml.c), as
// mirrored by the `gguf` Python package (gguf.constants.GGMLQuantizationType and
// GGML_QUANT_SIZES, version 0.19.0). A ggml type stores `block_size` consecutive elements of a row
// in `type_size` bytes; plain types (F32, F16, BF16, I8, ...) have block_size 1. A row's length
// (dims[0], the fastest-varying dimension) must be a whole number of blocks, so a tensor of
// `numel` elements occupies numel / block_size * type_size bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace sq {

/// ggml type ids as stored (u32) in a GGUF tensor info. Ids 4, 5 (Q4_2, Q4_3), 31-33 and 36-38
/// (repacked CPU layouts) were removed from ggml and are not valid in files.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  NVFP4 = 40,
  Q1_0 = 41,
};

/// Block geometry of one ggml type.
struct GgmlTypeTraits {
  const char* name;     ///< ggml's name, e.g. "Q4_K"
  int64_t block_size;   ///< elements per block (1 for plain types, 32 or 256 for most quants)
  int64_t type_size;    ///< bytes per block
};

/// The traits of type id `id`, or nullptr when `id` is not a (current) ggml type.
const GgmlTypeTraits* ggml_type_traits(uint32_t id);

/// The name of `type` ("Q8_0"), or "type <id>" for an id ggml_type_traits does not know.
std::string ggml_type_name(uint32_t id);

}  // namespace sq
