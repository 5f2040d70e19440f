// The real GGUF checkpoints (SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M; fetched by
// scripts/fetch-models.sh into $SQKIT_MODELS or <source>/models/) read by formats/gguf_file.h and
// dequantized by formats/gguf_dequantize.h, compared with the independent oracle
// tests/data/gguf_reference_*.json written by scripts/gguf_reference.py with the `gguf` Python
// package (GGUFReader + gguf.quants.dequantize). Skipped when the model file is absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/gguf_dequantize.h"
#include "formats/gguf_file.h"
#include "formats/mapped_file.h"
#include "tests/support/real_models.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

using sq::test::model_path;

json reference(const std::string& file) {
  return json::parse(sq::read_file_to_string(std::string(SQ_SOURCE_DIR) + "/tests/data/" + file));
}

/// zlib's CRC-32 (polynomial 0xEDB88320, init and final xor 0xFFFFFFFF), as Python's zlib.crc32.
uint32_t crc32(const void* data, size_t n, uint32_t crc = 0) {
  static const auto table = [] {
    std::vector<uint32_t> t(256);
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

/// gguf-py's GGUFValueType names, by type id.
const char* py_type_name(sq::GgufValueType t) {
  static const char* const k[] = {"uint8", "int8",  "uint16", "int16", "uint32", "int32", "float32",
                                  "bool",  "string", "array", "uint64", "int64", "float64"};
  return k[static_cast<uint32_t>(t)];
}

bool is_signed(sq::GgufValueType t) {
  using T = sq::GgufValueType;
  return t == T::I8 || t == T::I16 || t == T::I32 || t == T::I64;
}

/// Compares one scalar (or an array's first element, `index` 0) with the oracle's JSON value.
void expect_value(const std::string& key, sq::GgufValueType t, const sq::GgufValue& v, bool element, const json& want) {
  using T = sq::GgufValueType;
  if (t == T::STRING) {
    const std::string got = element ? std::string(v.strings.at(0)) : v.str;
    EXPECT_EQ(got, want.get<std::string>()) << key;
  } else if (t == T::F32 || t == T::F64) {
    EXPECT_EQ(element ? v.real_element(0) : v.real, want.get<double>()) << key;
  } else if (t == T::BOOL) {
    EXPECT_EQ((element ? v.integer_element(0) : v.integer) != 0, want.get<bool>()) << key;
  } else {
    const uint64_t raw = element ? v.integer_element(0) : v.integer;
    if (is_signed(t)) EXPECT_EQ(static_cast<int64_t>(raw), want.get<int64_t>()) << key;
    else EXPECT_EQ(raw, want.get<uint64_t>()) << key;
  }
}

/// Per-type summary of the comparison.
struct TypeStats {
  int tensors = 0;
  int64_t elements = 0;
  double max_sample_diff = 0;
  double max_rel_sum_diff = 0;  // |sum - ref| / sum|x|
  int crc_matches = 0;
};

/// Opens `file`, compares header, metadata and every tensor's dequantization with `ref`, prints a
/// per-type summary and the dequantization throughput.
void check_against_oracle(const std::string& path, const json& ref) {
  const auto t_open = std::chrono::steady_clock::now();
  const sq::GgufFile f(path);
  const double open_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_open).count();
  EXPECT_EQ(fs::file_size(path), ref["file_size"].get<uint64_t>());
  EXPECT_EQ(f.version(), ref["version"].get<uint32_t>());
  EXPECT_EQ(f.alignment(), ref["alignment"].get<uint64_t>());
  EXPECT_EQ(f.data_offset(), ref["data_offset"].get<uint64_t>());

  // Metadata: same keys in the same order, same types and values.
  const json& meta = ref["metadata"];
  ASSERT_EQ(f.metadata().size(), meta.size());
  size_t k = 0;
  for (auto it = meta.begin(); it != meta.end(); ++it, ++k) {
    const std::string& key = it.key();
    const json& m = it.value();
    EXPECT_EQ(f.metadata()[k].first, key);
    const sq::GgufValue& v = f.value(key);
    ASSERT_EQ(py_type_name(v.type), m["type"].get<std::string>()) << key;
    if (v.type == sq::GgufValueType::ARRAY) {
      EXPECT_EQ(py_type_name(v.elem_type), m["elem_type"].get<std::string>()) << key;
      EXPECT_EQ(v.count, m["count"].get<uint64_t>()) << key;
      if (m.contains("first")) expect_value(key, v.elem_type, v, true, m["first"]);
    } else if (m.contains("crc32")) {
      EXPECT_EQ(v.str.size(), m["length"].get<size_t>()) << key;
      EXPECT_EQ(crc32(v.str.data(), v.str.size()), m["crc32"].get<uint32_t>()) << key;
    } else {
      expect_value(key, v.type, v, false, m["value"]);
    }
  }

  // Tensors: infos, then the FP32 values, one tensor at a time into one reused buffer.
  const json& tensors = ref["tensors"];
  ASSERT_EQ(f.tensors().size(), tensors.size());
  int64_t max_numel = 0;
  for (const auto& t : f.tensors()) max_numel = std::max(max_numel, t.numel);
  std::vector<float> buf(static_cast<size_t>(max_numel));
  std::map<std::string, TypeStats> stats;
  double seconds = 0;
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const json& r = tensors[i];
    const sq::GgufTensorInfo& t = f.tensors()[i];
    const std::string name = r["name"].get<std::string>();
    ASSERT_EQ(t.name, name);
    const std::string type = sq::ggml_type_name(static_cast<uint32_t>(t.type));
    EXPECT_EQ(type, r["type"].get<std::string>()) << name;
    EXPECT_EQ(t.dims, r["dims"].get<std::vector<int64_t>>()) << name;
    EXPECT_EQ(t.offset, r["offset"].get<uint64_t>()) << name;
    EXPECT_EQ(t.nbytes, r["nbytes"].get<uint64_t>()) << name;
    ASSERT_EQ(t.numel, r["n"].get<int64_t>()) << name;

    const auto t0 = std::chrono::steady_clock::now();
    sq::dequantize_tensor_rows(f, t, 0, t.rows(), buf.data());
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    total += t.numel;

    TypeStats& s = stats[type];
    ++s.tensors;
    s.elements += t.numel;
    // Bit-exact check of every value: the oracle's CRC-32 of its FP32 bytes.
    const uint32_t crc = crc32(buf.data(), static_cast<size_t>(t.numel) * sizeof(float));
    EXPECT_EQ(crc, r["crc32"].get<uint32_t>()) << name << ": FP32 values differ from gguf.quants";
    if (crc == r["crc32"].get<uint32_t>()) ++s.crc_matches;
    // Samples: same per-element arithmetic, no tolerance.
    for (const json& sample : r["samples"]) {
      const int64_t idx = sample[0].get<int64_t>();
      const double want = sample[1].get<double>();
      const double got = buf[static_cast<size_t>(idx)];
      EXPECT_EQ(got, want) << name << "[" << idx << "]";
      s.max_sample_diff = std::max(s.max_sample_diff, std::fabs(got - want));
    }
    // Sums in float64: the values are identical, only the summation order differs (numpy adds
    // pairwise in blocks of 128, here sequentially). The error of a float64 sum of n terms is at
    // most (n - 1) u sum|x| sequentially and (128 + log2 n) u sum|x| pairwise (u = 2^-53); squares of
    // FP32 values are exact in float64. So |sum - ref| <= (n + 192) u sum|x|.
    double sum = 0, sumsq = 0, sumabs = 0;
    for (int64_t j = 0; j < t.numel; ++j) {
      const double x = buf[static_cast<size_t>(j)];
      sum += x;
      sumsq += x * x;
      sumabs += std::fabs(x);
    }
    const double u = std::ldexp(1.0, -53), bound = double(t.numel + 192) * u;
    EXPECT_NEAR(sum, r["sum"].get<double>(), bound * sumabs) << name;
    EXPECT_NEAR(sumsq, r["sumsq"].get<double>(), bound * sumsq) << name;
    if (sumabs > 0) s.max_rel_sum_diff = std::max(s.max_rel_sum_diff, std::fabs(sum - r["sum"].get<double>()) / sumabs);
  }

  std::printf("%s (gguf %s oracle): opened and validated in %.3f s\n", fs::path(path).filename().c_str(),
              ref["gguf_version"].get<std::string>().c_str(), open_s);
  std::printf("  %-6s %7s %11s %12s %15s %18s\n", "type", "tensors", "elements", "crc32 equal", "max |sample d|",
              "max |sum d|/sum|x|");
  for (const auto& [type, s] : stats)
    std::printf("  %-6s %7d %11lld %8d/%-3d %15g %18.3g\n", type.c_str(), s.tensors, static_cast<long long>(s.elements),
                s.crc_matches, s.tensors, s.max_sample_diff, s.max_rel_sum_diff);
  // The first pass also pages the mapped file in; time a second, warm pass as well.
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& t : f.tensors()) sq::dequantize_tensor_rows(f, t, 0, t.rows(), buf.data());
  const double warm = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("  dequantized %lld elements: first pass %.3f s (%.0f M elements/s), warm pass %.3f s (%.0f M elements/s, "
              "%.2f GB/s FP32 out), one thread\n",
              static_cast<long long>(total), seconds, total / seconds / 1e6, warm, total / warm / 1e6,
              total * 4.0 / warm / 1e9);
}

TEST(GgufModels, SmolLM2MatchesTheOracle) {
  const std::string path = model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
  if (path.empty()) GTEST_SKIP() << "SmolLM2-135M-Instruct.Q4_1.gguf not found in $SQKIT_MODELS or models/: run bash scripts/fetch-models.sh";
  const sq::GgufFile f(path);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_u32("llama.block_count"), 30u);
  EXPECT_EQ(f.get_u32("llama.embedding_length"), 576u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count"), 9u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count_kv"), 3u);
  EXPECT_EQ(f.get_f32("llama.rope.freq_base"), 100000.0f);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens").size(), 49152u);
  EXPECT_EQ(f.get_i32_array("tokenizer.ggml.token_type").size(), 49152u);
  EXPECT_EQ(f.get_array_size("tokenizer.ggml.merges"), 48900u);
  EXPECT_EQ(f.tensors().size(), 272u);  // 30 x 9 + token_embd + output_norm
  EXPECT_EQ(f.tensor("token_embd.weight").shape(), (std::vector<int64_t>{49152, 576}));
  check_against_oracle(path, reference("gguf_reference_smollm2.json"));
}

TEST(GgufModels, Gemma3MatchesTheOracle) {
  const std::string path = model_path("gemma-3-270m-q4_k_m.gguf");
  if (path.empty()) GTEST_SKIP() << "gemma-3-270m-q4_k_m.gguf not found in $SQKIT_MODELS or models/: run bash scripts/fetch-models.sh";
  const sq::GgufFile f(path);
  EXPECT_EQ(f.get_string("general.architecture"), "gemma3");
  EXPECT_EQ(f.get_u32("gemma3.block_count"), 18u);
  EXPECT_EQ(f.get_u32("gemma3.embedding_length"), 640u);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens").size(), 262144u);
  EXPECT_EQ(f.get_f32_array("tokenizer.ggml.scores").size(), 262144u);
  check_against_oracle(path, reference("gguf_reference_gemma3.json"));
}

}  // namespace
