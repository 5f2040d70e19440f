// Tests of the calibration HDF5 file (round trip, determinism, validation of corrupt files) and of
// the SHA-256 / model fingerprint helpers.
#include <gtest/gtest.h>

#include "tests/support/expect_error.h"
#include <hdf5.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "calib/activation_stats.h"
#include "core/checkpoint.h"
#include "core/error.h"
#include "formats/calibration_h5.h"
#include "formats/fingerprint.h"
#include "formats/llama2c_checkpoint.h"
#include "model/observer.h"
#include "support/process.h"
#include "support/test_data.h"

namespace {

using sq::CalibrationData;
using sq::ChannelStats;
using sq::InputError;
using sq::LayerStats;
using sq::test::read_file;
using sq::test::ScratchDir;
using sq::test::shared_data;
using sq::test::write_file;

constexpr int64_t kDim = 12, kAttn = 12, kKv = 6, kHidden = 20, kTokens = 75;

/// Statistics of `tokens` rows of heavy-tailed random activations with a few outlier channels.
ChannelStats random_stats(int64_t channels, int64_t tokens, std::mt19937& rng) {
  ChannelStats s(channels);
  std::student_t_distribution<float> heavy(3.0f);
  std::vector<float> x(static_cast<size_t>(channels * tokens));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < channels; ++c) {
      const float scale = (c % 5 == 1) ? 40.0f : 0.5f + 0.1f * static_cast<float>(c);
      x[static_cast<size_t>(t * channels + c)] = scale * heavy(rng);
    }
  // Two observe calls so that the sums are not a single pass.
  s.observe(x.data(), tokens / 2);
  s.observe(x.data() + (tokens / 2) * channels, tokens - tokens / 2);
  return s;
}

std::vector<float> random_absmax(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(0.01f, 30.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = u(rng);
  return v;
}

CalibrationData make_data(int layers = 2, uint32_t seed = 7) {
  std::mt19937 rng(seed);
  CalibrationData d;
  d.provenance.model_fingerprint = std::string(64, 'a');
  d.provenance.text_path = "/data/pile/val.jsonl.zst";
  d.provenance.text_sha256 = "5352b299dcb1a32898b2d779b145b5a05f3e1265953fd21c264c9f9f9c9ae33d";
  d.provenance.samples = 128;
  d.provenance.seq_len = 512;
  d.provenance.seed = 0xFEDCBA9876543210ULL;  // above INT64_MAX: must survive as uint64
  d.provenance.sqkit_version = "0.1.0";
  d.provenance.created = "2024-05-01T12:34:56Z";
  const int64_t site_width[sq::kActivationSites] = {kDim, kAttn, kDim, kHidden};
  const int64_t out_width[sq::kProjections] = {kAttn, kKv, kKv, kDim, kHidden, kHidden, kDim};
  for (int i = 0; i < layers; ++i) {
    LayerStats l;
    for (int s = 0; s < sq::kActivationSites; ++s) l.inputs.push_back(random_stats(site_width[s], kTokens, rng));
    for (int p = 0; p < sq::kProjections; ++p) l.output_absmax.push_back(random_absmax(out_width[p], rng));
    l.keys = random_stats(kKv, kTokens, rng);
    l.values = random_stats(kKv, kTokens, rng);
    d.layers.push_back(std::move(l));
  }
  return d;
}

void expect_stats_equal(const ChannelStats& a, const ChannelStats& b) {
  EXPECT_EQ(a.channels, b.channels);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.absmax, b.absmax);
  EXPECT_EQ(a.min, b.min);
  EXPECT_EQ(a.max, b.max);
  EXPECT_EQ(a.sum_sq, b.sum_sq);
  EXPECT_EQ(a.tensor_absmax, b.tensor_absmax);
  EXPECT_EQ(a.token_absmax_hist, b.token_absmax_hist);
  EXPECT_EQ(a.token_absmax_percentiles(), b.token_absmax_percentiles());
}

void expect_data_equal(const CalibrationData& a, const CalibrationData& b) {
  EXPECT_EQ(a.provenance.model_fingerprint, b.provenance.model_fingerprint);
  EXPECT_EQ(a.provenance.text_path, b.provenance.text_path);
  EXPECT_EQ(a.provenance.text_sha256, b.provenance.text_sha256);
  EXPECT_EQ(a.provenance.samples, b.provenance.samples);
  EXPECT_EQ(a.provenance.seq_len, b.provenance.seq_len);
  EXPECT_EQ(a.provenance.seed, b.provenance.seed);
  EXPECT_EQ(a.provenance.sqkit_version, b.provenance.sqkit_version);
  EXPECT_EQ(a.provenance.created, b.provenance.created);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) {
    SCOPED_TRACE("layer " + std::to_string(i));
    ASSERT_EQ(a.layers[i].inputs.size(), b.layers[i].inputs.size());
    for (size_t s = 0; s < a.layers[i].inputs.size(); ++s) expect_stats_equal(a.layers[i].inputs[s], b.layers[i].inputs[s]);
    EXPECT_EQ(a.layers[i].output_absmax, b.layers[i].output_absmax);
    expect_stats_equal(a.layers[i].keys, b.layers[i].keys);
    expect_stats_equal(a.layers[i].values, b.layers[i].values);
  }
}


// ---- HDF5 editing helpers for the corruption tests ----

struct H5File {
  hid_t id;
  explicit H5File(const std::string& path) : id(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)) {
    EXPECT_GE(id, 0) << path;
  }
  ~H5File() { H5Fclose(id); }
};

void set_string_attr(hid_t obj, const char* name, const std::string& value) {
  if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
  const char* p = value.c_str();
  EXPECT_GE(H5Awrite(a, t, &p), 0);
  H5Aclose(a);
  H5Sclose(sp);
  H5Tclose(t);
}

void set_int_attr(hid_t obj, const char* name, int32_t value) {
  if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(obj, name, H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT);
  EXPECT_GE(H5Awrite(a, H5T_NATIVE_INT32, &value), 0);
  H5Aclose(a);
  H5Sclose(sp);
}

/// Replaces dataset `path` by a 1-D dataset of `n` values of `file_type`.
void replace_dataset(hid_t file, const std::string& path, hid_t file_type, hsize_t n) {
  EXPECT_GE(H5Ldelete(file, path.c_str(), H5P_DEFAULT), 0);
  hid_t sp = H5Screate_simple(1, &n, nullptr);
  hid_t ds = H5Dcreate2(file, path.c_str(), file_type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  EXPECT_GE(ds, 0);
  std::vector<double> zeros(n, 0.0);
  EXPECT_GE(H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros.data()), 0);
  H5Dclose(ds);
  H5Sclose(sp);
}

class CalibrationH5 : public ::testing::Test {
 protected:
  void SetUp() override {
    file_ = dir_.file("cal.h5");
    sq::write_calibration_h5(file_, data_);
  }
  ScratchDir dir_;
  std::string file_;
  CalibrationData data_ = make_data();
};

TEST_F(CalibrationH5, RoundTripIsExact) {
  // The test data is non-trivial: outlier channels, negative minima, double sums.
  const ChannelStats& s = data_.layers[1].inputs[3];
  ASSERT_EQ(s.tokens, kTokens);
  EXPECT_LT(s.min[0], 0.0f);
  EXPECT_GT(s.absmax[1], 10.0f * s.absmax[0]);
  for (float v : s.min) ASSERT_FALSE(std::isnan(v));
  const CalibrationData back = sq::read_calibration_h5(file_);
  expect_data_equal(data_, back);
  EXPECT_EQ(back.layers.size(), 2u);
  EXPECT_EQ(back.layers[0].inputs[3].channels, kHidden);
  EXPECT_EQ(back.provenance.seed, 0xFEDCBA9876543210ULL);
}

TEST_F(CalibrationH5, SameDataGivesByteIdenticalFiles) {
  const std::string second = dir_.file("cal2.h5");
  sq::write_calibration_h5(second, data_);
  const std::string a = read_file(file_), b = read_file(second);
  ASSERT_GT(a.size(), 1000u);
  EXPECT_TRUE(a == b) << "two writes of the same data differ";
  // Rewriting the same path also gives the same bytes, and leaves no temporary behind.
  sq::write_calibration_h5(file_, data_);
  EXPECT_TRUE(read_file(file_) == a);
  // A different `created` changes the file.
  CalibrationData other = data_;
  other.provenance.created = "2024-05-01T12:34:57Z";
  sq::write_calibration_h5(second, other);
  EXPECT_FALSE(read_file(second) == a);
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_.path())) {
    ++entries;
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
  }
  EXPECT_EQ(entries, 2);
}

TEST_F(CalibrationH5, LayoutIsTheDocumentedOne) {
  H5File f(file_);
  for (const char* obj : {"/layer_000/attn_input/absmax", "/layer_000/attn_input/min", "/layer_000/attn_input/max",
                          "/layer_000/attn_input/sum_sq", "/layer_000/attn_input/token_absmax_hist",
                          "/layer_000/attn_input/token_absmax_percentiles", "/layer_001/attn_output/absmax",
                          "/layer_001/ffn_input/absmax", "/layer_001/ffn_hidden/absmax", "/layer_001/outputs/q_proj",
                          "/layer_001/outputs/down_proj", "/layer_001/k_cache/absmax", "/layer_001/v_cache/sum_sq"})
    EXPECT_GT(H5Lexists(f.id, obj, H5P_DEFAULT) > 0 ? 1 : 0, 0) << obj;
  hid_t ds = H5Dopen2(f.id, "/layer_000/attn_input/sum_sq", H5P_DEFAULT);
  hid_t t = H5Dget_type(ds);
  EXPECT_EQ(H5Tget_class(t), H5T_FLOAT);
  EXPECT_EQ(H5Tget_size(t), 8u);
  H5Tclose(t);
  H5Dclose(ds);
  hid_t g = H5Gopen2(f.id, "/layer_000/attn_input", H5P_DEFAULT);
  EXPECT_GT(H5Aexists(g, "linears"), 0);
  EXPECT_GT(H5Aexists(g, "tokens"), 0);
  EXPECT_GT(H5Aexists(g, "tensor_absmax"), 0);
  H5Gclose(g);
  EXPECT_GT(H5Aexists(f.id, "format_version"), 0);
}

TEST_F(CalibrationH5, GroupNamesMatchTheObserverNames) {
  // calibration_h5.cpp spells the names out (no dependency on the model library); they must agree.
  H5File f(file_);
  for (int s = 0; s < sq::kActivationSites; ++s) {
    const std::string g = std::string("/layer_001/") + sq::activation_site_name(static_cast<sq::ActivationSite>(s));
    EXPECT_GT(H5Lexists(f.id, g.c_str(), H5P_DEFAULT), 0) << g;
  }
  for (int p = 0; p < sq::kProjections; ++p) {
    const std::string d = std::string("/layer_001/outputs/") + sq::projection_name(static_cast<sq::Projection>(p));
    EXPECT_GT(H5Lexists(f.id, d.c_str(), H5P_DEFAULT), 0) << d;
  }
}

TEST_F(CalibrationH5, WrongFormatAttribute) {
  {
    H5File f(file_);
    set_string_attr(f.id, "format", "something-else");
  }
  const std::string msg = sq::test::expect_error<InputError>([&] { sq::read_calibration_h5(file_); });
  EXPECT_NE(msg.find(file_), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a sqkit calibration file"), std::string::npos) << msg;
  EXPECT_NE(msg.find("something-else"), std::string::npos) << msg;
}

TEST_F(CalibrationH5, TextFormatIsOptionalAndOnlyTokenIds) {
  // A text calibration has no text_format attribute (files as before); token ids round-trip it.
  EXPECT_EQ(sq::read_calibration_h5(file_).provenance.text_format, "");
  {
    H5File f(file_);
    EXPECT_EQ(H5Aexists(f.id, "text_format"), 0);
  }
  CalibrationData ids = data_;
  ids.provenance.text_format = sq::kTextFormatTokenIds;
  sq::write_calibration_h5(file_, ids);
  EXPECT_EQ(sq::read_calibration_h5(file_).provenance.text_format, "token_ids");
  {
    H5File f(file_);
    set_string_attr(f.id, "text_format", "tokens");
  }
  sq::test::expect_error<InputError>([&] { sq::read_calibration_h5(file_); },
                                     {file_, "root attribute text_format is \"tokens\", expected \"token_ids\""});
}

TEST_F(CalibrationH5, UnknownVersionIsUnsupported) {
  {
    H5File f(file_);
    set_int_attr(f.id, "format_version", 3);
  }
  const std::string msg = sq::test::expect_error<sq::UnsupportedError>([&] { sq::read_calibration_h5(file_); });
  EXPECT_EQ(msg, file_ + ": calibration format version 3 is not supported (this sqkit reads version 1)");
}

TEST_F(CalibrationH5, MissingDataset) {
  {
    H5File f(file_);
    EXPECT_GE(H5Ldelete(f.id, "/layer_001/ffn_hidden/sum_sq", H5P_DEFAULT), 0);
  }
  const std::string msg = sq::test::expect_error<InputError>([&] { sq::read_calibration_h5(file_); });
  EXPECT_NE(msg.find(file_), std::string::npos) << msg;
  EXPECT_NE(msg.find("/layer_001/ffn_hidden/sum_sq is missing"), std::string::npos) << msg;
}

TEST_F(CalibrationH5, MissingRootAttribute) {
  {
    H5File f(file_);
    EXPECT_GE(H5Adelete(f.id, "text_sha256"), 0);
  }
  const std::string msg = sq::test::expect_error<InputError>([&] { sq::read_calibration_h5(file_); });
  EXPECT_NE(msg.find("root attribute text_sha256 is missing"), std::string::npos) << msg;
}

TEST_F(CalibrationH5, LengthMismatchInAGroup) {
  {
    H5File f(file_);
    replace_dataset(f.id, "/layer_000/attn_input/min", H5T_IEEE_F32LE, kDim - 1);
  }
  const std::string msg = sq::test::expect_error<InputError>([&] { sq::read_calibration_h5(file_); });
  EXPECT_NE(msg.find(file_), std::string::npos) << msg;
  EXPECT_NE(msg.find("/layer_000/attn_input/min has length 11, expected 12"), std::string::npos) << msg;
}

TEST_F(CalibrationH5, LengthMismatchAcrossGroups) {
  {
    H5File f(file_);
    replace_dataset(f.id, "/layer_001/outputs/gate_proj", H5T_IEEE_F32LE, kHidden + 1);
  }
  const std::string msg = sq::test::expect_error<InputError>([&] { sq::read_calibration_h5(file_); });
  EXPECT_NE(msg.find("/layer_001/outputs/gate_proj has length 21, expected 20"), std::string::npos) << msg;
}

TEST_F(CalibrationH5, WrongDtype) {
  {
    H5File f(file_);
    replace_dataset(f.id, "/layer_000/k_cache/sum_sq", H5T_IEEE_F32LE, kKv);
  }
  const std::string msg = sq::test::expect_error<InputError>([&] { sq::read_calibration_h5(file_); });
  EXPECT_NE(msg.find("/layer_000/k_cache/sum_sq has dtype float32, expected float64"), std::string::npos) << msg;
}

TEST_F(CalibrationH5, WrongHistogramLength) {
  {
    H5File f(file_);
    replace_dataset(f.id, "/layer_000/v_cache/token_absmax_hist", H5T_STD_I64LE, 100);
  }
  const std::string msg = sq::test::expect_error<InputError>([&] { sq::read_calibration_h5(file_); });
  EXPECT_NE(msg.find("/layer_000/v_cache/token_absmax_hist has 100 bins, expected 1536"), std::string::npos) << msg;
}

TEST_F(CalibrationH5, LayerGroupsMustBeContiguous) {
  {
    H5File f(file_);
    EXPECT_GE(H5Ldelete(f.id, "/layer_000", H5P_DEFAULT), 0);
  }
  const std::string msg = sq::test::expect_error<InputError>([&] { sq::read_calibration_h5(file_); });
  EXPECT_NE(msg.find("/layer_000 is missing"), std::string::npos) << msg;
}

TEST_F(CalibrationH5, TruncatedFile) {
  const std::string bytes = read_file(file_);
  const std::string cut = dir_.file("cut.h5");
  write_file(cut, bytes.substr(0, bytes.size() / 2));
  const std::string msg = sq::test::expect_error<InputError>([&] { sq::read_calibration_h5(cut); });
  EXPECT_NE(msg.find(cut), std::string::npos) << msg;
}

TEST_F(CalibrationH5, GarbageAndMissingFiles) {
  const std::string garbage = dir_.file("garbage.h5");
  write_file(garbage, std::string(5000, 'x'));
  std::string msg = sq::test::expect_error<InputError>([&] { sq::read_calibration_h5(garbage); });
  EXPECT_NE(msg.find(garbage + ": not an HDF5 file"), std::string::npos) << msg;

  const std::string missing = dir_.file("missing.h5");
  msg = sq::test::expect_error<InputError>([&] { sq::read_calibration_h5(missing); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file"), std::string::npos) << msg;
}

TEST(CalibrationH5Write, FailureLeavesNoFile) {
  ScratchDir dir;
  const std::string bad = dir.file("no-such-dir/cal.h5");
  EXPECT_THROW(sq::write_calibration_h5(bad, make_data()), sq::OutputError);
  EXPECT_FALSE(std::filesystem::exists(bad));
}

TEST(CalibrationH5Write, InconsistentDataIsRejected) {
  ScratchDir dir;
  CalibrationData d = make_data();
  d.layers[1].output_absmax[static_cast<int>(sq::Projection::K)].pop_back();
  EXPECT_THROW(sq::write_calibration_h5(dir.file("x.h5"), d), std::invalid_argument);
  d = make_data();
  d.layers[0].keys.tokens += 1;  // histogram no longer sums to tokens
  EXPECT_THROW(sq::write_calibration_h5(dir.file("x.h5"), d), std::invalid_argument);
  EXPECT_THROW(sq::write_calibration_h5(dir.file("x.h5"), CalibrationData{}), std::invalid_argument);
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.h5")));
}

// ---- Fisher data (sq-calibrate --fisher) ----

constexpr int64_t kFisherTokens = 5;

/// Adds Fisher samples of kFisherTokens tokens to every layer of `d` (same tokens in every layer,
/// positions < seq_len − 1 = 511, windows < samples = 128; weights ≥ 0 spanning 1e−12 … 1).
void add_fisher(CalibrationData& d, uint32_t seed = 3) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::uniform_real_distribution<float> ex(-12.0f, 0.0f);
  d.fisher_max_tokens = 8;
  d.fisher_mean_loss = 1.234567890123;
  for (LayerStats& l : d.layers) {
    sq::KVFisherSamples& f = l.kv_fisher;
    f.tokens = kFisherTokens;
    f.width = kKv;
    for (auto* m : {&f.keys, &f.values}) {
      m->resize(size_t(kFisherTokens * kKv));
      for (float& x : *m) x = nd(rng);
    }
    for (auto* m : {&f.keys_fisher, &f.values_fisher}) {
      m->resize(size_t(kFisherTokens * kKv));
      for (float& x : *m) x = std::pow(10.0f, ex(rng));
    }
    f.windows = {0, 0, 3, 3, 127};
    f.positions = {0, 510, 7, 8, 2};
  }
}

void expect_fisher_equal(const sq::KVFisherSamples& a, const sq::KVFisherSamples& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.width, b.width);
  EXPECT_EQ(a.keys, b.keys);
  EXPECT_EQ(a.keys_fisher, b.keys_fisher);
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.values_fisher, b.values_fisher);
  EXPECT_EQ(a.positions, b.positions);
  EXPECT_EQ(a.windows, b.windows);
}

/// Replaces dataset `path` by a zero-filled 2-D float32 dataset of [rows, cols].
void replace_matrix(hid_t file, const std::string& path, hsize_t rows, hsize_t cols) {
  EXPECT_GE(H5Ldelete(file, path.c_str(), H5P_DEFAULT), 0);
  const hsize_t dims[2] = {rows, cols};
  hid_t sp = H5Screate_simple(2, dims, nullptr);
  hid_t ds = H5Dcreate2(file, path.c_str(), H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  EXPECT_GE(ds, 0);
  std::vector<float> zeros(size_t(rows * cols), 0.0f);
  EXPECT_GE(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros.data()), 0);
  H5Dclose(ds);
  H5Sclose(sp);
}

class CalibrationH5Fisher : public ::testing::Test {
 protected:
  void SetUp() override {
    add_fisher(data_);
    file_ = dir_.file("fisher.h5");
    sq::write_calibration_h5(file_, data_);
  }
  std::string read_error() { return sq::test::expect_error<InputError>([&] { sq::read_calibration_h5(file_); }); }
  ScratchDir dir_;
  std::string file_;
  CalibrationData data_ = make_data();
};

TEST_F(CalibrationH5Fisher, RoundTripIsExactAndLayoutIsTheDocumentedOne) {
  const CalibrationData back = sq::read_calibration_h5(file_);
  expect_data_equal(data_, back);
  ASSERT_TRUE(back.has_fisher());
  EXPECT_EQ(back.fisher_max_tokens, 8);
  EXPECT_EQ(back.fisher_mean_loss, 1.234567890123);
  for (size_t i = 0; i < back.layers.size(); ++i) expect_fisher_equal(data_.layers[i].kv_fisher, back.layers[i].kv_fisher);
  H5File f(file_);
  hid_t ds = H5Dopen2(f.id, "/layer_001/kv_fisher/values_fisher", H5P_DEFAULT);
  hid_t sp = H5Dget_space(ds);
  hsize_t dims[2] = {0, 0};
  EXPECT_EQ(H5Sget_simple_extent_ndims(sp), 2);
  H5Sget_simple_extent_dims(sp, dims, nullptr);
  EXPECT_EQ(dims[0], hsize_t(kFisherTokens));
  EXPECT_EQ(dims[1], hsize_t(kKv));
  H5Sclose(sp);
  H5Dclose(ds);
  for (const char* obj : {"/layer_000/kv_fisher/keys", "/layer_000/kv_fisher/keys_fisher", "/layer_000/kv_fisher/values",
                          "/layer_000/kv_fisher/positions", "/layer_000/kv_fisher/windows"})
    EXPECT_GT(H5Lexists(f.id, obj, H5P_DEFAULT), 0) << obj;
  EXPECT_GT(H5Aexists(f.id, "fisher_max_tokens"), 0);
}

TEST_F(CalibrationH5Fisher, FilesWithoutFisherDataReadAsBefore) {
  // A file written without Fisher data (as every file before --fisher existed) has no kv_fisher
  // object at all and reads with has_fisher() false.
  const std::string plain = dir_.file("plain.h5");
  sq::write_calibration_h5(plain, make_data());
  H5File f(plain);
  EXPECT_EQ(H5Lexists(f.id, "/layer_000/kv_fisher", H5P_DEFAULT), 0);
  EXPECT_EQ(H5Aexists(f.id, "fisher_max_tokens"), 0);
  const CalibrationData back = sq::read_calibration_h5(plain);
  EXPECT_FALSE(back.has_fisher());
  EXPECT_EQ(back.fisher_max_tokens, 0);
  EXPECT_EQ(back.layers[1].kv_fisher.tokens, 0);
}

TEST_F(CalibrationH5Fisher, MissingDatasetGroupOrAttribute) {
  {
    H5File f(file_);
    EXPECT_GE(H5Ldelete(f.id, "/layer_001/kv_fisher/values_fisher", H5P_DEFAULT), 0);
  }
  std::string msg = read_error();
  EXPECT_NE(msg.find(file_ + ": /layer_001/kv_fisher/values_fisher is missing (expected a float32 dataset)"), std::string::npos)
      << msg;
  sq::write_calibration_h5(file_, data_);
  {
    H5File f(file_);
    EXPECT_GE(H5Ldelete(f.id, "/layer_001/kv_fisher", H5P_DEFAULT), 0);
  }
  msg = read_error();
  EXPECT_NE(msg.find("/layer_001/kv_fisher is missing, but the root attribute fisher_max_tokens says the file has Fisher data"),
            std::string::npos)
      << msg;
  sq::write_calibration_h5(file_, data_);
  {
    H5File f(file_);
    EXPECT_GE(H5Adelete(f.id, "fisher_max_tokens"), 0);
  }
  msg = read_error();
  EXPECT_NE(msg.find("/layer_000/kv_fisher exists, but the root attribute fisher_max_tokens is missing"), std::string::npos)
      << msg;
  sq::write_calibration_h5(file_, data_);
  {
    H5File f(file_);
    EXPECT_GE(H5Adelete(f.id, "fisher_mean_loss"), 0);
  }
  msg = read_error();
  EXPECT_NE(msg.find("root attribute fisher_mean_loss is missing"), std::string::npos) << msg;
}

TEST_F(CalibrationH5Fisher, WrongShapesAndDtypes) {
  {
    H5File f(file_);
    replace_matrix(f.id, "/layer_000/kv_fisher/keys", kFisherTokens, kKv + 1);
  }
  std::string msg = read_error();
  EXPECT_NE(msg.find("/layer_000/kv_fisher/keys has shape [5, 7], expected [5, 6] (tokens × k_cache width)"), std::string::npos)
      << msg;
  sq::write_calibration_h5(file_, data_);
  {
    H5File f(file_);
    replace_dataset(f.id, "/layer_001/kv_fisher/keys_fisher", H5T_IEEE_F32LE, kFisherTokens * kKv);
  }
  msg = read_error();
  EXPECT_NE(msg.find("/layer_001/kv_fisher/keys_fisher has rank 1, expected 2"), std::string::npos) << msg;
  sq::write_calibration_h5(file_, data_);
  {
    H5File f(file_);
    replace_dataset(f.id, "/layer_000/kv_fisher/positions", H5T_STD_I32LE, kFisherTokens - 1);
  }
  msg = read_error();
  EXPECT_NE(msg.find("/layer_000/kv_fisher/positions has length 4, expected 5 (attribute tokens)"), std::string::npos) << msg;
  sq::write_calibration_h5(file_, data_);
  {
    H5File f(file_);
    replace_dataset(f.id, "/layer_000/kv_fisher/windows", H5T_STD_I64LE, kFisherTokens);
  }
  msg = read_error();
  EXPECT_NE(msg.find("/layer_000/kv_fisher/windows has dtype integer64, expected int32"), std::string::npos) << msg;
}

TEST(CalibrationFisherValidation, ValuesAreChecked) {
  // The validation layer the reader applies to the values (exercised directly, like the fuzz target).
  CalibrationData d = make_data();
  add_fisher(d);
  const auto& p = d.provenance;
  const sq::KVFisherSamples good = d.layers[1].kv_fisher;
  auto check = [&](const sq::KVFisherSamples& f, const sq::KVFisherSamples* layer0 = nullptr, int64_t max_tokens = 8) {
    sq::check_calibration_kv_fisher(f, kKv, max_tokens, p, layer0, "/layer_001/kv_fisher", "cal.h5");
  };
  check(good, &d.layers[0].kv_fisher);
  auto expect = [&](const sq::KVFisherSamples& f, const std::string& part, const sq::KVFisherSamples* layer0 = nullptr,
                    int64_t max_tokens = 8) {
    sq::test::expect_error<InputError>([&] { check(f, layer0, max_tokens); }, {"cal.h5: ", part});
  };
  sq::KVFisherSamples f = good;
  f.keys_fisher[3] = -1e-9f;
  expect(f, "/layer_001/kv_fisher/keys_fisher holds a negative Fisher weight");
  f = good;
  f.values[0] = NAN;
  expect(f, "/layer_001/kv_fisher/values holds a non-finite value");
  f = good;
  f.positions[1] = 511;  // seq_len 512: the last position has no gradient and is never stored
  expect(f, "positions holds position 511, expected 0 … 510 (seq_len − 2)");
  f = good;
  f.windows[4] = 128;
  expect(f, "windows holds window 128, expected 0 … 127 (samples − 1)");
  f = good;
  std::swap(f.positions[0], f.positions[1]);
  expect(f, "not in strictly increasing (window, position) order at row 1");
  expect(good, "attribute tokens is 5, expected 1 … 4", nullptr, 4);
  f = good;
  f.positions[2] = 6;
  expect(f, "holds other tokens than /layer_000/kv_fisher", &d.layers[0].kv_fisher);
}

TEST(CalibrationH5Write, FisherInSomeLayersOnlyIsRejected) {
  ScratchDir dir;
  CalibrationData d = make_data();
  add_fisher(d);
  d.layers[1].kv_fisher = {};
  EXPECT_THROW(sq::write_calibration_h5(dir.file("x.h5"), d), std::invalid_argument);
  d = make_data();
  add_fisher(d);
  d.layers[0].kv_fisher.values_fisher.pop_back();
  EXPECT_THROW(sq::write_calibration_h5(dir.file("x.h5"), d), std::invalid_argument);
  d = make_data();
  add_fisher(d);
  d.fisher_max_tokens = 4;  // below the 5 stored tokens
  EXPECT_THROW(sq::write_calibration_h5(dir.file("x.h5"), d), std::invalid_argument);
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.h5")));
}

// ---- hashes and fingerprints ----

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sq::sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sq::sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sq::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sq::sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, FileMatchesSha256Sums) {
  // The expected value comes from the data folder's SHA256SUMS, not from this code.
  std::istringstream sums(read_file(shared_data("SHA256SUMS")));
  std::string hash, name, expected;
  while (sums >> hash >> name)
    if (name == "stories260K/stories260K.bin") expected = hash;
  ASSERT_EQ(expected, "b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696");
  EXPECT_EQ(sq::sha256_file_hex(sq::test::stories_model()), expected);

  ScratchDir dir;
  write_file(dir.file("abc.txt"), "abc");
  EXPECT_EQ(sq::sha256_file_hex(dir.file("abc.txt")), sq::sha256_hex("abc"));
  // Larger than one 1 MiB read block.
  const std::string big(3 * 1048576 + 17, 'a');
  write_file(dir.file("big.txt"), big);
  EXPECT_EQ(sq::sha256_file_hex(dir.file("big.txt")), sq::sha256_hex(big));
  const std::string msg = sq::test::expect_error<InputError>([&] { sq::sha256_file_hex(dir.file("missing")); });
  EXPECT_NE(msg.find(dir.file("missing")), std::string::npos) << msg;
}

sq::Checkpoint tiny_checkpoint() {
  sq::Checkpoint c;
  c.config.dim = 8;
  c.config.hidden_dim = 16;
  c.config.n_layers = 1;
  c.config.n_heads = 2;
  c.config.n_kv_heads = 1;
  c.config.head_dim = 4;
  c.config.vocab_size = 10;
  c.config.max_seq_len = 32;
  c.tensors[sq::names::kEmbed] = sq::Tensor::zeros({10, 8});
  c.tensors[sq::names::kFinalNorm] = sq::Tensor::zeros({8});
  return c;
}

TEST(ModelFingerprint, CanonicalJsonAndIndependentHash) {
  const sq::Checkpoint c = tiny_checkpoint();
  EXPECT_EQ(sq::model_fingerprint_json(c),
            R"({"config":{"architecture":"llama","bos_id":1,"dim":8,"eos_id":2,"head_dim":4,"hidden_dim":16,)"
            R"("max_seq_len":32,"n_heads":2,"n_kv_heads":1,"n_layers":1,"norm_eps":"9.99999975e-06","qkv_bias":false,)"
            R"("rope_layout":"interleaved","rope_theta":"10000","tied_embeddings":true,"vocab_size":10},)"
            R"("tensors":{"model.embed_tokens.weight":{"dtype":"f32","shape":[10,8]},)"
            R"("model.norm.weight":{"dtype":"f32","shape":[8]}}})");
  // Computed independently with Python's json.dumps(sort_keys=True, separators=(",", ":")) + hashlib.
  EXPECT_EQ(sq::model_fingerprint(c), "e670cf81bb73437e30f15e1cc43928dbce858719294ca9efcf42499c693c3284");
}

TEST(ModelFingerprint, DependsOnConfigAndShapesNotValues) {
  const sq::Checkpoint base = tiny_checkpoint();
  const std::string fp = sq::model_fingerprint(base);
  sq::Checkpoint values = tiny_checkpoint();
  values.tensors[sq::names::kEmbed] = sq::Tensor::from_vector({10, 8}, std::vector<float>(80, 1.5f));
  EXPECT_EQ(sq::model_fingerprint(values), fp);
  sq::Checkpoint eps = tiny_checkpoint();
  eps.config.norm_eps = 1e-6f;
  EXPECT_NE(sq::model_fingerprint(eps), fp);
  sq::Checkpoint layout = tiny_checkpoint();
  layout.config.rope_layout = sq::RopeLayout::HalfSplit;
  EXPECT_NE(sq::model_fingerprint(layout), fp);
  sq::Checkpoint shape = tiny_checkpoint();
  shape.tensors[sq::names::kFinalNorm] = sq::Tensor::zeros({1, 8});
  EXPECT_NE(sq::model_fingerprint(shape), fp);
  sq::Checkpoint extra = tiny_checkpoint();
  extra.tensors[sq::names::kLmHead] = sq::Tensor::zeros({10, 8});
  EXPECT_NE(sq::model_fingerprint(extra), fp);
}

TEST(ModelFingerprint, Stories260K) {
  const sq::Checkpoint a = sq::load_llama2c_checkpoint(sq::test::stories_model());
  const sq::Checkpoint b = sq::load_llama2c_checkpoint(sq::test::stories_model());
  const std::string fp = sq::model_fingerprint(a);
  EXPECT_EQ(fp.size(), 64u);
  EXPECT_EQ(fp.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(sq::model_fingerprint(b), fp);
  const std::string json = sq::model_fingerprint_json(a);
  EXPECT_NE(json.find(R"("dim":64)"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("model.layers.4.mlp.down_proj.weight":{"dtype":"f32","shape":[64,172]})"), std::string::npos)
      << json;
}

}  // namespace
