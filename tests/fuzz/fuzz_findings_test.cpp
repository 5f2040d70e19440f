// Regression tests for the reader bugs found while fuzzing (issue #8; docs/reliability.md, "Fuzzing"),
// and for the byte-buffer entry points and the option-spec parser the fuzz targets use.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <xxhash.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "calib/activation_stats.h"
#include "calib/convert_spec.h"
#include "core/error.h"
#include "formats/calibration_h5.h"
#include "formats/hf_checkpoint.h"
#include "formats/hf_config.h"
#include "formats/json_limits.h"
#include "formats/safetensors.h"
#include "formats/sqm_file.h"
#include "formats/text_source.h"
#include "formats/llama2c_checkpoint.h"
#include "formats/mapped_file.h"
#include "model/observer.h"
#include "tests/support/expect_error.h"
#include "tests/support/test_data.h"

namespace {

using sq::test::expect_error;

std::shared_ptr<const sq::MappedFile> buffer(const std::vector<int32_t>& words, const std::string& name) {
  return sq::MappedFile::from_bytes(reinterpret_cast<const uint8_t*>(words.data()), words.size() * 4, name);
}

/// A fresh, empty directory under the system temp directory, removed at the end of the test.
struct ScratchDir {
  std::filesystem::path path;
  ScratchDir() {
    path = std::filesystem::temp_directory_path() /
           ("sq-fuzz-findings-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// ---- byte-buffer entry points ----------------------------------------------------------------------

TEST(MappedFileFromBytes, CopiesAlignedAndNamesTheBuffer) {
  const std::string bytes = "hello, world";
  const auto f = sq::MappedFile::from_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "mem.bin");
  ASSERT_EQ(f->size(), bytes.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f->data()), f->size()), bytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f->data()) % 64, 0u);
  EXPECT_EQ(f->path(), "mem.bin");
  const auto empty = sq::MappedFile::from_bytes(nullptr, 0, "empty.bin");
  EXPECT_EQ(empty->size(), 0u);
  EXPECT_EQ(empty->data(), nullptr);
}

TEST(MappedFileFromBytes, Llama2cCheckpointFromBytesEqualsTheFile) {
  const std::string path = sq::test::stories_model();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared data missing: " << path;
  const std::string bytes = sq::read_file_to_string(path);
  const auto a = sq::load_llama2c_checkpoint(path);
  const auto b = sq::load_llama2c_checkpoint(
      sq::MappedFile::from_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path));
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    const sq::Tensor& u = b.tensors.at(name);
    ASSERT_EQ(t.shape(), u.shape()) << name;
    EXPECT_EQ(std::memcmp(t.data(), u.data(), size_t(t.numel()) * 4), 0) << name;
  }
}

// ---- llama2.c checkpoint header ------------------------------------------------------------------

// vocab_size = INT32_MIN: negating it (the unshared-classifier convention) was signed overflow (UB).
TEST(FuzzFindings, Llama2cHeaderWithInt32MinVocabIsInputError) {
  std::vector<int32_t> words = {8, 16, 1, 2, 1, INT32_MIN, 4};
  words.resize(64, 0);
  expect_error<sq::InputError>([&] { sq::load_llama2c_checkpoint(buffer(words, "min-vocab.bin")); },
                               {"min-vocab.bin", "vocab_size", "-2147483648"});
  ScratchDir dir;
  const std::string path = (dir.path / "min-vocab.bin").string();
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(words.data(), 4, words.size(), f);
    std::fclose(f);
  }
  EXPECT_FALSE(sq::looks_like_llama2c_checkpoint(path));
}

// Sizes each within 1..2^24 whose product (L x dim x hidden ~ 2^72 floats) overflowed the int64
// byte count (UB), which could wrap to the file's size; now the count is 128-bit and rejected.
TEST(FuzzFindings, Llama2cHeaderWhoseImpliedSizeOverflowsIsInputError) {
  const int32_t big = 1 << 24;
  std::vector<int32_t> legacy = {big, big, big, 1, 1, big, 2};
  legacy.resize(64, 0);
  expect_error<sq::InputError>([&] { sq::load_llama2c_checkpoint(buffer(legacy, "huge.bin")); },
                               {"huge.bin", "truncated llama2.c checkpoint", "more than 2^64"});
  std::vector<int32_t> v1 = {0x616b3432, 1, big, big, big, 1, 1, big, 2};
  v1.resize(64, 0);
  expect_error<sq::InputError>([&] { sq::load_llama2c_checkpoint(buffer(v1, "huge-v1.bin")); },
                               {"huge-v1.bin", "truncated llama2.c checkpoint", "more than 2^64"});
}

// ---- calibration file ------------------------------------------------------------------------------

sq::ChannelStats stats(int channels, int64_t tokens) {
  sq::ChannelStats s(channels);
  s.tokens = tokens;
  s.token_absmax_hist[0] = tokens;
  return s;
}

// Two huge histogram counts: the running sum was signed overflow (UB) before it was compared.
TEST(FuzzFindings, CalibrationHistogramSumOverflowIsInputError) {
  sq::ChannelStats s = stats(4, INT64_MAX);
  s.token_absmax_hist[0] = INT64_MAX;
  s.token_absmax_hist[1] = INT64_MAX;
  expect_error<sq::InputError>(
      [&] { sq::check_calibration_channel_stats(s, 7, "/layer_000/attn_input", "calib.h5"); },
      {"calib.h5: /layer_000/attn_input/token_absmax_hist", "sums to more than"});
  s.token_absmax_hist[1] = 0;
  EXPECT_NO_THROW(sq::check_calibration_channel_stats(s, 7, "/layer_000/attn_input", "calib.h5"));
}

TEST(CalibrationValidation, LayerNamesAndWidthsAreChecked) {
  EXPECT_EQ(sq::calibration_layer_count({"layer_001", "notes", "layer_000"}, "c.h5"), 2u);
  expect_error<sq::InputError>([] { sq::calibration_layer_count({"layer_01"}, "c.h5"); }, {"c.h5: /layer_01", "not a valid"});
  expect_error<sq::InputError>([] { sq::calibration_layer_count({"layer_001"}, "c.h5"); }, {"/layer_000 is missing"});
  expect_error<sq::InputError>([] { sq::calibration_layer_count({}, "c.h5"); }, {"no layer groups"});

  std::vector<sq::LayerStats> layers(1);
  expect_error<sq::InputError>([&] { sq::check_calibration_layer(layers, 0, "c.h5"); }, {"c.h5: /layer_000/", "input sites"});
  sq::LayerStats& l = layers[0];
  l.inputs = {stats(8, 5), stats(8, 5), stats(8, 5), stats(16, 5)};
  l.keys = stats(4, 5);
  l.values = stats(4, 5);
  l.output_absmax = {std::vector<float>(8), std::vector<float>(4), std::vector<float>(4), std::vector<float>(8),
                     std::vector<float>(16), std::vector<float>(16), std::vector<float>(8)};
  EXPECT_NO_THROW(sq::check_calibration_layer(layers, 0, "c.h5"));
  l.output_absmax[1].resize(5);
  expect_error<sq::InputError>([&] { sq::check_calibration_layer(layers, 0, "c.h5"); },
                               {"c.h5: /layer_000/outputs/k_proj has length 5, expected 4"});
}

/// A valid one-layer calibration file.
sq::CalibrationData small_calibration() {
  sq::CalibrationData d;
  d.provenance.model_fingerprint = "f";
  d.provenance.text_path = "t.txt";
  d.provenance.text_sha256 = "s";
  d.provenance.samples = 1;
  d.provenance.seq_len = 5;
  d.provenance.sqkit_version = "test";
  d.provenance.created = "now";
  sq::LayerStats l;
  l.inputs = {stats(8, 5), stats(8, 5), stats(8, 5), stats(16, 5)};
  for (auto& s : l.inputs) s.tensor_absmax = 1.0f;
  l.keys = stats(4, 5);
  l.values = stats(4, 5);
  l.output_absmax = {std::vector<float>(8), std::vector<float>(4), std::vector<float>(4), std::vector<float>(8),
                     std::vector<float>(16), std::vector<float>(16), std::vector<float>(8)};
  d.layers.push_back(l);
  return d;
}

// A dataset declaring 2^40 floats (chunked, nothing stored, so the file stays small) made the reader
// allocate 4 TiB (std::bad_alloc / a sanitizer abort) before HDF5 could fail the read.
TEST(FuzzFindings, CalibrationDatasetLargerThanTheFileIsInputError) {
  ScratchDir dir;
  const std::string path = (dir.path / "calib.h5").string();
  sq::write_calibration_h5(path, small_calibration());
  ASSERT_NO_THROW(sq::read_calibration_h5(path));
  {
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    ASSERT_GE(H5Ldelete(f, "/layer_000/attn_input/min", H5P_DEFAULT), 0);
    const hsize_t dims[1] = {hsize_t(1) << 40};
    const hsize_t chunk[1] = {1024};
    const hid_t space = H5Screate_simple(1, dims, nullptr);
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, chunk);
    const hid_t ds = H5Dcreate2(f, "/layer_000/attn_input/min", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ASSERT_GE(ds, 0);
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Fclose(f);
  }
  expect_error<sq::InputError>([&] { sq::read_calibration_h5(path); },
                               {path + ": /layer_000/attn_input/min declares 1099511627776 elements", "more than the whole file"});
}

// ---- JSON readers ------------------------------------------------------------------------------------

// nlohmann::json reports a number outside double's range (1e400) as json::out_of_range, not
// json::parse_error; the readers caught only parse_error, so such a file escaped as an untyped
// exception (tools: exit status 1 with a bare library message instead of 2 naming the file).
// Fuzz reproducers: tests/fuzz/regressions/{hf_config,safetensors_index}/number-overflow-*.
TEST(FuzzFindings, JsonNumberOutOfRangeIsInputError) {
  expect_error<sq::InputError>([] { sq::parse_hf_config_text(R"({"hidden_size": 1e400})", "dir/config.json"); },
                               {"dir/config.json: not valid JSON", "number overflow"});
  expect_error<sq::InputError>([] { sq::parse_safetensors_index(R"({"weight_map": {}, "n": -1E999})", "idx.json"); },
                               {"idx.json: not valid JSON"});
  const std::string header = R"({"t":{"dtype":"F32","shape":[1e400],"data_offsets":[0,4]}})";
  std::string file(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(file.data(), &n, 8);
  file += header + "abcd";
  expect_error<sq::InputError>(
      [&] { sq::SafetensorsFile(sq::MappedFile::from_bytes(reinterpret_cast<const uint8_t*>(file.data()), file.size(), "w.safetensors")); },
      {"w.safetensors: safetensors header is not valid JSON"});

  ScratchDir dir;
  const std::string jsonl = (dir.path / "docs.jsonl").string();
  {
    std::FILE* f = std::fopen(jsonl.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fputs("{\"text\": \"ok\"}\n{\"text\": \"x\", \"score\": 1e400}\n", f);
    std::fclose(f);
  }
  auto docs = sq::TextDocuments::open(jsonl);
  std::string doc;
  ASSERT_TRUE(docs->next(doc));
  EXPECT_EQ(doc, "ok");
  expect_error<sq::InputError>([&] { docs->next(doc); }, {jsonl + ":2: not valid JSON"});
}

// rope_theta 1e39 (beyond float's range) became inf, passed ModelConfig::validate ("positive") and was
// written back by make_hf_config_json as null. Fuzz reproducer: tests/fuzz/regressions/hf_config/rope-theta-inf.
TEST(FuzzFindings, HfConfigFloatOutOfRangeIsInputError) {
  const std::string base = R"({"model_type":"llama","hidden_size":64,"intermediate_size":128,"num_hidden_layers":1,)"
                           R"("num_attention_heads":4,)";
  expect_error<sq::InputError>([&] { sq::parse_hf_config_text(base + R"("rope_theta":1e39})", "c/config.json"); },
                               {"c/config.json: key 'rope_theta' = ", "out of range for a 32-bit float"});
  expect_error<sq::InputError>([&] { sq::parse_hf_config_text(base + R"("rms_norm_eps":-1e300})", "c/config.json"); },
                               {"key 'rms_norm_eps'", "out of range"});
  EXPECT_EQ(sq::parse_hf_config_text(base + R"("rope_theta":1e30})", "c/config.json").rope_theta, 1e30f);
}

// A value nested 200,000 levels deep (~400 KB): nlohmann parses it iteratively, but dump() in an
// error message (config.json, index, safetensors "shape") and copying it (.sqm "format" object)
// recurse once per level and overflowed the stack (AddressSanitizer: stack-overflow). Readers now
// refuse nesting deeper than kMaxJsonDepth before parsing. (Found with hand-made inputs beyond the
// fuzzers' -max_len; reproduced here instead of as 400 KB files in tests/fuzz/regressions.)
TEST(FuzzFindings, DeeplyNestedJsonIsInputErrorNotStackOverflow) {
  const size_t depth = 200000;
  const std::string deep = std::string(depth, '[') + std::string(depth, ']');
  expect_error<sq::InputError>(
      [&] { sq::parse_hf_config_text(R"({"model_type":"llama","hidden_size":)" + deep + "}", "d/config.json"); },
      {"d/config.json nests arrays/objects deeper than 64 levels"});
  expect_error<sq::InputError>([&] { sq::parse_safetensors_index(R"({"weight_map":{"a":)" + deep + "}}", "d/i.json"); },
                               {"d/i.json nests arrays/objects deeper than 64 levels"});
  const std::string header = R"({"t":{"dtype":"F32","shape":)" + deep + R"(,"data_offsets":[0,4]}})";
  std::string st(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(st.data(), &n, 8);
  st += header + "abcd";
  expect_error<sq::InputError>(
      [&] { sq::SafetensorsFile(sq::MappedFile::from_bytes(reinterpret_cast<const uint8_t*>(st.data()), st.size(), "d.safetensors")); },
      {"d.safetensors: safetensors header nests arrays/objects deeper than 64 levels"});

  // .sqm: a well-formed preamble (checksums included) around a deep "format" object.
  const std::string h = R"({"format":{"name":)" + deep + "}}", t = "[]";
  std::string sqm(sq::kSqmPreambleSize, '\0');
  auto put = [&](size_t off, uint64_t v, size_t bytes) { std::memcpy(sqm.data() + off, &v, bytes); };
  std::memcpy(sqm.data(), "SQKITMDL", 8);
  put(8, 1, 4);
  put(16, 128, 8);
  put(24, 0, 8);
  put(32, 128, 8);
  put(40, h.size(), 8);
  put(48, 128 + h.size(), 8);
  put(56, t.size(), 8);
  put(64, XXH3_64bits(h.data(), h.size()), 8);
  put(72, XXH3_64bits(t.data(), t.size()), 8);
  put(120, XXH3_64bits(sqm.data(), 120), 8);
  sqm += h + t;
  expect_error<sq::InputError>(
      [&] { sq::SqmFile::open(sq::MappedFile::from_bytes(reinterpret_cast<const uint8_t*>(sqm.data()), sqm.size(), "d.sqm")); },
      {"d.sqm: the JSON header nests arrays/objects deeper than 64 levels"});

  // The limit itself: 64 levels parse, strings and escapes do not count.
  EXPECT_EQ(sq::json_nesting_depth(std::string(64, '[') + std::string(64, ']')), 64u);
  EXPECT_EQ(sq::json_nesting_depth(R"({"a":"[[[\"[[","b":[{}]})"), 3u);
  EXPECT_NO_THROW(sq::check_json_depth(std::string(64, '[') + std::string(64, ']'), "x"));
}

TEST(JsonExcerpt, IsShortAndShallow) {
  EXPECT_EQ(sq::json_excerpt(nlohmann::json::parse(R"([1,"a",{"k":null}])")), R"([1,"a",{"k":null}])");
  EXPECT_EQ(sq::json_excerpt(nlohmann::json::parse("[[[[[[1]]]]]]")), "[[[[[...]]]]]");
  const std::string e = sq::json_excerpt(nlohmann::json(std::string(1000, 'x')), 50);
  EXPECT_EQ(e.size(), 53u);
  EXPECT_EQ(e.substr(50), "...");
}

// ---- sq-convert option spec --------------------------------------------------------------------------

/// sq-convert's option texts (defaults as in the tool).
sq::ConvertFlags flags(std::string scheme, std::string alpha = "0.5", bool alpha_given = false, bool no_smooth = false,
                       std::string preset = "", std::string weight = "", std::string act = "") {
  return {scheme, alpha, alpha_given, no_smooth, preset, weight, act};
}

TEST(ConvertSpec, ParsesTheToolsOptions) {
  sq::ConvertFlags f;
  sq::ConvertSpec s = sq::parse_convert_flags(f);
  EXPECT_EQ(s.scheme, sq::ConvertScheme::W8A8);
  EXPECT_EQ(s.alpha, 0.5f);
  EXPECT_TRUE(s.smooth);
  EXPECT_EQ(s.weight, sq::WeightGranularity::PerChannel);
  EXPECT_EQ(s.act, sq::ActQuant::PerToken);
  f.preset = "O3";
  f.alpha = "auto";
  s = sq::parse_convert_flags(f);
  EXPECT_TRUE(s.alpha_auto);
  EXPECT_EQ(s.preset, "O3");
  EXPECT_EQ(s.weight, sq::WeightGranularity::PerTensor);
  EXPECT_EQ(s.act, sq::ActQuant::PerTensorStatic);
  f.act = "per-token";
  f.weight = "per-channel";
  s = sq::parse_convert_flags(f);
  EXPECT_EQ(s.act, sq::ActQuant::PerToken);
  EXPECT_EQ(s.weight, sq::WeightGranularity::PerChannel);
  EXPECT_EQ(sq::scheme_name(sq::parse_convert_flags(flags("bf16")).scheme), std::string("bf16"));
}

TEST(ConvertSpec, RejectsBadValuesWithUsageErrorNamingTheOption) {
  expect_error<sq::UsageError>([] { sq::parse_convert_flags(flags("int8")); }, {"--scheme", "'int8'"});
  expect_error<sq::UsageError>([] { sq::parse_convert_flags(flags("w8a8", "1.5")); }, {"--alpha must be in [0, 1], got 1.5"});
  expect_error<sq::UsageError>([] { sq::parse_convert_flags(flags("w8a8", "0.5x")); }, {"--alpha", "'0.5x'"});
  expect_error<sq::UsageError>([] { sq::parse_convert_flags(flags("w8a8", "1e99")); }, {"--alpha", "1e99"});
  expect_error<sq::UsageError>([] { sq::parse_convert_flags(flags("w8a8", "nan")); }, {"--alpha must be in [0, 1]"});
  expect_error<sq::UsageError>([] { sq::parse_convert_flags(flags("w8a8", "0.5", true, true)); }, {"--no-smooth"});
  expect_error<sq::UsageError>([] { sq::parse_convert_flags(flags("w8a8", "0.5", false, false, "O4")); }, {"--preset"});
  expect_error<sq::UsageError>([] { sq::parse_convert_flags(flags("w8a8", "0.5", false, false, "", "row")); }, {"--weight"});
  expect_error<sq::UsageError>([] { sq::parse_convert_flags(flags("w8a8", "0.5", false, false, "", "", "x")); }, {"--act"});
}

// An empty --alpha used to be accepted as the default 0.5 (std::stof threw, and 0 characters used
// equalled the length of the empty text).
TEST(ConvertSpec, EmptyAlphaIsRejected) {
  expect_error<sq::UsageError>([] { sq::parse_convert_flags(flags("w8a8", "")); },
                               {"--alpha must be a number in [0, 1] or 'auto', got ''"});
}

}  // namespace
