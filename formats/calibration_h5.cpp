#include "formats/calibration_h5.h"

#include <hdf5.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "formats/atomic_file.h"
#include "model/observer.h"

namespace sq {

namespace {

constexpr const char* kFormatName = "sqkit-calibration";

// ---------------------------------------------------------------------------------------------
// HDF5 plumbing

void silence_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

/// The most specific message on HDF5's error stack (e.g. "file signature not found"), or "".
std::string hdf5_error() {
  std::string msg;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* e, void* out) -> herr_t {
        auto* s = static_cast<std::string*>(out);
        if (s->empty() && e->desc && *e->desc) *s = e->desc;
        return 0;
      },
      &msg);
  return msg;
}

/// Owns one HDF5 identifier.
class Hid {
 public:
  Hid() = default;
  Hid(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Hid(Hid&& o) noexcept : id_(std::exchange(o.id_, -1)), close_(o.close_) {}
  Hid& operator=(Hid&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
      close_ = o.close_;
    }
    return *this;
  }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid() { reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  /// Gives up ownership and returns the identifier.
  hid_t release() { return std::exchange(id_, -1); }

 private:
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

std::string layer_name(size_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "layer_%03zu", i);
  return buf;
}

/// "/layer_001" (absolute path of a layer group).
std::string layer_path(size_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "/layer_%03zu", i);
  return buf;
}

// Names of the sites and projections, indexed by ActivationSite / Projection. They equal
// activation_site_name() / projection_name() (lib/model/observer.h; tested), but are spelled out
// here because sqkit_formats must not depend on the model library (static link order).
const char* const kSiteNames[kActivationSites] = {"attn_input", "attn_output", "ffn_input", "ffn_hidden"};
const char* const kSiteLinears[kActivationSites] = {"q_proj,k_proj,v_proj", "o_proj", "gate_proj,up_proj", "down_proj"};
const char* const kProjectionNames[kProjections] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                    "down_proj"};
const char* site_name(int s) { return kSiteNames[s]; }
const char* proj_name(int p) { return kProjectionNames[p]; }
constexpr const char* kKCache = "k_cache";
constexpr const char* kVCache = "v_cache";
constexpr const char* kOutputs = "outputs";
constexpr const char* kKvFisher = "kv_fisher";
// Datasets of a kv_fisher group: [T, kvw] float32 ...
const char* const kFisherMatrices[4] = {"keys", "keys_fisher", "values", "values_fisher"};
// ... and [T] int32.
constexpr const char* kFisherPositions = "positions";
constexpr const char* kFisherWindows = "windows";
constexpr const char* kFisherMaxTokensAttr = "fisher_max_tokens";
constexpr const char* kTextFormatAttr = "text_format";  // optional: absent = text, "token_ids"
constexpr const char* kFisherMeanLossAttr = "fisher_mean_loss";

/// The four [T, kvw] matrices of `s`, in kFisherMatrices order.
std::array<const std::vector<float>*, 4> fisher_matrices(const KVFisherSamples& s) {
  return {&s.keys, &s.keys_fisher, &s.values, &s.values_fisher};
}
std::array<std::vector<float>*, 4> fisher_matrices(KVFisherSamples& s) {
  return {&s.keys, &s.keys_fisher, &s.values, &s.values_fisher};
}

/// Width relations of one LLaMA layer (see read_calibration_h5), checked on write and read.
/// `fail(object, message)` reports a violation.
template <typename Fail>
void check_layer_widths(const LayerStats& l, const std::string& prefix, Fail&& fail) {
  const int64_t d = l.inputs[0].channels, a = l.inputs[1].channels, h = l.inputs[3].channels, kv = l.keys.channels;
  auto expect = [&](const std::string& object, int64_t got, int64_t want, const std::string& reference) {
    if (got != want)
      fail(object, "has length " + std::to_string(got) + ", expected " + std::to_string(want) + " (the length of " +
                       reference + ")");
  };
  const std::string in = prefix + "attn_input/absmax";
  expect(prefix + "ffn_input/absmax", l.inputs[2].channels, d, in);
  expect(prefix + "v_cache/absmax", l.values.channels, kv, prefix + "k_cache/absmax");
  const int64_t want[kProjections] = {a, kv, kv, d, h, h, d};
  const std::string ref[kProjections] = {prefix + "attn_output/absmax", prefix + "k_cache/absmax",
                                         prefix + "k_cache/absmax",     in,
                                         prefix + "ffn_hidden/absmax",  prefix + "ffn_hidden/absmax",
                                         in};
  for (int p = 0; p < kProjections; ++p)
    expect(prefix + "outputs/" + proj_name(p),
           static_cast<int64_t>(l.output_absmax[static_cast<size_t>(p)].size()), want[p], ref[p]);
}

/// Widths of layer `i` equal those of layer 0.
template <typename Fail>
void check_same_widths(const LayerStats& l0, const LayerStats& l, const std::string& prefix, Fail&& fail) {
  for (int s = 0; s < kActivationSites; ++s)
    if (l.inputs[static_cast<size_t>(s)].channels != l0.inputs[static_cast<size_t>(s)].channels)
      fail(prefix + site_name(s) + "/absmax",
           "has length " + std::to_string(l.inputs[static_cast<size_t>(s)].channels) + ", but layer_000 has " +
               std::to_string(l0.inputs[static_cast<size_t>(s)].channels));
  if (l.keys.channels != l0.keys.channels)
    fail(prefix + "k_cache/absmax", "has length " + std::to_string(l.keys.channels) + ", but layer_000 has " +
                                        std::to_string(l0.keys.channels));
}

// ---------------------------------------------------------------------------------------------
// Writer

class Writer {
 public:
  Writer(std::string path, const std::string& tmp) : path_(std::move(path)) {
    Hid fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
    check(fcpl.valid() && H5Pset_obj_track_times(fcpl.get(), 0) >= 0, "file creation properties");
    gcpl_ = Hid(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
    check(gcpl_.valid() && H5Pset_obj_track_times(gcpl_.get(), 0) >= 0, "group creation properties");
    dcpl_ = Hid(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    check(dcpl_.valid() && H5Pset_obj_track_times(dcpl_.get(), 0) >= 0, "dataset creation properties");
    str_type_ = Hid(H5Tcopy(H5T_C_S1), H5Tclose);
    check(str_type_.valid() && H5Tset_size(str_type_.get(), H5T_VARIABLE) >= 0 &&
              H5Tset_cset(str_type_.get(), H5T_CSET_UTF8) >= 0,
          "string type");
    file_ = Hid(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, fcpl.get(), H5P_DEFAULT), H5Fclose);
    check(file_.valid(), "file");
  }

  void write(const CalibrationData& data) {
    const CalibrationProvenance& p = data.provenance;
    const hid_t root = file_.get();
    attr_string(root, "/", "format", kFormatName);
    attr_scalar(root, "/", "format_version", H5T_STD_I32LE, H5T_NATIVE_INT32, &kCalibrationFormatVersion);
    attr_string(root, "/", "model_fingerprint", p.model_fingerprint);
    attr_string(root, "/", "text_path", p.text_path);
    attr_string(root, "/", "text_sha256", p.text_sha256);
    if (!p.text_format.empty()) attr_string(root, "/", kTextFormatAttr, p.text_format);
    attr_scalar(root, "/", "samples", H5T_STD_I64LE, H5T_NATIVE_INT64, &p.samples);
    attr_scalar(root, "/", "seq_len", H5T_STD_I64LE, H5T_NATIVE_INT64, &p.seq_len);
    attr_scalar(root, "/", "seed", H5T_STD_U64LE, H5T_NATIVE_UINT64, &p.seed);
    attr_string(root, "/", "sqkit_version", p.sqkit_version);
    attr_string(root, "/", "created", p.created);
    if (data.has_fisher()) {  // optional (sq-calibrate --fisher), with a kv_fisher group in every layer
      attr_scalar(root, "/", kFisherMaxTokensAttr, H5T_STD_I64LE, H5T_NATIVE_INT64, &data.fisher_max_tokens);
      attr_scalar(root, "/", kFisherMeanLossAttr, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &data.fisher_mean_loss);
    }

    for (size_t i = 0; i < data.layers.size(); ++i) {
      const LayerStats& l = data.layers[i];
      const std::string lname = layer_path(i);
      const bool early = i < early_hessians_.size() && early_hessians_[i];  // groups made by write_hessians
      Hid lg = early ? open_group(root, lname) : group(root, lname);
      for (int s = 0; s < kActivationSites; ++s) {
        const std::string gname = lname + "/" + site_name(s);
        Hid g = early ? open_group(lg.get(), gname) : group(lg.get(), gname);
        attr_string(g.get(), gname, "linears", kSiteLinears[s]);
        channel_stats(g.get(), gname, l.inputs[static_cast<size_t>(s)]);
        if (!l.hessians.empty()) hessian(g.get(), gname, l.hessians[static_cast<size_t>(s)], l.hessian_tokens);
      }
      {
        const std::string gname = lname + "/" + kOutputs;
        Hid g = group(lg.get(), gname);
        for (int pr = 0; pr < kProjections; ++pr) {
          const auto& v = l.output_absmax[static_cast<size_t>(pr)];
          dataset(g.get(), gname + "/" + proj_name(pr), H5T_IEEE_F32LE, H5T_NATIVE_FLOAT,
                  v.size(), v.data());
        }
      }
      {
        const std::string gname = lname + "/" + kKCache;
        Hid g = group(lg.get(), gname);
        channel_stats(g.get(), gname, l.keys);
      }
      {
        const std::string gname = lname + "/" + kVCache;
        Hid g = group(lg.get(), gname);
        channel_stats(g.get(), gname, l.values);
      }
      if (data.has_fisher()) {
        const KVFisherSamples& f = l.kv_fisher;
        const std::string gname = lname + "/" + kKvFisher;
        Hid g = group(lg.get(), gname);
        attr_scalar(g.get(), gname, "tokens", H5T_STD_I64LE, H5T_NATIVE_INT64, &f.tokens);
        const auto mats = fisher_matrices(f);
        for (int m = 0; m < 4; ++m)
          dataset(g.get(), gname + "/" + kFisherMatrices[m], H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {f.tokens, f.width},
                  mats[static_cast<size_t>(m)]->data());
        dataset(g.get(), gname + "/" + kFisherPositions, H5T_STD_I32LE, H5T_NATIVE_INT32, {f.tokens}, f.positions.data());
        dataset(g.get(), gname + "/" + kFisherWindows, H5T_STD_I32LE, H5T_NATIVE_INT32, {f.tokens}, f.windows.data());
      }
    }
    gcpl_ = Hid();
    dcpl_ = Hid();
    str_type_ = Hid();
    // Close explicitly (all objects are closed by now) so that a failed final write is reported.
    check(H5Fclose(file_.release()) >= 0, "file (close)");
  }

  /// Writes layer i's Hessians now (groups layer_i and its sites, each site's hessian dataset and
  /// hessian_tokens); write(data) later adds the rest of the layer to those groups.
  void write_hessians(size_t i, const std::vector<std::vector<double>>& hessians, int64_t tokens) {
    if (early_hessians_.size() <= i) early_hessians_.resize(i + 1, false);
    if (early_hessians_[i]) throw std::invalid_argument("CalibrationH5Writer: Hessians of layer " + std::to_string(i) + " written twice");
    const std::string lname = layer_path(i);
    Hid lg = group(file_.get(), lname);
    for (int s = 0; s < kActivationSites; ++s) {
      const std::string gname = lname + "/" + site_name(s);
      Hid g = group(lg.get(), gname);
      hessian(g.get(), gname, hessians[static_cast<size_t>(s)], tokens);
    }
    early_hessians_[i] = true;
  }
  /// Layers whose Hessians write_hessians wrote.
  const std::vector<bool>& early_hessians() const { return early_hessians_; }

 private:
  void check(bool ok, const std::string& what) const {
    if (ok) return;
    const std::string detail = hdf5_error();
    throw OutputError("cannot write " + path_ + ": HDF5 error writing " + what + (detail.empty() ? "" : ": " + detail));
  }

  /// A site's optional (sq-calibrate --hessian) Hessian: [C·C] = row-major [C, C], and hessian_tokens.
  void hessian(hid_t g, const std::string& gname, const std::vector<double>& H, int64_t tokens) {
    dataset(g, gname + "/hessian", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, H.size(), H.data());
    attr_scalar(g, gname, "hessian_tokens", H5T_STD_I64LE, H5T_NATIVE_INT64, &tokens);
  }

  Hid open_group(hid_t parent, const std::string& name) {
    const std::string leaf = name.substr(name.rfind('/') + 1);
    Hid g(H5Gopen2(parent, leaf.c_str(), H5P_DEFAULT), H5Gclose);
    check(g.valid(), "group " + name);
    return g;
  }

  Hid group(hid_t parent, const std::string& name) {
    const std::string leaf = name.substr(name.rfind('/') + 1);
    Hid g(H5Gcreate2(parent, leaf.c_str(), H5P_DEFAULT, gcpl_.get(), H5P_DEFAULT), H5Gclose);
    check(g.valid(), "group " + name);
    return g;
  }

  void attr_write(hid_t obj, const std::string& obj_name, const char* name, hid_t file_type, hid_t mem_type,
                  hid_t space, const void* value) {
    const std::string what = "attribute " + std::string(name) + " of " + obj_name;
    Hid a(H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    check(a.valid(), what);
    check(H5Awrite(a.get(), mem_type, value) >= 0, what);
  }

  void attr_scalar(hid_t obj, const std::string& obj_name, const char* name, hid_t file_type, hid_t mem_type,
                   const void* value) {
    Hid space(H5Screate(H5S_SCALAR), H5Sclose);
    check(space.valid(), "dataspace");
    attr_write(obj, obj_name, name, file_type, mem_type, space.get(), value);
  }

  void attr_string(hid_t obj, const std::string& obj_name, const char* name, const std::string& value) {
    const char* ptr = value.c_str();
    attr_scalar(obj, obj_name, name, str_type_.get(), str_type_.get(), &ptr);
  }

  void attr_vector(hid_t obj, const std::string& obj_name, const char* name, hid_t file_type, hid_t mem_type,
                   size_t n, const void* values) {
    const hsize_t dims[1] = {static_cast<hsize_t>(n)};
    Hid space(H5Screate_simple(1, dims, nullptr), H5Sclose);
    check(space.valid(), "dataspace");
    attr_write(obj, obj_name, name, file_type, mem_type, space.get(), values);
  }

  Hid dataset(hid_t parent, const std::string& name, hid_t file_type, hid_t mem_type, size_t n, const void* values) {
    return dataset(parent, name, file_type, mem_type, {static_cast<int64_t>(n)}, values);
  }

  /// A dataset of shape `shape` (rank 1 or 2, row-major `values`).
  Hid dataset(hid_t parent, const std::string& name, hid_t file_type, hid_t mem_type, std::initializer_list<int64_t> shape,
              const void* values) {
    const std::string leaf = name.substr(name.rfind('/') + 1);
    std::vector<hsize_t> dims;
    hsize_t count = 1;
    for (int64_t d : shape) {
      dims.push_back(static_cast<hsize_t>(d));
      count *= static_cast<hsize_t>(d);
    }
    Hid space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
    check(space.valid(), "dataspace");
    Hid ds(H5Dcreate2(parent, leaf.c_str(), file_type, space.get(), H5P_DEFAULT, dcpl_.get(), H5P_DEFAULT), H5Dclose);
    check(ds.valid(), "dataset " + name);
    if (count > 0) check(H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) >= 0, "dataset " + name);
    return ds;
  }

  void channel_stats(hid_t g, const std::string& gname, const ChannelStats& s) {
    const size_t c = static_cast<size_t>(s.channels);
    dataset(g, gname + "/absmax", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, c, s.absmax.data());
    dataset(g, gname + "/min", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, c, s.min.data());
    dataset(g, gname + "/max", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, c, s.max.data());
    dataset(g, gname + "/sum_sq", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, c, s.sum_sq.data());
    dataset(g, gname + "/token_absmax_hist", H5T_STD_I64LE, H5T_NATIVE_INT64, s.token_absmax_hist.size(),
            s.token_absmax_hist.data());
    const std::vector<float> pct = s.token_absmax_percentiles();
    Hid ds = dataset(g, gname + "/token_absmax_percentiles", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, pct.size(), pct.data());
    attr_vector(ds.get(), gname + "/token_absmax_percentiles", "percent", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE,
                kTokenAbsmaxPercentiles.size(), kTokenAbsmaxPercentiles.data());
    attr_scalar(g, gname, "tokens", H5T_STD_I64LE, H5T_NATIVE_INT64, &s.tokens);
    attr_scalar(g, gname, "tensor_absmax", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, &s.tensor_absmax);
  }

  std::vector<bool> early_hessians_;  ///< [layer] Hessians already written by write_hessians
  std::string path_;
  Hid file_, gcpl_, dcpl_, str_type_;
};

void validate_channel_stats_for_write(const ChannelStats& s, const std::string& object) {
  auto bad = [&](const std::string& why) {
    throw std::invalid_argument("write_calibration_h5: " + object + ": " + why);
  };
  const size_t c = static_cast<size_t>(s.channels);
  if (s.channels < 1) bad("channels must be at least 1");
  if (s.absmax.size() != c || s.min.size() != c || s.max.size() != c || s.sum_sq.size() != c)
    bad("absmax/min/max/sum_sq sizes differ from channels = " + std::to_string(s.channels));
  if (s.token_absmax_hist.size() != static_cast<size_t>(ChannelStats::kHistBins))
    bad("token_absmax_hist has " + std::to_string(s.token_absmax_hist.size()) + " bins, expected " +
        std::to_string(ChannelStats::kHistBins));
  int64_t sum = 0;
  for (int64_t v : s.token_absmax_hist) {
    if (v < 0) bad("negative histogram count");
    sum += v;
  }
  if (sum != s.tokens) bad("token_absmax_hist sums to " + std::to_string(sum) + ", but tokens = " + std::to_string(s.tokens));
}

/// Fisher data of layer `i`: all layers or none, sizes consistent (see read_calibration_h5).
void validate_fisher_for_write(const CalibrationData& data, size_t i) {
  const KVFisherSamples& f = data.layers[i].kv_fisher;
  const std::string object = layer_path(i) + "/" + kKvFisher;
  auto bad = [&](const std::string& why) { throw std::invalid_argument("write_calibration_h5: " + object + ": " + why); };
  if (!data.has_fisher()) {
    if (f.tokens != 0) bad("has Fisher data, but layer_000 has none (all layers or none)");
    return;
  }
  if (f.tokens < 1) bad("has no Fisher data, but layer_000 has (all layers or none)");
  if (data.fisher_max_tokens < f.tokens)
    bad(std::to_string(f.tokens) + " tokens exceed fisher_max_tokens = " + std::to_string(data.fisher_max_tokens));
  if (f.width != data.layers[i].keys.channels)
    bad("width " + std::to_string(f.width) + " differs from the k_cache width " + std::to_string(data.layers[i].keys.channels));
  const size_t rows = static_cast<size_t>(f.tokens), cells = static_cast<size_t>(f.tokens * f.width);
  for (const auto* m : fisher_matrices(f))
    if (m->size() != cells) bad("a [tokens, width] matrix has " + std::to_string(m->size()) + " values, expected " + std::to_string(cells));
  if (f.positions.size() != rows || f.windows.size() != rows) bad("positions/windows must hold `tokens` values");
}

void validate_for_write(const CalibrationData& data) {
  if (data.layers.empty()) throw std::invalid_argument("write_calibration_h5: no layers");
  auto fail = [](const std::string& object, const std::string& why) {
    throw std::invalid_argument("write_calibration_h5: " + object + " " + why);
  };
  for (size_t i = 0; i < data.layers.size(); ++i) {
    const LayerStats& l = data.layers[i];
    const std::string prefix = layer_path(i) + "/";
    if (l.inputs.size() != static_cast<size_t>(kActivationSites))
      throw std::invalid_argument("write_calibration_h5: " + prefix + " has " + std::to_string(l.inputs.size()) +
                                  " input sites, expected " + std::to_string(kActivationSites));
    if (l.output_absmax.size() != static_cast<size_t>(kProjections))
      throw std::invalid_argument("write_calibration_h5: " + prefix + " has " + std::to_string(l.output_absmax.size()) +
                                  " output vectors, expected " + std::to_string(kProjections));
    if (!l.hessians.empty()) {
      if (l.hessians.size() != size_t(kActivationSites))
        throw std::invalid_argument("write_calibration_h5: a layer has " + std::to_string(l.hessians.size()) + " Hessians, expected 4");
      for (int s2 = 0; s2 < kActivationSites; ++s2) {
        const int64_t c = l.inputs[static_cast<size_t>(s2)].channels;
        if (static_cast<int64_t>(l.hessians[static_cast<size_t>(s2)].size()) != c * c)
          throw std::invalid_argument("write_calibration_h5: Hessian of site " + std::to_string(s2) + " is not [C, C]");
      }
      if (l.hessian_tokens < 1) throw std::invalid_argument("write_calibration_h5: hessian_tokens must be ≥ 1");
    }
    for (int s = 0; s < kActivationSites; ++s)
      validate_channel_stats_for_write(l.inputs[static_cast<size_t>(s)],
                                       prefix + site_name(s));
    validate_channel_stats_for_write(l.keys, prefix + kKCache);
    validate_channel_stats_for_write(l.values, prefix + kVCache);
    validate_fisher_for_write(data, i);
    check_layer_widths(l, prefix, fail);
    if (i > 0) check_same_widths(data.layers[0], l, prefix, fail);
  }
}

// ---------------------------------------------------------------------------------------------
// Reader

const char* class_name(H5T_class_t c) {
  switch (c) {
    case H5T_INTEGER: return "integer";
    case H5T_FLOAT: return "float";
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    case H5T_ARRAY: return "array";
    case H5T_ENUM: return "enum";
    default: return "non-numeric";
  }
}

/// What a dataset or attribute must hold.
struct Expect {
  H5T_class_t cls;
  size_t size;     // bytes per element
  bool is_signed;  // integers only
  hid_t mem_type;
  const char* name;  // for messages: "float32", "int64", ...
};
const Expect kF32{H5T_FLOAT, 4, true, H5T_NATIVE_FLOAT, "float32"};
const Expect kF64{H5T_FLOAT, 8, true, H5T_NATIVE_DOUBLE, "float64"};
const Expect kI64{H5T_INTEGER, 8, true, H5T_NATIVE_INT64, "int64"};
const Expect kI32{H5T_INTEGER, 4, true, H5T_NATIVE_INT32, "int32"};

class Reader {
 public:
  explicit Reader(std::string path, CalibrationHessians hessians = CalibrationHessians::Read)
      : path_(std::move(path)), hessians_(hessians) {}

  CalibrationData read() {
    open_file();
    return read_rest();
  }

  /// Opens the file (once), checking that it exists, is no directory and is HDF5.
  void open_file() {
    if (file_.valid()) return;
    {
      std::error_code ec;
      if (std::filesystem::is_directory(path_, ec)) throw InputError("cannot read " + path_ + ": it is a directory");
      std::FILE* f = std::fopen(path_.c_str(), "rb");
      if (!f) throw InputError("cannot open " + path_ + ": " + std::strerror(errno));
      std::fclose(f);
    }
    const htri_t is_h5 = H5Fis_hdf5(path_.c_str());
    if (is_h5 <= 0) {
      const std::string detail = hdf5_error();
      throw InputError(path_ + ": not an HDF5 file (a sqkit calibration file is HDF5)" +
                       (detail.empty() ? "" : ": " + detail));
    }
    file_ = Hid(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (!file_.valid()) {
      const std::string detail = hdf5_error();
      throw InputError(path_ + ": corrupt or truncated HDF5 file" + (detail.empty() ? "" : ": " + detail));
    }
  }

  /// Layer i's Hessians (4 sites; widths from `stats`), each checked for size and finiteness.
  std::vector<std::vector<double>> layer_hessians(size_t i, const LayerStats& stats) {
    open_file();
    const std::string lname = layer_path(i);
    Hid lg = open_group(file_.get(), lname);
    std::vector<std::vector<double>> out(kActivationSites);
    for (int s = 0; s < kActivationSites; ++s) {
      const std::string gname = lname + "/" + site_name(s);
      Hid g = open_group(lg.get(), gname);
      const htri_t has_h = H5Lexists(g.get(), "hessian", H5P_DEFAULT);
      check(has_h >= 0, gname + "/hessian");
      if (has_h == 0) fail(gname + "/hessian", "is missing (record the Hessians with sq-calibrate --hessian)");
      out[static_cast<size_t>(s)] = site_hessian(g.get(), gname, stats.inputs[static_cast<size_t>(s)].channels, true);
    }
    return out;
  }

 private:
  /// A site's hessian dataset, checked to hold c² values (and, when read, finite ones); `read`
  /// false checks the declared size only and returns nothing.
  std::vector<double> site_hessian(hid_t g, const std::string& gname, int64_t c, bool read) {
    hsize_t dims[1] = {0};
    std::vector<double> H = dataset_of_rank<double>(g, gname + "/hessian", kF64, 1, dims, nullptr, read);
    if (static_cast<int64_t>(dims[0]) != c * c)
      fail(gname + "/hessian", "has " + std::to_string(dims[0]) + " entries, expected " + std::to_string(c) + "² = " +
                                   std::to_string(c * c) + " (absmax length squared)");
    for (double v : H)
      if (!std::isfinite(v)) fail(gname + "/hessian", "holds a non-finite value");
    return H;
  }

 public:
  CalibrationData read_rest() {
    const hid_t root = file_.get();
    CalibrationData data;
    if (H5Aexists(root, "format") <= 0)
      throw InputError(path_ + ": not a sqkit calibration file (no root attribute \"format\")");
    const std::string format = attr_string(root, "/", "format");
    if (format != kFormatName)
      throw InputError(path_ + ": not a sqkit calibration file (root attribute format is \"" + format +
                       "\", expected \"" + kFormatName + "\")");
    const int64_t version = attr_int(root, "/", "format_version");
    if (version != kCalibrationFormatVersion)
      throw UnsupportedError(path_ + ": calibration format version " + std::to_string(version) +
                             " is not supported (this sqkit reads version " +
                             std::to_string(kCalibrationFormatVersion) + ")");
    CalibrationProvenance& p = data.provenance;
    p.model_fingerprint = attr_string(root, "/", "model_fingerprint");
    p.text_path = attr_string(root, "/", "text_path");
    p.text_sha256 = attr_string(root, "/", "text_sha256");
    const htri_t has_text_format = H5Aexists(root, kTextFormatAttr);
    check(has_text_format >= 0, "/");
    if (has_text_format > 0) {
      p.text_format = attr_string(root, "/", kTextFormatAttr);
      if (p.text_format != kTextFormatTokenIds)
        throw InputError(path_ + ": root attribute text_format is \"" + p.text_format + "\", expected \"" + kTextFormatTokenIds +
                         "\" (or no attribute, for a text)");
    }
    p.samples = attr_int(root, "/", "samples");
    p.seq_len = attr_int(root, "/", "seq_len");
    p.seed = attr_uint(root, "/", "seed");
    p.sqkit_version = attr_string(root, "/", "sqkit_version");
    p.created = attr_string(root, "/", "created");
    const htri_t has_fisher = H5Aexists(root, kFisherMaxTokensAttr);
    check(has_fisher >= 0, "/");
    if (has_fisher > 0) {
      data.fisher_max_tokens = attr_int(root, "/", kFisherMaxTokensAttr);
      data.fisher_mean_loss = attr_f64(root, "/", kFisherMeanLossAttr);
    }

    const size_t n_layers = count_layers(root);
    data.layers.resize(n_layers);
    for (size_t i = 0; i < n_layers; ++i) {
      LayerStats& l = data.layers[i];
      const std::string lname = layer_path(i);
      Hid lg = open_group(root, lname);
      l.inputs.resize(kActivationSites);
      for (int s = 0; s < kActivationSites; ++s) {
        const std::string gname = lname + "/" + site_name(s);
        Hid g = open_group(lg.get(), gname);
        const std::string linears = attr_string(g.get(), gname, "linears");
        if (linears != kSiteLinears[s])
          fail(gname, "attribute linears is \"" + linears + "\", expected \"" + kSiteLinears[s] + "\"");
        l.inputs[static_cast<size_t>(s)] = channel_stats(g.get(), gname);
        const htri_t has_h = H5Lexists(g.get(), "hessian", H5P_DEFAULT);
        check(has_h >= 0, gname + "/hessian");
        if (s > 0 && (has_h > 0) != !l.hessians.empty())
          fail(gname + "/hessian", has_h > 0 ? "exists, but attn_input has none" : "is missing, but attn_input has one");
        if (has_h > 0) {
          std::vector<double> H = site_hessian(g.get(), gname, l.inputs[static_cast<size_t>(s)].channels,
                                               hessians_ == CalibrationHessians::Read);
          const int64_t tokens = attr_int(g.get(), gname, "hessian_tokens");
          if (tokens < 1) fail(gname, "attribute hessian_tokens must be ≥ 1, got " + std::to_string(tokens));
          l.hessian_tokens = tokens;
          if (l.hessians.empty()) l.hessians.resize(kActivationSites);
          l.hessians[static_cast<size_t>(s)] = std::move(H);
        }
      }
      {
        const std::string gname = lname + "/" + kOutputs;
        Hid g = open_group(lg.get(), gname);
        l.output_absmax.resize(kProjections);
        for (int pr = 0; pr < kProjections; ++pr)
          l.output_absmax[static_cast<size_t>(pr)] =
              dataset<float>(g.get(), gname + "/" + proj_name(pr), kF32);
      }
      {
        const std::string gname = lname + "/" + kKCache;
        Hid g = open_group(lg.get(), gname);
        l.keys = channel_stats(g.get(), gname);
      }
      {
        const std::string gname = lname + "/" + kVCache;
        Hid g = open_group(lg.get(), gname);
        l.values = channel_stats(g.get(), gname);
      }
      {
        const std::string gname = lname + "/" + kKvFisher;
        const htri_t exists = H5Lexists(lg.get(), kKvFisher, H5P_DEFAULT);
        check(exists >= 0, gname);
        if ((exists > 0) != (has_fisher > 0))
          fail(gname, exists > 0 ? "exists, but the root attribute " + std::string(kFisherMaxTokensAttr) +
                                       " is missing (Fisher data must be in every layer or none)"
                                 : "is missing, but the root attribute " + std::string(kFisherMaxTokensAttr) +
                                       " says the file has Fisher data (it must be in every layer)");
        if (exists > 0) {
          Hid g = open_group(lg.get(), gname);
          l.kv_fisher = kv_fisher(g.get(), gname, l.keys.channels);
          check_calibration_kv_fisher(l.kv_fisher, l.keys.channels, data.fisher_max_tokens, data.provenance,
                                      i == 0 ? nullptr : &data.layers[0].kv_fisher, gname, path_);
        }
      }
      check_calibration_layer(data.layers, i, path_);
    }
    return data;
  }

 private:
  [[noreturn]] void fail(const std::string& object, const std::string& why) const {
    throw InputError(path_ + ": " + object + " " + why);
  }

  /// Fails with the HDF5 detail when `ok` is false (a read error in an object that exists).
  void check(bool ok, const std::string& object) const {
    if (ok) return;
    const std::string detail = hdf5_error();
    fail(object, "cannot be read (corrupt or truncated file)" + (detail.empty() ? "" : ": " + detail));
  }

  size_t count_layers(hid_t root) {
    H5G_info_t info{};
    check(H5Gget_info(root, &info) >= 0, "/");
    std::vector<std::string> names;
    for (hsize_t k = 0; k < info.nlinks; ++k) {
      const ssize_t len = H5Lget_name_by_idx(root, ".", H5_INDEX_NAME, H5_ITER_INC, k, nullptr, 0, H5P_DEFAULT);
      check(len >= 0, "/");
      std::string name(static_cast<size_t>(len) + 1, '\0');
      check(H5Lget_name_by_idx(root, ".", H5_INDEX_NAME, H5_ITER_INC, k, name.data(), name.size(), H5P_DEFAULT) >= 0,
            "/");
      name.resize(static_cast<size_t>(len));
      names.push_back(std::move(name));
    }
    return calibration_layer_count(names, path_);
  }

  Hid open_group(hid_t parent, const std::string& name) {
    const std::string leaf = name.substr(name.rfind('/') + 1);
    const htri_t exists = H5Lexists(parent, leaf.c_str(), H5P_DEFAULT);
    check(exists >= 0, name);
    if (exists == 0) fail(name, "is missing (expected a group)");
    Hid g(H5Gopen2(parent, leaf.c_str(), H5P_DEFAULT), H5Gclose);
    if (!g.valid()) fail(name, "is not a group (or cannot be read)");
    return g;
  }

  /// Opens attribute `name` of `obj` and checks it holds exactly `count` elements (0: scalar or
  /// one element).
  Hid open_attr(hid_t obj, const std::string& obj_name, const char* name, hsize_t count, std::string& what) {
    what = (obj_name == "/" ? "root attribute " : obj_name + " attribute ") + std::string(name);
    const htri_t exists = H5Aexists(obj, name);
    check(exists >= 0, what);
    if (exists == 0) {
      if (obj_name == "/") throw InputError(path_ + ": " + what + " is missing");
      fail(what, "is missing");
    }
    Hid a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
    check(a.valid(), what);
    Hid space(H5Aget_space(a.get()), H5Sclose);
    check(space.valid(), what);
    const hssize_t n = H5Sget_simple_extent_npoints(space.get());
    const int rank = H5Sget_simple_extent_ndims(space.get());
    const hsize_t want = count == 0 ? 1 : count;
    if (n != static_cast<hssize_t>(want) || (count > 0 && rank != 1))
      fail(what, count == 0 ? "must be a single value" : "must hold " + std::to_string(count) + " values");
    return a;
  }

  void check_type(hid_t type, const std::string& what, H5T_class_t cls, size_t size, bool is_signed,
                  const char* expected) const {
    const H5T_class_t c = H5Tget_class(type);
    const size_t sz = H5Tget_size(type);
    bool ok = c == cls && sz == size;
    if (ok && c == H5T_INTEGER) ok = (H5Tget_sign(type) == H5T_SGN_2) == is_signed;
    if (!ok) {
      std::string got = class_name(c);
      if (c == H5T_INTEGER || c == H5T_FLOAT) got += std::to_string(sz * 8);
      if (c == H5T_INTEGER && H5Tget_sign(type) == H5T_SGN_NONE) got = "u" + got;
      fail(what, "has dtype " + got + ", expected " + expected);
    }
  }

  std::string attr_string(hid_t obj, const std::string& obj_name, const char* name) {
    std::string what;
    Hid a = open_attr(obj, obj_name, name, 0, what);
    Hid type(H5Aget_type(a.get()), H5Tclose);
    check(type.valid(), what);
    if (H5Tget_class(type.get()) != H5T_STRING) fail(what, "must be a string");
    const htri_t vlen = H5Tis_variable_str(type.get());
    check(vlen >= 0, what);
    if (vlen > 0) {
      Hid mem(H5Tcopy(H5T_C_S1), H5Tclose);
      check(mem.valid() && H5Tset_size(mem.get(), H5T_VARIABLE) >= 0 &&
                H5Tset_cset(mem.get(), H5Tget_cset(type.get())) >= 0,
            what);
      char* ptr = nullptr;
      check(H5Aread(a.get(), mem.get(), &ptr) >= 0, what);
      std::string out = ptr ? ptr : "";
      if (ptr) H5free_memory(ptr);
      return out;
    }
    const size_t size = H5Tget_size(type.get());
    if (size > file_size()) fail(what, "declares a " + std::to_string(size) + "-byte string, longer than the whole file");
    std::string out(size, '\0');
    if (size > 0) check(H5Aread(a.get(), type.get(), out.data()) >= 0, what);
    const size_t nul = out.find('\0');
    if (nul != std::string::npos) out.resize(nul);
    return out;
  }

  /// Integer attribute read as T (int64_t or uint64_t; HDF5 converts from the stored width).
  template <typename T>
  T attr_integer(hid_t obj, const std::string& obj_name, const char* name) {
    static_assert(std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>);
    std::string what;
    Hid a = open_attr(obj, obj_name, name, 0, what);
    Hid type(H5Aget_type(a.get()), H5Tclose);
    check(type.valid(), what);
    if (H5Tget_class(type.get()) != H5T_INTEGER) fail(what, "must be an integer");
    T v = 0;
    check(H5Aread(a.get(), std::is_same_v<T, int64_t> ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT64, &v) >= 0, what);
    return v;
  }
  int64_t attr_int(hid_t obj, const std::string& obj_name, const char* name) { return attr_integer<int64_t>(obj, obj_name, name); }
  uint64_t attr_uint(hid_t obj, const std::string& obj_name, const char* name) { return attr_integer<uint64_t>(obj, obj_name, name); }

  float attr_f32(hid_t obj, const std::string& obj_name, const char* name) {
    std::string what;
    Hid a = open_attr(obj, obj_name, name, 0, what);
    Hid type(H5Aget_type(a.get()), H5Tclose);
    check(type.valid(), what);
    check_type(type.get(), what, H5T_FLOAT, 4, true, "float32");
    float v = 0;
    check(H5Aread(a.get(), H5T_NATIVE_FLOAT, &v) >= 0, what);
    return v;
  }

  void attr_f64_vector(hid_t obj, const std::string& obj_name, const char* name, hsize_t count) {
    std::string what;
    Hid a = open_attr(obj, obj_name, name, count, what);
    Hid type(H5Aget_type(a.get()), H5Tclose);
    check(type.valid(), what);
    check_type(type.get(), what, H5T_FLOAT, 8, true, "float64");
    std::vector<double> v(count);
    check(H5Aread(a.get(), H5T_NATIVE_DOUBLE, v.data()) >= 0, what);
  }

  /// Reads the 1-D dataset `name` (full path for messages; the leaf is opened in `parent`).
  /// `ds_out`, when given, receives the open dataset.
  template <typename T>
  std::vector<T> dataset(hid_t parent, const std::string& name, const Expect& e, Hid* ds_out = nullptr) {
    hsize_t dims[1] = {0};
    return dataset_of_rank<T>(parent, name, e, 1, dims, ds_out);
  }

  /// Reads the 2-D dataset `name` as row-major [rows, cols], checking both dimensions.
  template <typename T>
  std::vector<T> matrix(hid_t parent, const std::string& name, const Expect& e, int64_t rows, int64_t cols) {
    hsize_t dims[2] = {0, 0};
    std::vector<T> out = dataset_of_rank<T>(parent, name, e, 2, dims, nullptr);
    if (dims[0] != static_cast<hsize_t>(rows) || dims[1] != static_cast<hsize_t>(cols))
      fail(name, "has shape [" + std::to_string(dims[0]) + ", " + std::to_string(dims[1]) + "], expected [" +
                     std::to_string(rows) + ", " + std::to_string(cols) + "] (tokens × k_cache width)");
    return out;
  }

  /// Reads dataset `name` of rank `rank` (1 or 2) into a flat vector; `dims` receives its shape.
  template <typename T>
  std::vector<T> dataset_of_rank(hid_t parent, const std::string& name, const Expect& e, int want_rank, hsize_t* dims,
                                 Hid* ds_out, bool read = true) {
    const std::string leaf = name.substr(name.rfind('/') + 1);
    const htri_t exists = H5Lexists(parent, leaf.c_str(), H5P_DEFAULT);
    check(exists >= 0, name);
    if (exists == 0) fail(name, "is missing (expected a " + std::string(e.name) + " dataset)");
    Hid ds(H5Dopen2(parent, leaf.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.valid()) fail(name, "is not a dataset (or cannot be read)");
    Hid type(H5Dget_type(ds.get()), H5Tclose);
    check(type.valid(), name);
    check_type(type.get(), name, e.cls, e.size, e.is_signed, e.name);
    Hid space(H5Dget_space(ds.get()), H5Sclose);
    check(space.valid(), name);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    check(rank >= 0, name);
    if (rank != want_rank) fail(name, "has rank " + std::to_string(rank) + ", expected " + std::to_string(want_rank));
    check(H5Sget_simple_extent_dims(space.get(), dims, nullptr) >= 0, name);
    // sqkit writes contiguous, uncompressed datasets: a declared size beyond the whole file is
    // corrupt, and must not size an allocation (checked per dimension, then for the product).
    const hsize_t limit = file_size() / e.size;
    hsize_t count = 1;
    bool too_large = false;
    std::string declared;
    for (int k = 0; k < rank; ++k) {
      declared += (k > 0 ? " × " : "") + std::to_string(dims[k]);
      too_large = too_large || dims[k] > limit || (dims[k] > 0 && count > limit / dims[k]);
      if (!too_large) count *= dims[k];
    }
    if (too_large)
      fail(name, "declares " + declared + " elements of " + std::to_string(e.size) + " bytes, more than the whole file (" +
                     std::to_string(file_size()) + " bytes; file corrupt)");
    if (!read) return {};
    std::vector<T> out(static_cast<size_t>(count));
    if (!out.empty()) check(H5Dread(ds.get(), e.mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) >= 0, name);
    if (ds_out) *ds_out = std::move(ds);
    return out;
  }

  double attr_f64(hid_t obj, const std::string& obj_name, const char* name) {
    std::string what;
    Hid a = open_attr(obj, obj_name, name, 0, what);
    Hid type(H5Aget_type(a.get()), H5Tclose);
    check(type.valid(), what);
    check_type(type.get(), what, H5T_FLOAT, 8, true, "float64");
    double v = 0;
    check(H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v) >= 0, what);
    return v;
  }

  /// The datasets of a kv_fisher group (shapes checked here; values by check_calibration_kv_fisher).
  KVFisherSamples kv_fisher(hid_t g, const std::string& gname, int64_t width) {
    KVFisherSamples f;
    f.tokens = attr_int(g, gname, "tokens");
    if (f.tokens < 1) fail(gname, "attribute tokens must be ≥ 1, got " + std::to_string(f.tokens));
    f.width = width;
    const auto mats = fisher_matrices(f);
    for (int m = 0; m < 4; ++m)
      *mats[static_cast<size_t>(m)] = matrix<float>(g, gname + "/" + kFisherMatrices[m], kF32, f.tokens, width);
    f.positions = dataset<int32_t>(g, gname + "/" + kFisherPositions, kI32);
    f.windows = dataset<int32_t>(g, gname + "/" + kFisherWindows, kI32);
    return f;
  }

  ChannelStats channel_stats(hid_t g, const std::string& gname) {
    ChannelStats s;
    s.absmax = dataset<float>(g, gname + "/absmax", kF32);
    if (s.absmax.empty()) fail(gname + "/absmax", "is empty");
    s.min = dataset<float>(g, gname + "/min", kF32);
    s.max = dataset<float>(g, gname + "/max", kF32);
    s.sum_sq = dataset<double>(g, gname + "/sum_sq", kF64);
    s.channels = static_cast<int64_t>(s.absmax.size());
    s.token_absmax_hist = dataset<int64_t>(g, gname + "/token_absmax_hist", kI64);
    Hid pct_ds;
    const std::vector<float> pct = dataset<float>(g, gname + "/token_absmax_percentiles", kF32, &pct_ds);
    if (pct.size() == kTokenAbsmaxPercentiles.size())
      attr_f64_vector(pct_ds.get(), gname + "/token_absmax_percentiles", "percent", kTokenAbsmaxPercentiles.size());
    s.tokens = attr_int(g, gname, "tokens");
    s.tensor_absmax = attr_f32(g, gname, "tensor_absmax");
    check_calibration_channel_stats(s, pct.size(), gname, path_);
    return s;
  }

  /// Size of the open file in bytes (bounds every allocation sized from the file).
  uint64_t file_size() {
    if (file_size_ == 0) {
      hsize_t n = 0;
      check(H5Fget_filesize(file_.get(), &n) >= 0, "/");
      file_size_ = static_cast<uint64_t>(n);
    }
    return file_size_;
  }

  std::string path_;
  Hid file_;
  CalibrationHessians hessians_ = CalibrationHessians::Read;
  uint64_t file_size_ = 0;
};

}  // namespace

size_t calibration_layer_count(const std::vector<std::string>& root_links, const std::string& path) {
  auto fail = [&](const std::string& object, const std::string& why) { throw InputError(path + ": " + object + " " + why); };
  std::vector<size_t> indices;
  for (const std::string& name : root_links) {
    if (name.rfind("layer_", 0) != 0) continue;  // not a layer group: ignored
    const std::string digits = name.substr(6);
    bool ok = !digits.empty() && digits.size() <= 9;
    for (char c : digits) ok = ok && c >= '0' && c <= '9';
    const size_t index = ok ? static_cast<size_t>(std::stoul(digits)) : 0;
    if (!ok || layer_name(index) != name)
      fail("/" + name, "is not a valid layer group name (expected layer_000, layer_001, ...)");
    indices.push_back(index);
  }
  if (indices.empty()) fail("/", "has no layer groups (expected /layer_000, /layer_001, ...)");
  std::sort(indices.begin(), indices.end());
  for (size_t i = 0; i < indices.size(); ++i)
    if (indices[i] != i)
      fail(layer_path(i), "is missing: layer groups must be contiguous from /layer_000 (found up to " +
                              layer_path(indices.back()) + ")");
  return indices.size();
}

void check_calibration_channel_stats(const ChannelStats& s, size_t percentiles, const std::string& group,
                                     const std::string& path) {
  auto fail = [&](const std::string& object, const std::string& why) { throw InputError(path + ": " + object + " " + why); };
  const size_t c = s.absmax.size();
  if (c == 0) fail(group + "/absmax", "is empty");
  const std::pair<const char*, size_t> lens[] = {{"min", s.min.size()}, {"max", s.max.size()}, {"sum_sq", s.sum_sq.size()}};
  for (const auto& [n, len] : lens)
    if (len != c)
      fail(group + "/" + n, "has length " + std::to_string(len) + ", expected " + std::to_string(c) + " (the length of " +
                                group + "/absmax)");
  if (s.channels != static_cast<int64_t>(c))
    fail(group + "/absmax", "has length " + std::to_string(c) + ", but the statistics claim " +
                                std::to_string(s.channels) + " channels");
  if (s.token_absmax_hist.size() != static_cast<size_t>(ChannelStats::kHistBins))
    fail(group + "/token_absmax_hist", "has " + std::to_string(s.token_absmax_hist.size()) + " bins, expected " +
                                           std::to_string(ChannelStats::kHistBins));
  if (percentiles != kTokenAbsmaxPercentiles.size())
    fail(group + "/token_absmax_percentiles", "has length " + std::to_string(percentiles) + ", expected " +
                                                  std::to_string(kTokenAbsmaxPercentiles.size()));
  if (s.tokens < 0) fail(group, "attribute tokens is negative");
  int64_t sum = 0;
  for (int64_t v : s.token_absmax_hist) {
    if (v < 0) fail(group + "/token_absmax_hist", "has a negative count");
    // Counts are non-negative and must sum to `tokens`: one above what is left cannot (and the
    // running sum never overflows).
    if (v > s.tokens - sum)
      fail(group + "/token_absmax_hist", "sums to more than the " + std::to_string(s.tokens) + " tokens of attribute tokens");
    sum += v;
  }
  if (sum != s.tokens)
    fail(group + "/token_absmax_hist", "sums to " + std::to_string(sum) + " tokens, but attribute tokens is " +
                                           std::to_string(s.tokens));
}

void check_calibration_layer(const std::vector<LayerStats>& layers, size_t i, const std::string& path) {
  auto fail = [&](const std::string& object, const std::string& why) { throw InputError(path + ": " + object + " " + why); };
  const std::string prefix = layer_path(i) + "/";
  if (i >= layers.size()) fail(prefix, "does not exist (" + std::to_string(layers.size()) + " layers)");
  for (size_t k : {size_t(0), i}) {
    const LayerStats& l = layers[k];
    if (l.inputs.size() != static_cast<size_t>(kActivationSites) ||
        l.output_absmax.size() != static_cast<size_t>(kProjections))
      fail(layer_path(k) + "/", "has " + std::to_string(l.inputs.size()) + " input sites and " +
                                    std::to_string(l.output_absmax.size()) + " output vectors, expected " +
                                    std::to_string(kActivationSites) + " and " + std::to_string(kProjections));
  }
  check_layer_widths(layers[i], prefix, fail);
  if (i > 0) check_same_widths(layers[0], layers[i], prefix, fail);
}

void check_calibration_kv_fisher(const KVFisherSamples& f, int64_t kv_width, int64_t max_tokens,
                                 const CalibrationProvenance& provenance, const KVFisherSamples* layer0,
                                 const std::string& group, const std::string& path) {
  auto fail = [&](const std::string& object, const std::string& why) { throw InputError(path + ": " + object + " " + why); };
  if (max_tokens < 1) fail("root attribute " + std::string(kFisherMaxTokensAttr), "must be ≥ 1, got " + std::to_string(max_tokens));
  if (f.tokens < 1 || f.tokens > max_tokens)
    fail(group, "attribute tokens is " + std::to_string(f.tokens) + ", expected 1 … " + std::to_string(max_tokens) +
                    " (root attribute " + kFisherMaxTokensAttr + ")");
  if (f.width != kv_width)
    fail(group, "has width " + std::to_string(f.width) + ", expected " + std::to_string(kv_width) + " (the k_cache width)");
  const size_t rows = static_cast<size_t>(f.tokens), cells = rows * static_cast<size_t>(kv_width);
  const auto mats = fisher_matrices(f);
  for (int m = 0; m < 4; ++m) {
    const std::vector<float>& v = *mats[static_cast<size_t>(m)];
    const std::string object = group + "/" + kFisherMatrices[m];
    if (v.size() != cells)
      fail(object, "has " + std::to_string(v.size()) + " values, expected " + std::to_string(rows) + " × " +
                       std::to_string(kv_width) + " (tokens × k_cache width)");
    const bool weights = m % 2 == 1;
    for (float x : v) {
      if (!std::isfinite(x)) fail(object, "holds a non-finite value");
      if (weights && x < 0) fail(object, "holds a negative Fisher weight");
    }
  }
  const std::pair<const char*, const std::vector<int32_t>*> lists[] = {{kFisherPositions, &f.positions},
                                                                        {kFisherWindows, &f.windows}};
  for (const auto& [name, v] : lists)
    if (v->size() != rows)
      fail(group + "/" + name, "has length " + std::to_string(v->size()) + ", expected " + std::to_string(rows) +
                                   " (attribute tokens)");
  for (size_t r = 0; r < rows; ++r) {
    const int64_t pos = f.positions[r], win = f.windows[r];
    if (pos < 0 || pos > provenance.seq_len - 2)
      fail(group + "/" + kFisherPositions, "holds position " + std::to_string(pos) + ", expected 0 … " +
                                               std::to_string(provenance.seq_len - 2) + " (seq_len − 2)");
    if (win < 0 || win >= provenance.samples)
      fail(group + "/" + kFisherWindows, "holds window " + std::to_string(win) + ", expected 0 … " +
                                             std::to_string(provenance.samples - 1) + " (samples − 1)");
    if (r > 0 && std::make_pair(win, pos) <= std::make_pair(int64_t(f.windows[r - 1]), int64_t(f.positions[r - 1])))
      fail(group, "tokens are not in strictly increasing (window, position) order at row " + std::to_string(r));
  }
  if (layer0 && (f.positions != layer0->positions || f.windows != layer0->windows))
    fail(group, "holds other tokens than /layer_000/kv_fisher (every layer stores the same tokens)");
}

void write_calibration_h5(const std::string& path, const CalibrationData& data) {
  validate_for_write(data);
  silence_hdf5();
  write_file_atomic_with(path, [&](const std::string& tmp) {
    Writer w(path, tmp);
    w.write(data);
  });
}

struct CalibrationH5Writer::Impl {
  AtomicFile file;
  Writer writer;
  explicit Impl(const std::string& path) : file(path), writer(path, file.temp_path()) {}
};

CalibrationH5Writer::CalibrationH5Writer(const std::string& path) : path_(path) {
  silence_hdf5();
  impl_ = std::make_unique<Impl>(path);
}

CalibrationH5Writer::~CalibrationH5Writer() = default;

void CalibrationH5Writer::write_hessians(int layer, const std::vector<std::vector<double>>& hessians, int64_t tokens) {
  if (!impl_) throw std::logic_error("CalibrationH5Writer::write_hessians after finish");
  if (layer < 0) throw std::invalid_argument("CalibrationH5Writer: negative layer " + std::to_string(layer));
  if (hessians.size() != size_t(kActivationSites))
    throw std::invalid_argument("CalibrationH5Writer: layer " + std::to_string(layer) + " has " + std::to_string(hessians.size()) +
                                " Hessians, expected " + std::to_string(kActivationSites));
  for (size_t s = 0; s < hessians.size(); ++s) {
    const auto c = static_cast<int64_t>(std::llround(std::sqrt(double(hessians[s].size()))));
    if (hessians[s].empty() || c * c != static_cast<int64_t>(hessians[s].size()))
      throw std::invalid_argument("CalibrationH5Writer: Hessian of layer " + std::to_string(layer) + " site " + site_name(int(s)) +
                                  " is not [C, C]");
  }
  if (tokens < 1) throw std::invalid_argument("CalibrationH5Writer: hessian_tokens must be ≥ 1");
  impl_->writer.write_hessians(static_cast<size_t>(layer), hessians, tokens);
}

void CalibrationH5Writer::finish(const CalibrationData& data) {
  if (!impl_) throw std::logic_error("CalibrationH5Writer::finish called twice");
  validate_for_write(data);
  const std::vector<bool>& early = impl_->writer.early_hessians();
  if (early.size() > data.layers.size())
    throw std::invalid_argument("write_calibration_h5: Hessians were written for layer " + std::to_string(early.size() - 1) + ", but there are " +
                                std::to_string(data.layers.size()) + " layers");
  for (size_t i = 0; i < early.size(); ++i)
    if (early[i] && !data.layers[i].hessians.empty())
      throw std::invalid_argument("write_calibration_h5: layer " + std::to_string(i) + " carries Hessians already written");
  impl_->writer.write(data);
  impl_->file.commit();
  impl_.reset();
}

CalibrationData read_calibration_h5(const std::string& path, CalibrationHessians hessians) {
  silence_hdf5();
  return Reader(path, hessians).read();
}

std::vector<std::vector<double>> read_calibration_hessians(const std::string& path, int layer, const LayerStats& stats) {
  silence_hdf5();
  if (layer < 0) throw std::invalid_argument("read_calibration_hessians: negative layer");
  if (stats.inputs.size() != size_t(kActivationSites))
    throw std::invalid_argument("read_calibration_hessians: statistics without the 4 input sites");
  return Reader(path).layer_hessians(static_cast<size_t>(layer), stats);
}

}  // namespace sq
