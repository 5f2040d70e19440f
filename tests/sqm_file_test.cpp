// Tests for formats/sqm_file.h (the packed model file .sqm) and tools/sq_inspect.cpp.
#include "formats/sqm_file.h"

#include <gtest/gtest.h>

#include "tests/support/expect_error.h"
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "core/error.h"
#include "support/process.h"
#include "support/test_data.h"

namespace {

using sq::SqmDType;
using sq::SqmFile;
using sq::SqmWriteOptions;
using sq::SqmWriter;
using sq::test::ScratchDir;
using sq::test::expect_error;
namespace fs = std::filesystem;


uint64_t rd64(const std::string& b, size_t off) {
  uint64_t v;
  std::memcpy(&v, b.data() + off, 8);
  return v;
}
uint32_t rd32(const std::string& b, size_t off) {
  uint32_t v;
  std::memcpy(&v, b.data() + off, 4);
  return v;
}

/// Deterministic pseudo-random bytes (xorshift64*), incompressible for zstd.
std::vector<uint8_t> noise(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : v) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    b = static_cast<uint8_t>((x * 0x2545F4914F6CDD1Dull) >> 56);
  }
  return v;
}

struct SampleTensor {
  std::string name;
  SqmDType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

/// Every dtype, with odd 4-bit lengths, a scalar, an empty tensor, one compressible and one
/// incompressible large tensor.
std::vector<SampleTensor> sample_tensors() {
  std::vector<SampleTensor> t;
  auto add = [&](std::string name, SqmDType dt, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
    t.push_back({std::move(name), dt, std::move(shape), std::move(bytes)});
  };
  std::vector<uint8_t> f32(4 * 6);
  const float fv[6] = {1.0f, -2.5f, 3.25f, 0.0f, 1e-7f, 65504.0f};
  std::memcpy(f32.data(), fv, sizeof fv);
  add("model.embed_tokens.weight", SqmDType::F32, {2, 3}, f32);
  add("model.layers.0.self_attn.q_proj.weight", SqmDType::F16, {3, 5}, noise(30, 1));
  add("model.layers.0.self_attn.k_proj.weight", SqmDType::BF16, {7}, noise(14, 2));
  add("model.layers.0.self_attn.v_proj.weight", SqmDType::I8, {4, 33}, noise(132, 3));
  add("model.layers.0.self_attn.v_proj.zero_point", SqmDType::U8, {5}, {0, 1, 127, 128, 255});
  add("model.layers.0.mlp.gate_proj.weight", SqmDType::I32, {2, 2}, noise(16, 4));
  // I4x2 [3, 5]: 15 elements -> 8 bytes, last high nibble zero. Values -8..7, low nibble first.
  std::vector<uint8_t> i4(8);
  for (int i = 0; i < 15; ++i) {
    const int v = (i % 16) - 8;
    i4[i / 2] |= static_cast<uint8_t>((v & 0xF) << (4 * (i % 2)));
  }
  add("model.layers.0.mlp.up_proj.weight", SqmDType::I4x2, {3, 5}, i4);
  add("model.layers.0.mlp.down_proj.weight", SqmDType::U4x2, {7}, {0x10, 0x32, 0x54, 0x06});
  std::vector<uint8_t> scalar(4);
  const float s = 0.125f;
  std::memcpy(scalar.data(), &s, 4);
  add("model.scale", SqmDType::F32, {}, scalar);
  add("model.empty", SqmDType::F16, {0, 4}, {});
  add("model.layers.1.compressible.weight", SqmDType::I8, {64, 100}, std::vector<uint8_t>(6400, 7));
  add("model.layers.1.random.weight", SqmDType::U8, {50, 100}, noise(5000, 9));
  return t;
}

nlohmann::json sample_header() {
  return {{"producer", "sqkit-test 1.0"},
          {"model_config", {{"architecture", "llama"}, {"dim", 8}, {"n_layers", 2}}},
          {"quantization", {{"method", "w8a8"}, {"alpha", 0.5}}}};
}

void write_sample(const std::string& path, bool compress, bool force = false) {
  SqmWriter w(path, SqmWriteOptions{compress, force});
  for (const auto& t : sample_tensors()) w.add_tensor(t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
  w.finish(sample_header());
}

std::vector<std::string> dir_entries(const std::string& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  return v;
}

/// Re-serializes `bytes` (a valid .sqm) with its header / table changed by `edit`, recomputing all
/// checksums, so that structural validation (not the checksums) is what a test exercises.
std::string rewrite(const std::string& bytes, const std::function<void(nlohmann::json& header, nlohmann::json& table)>& edit) {
  const uint64_t ho = rd64(bytes, 32), hs = rd64(bytes, 40), to = rd64(bytes, 48), ts = rd64(bytes, 56);
  auto header = nlohmann::json::parse(bytes.substr(ho, hs));
  auto table = nlohmann::json::parse(bytes.substr(to, ts));
  edit(header, table);
  const std::string h = header.dump(), t = table.dump();
  std::string out = bytes.substr(0, ho) + h + t;
  auto put64 = [&](size_t off, uint64_t v) { std::memcpy(out.data() + off, &v, 8); };
  put64(40, h.size());
  put64(48, ho + h.size());
  put64(56, t.size());
  put64(64, XXH3_64bits(h.data(), h.size()));
  put64(72, XXH3_64bits(t.data(), t.size()));
  put64(120, XXH3_64bits(out.data(), 120));
  return out;
}

// ---- dtypes --------------------------------------------------------------------------------------

TEST(SqmDType, NamesBitsAndByteCounts) {
  for (SqmDType d : sq::kSqmDTypes) EXPECT_EQ(sq::sqm_dtype_from_name(sq::sqm_dtype_name(d)), d);
  EXPECT_STREQ(sq::sqm_dtype_name(SqmDType::I4x2), "I4x2");
  EXPECT_FALSE(sq::sqm_dtype_from_name("i8").has_value());
  EXPECT_FALSE(sq::sqm_dtype_from_name("F64").has_value());
  EXPECT_EQ(sq::sqm_byte_count(SqmDType::F32, {2, 3}), 24u);
  EXPECT_EQ(sq::sqm_byte_count(SqmDType::F16, {2, 3}), 12u);
  EXPECT_EQ(sq::sqm_byte_count(SqmDType::BF16, {2, 3}), 12u);
  EXPECT_EQ(sq::sqm_byte_count(SqmDType::I8, {2, 3}), 6u);
  EXPECT_EQ(sq::sqm_byte_count(SqmDType::U8, {2, 3}), 6u);
  EXPECT_EQ(sq::sqm_byte_count(SqmDType::I32, {2, 3}), 24u);
  EXPECT_EQ(sq::sqm_byte_count(SqmDType::I4x2, {2, 3}), 3u);
  EXPECT_EQ(sq::sqm_byte_count(SqmDType::I4x2, {3, 5}), 8u);  // 15 elements: ceil(15/2)
  EXPECT_EQ(sq::sqm_byte_count(SqmDType::U4x2, {1}), 1u);
  EXPECT_EQ(sq::sqm_byte_count(SqmDType::U4x2, {4096, 11008}), 22544384u);
  EXPECT_EQ(sq::sqm_byte_count(SqmDType::F32, {}), 4u);  // scalar
  EXPECT_EQ(sq::sqm_byte_count(SqmDType::F32, {0, 7}), 0u);
  EXPECT_EQ(sq::sqm_dtype_bits(SqmDType::BF16), 16);
  EXPECT_EQ(sq::sqm_dtype_bits(SqmDType::U4x2), 4);
  EXPECT_THROW(sq::sqm_byte_count(SqmDType::F32, {2, -1}), std::invalid_argument);
  EXPECT_THROW(sq::sqm_byte_count(SqmDType::F32, {int64_t{1} << 40, int64_t{1} << 40}), std::invalid_argument);
}

// ---- round trips ---------------------------------------------------------------------------------

class SqmRoundTrip : public ::testing::TestWithParam<bool> {};

TEST_P(SqmRoundTrip, EveryDtypeRoundTrips) {
  const bool compress = GetParam();
  ScratchDir dir;
  const std::string path = dir.file("m.sqm");
  write_sample(path, compress);
  EXPECT_EQ(dir_entries(dir.path()), std::vector<std::string>{"m.sqm"});  // no temporary left

  const auto f = SqmFile::open(path);
  const auto expected = sample_tensors();
  nlohmann::json want_header = sample_header();
  want_header["format"] = {{"name", "sqkit.sqm"}, {"version", 1}, {"alignment", 64}, {"tensor_count", 12}};
  EXPECT_EQ(f->header(), want_header);
  EXPECT_EQ(f->file_size(), fs::file_size(path));
  EXPECT_EQ(f->flags(), compress ? 1u : 0u);
  ASSERT_EQ(f->tensors().size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto& e = expected[i];
    SCOPED_TRACE(e.name);
    EXPECT_EQ(f->names()[i], e.name);
    ASSERT_TRUE(f->has(e.name));
    const auto& info = f->info(e.name);
    EXPECT_EQ(info.dtype, e.dtype);
    EXPECT_EQ(info.shape, e.shape);
    EXPECT_EQ(info.raw_bytes, e.bytes.size());
    EXPECT_EQ(info.xxh3, XXH3_64bits(e.bytes.data(), e.bytes.size()));
    EXPECT_EQ(info.offset % 64, 0u);
    const sq::SqmBytes raw = f->raw(e.name);
    ASSERT_EQ(raw.size, e.bytes.size());
    if (!e.bytes.empty()) EXPECT_EQ(std::memcmp(raw.data, e.bytes.data(), raw.size), 0);
    else EXPECT_EQ(raw.data, nullptr);
    if (!info.compressed) {
      EXPECT_EQ(info.stored_bytes, info.raw_bytes);
      if (raw.size) {  // zero-copy, 64-byte aligned in memory
        EXPECT_EQ(raw.data, f->mapping()->data() + info.offset);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(raw.data) % 64, 0u);
      }
    }
  }
  const auto& comp = f->info("model.layers.1.compressible.weight");
  const auto& rnd = f->info("model.layers.1.random.weight");
  EXPECT_EQ(comp.compressed, compress);
  if (compress) {
    EXPECT_LT(comp.stored_bytes, 100u);  // 6400 identical bytes
    EXPECT_STREQ(comp.compression(), "zstd");
  }
  EXPECT_FALSE(rnd.compressed);  // zstd output would not be smaller: kept raw
  EXPECT_EQ(rnd.stored_bytes, 5000u);
  // Small tensors never shrink under zstd.
  EXPECT_FALSE(f->info("model.layers.0.mlp.up_proj.weight").compressed);
  // raw() of a compressed tensor is cached: same pointer twice.
  EXPECT_EQ(f->raw("model.layers.1.compressible.weight").data, f->raw("model.layers.1.compressible.weight").data);
  expect_error<sq::InputError>([&] { f->info("nope"); }, {path, "no tensor 'nope'"});
  expect_error<sq::InputError>([&] { f->raw("nope"); }, {"no tensor 'nope'"});
}

TEST_P(SqmRoundTrip, TwoWritesAreByteIdentical) {
  ScratchDir dir;
  write_sample(dir.file("a.sqm"), GetParam());
  write_sample(dir.file("b.sqm"), GetParam());
  const std::string a = sq::test::read_file(dir.file("a.sqm")), b = sq::test::read_file(dir.file("b.sqm"));
  EXPECT_GT(a.size(), 1000u);
  EXPECT_EQ(a, b);
}

INSTANTIATE_TEST_SUITE_P(Compression, SqmRoundTrip, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "zstd" : "none"; });

TEST(SqmLayout, ExactBytes) {
  ScratchDir dir;
  const std::string path = dir.file("m.sqm");
  const auto a = noise(100, 1);
  const std::vector<uint8_t> b = {0x21, 0x43, 0x05};  // I4x2 [5]: 1 2 3 4 5
  {
    SqmWriter w(path);
    w.add_tensor("a", SqmDType::U8, {100}, a.data(), a.size());
    w.add_tensor("b", SqmDType::I4x2, {5}, b.data(), b.size());
    w.finish({{"producer", "x"}});
  }
  const std::string f = sq::test::read_file(path);
  EXPECT_EQ(f.substr(0, 8), "SQKITMDL");
  EXPECT_EQ(rd32(f, 8), 1u);   // version
  EXPECT_EQ(rd32(f, 12), 0u);  // flags
  EXPECT_EQ(rd64(f, 16), 128u);                  // data_offset
  EXPECT_EQ(rd64(f, 24), 131u);                  // data_size: a at [128, 228), b at [256, 259)
  EXPECT_EQ(rd64(f, 32), 259u);                  // header_offset
  const uint64_t hs = rd64(f, 40), to = rd64(f, 48), ts = rd64(f, 56);
  EXPECT_EQ(to, 259u + hs);
  EXPECT_EQ(to + ts, f.size());
  EXPECT_EQ(f.substr(259, hs), R"({"format":{"alignment":64,"name":"sqkit.sqm","tensor_count":2,"version":1},"producer":"x"})");
  const auto table = nlohmann::json::parse(f.substr(to, ts));
  ASSERT_EQ(table.size(), 2u);
  EXPECT_EQ(table[0]["offset"], 128);
  EXPECT_EQ(table[1]["offset"], 256);
  EXPECT_EQ(table[1]["dtype"], "I4x2");
  EXPECT_EQ(table[1]["shape"], nlohmann::json::array({5}));
  EXPECT_EQ(table[1]["stored_bytes"], 3);
  EXPECT_EQ(table[1]["raw_bytes"], 3);
  EXPECT_EQ(table[1]["compression"], "none");
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits(b.data(), 3)));
  EXPECT_EQ(table[1]["xxh3"], hex);
  EXPECT_EQ(rd64(f, 64), XXH3_64bits(f.data() + 259, hs));
  EXPECT_EQ(rd64(f, 72), XXH3_64bits(f.data() + to, ts));
  EXPECT_EQ(rd64(f, 120), XXH3_64bits(f.data(), 120));
  for (size_t i = 80; i < 120; ++i) EXPECT_EQ(f[i], '\0');   // reserved
  for (size_t i = 228; i < 256; ++i) EXPECT_EQ(f[i], '\0');  // padding
  EXPECT_EQ(f.substr(128, 100), std::string(a.begin(), a.end()));
}

// ---- corruption ----------------------------------------------------------------------------------

TEST_P(SqmRoundTrip, FlippedBitInAnyTensorNamesThatTensor) {
  ScratchDir dir;
  const std::string path = dir.file("m.sqm"), bad = dir.file("bad.sqm");
  write_sample(path, GetParam());
  const std::string good = sq::test::read_file(path);
  const auto f = SqmFile::open(path);
  int checked = 0;
  for (const auto& t : f->tensors()) {
    if (t.stored_bytes == 0) continue;
    for (uint64_t pos : {t.offset, t.offset + t.stored_bytes / 2, t.offset + t.stored_bytes - 1}) {
      for (int bit : {0, 7}) {
        std::string b = good;
        b[pos] = static_cast<char>(b[pos] ^ (1 << bit));
        sq::test::write_file(bad, b);
        SCOPED_TRACE(t.name + " byte " + std::to_string(pos));
        const std::string msg =
            expect_error<sq::InputError>([&] { SqmFile::open(bad); }, {bad + ": ", "tensor '" + t.name + "'", "file corrupt"});
        if (!t.compressed) {
          EXPECT_EQ(msg, bad + ": checksum mismatch in tensor '" + t.name + "' (file corrupt)");
        }
        ++checked;
      }
    }
    if (!t.compressed) {  // the structure is intact: without verification the file opens
      std::string b = good;
      b[t.offset] = static_cast<char>(b[t.offset] ^ 1);
      sq::test::write_file(bad, b);
      EXPECT_NO_THROW(SqmFile::open(bad, /*verify_checksums=*/false));
    }
  }
  EXPECT_EQ(checked, 11 * 3 * 2);
}

TEST(SqmCorruption, EverySingleBitFlipAnywhereIsAnInputError) {
  ScratchDir dir;
  const std::string path = dir.file("m.sqm"), bad = dir.file("bad.sqm");
  {
    SqmWriter w(path, SqmWriteOptions{.compress = true});
    const auto a = noise(70, 3);
    const std::vector<uint8_t> z(300, 1);
    w.add_tensor("a.weight", SqmDType::U8, {70}, a.data(), a.size());
    w.add_tensor("z.weight", SqmDType::I8, {300}, z.data(), z.size());
    w.finish({{"producer", "p"}});
  }
  const std::string good = sq::test::read_file(path);
  ASSERT_NO_THROW(SqmFile::open(path));
  sq::test::write_file(bad, good);
  // Flip in place (no truncate-and-rewrite of the whole file per case).
  std::fstream io(bad, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(io.good());
  auto poke = [&](size_t pos, char c) {
    io.seekp(static_cast<std::streamoff>(pos));
    io.put(c);
    io.flush();
  };
  int detected = 0;
  for (size_t pos = 0; pos < good.size(); ++pos) {
    for (int bit = 0; bit < 8; ++bit) {
      poke(pos, static_cast<char>(good[pos] ^ (1 << bit)));
      try {
        SqmFile::open(bad);
        ADD_FAILURE() << "flip of bit " << bit << " of byte " << pos << " went unnoticed";
      } catch (const sq::InputError& e) {
        EXPECT_EQ(std::string(e.what()).rfind(bad + ": ", 0), 0u) << e.what();
        ++detected;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "byte " << pos << " bit " << bit << ": wrong exception type: " << e.what();
      }
    }
    poke(pos, good[pos]);
  }
  EXPECT_EQ(detected, static_cast<int>(8 * good.size()));
  EXPECT_NO_THROW(SqmFile::open(bad));  // restored
}

TEST(SqmCorruption, HeaderTablePreambleAndPaddingFlips) {
  ScratchDir dir;
  const std::string path = dir.file("m.sqm"), bad = dir.file("bad.sqm");
  write_sample(path, false);
  const std::string good = sq::test::read_file(path);
  const uint64_t ho = rd64(good, 32), hs = rd64(good, 40), to = rd64(good, 48);
  auto flipped = [&](uint64_t pos) {
    std::string b = good;
    b[pos] = static_cast<char>(b[pos] ^ 0x04);
    sq::test::write_file(bad, b);
    return bad;
  };
  for (uint64_t pos : {ho, ho + hs / 2, ho + hs - 1})
    EXPECT_EQ(expect_error<sq::InputError>([&] { SqmFile::open(flipped(pos)); }, {}),
              bad + ": checksum mismatch in the JSON header (file corrupt)");
  EXPECT_EQ(expect_error<sq::InputError>([&] { SqmFile::open(flipped(to + 5)); }, {}),
            bad + ": checksum mismatch in the tensor table (file corrupt)");
  EXPECT_EQ(expect_error<sq::InputError>([&] { SqmFile::open(flipped(40)); }, {}),
            bad + ": corrupt .sqm preamble (checksum mismatch)");
  // The first tensor (24 bytes at 128) is followed by 40 bytes of zero padding.
  expect_error<sq::InputError>([&] { SqmFile::open(flipped(128 + 30)); }, {"nonzero padding byte at offset 158"});
}

TEST(SqmCorruption, TruncatedFiles) {
  ScratchDir dir;
  const std::string path = dir.file("m.sqm"), bad = dir.file("bad.sqm");
  write_sample(path, true);
  const std::string good = sq::test::read_file(path);
  const uint64_t ho = rd64(good, 32), to = rd64(good, 48);
  for (uint64_t cut : {uint64_t{4}, uint64_t{8}, uint64_t{13}, uint64_t{64}, uint64_t{127}, uint64_t{128},
                       uint64_t{200}, ho - 1, ho, ho + 10, to, to + 1, good.size() - 1}) {
    sq::test::write_file(bad, good.substr(0, cut));
    SCOPED_TRACE(cut);
    expect_error<sq::InputError>([&] { SqmFile::open(bad); }, {bad + ": truncated .sqm file (" + std::to_string(cut) + " bytes"});
  }
  sq::test::write_file(bad, "");
  EXPECT_EQ(expect_error<sq::InputError>([&] { SqmFile::open(bad); }, {}), bad + ": not an sqkit .sqm file");
  sq::test::write_file(bad, good + "x");
  expect_error<sq::InputError>([&] { SqmFile::open(bad); }, {"1 unexpected bytes after the tensor table"});
}

TEST(SqmCorruption, UnknownVersionIsUnsupported) {
  ScratchDir dir;
  const std::string path = dir.file("m.sqm");
  write_sample(path, false);
  std::string b = sq::test::read_file(path);
  const uint32_t v = 7;
  std::memcpy(b.data() + 8, &v, 4);
  sq::test::write_file(path, b);
  EXPECT_EQ(expect_error<sq::UnsupportedError>([&] { SqmFile::open(path); }, {}),
            path + ": .sqm format version 7 is not supported (this sqkit reads version 1)");
}

TEST(SqmCorruption, NotAnSqmFile) {
  ScratchDir dir;
  const std::string path = dir.file("x.sqm");
  sq::test::write_file(path, std::string(300, 'a'));
  EXPECT_EQ(expect_error<sq::InputError>([&] { SqmFile::open(path); }, {}), path + ": not an sqkit .sqm file");
  sq::test::write_file(path, "SQKIT");
  expect_error<sq::InputError>([&] { SqmFile::open(path); }, {"truncated"});
  expect_error<sq::InputError>([&] { SqmFile::open(dir.file("missing.sqm")); }, {"cannot open", "missing.sqm"});
  if (fs::exists(sq::test::stories_model())) {
    EXPECT_EQ(expect_error<sq::InputError>([&] { SqmFile::open(sq::test::stories_model()); }, {}),
              sq::test::stories_model() + ": not an sqkit .sqm file");
  }
}

TEST(SqmCorruption, StructuralErrorsWithValidChecksums) {
  ScratchDir dir;
  const std::string path = dir.file("m.sqm"), bad = dir.file("bad.sqm");
  write_sample(path, true);
  const std::string good = sq::test::read_file(path);
  sq::test::write_file(bad, rewrite(good, [](auto&, auto&) {}));
  ASSERT_NO_THROW(SqmFile::open(bad));  // the rewrite helper itself is faithful

  auto check = [&](const std::function<void(nlohmann::json&, nlohmann::json&)>& edit, const std::string& part) {
    sq::test::write_file(bad, rewrite(good, edit));
    SCOPED_TRACE(part);
    return expect_error<sq::InputError>([&] { SqmFile::open(bad); }, {bad + ": ", part});
  };
  check([](auto&, auto& t) { t[1]["offset"] = 200; }, "offset 200 is not a multiple of 64");
  check([](auto&, auto& t) { t[2]["offset"] = 128; }, "overlaps the previous tensor");
  check([](auto&, auto& t) { t[1]["raw_bytes"] = 31; }, "raw_bytes is 31 but F16 [3, 5] needs 30");
  check([](auto&, auto& t) { t[6]["shape"] = {3, 6}; }, "I4x2 [3, 6] needs 9");
  check([](auto&, auto& t) { t[0]["shape"] = {int64_t{1} << 40, int64_t{1} << 40}; }, "more than 2^60 elements");
  check([](auto&, auto& t) { t[0]["shape"] = {-2, 3}; }, "non-negative integers");
  check([](auto&, auto& t) { t[0]["shape"] = nlohmann::json::array({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}); },
        "rank 17");
  check([](auto&, auto& t) { t[3]["name"] = t[2]["name"]; }, "duplicate tensor");
  check([](auto&, auto& t) { t[0].erase("xxh3"); }, "lacks \"xxh3\"");
  check([](auto&, auto& t) { t[0]["xxh3"] = "XYZ"; }, "16 lowercase hexadecimal digits");
  check([](auto&, auto& t) { t[0]["stored_bytes"] = 20; }, "stored_bytes 20 != raw_bytes 24");
  check([](auto&, auto& t) { t.erase(t.size() - 1); }, "tensor_count disagrees");
  check([](auto& h, auto& t) { t.erase(t.size() - 1); h["format"]["tensor_count"] = t.size(); },
        "unaccounted bytes at the end of the data region");
  check([](auto&, auto& t) { t[10]["raw_bytes"] = 6401; t[10]["shape"] = {6401}; }, "does not declare raw_bytes");
  check([](auto& h, auto&) { h.erase("format"); }, "lacks the \"format\" object");
  check([](auto&, auto& t) { t[10].erase("stored_xxh3"); }, "lacks \"stored_xxh3\"");
  // The zstd frame is intact (stored_xxh3 matches) but the raw checksum differs: found by decompressing.
  EXPECT_EQ(check([](auto&, auto& t) { t[10]["xxh3"] = "0123456789abcdef"; }, "checksum mismatch"),
            bad + ": checksum mismatch in tensor 'model.layers.1.compressible.weight' (file corrupt)");
  sq::test::write_file(bad, rewrite(good, [](auto&, auto& t) { t[10]["xxh3"] = "0123456789abcdef"; }));
  EXPECT_NO_THROW(SqmFile::open(bad, /*verify_checksums=*/false)->raw("model.layers.1.compressible.weight"));
  check([](auto& h, auto&) { h = nlohmann::json::array(); }, "not a JSON object");
  check([](auto&, auto& t) { t = nlohmann::json::object(); }, "not a JSON array");
  check([](auto&, auto& t) { t[11]["stored_bytes"] = uint64_t{1} << 40; }, "outside the data region");

  sq::test::write_file(bad, rewrite(good, [](auto&, auto& t) { t[0]["dtype"] = "Q8_0"; }));
  expect_error<sq::UnsupportedError>([&] { SqmFile::open(bad); }, {"tensor 'model.embed_tokens.weight' has dtype 'Q8_0'"});
  sq::test::write_file(bad, rewrite(good, [](auto&, auto& t) { t[0]["compression"] = "lz4"; }));
  expect_error<sq::UnsupportedError>([&] { SqmFile::open(bad); }, {"compression 'lz4'"});
}

// ---- writer behaviour ----------------------------------------------------------------------------

TEST(SqmWriter, ExistingOutputRefusedWithoutForceReplacedWithForce) {
  ScratchDir dir;
  const std::string path = dir.file("m.sqm");
  sq::test::write_file(path, "old contents");
  expect_error<sq::UsageError>([&] { SqmWriter w(path); }, {path, "--force"});
  EXPECT_EQ(sq::test::read_file(path), "old contents");
  EXPECT_EQ(dir_entries(dir.path()), std::vector<std::string>{"m.sqm"});

  write_sample(path, false, /*force=*/true);
  EXPECT_EQ(SqmFile::open(path)->tensors().size(), 12u);
  EXPECT_EQ(dir_entries(dir.path()), std::vector<std::string>{"m.sqm"});

  // The output appears while the writer runs: finish() refuses it too, and cleans up.
  const std::string late = dir.file("late.sqm");
  {
    SqmWriter w(late);
    sq::test::write_file(late, "someone else's");
    expect_error<sq::UsageError>([&] { w.finish(nlohmann::json::object()); }, {late, "--force"});
  }
  EXPECT_EQ(sq::test::read_file(late), "someone else's");
  EXPECT_EQ(dir_entries(dir.path()).size(), 2u);
}

TEST(SqmWriter, NoOutputWithoutFinish) {
  ScratchDir dir;
  const std::string path = dir.file("m.sqm");
  try {
    SqmWriter w(path, SqmWriteOptions{.compress = true});
    const auto a = noise(1000, 5);
    w.add_tensor("a", SqmDType::U8, {1000}, a.data(), a.size());
    ASSERT_TRUE(fs::exists(w.temp_path()));
    EXPECT_EQ(w.temp_path().rfind(path + ".tmp-", 0), 0u);
    EXPECT_FALSE(fs::exists(path));
    throw std::runtime_error("conversion failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_TRUE(dir_entries(dir.path()).empty());
  { SqmWriter w(path); }
  EXPECT_TRUE(dir_entries(dir.path()).empty());
}

TEST(SqmWriter, ArgumentErrors) {
  ScratchDir dir;
  const std::string path = dir.file("m.sqm");
  SqmWriter w(path);
  const std::vector<uint8_t> buf(64, 0);
  expect_error<std::invalid_argument>([&] { w.add_tensor("x", SqmDType::F32, {2, 3}, buf.data(), 23); },
                                      {"tensor 'x'", "23 bytes given", "F32 [2, 3] needs 24"});
  expect_error<std::invalid_argument>([&] { w.add_tensor("x", SqmDType::I4x2, {3}, buf.data(), 1); }, {"needs 2"});
  const uint8_t odd[2] = {0x21, 0x53};
  expect_error<std::invalid_argument>([&] { w.add_tensor("x", SqmDType::I4x2, {3}, odd, 2); }, {"high nibble"});
  expect_error<std::invalid_argument>([&] { w.add_tensor("", SqmDType::U8, {1}, buf.data(), 1); }, {"empty tensor name"});
  expect_error<std::invalid_argument>([&] { w.add_tensor("x", SqmDType::U8, {-1}, buf.data(), 0); }, {"negative"});
  expect_error<std::invalid_argument>([&] { w.add_tensor("x", SqmDType::U8, {4}, nullptr, 4); }, {"null data"});
  expect_error<std::invalid_argument>([&] { w.add_tensor("\xff\xfe", SqmDType::U8, {1}, buf.data(), 1); }, {"UTF-8"});
  w.add_tensor("x", SqmDType::U8, {4}, buf.data(), 4);
  expect_error<std::invalid_argument>([&] { w.add_tensor("x", SqmDType::U8, {4}, buf.data(), 4); }, {"duplicate tensor 'x'"});
  expect_error<std::invalid_argument>([&] { w.finish(nlohmann::json::array()); }, {"must be a JSON object"});
  w.finish({{"producer", "ok"}});  // still usable after rejected arguments
  EXPECT_THROW(w.finish(nlohmann::json::object()), std::logic_error);
  EXPECT_THROW(w.add_tensor("y", SqmDType::U8, {1}, buf.data(), 1), std::logic_error);
  const auto f = SqmFile::open(path);
  EXPECT_EQ(f->names(), std::vector<std::string>{"x"});
  EXPECT_EQ(f->header()["producer"], "ok");
}

TEST(SqmWriter, UnwritableDestinationIsAnOutputError) {
  ScratchDir dir;
  const std::string path = dir.file("no/such/dir/m.sqm");
  expect_error<sq::OutputError>([&] { SqmWriter w(path); }, {path});
}

TEST(SqmWriter, CallerFormatKeyIsReplaced) {
  ScratchDir dir;
  const std::string path = dir.file("m.sqm");
  SqmWriter w(path);
  w.finish({{"format", "bogus"}, {"producer", "p"}});
  const auto f = SqmFile::open(path);
  EXPECT_EQ(f->header()["format"]["name"], "sqkit.sqm");
  EXPECT_EQ(f->header()["format"]["tensor_count"], 0);
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->file_size(), 128u + rd64(sq::test::read_file(path), 40) + rd64(sq::test::read_file(path), 56));
}

// ---- sq-inspect ----------------------------------------------------------------------------------

/// A small quantized-looking model: raw bytes F32 160 (2), I8 64, I4x2 32, F16 16, U8 100 (tokenizer).
void write_inspect_sample(const std::string& path, bool compress) {
  SqmWriter w(path, SqmWriteOptions{.compress = compress});
  const std::vector<uint8_t> tok = noise(100, 11), emb(128, 0), q8 = noise(64, 12), scale = noise(32, 14),
                             q4 = noise(32, 13), norm = noise(16, 15);
  w.add_tensor("tokenizer.bin", SqmDType::U8, {100}, tok.data(), tok.size());
  w.add_tensor("model.embed_tokens.weight", SqmDType::F32, {4, 8}, emb.data(), emb.size());
  w.add_tensor("model.layers.0.mlp.up_proj.weight", SqmDType::I8, {8, 8}, q8.data(), q8.size());
  w.add_tensor("model.layers.0.mlp.up_proj.weight_scale", SqmDType::F32, {8}, scale.data(), scale.size());
  w.add_tensor("model.layers.0.mlp.down_proj.weight", SqmDType::I4x2, {8, 8}, q4.data(), q4.size());
  w.add_tensor("model.norm.weight", SqmDType::F16, {8}, norm.data(), norm.size());
  w.finish({{"producer", "sqkit-test 1.0"},
            {"model_config", {{"architecture", "llama"}, {"dim", 8}, {"n_layers", 1}}},
            {"tokenizer", {{"format", "llama2c"}, {"tensor", "tokenizer.bin"}}},
            {"quantization", {{"method", "w8a8"}, {"alpha", 0.5}}},
            {"calibration", {{"dataset", "tinystories"}, {"samples", 16}}},
            {"notes", "hello"}});
}

TEST(SqInspect, PrintsTheSummary) {
  ScratchDir dir;
  const std::string path = dir.file("m.sqm");
  write_inspect_sample(path, false);
  const auto r = sq::test::run_process({sq::test::tool("sq-inspect"), path});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const std::string size = std::to_string(fs::file_size(path));
  for (const std::string& line : {
           "file:           " + path + "\n",
           "format:         .sqm version 1, " + size + " bytes\n",
           std::string("producer:       sqkit-test 1.0\n"),
           std::string("model_config:\n  architecture  llama\n  dim           8\n  n_layers      1\n"),
           std::string("tokenizer:\n  format  llama2c\n  tensor  tokenizer.bin\n"),
           std::string("quantization:\n  alpha   0.5\n  method  w8a8\n"),
           std::string("calibration:\n  dataset  tinystories\n  samples  16\n"),
           std::string("other keys:     notes\n"),
           std::string("tensors:        6 (0 zstd-compressed)\n"),
           std::string("bytes by dtype:\n  F16   16 bytes in 1 tensor\n  F32   160 bytes in 2 tensors\n"
                       "  I4x2  32 bytes in 1 tensor\n  I8    64 bytes in 1 tensor\n  U8    100 bytes in 1 tensor\n"),
           std::string("total bytes:    372 raw, 372 stored\n"),
           // 8 x (372 - 100) / (32 + 64 + 64 + 8) = 2176 / 168
           std::string("bits/weight:    12.9524 (8 x 272 non-tokenizer bytes / 168 elements of *.weight tensors)\n"),
       })
    EXPECT_NE(r.out.find(line), std::string::npos) << "missing:\n" << line << "\nin:\n" << r.out;
  EXPECT_EQ(r.out.find("NAME"), std::string::npos);  // no tensor list without --tensors
}

TEST(SqInspect, JsonAndTensorList) {
  ScratchDir dir;
  const std::string path = dir.file("m.sqm");
  write_inspect_sample(path, true);
  auto r = sq::test::run_process({sq::test::tool("sq-inspect"), path, "--json", "--tensors"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["file"], path);
  EXPECT_EQ(j["file_bytes"], fs::file_size(path));
  EXPECT_EQ(j["format_version"], 1);
  EXPECT_EQ(j["header"]["producer"], "sqkit-test 1.0");
  EXPECT_EQ(j["header"]["quantization"]["alpha"], 0.5);
  EXPECT_EQ(j["header"]["calibration"]["samples"], 16);
  EXPECT_EQ(j["tensor_count"], 6);
  EXPECT_EQ(j["compressed_tensor_count"], 1);  // only the all-zero embedding shrinks
  EXPECT_EQ(j["bytes_by_dtype"]["F32"]["raw_bytes"], 160);
  EXPECT_EQ(j["bytes_by_dtype"]["F32"]["tensors"], 2);
  EXPECT_LT(j["bytes_by_dtype"]["F32"]["stored_bytes"].get<int>(), 160);
  EXPECT_EQ(j["bytes_by_dtype"]["I4x2"]["raw_bytes"], 32);
  EXPECT_EQ(j["bytes_by_dtype"]["U8"]["raw_bytes"], 100);
  EXPECT_EQ(j["total_raw_bytes"], 372);
  EXPECT_EQ(j["weight_bytes"], 272);
  EXPECT_EQ(j["weight_elements"], 168);
  EXPECT_NEAR(j["bits_per_weight"].get<double>(), 2176.0 / 168.0, 1e-12);
  ASSERT_EQ(j["tensors"].size(), 6u);
  EXPECT_EQ(j["tensors"][4]["name"], "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(j["tensors"][4]["dtype"], "I4x2");
  EXPECT_EQ(j["tensors"][4]["shape"], nlohmann::json::array({8, 8}));
  EXPECT_EQ(j["tensors"][1]["compression"], "zstd");

  r = sq::test::run_process({sq::test::tool("sq-inspect"), path, "--tensors"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_NE(r.out.find("tensors:        6 (1 zstd-compressed)\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("NAME"), std::string::npos);
  for (const std::string row : {"model.layers.0.mlp.down_proj.weight      I4x2   [8, 8]            32  none\n",
                                 "tokenizer.bin                            U8     [100]            100  none\n"})
    EXPECT_NE(r.out.find(row), std::string::npos) << "missing:\n" << row << "in:\n" << r.out;
  EXPECT_NE(r.out.find("zstd (128 raw)\n"), std::string::npos) << r.out;
}

TEST(SqInspect, CorruptOrMissingFileExitsTwoWithOneLine) {
  ScratchDir dir;
  const std::string path = dir.file("m.sqm");
  write_inspect_sample(path, false);
  std::string b = sq::test::read_file(path);
  const auto f = SqmFile::open(path);
  const auto& t = f->info("model.layers.0.mlp.up_proj.weight");
  b[t.offset + 10] = static_cast<char>(b[t.offset + 10] ^ 0x10);
  sq::test::write_file(path, b);
  auto r = sq::test::run_process({sq::test::tool("sq-inspect"), path});
  EXPECT_EQ(r.exit_status, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "sq-inspect: error: " + path +
                       ": checksum mismatch in tensor 'model.layers.0.mlp.up_proj.weight' (file corrupt)\n");
  r = sq::test::run_process({sq::test::tool("sq-inspect"), path, "--no-verify"});
  EXPECT_EQ(r.exit_status, 0) << r.err;

  r = sq::test::run_process({sq::test::tool("sq-inspect"), dir.file("missing.sqm"), "--json"});
  EXPECT_EQ(r.exit_status, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.rfind("sq-inspect: error: ", 0), 0u) << r.err;
  r = sq::test::run_process({sq::test::tool("sq-inspect")});
  EXPECT_EQ(r.exit_status, 2);
}

}  // namespace
