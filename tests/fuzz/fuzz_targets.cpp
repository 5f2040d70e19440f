#include "tests/fuzz/fuzz_targets.h"

#include <stdlib.h>  // mkdtemp
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "calib/activation_stats.h"
#include "calib/convert_spec.h"
#include "core/error.h"
#include "formats/calibration_h5.h"
#include "formats/gguf_dequantize.h"
#include "formats/bpe_tokenizer.h"
#include "formats/gguf_file.h"
#include "formats/tokenizer.h"
#include "formats/utf8.h"
#include "formats/hf_checkpoint.h"
#include "formats/hf_config.h"
#include "formats/llama2c_checkpoint.h"
#include "formats/llama2c_tokenizer.h"
#include "formats/mapped_file.h"
#include "formats/safetensors.h"
#include "formats/sqm_file.h"
#include "formats/token_ids_file.h"
#include "model/observer.h"  // kActivationSites, kProjections (constants only)
#include "tests/support/gguf_writer.h"

namespace sq::fuzz {

namespace {

// The names the inputs are given; every rejection message must contain the one of its reader.
constexpr const char* kSafetensorsSource = "fuzz-input.safetensors";
constexpr const char* kConfigSource = "fuzz-input/config.json";
constexpr const char* kIndexSource = "fuzz-input/model.safetensors.index.json";
constexpr const char* kCheckpointSource = "fuzz-input-llama2c.bin";
constexpr const char* kTokenizerSource = "fuzz-input-tokenizer.bin";
constexpr const char* kSqmSource = "fuzz-input.sqm";
constexpr const char* kCalibrationSource = "fuzz-input.h5";
constexpr const char* kTokenIdsSource = "fuzz-input-ids.txt";
constexpr const char* kGgufSource = "fuzz-input.gguf";

/// Keeps the compiler from dropping reads whose only purpose is to let AddressSanitizer check them.
volatile float g_sink = 0.0f;

/// Runs `fn`; a sq::InputError is a proper rejection when its message names `source`, anything
/// else escapes.
template <typename Fn>
void expect_input_error_or_success(const char* source, Fn&& fn) {
  try {
    fn();
  } catch (const InputError& e) {
    if (std::string_view(e.what()).find(source) == std::string_view::npos)
      throw FuzzFinding(std::string("rejection message does not name the input '") + source + "': " + e.what());
  }
}

/// Reads every float of `t` (bounds-checked by the sanitizers).
void touch(const Tensor& t) {
  float acc = 0.0f;
  const float* p = t.data();
  for (int64_t i = 0; i < t.numel(); ++i) acc += p[i];
  g_sink = g_sink + acc;
}

std::string_view as_text(const uint8_t* data, size_t size) {
  return size == 0 ? std::string_view() : std::string_view(reinterpret_cast<const char*>(data), size);
}

/// Reads little-endian values from the fuzz bytes; past the end every read gives zeros.
class ByteStream {
 public:
  ByteStream(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint16_t u16() { return static_cast<uint16_t>(u8() | (u8() << 8)); }
  int64_t i64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(u8()) << (8 * i);
    return static_cast<int64_t>(v);
  }
  std::string str(size_t n) {
    std::string s;
    for (size_t i = 0; i < n && pos_ < size_; ++i) s += static_cast<char>(data_[pos_++]);
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

/// Appends little-endian values (the encoder of ByteStream, for seeds).
struct ByteWriter {
  std::string out;
  void u8(unsigned v) { out += static_cast<char>(v & 0xff); }
  void u16(unsigned v) {
    u8(v);
    u8(v >> 8);
  }
  void i64(int64_t v) {
    for (int i = 0; i < 8; ++i) u8(static_cast<unsigned>(static_cast<uint64_t>(v) >> (8 * i)));
  }
  void i32(int32_t v) {
    for (int i = 0; i < 4; ++i) u8(static_cast<unsigned>(static_cast<uint32_t>(v) >> (8 * i)));
  }
  void f32(float v) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    i32(static_cast<int32_t>(b));
  }
};

/// A temporary directory (for seeds produced by sqkit's file writers), removed on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "sq-fuzz-seeds-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("cannot create a temporary directory for fuzz seeds");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string slurp(const std::string& path) { return read_file_to_string(path); }

// ---- calibration: the byte encoding of the validation layer's inputs ----------------------------
//
//   u8 n                         root link names, n of them, each:
//     u8 kind, u8 x              kind even: "layer_" + 3-digit x; odd: x raw bytes
//   then, for each layer the names imply (at most 8), 6 channel statistics (attn_input,
//   attn_output, ffn_input, ffn_hidden, k_cache, v_cache), each:
//     u8 absmax, u8 min, u8 max, u8 sum_sq lengths; i64 channels; u16 histogram bins;
//     u8 percentiles length; i64 tokens; u8 k, then k x (u16 bin, i64 count) histogram entries
//   then 7 u8 output-vector lengths (q, k, v, o, gate, up, down).
//   then (Fisher data; absent = u8 0, so inputs that end before it have none):
//     u8 flag (non-zero: present); i64 max_tokens, i64 seq_len, i64 samples; for each layer:
//     i64 tokens, i64 width; 4 x (u16 length, u8 value kind) for keys, keys_fisher, values,
//     values_fisher (kind % 5: 0 → 0.5, 1 → −0.5, 2 → NaN, 3 → +inf, 4 → 0); u8 length, then
//     that many (u16 window, u16 position) rows.

constexpr const char* kSiteGroups[6] = {"attn_input", "attn_output", "ffn_input", "ffn_hidden", "k_cache", "v_cache"};
constexpr size_t kMaxFuzzLayers = 8;

/// Decodes one layer's Fisher samples (see the encoding above).
KVFisherSamples decode_fisher(ByteStream& in) {
  KVFisherSamples f;
  f.tokens = in.i64();
  f.width = in.i64();
  const float kinds[5] = {0.5f, -0.5f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 0.0f};
  for (std::vector<float>* m : {&f.keys, &f.keys_fisher, &f.values, &f.values_fisher}) {
    const size_t n = in.u16();
    m->assign(n, kinds[in.u8() % 5]);
  }
  const size_t rows = in.u8();
  for (size_t r = 0; r < rows; ++r) {
    f.windows.push_back(static_cast<int16_t>(in.u16()));  // negative values reachable
    f.positions.push_back(static_cast<int16_t>(in.u16()));
  }
  return f;
}

/// Fisher data for `layers` layers of kv width `kv`: `tokens` rows (windows 0, 0, 1, 1, …;
/// positions 0, 1, 0, 1, …), all values valid for seq_len 8 and samples 4.
void encode_fisher(ByteWriter& w, int layers, int kv, int tokens) {
  w.u8(1);
  w.i64(tokens);  // max_tokens
  w.i64(8);       // seq_len
  w.i64(4);       // samples
  for (int l = 0; l < layers; ++l) {
    w.i64(tokens);
    w.i64(kv);
    for (int m = 0; m < 4; ++m) {
      w.u16(static_cast<unsigned>(tokens * kv));
      w.u8(m % 2 == 0 ? 1 : 0);  // activations −0.5, weights 0.5
    }
    w.u8(static_cast<unsigned>(tokens));
    for (int r = 0; r < tokens; ++r) {
      w.u16(static_cast<unsigned>(r / 2));
      w.u16(static_cast<unsigned>(r % 2));
    }
  }
}

ChannelStats decode_stats(ByteStream& in, size_t& percentiles) {
  ChannelStats s;
  s.absmax.assign(in.u8(), 1.0f);
  s.min.assign(in.u8(), -1.0f);
  s.max.assign(in.u8(), 1.0f);
  s.sum_sq.assign(in.u8(), 1.0);
  s.channels = in.i64();
  s.token_absmax_hist.assign(in.u16(), 0);
  percentiles = in.u8();
  s.tokens = in.i64();
  const unsigned k = in.u8();
  for (unsigned i = 0; i < k; ++i) {
    const size_t bin = in.u16();
    const int64_t count = in.i64();
    if (bin < s.token_absmax_hist.size()) s.token_absmax_hist[bin] = count;
  }
  return s;
}

void encode_stats(ByteWriter& w, int channels, int64_t tokens, bool wrong_hist = false) {
  for (int i = 0; i < 4; ++i) w.u8(static_cast<unsigned>(channels));
  w.i64(channels);
  w.u16(ChannelStats::kHistBins);
  w.u8(7);
  w.i64(tokens);
  w.u8(2);
  w.u16(3);
  w.i64(tokens / 2);
  w.u16(ChannelStats::kHistBins - 1);
  w.i64(tokens - tokens / 2 + (wrong_hist ? 1 : 0));
}

/// A calibration encoding of `layers` layers with widths d, attention output a, kv, hidden h.
std::string encode_calibration(int layers, int d, int a, int kv, int h, bool extra_name = false) {
  ByteWriter w;
  w.u8(static_cast<unsigned>(layers + (extra_name ? 1 : 0)));
  for (int i = layers - 1; i >= 0; --i) {  // HDF5 lists links by name; any order must work
    w.u8(0);
    w.u8(static_cast<unsigned>(i));
  }
  if (extra_name) {
    w.u8(1);
    w.u8(5);
    w.out += "notes";
  }
  for (int l = 0; l < layers; ++l) {
    const int widths[6] = {d, a, d, h, kv, kv};
    for (int s = 0; s < 6; ++s) encode_stats(w, widths[s], 1000 + l);
    const int outs[7] = {a, kv, kv, d, h, h, d};
    for (int o : outs) w.u8(static_cast<unsigned>(o));
  }
  return w.out;
}

// ---- llama2.c seeds ------------------------------------------------------------------------------

/// A tiny llama2.c checkpoint: legacy layout (version 0, with freq_cis) or version 1.
std::string tiny_llama2c(int version, bool shared) {
  const int dim = 8, hidden = 16, layers = 1, heads = 2, kv_heads = 1, vocab = 8, seq = 4;
  const int head_dim = dim / heads, kv = kv_heads * head_dim;
  ByteWriter w;
  if (version == 1) {
    w.i32(0x616b3432);
    w.i32(1);
  }
  for (int v : {dim, hidden, layers, heads, kv_heads, version == 0 && !shared ? -vocab : vocab, seq}) w.i32(v);
  if (version == 1) {
    w.u8(shared ? 1 : 0);
    w.out.resize(256, '\0');
  }
  int64_t floats = int64_t(vocab) * dim + layers * (2 * dim + 2 * dim * dim + 2 * kv * dim + 3 * dim * hidden) + dim;
  if (version == 0) floats += 2 * int64_t(seq) * (head_dim / 2);
  if (!shared) floats += int64_t(vocab) * dim;
  for (int64_t i = 0; i < floats; ++i) w.f32(static_cast<float>(i % 17) * 0.01f - 0.08f);
  return w.out;
}

/// A tiny tokenizer.bin: <unk>, BOS, EOS, the 256 byte pieces and a few mergeable pieces.
std::string tiny_tokenizer(bool with_byte_pieces) {
  ByteWriter w;
  w.i32(8);
  auto piece = [&](float score, const std::string& p) {
    w.f32(score);
    w.i32(static_cast<int32_t>(p.size()));
    w.out += p;
  };
  piece(0.0f, "<unk>");
  piece(0.0f, "\n<s>\n");
  piece(0.0f, "\n</s>\n");
  if (with_byte_pieces)
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", b);
      piece(0.0f, buf);
    }
  const char* pieces[] = {" ", "a", "b", "n", "o", " a", "ab", " ab", "on", " on", "ce", " once", "é"};
  float score = -1.0f;
  for (const char* p : pieces) piece(score -= 0.5f, p);
  piece(-2.0f, "ab");  // a duplicate piece maps to its last id
  return w.out;
}

// ---- sqm ------------------------------------------------------------------------------------------

/// Recomputes the header, table and preamble checksums where the preamble's offsets lie inside the
/// buffer (see sqm_file in fuzz_targets.h).
void fix_sqm_checksums(std::string& b) {
  if (b.size() < kSqmPreambleSize || b.compare(0, 8, "SQKITMDL") != 0 || b[80] != 0) return;
  auto rd64 = [&](size_t off) {
    uint64_t v;
    std::memcpy(&v, b.data() + off, 8);
    return v;
  };
  auto wr64 = [&](size_t off, uint64_t v) { std::memcpy(b.data() + off, &v, 8); };
  const uint64_t size = b.size();
  const uint64_t ho = rd64(32), hs = rd64(40), to = rd64(48), ts = rd64(56);
  if (ho <= size && hs <= size - ho) wr64(64, XXH3_64bits(b.data() + ho, hs));
  if (to <= size && ts <= size - to) wr64(72, XXH3_64bits(b.data() + to, ts));
  wr64(120, XXH3_64bits(b.data(), 120));
}

}  // namespace

// ---- entry points ---------------------------------------------------------------------------------

void safetensors(const uint8_t* data, size_t size) {
  expect_input_error_or_success(kSafetensorsSource, [&] {
    const SafetensorsFile f(MappedFile::from_bytes(data, size, kSafetensorsSource));
    for (const std::string& name : f.names()) {
      const SafetensorsTensorInfo& i = f.info(name);
      if (i.end < i.begin || f.data_start() + i.end > f.mapping()->size())
        throw FuzzFinding("accepted tensor '" + name + "' lies outside the file");
      if (i.dtype == "F32" || i.dtype == "F16" || i.dtype == "BF16") touch(f.load_f32(name));
    }
  });
}

void hf_config(const uint8_t* data, size_t size) {
  expect_input_error_or_success(kConfigSource, [&] {
    const ModelConfig c = parse_hf_config_text(as_text(data, size), kConfigSource);
    // An accepted config must round-trip through the writer unchanged, where sqkit writes its
    // architecture and structure (llama, mistral, qwen2; others are read-only).
    nlohmann::json again;
    try {
      again = nlohmann::json::parse(make_hf_config_json(c, "float32").dump());
    } catch (const UnsupportedError&) {
      return;
    }
    const ModelConfig r = parse_hf_config(again, kConfigSource);
    const bool same = r.architecture == c.architecture && r.dim == c.dim && r.hidden_dim == c.hidden_dim &&
                      r.n_layers == c.n_layers && r.n_heads == c.n_heads && r.n_kv_heads == c.n_kv_heads &&
                      r.head_dim == c.head_dim && r.vocab_size == c.vocab_size && r.max_seq_len == c.max_seq_len &&
                      r.norm_eps == c.norm_eps && r.rope_theta == c.rope_theta && r.rope_scaling == c.rope_scaling &&
                      r.tied_embeddings == c.tied_embeddings && r.qkv_bias == c.qkv_bias && r.bos_id == c.bos_id &&
                      r.eos_id == c.eos_id && r.spec == c.spec;
    if (!same) throw FuzzFinding("accepted config.json does not round-trip through make_hf_config_json: " + again.dump());
  });
}

void safetensors_index(const uint8_t* data, size_t size) {
  expect_input_error_or_success(kIndexSource, [&] {
    for (const auto& [tensor, shard] : parse_safetensors_index(as_text(data, size), kIndexSource))
      if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
          shard.find('\\') != std::string::npos || shard.find('\0') != std::string::npos)
        throw FuzzFinding("accepted a shard name that is not a plain file name: '" + shard + "'");
  });
}

void llama2c_checkpoint(const uint8_t* data, size_t size) {
  expect_input_error_or_success(kCheckpointSource, [&] {
    const Checkpoint ck = load_llama2c_checkpoint(MappedFile::from_bytes(data, size, kCheckpointSource));
    uint64_t floats = 0;
    for (const auto& [name, t] : ck.tensors) {
      touch(t);
      floats += static_cast<uint64_t>(t.numel());
    }
    if (floats * sizeof(float) > size) throw FuzzFinding("accepted checkpoint has more tensor bytes than the file");
  });
}

void llama2c_tokenizer(const uint8_t* data, size_t size) {
  expect_input_error_or_success(kTokenizerSource, [&] {
    const Llama2cTokenizer tok(data, size, kTokenizerSource);
    const std::string_view tail = as_text(data, size).substr(size > 64 ? size - 64 : 0);
    for (std::string_view text : {std::string_view("Once upon a time, there was a café.\n\xff\xc3"), tail}) {
      const std::vector<int> ids = tok.encode(text, true, true);
      int prev = tok.bos_id();
      for (int id : ids) {
        if (id < 0 || id >= tok.vocab_size()) throw FuzzFinding("encode produced token " + std::to_string(id));
        (void)tok.decode_token(prev, id);
        prev = id;
      }
    }
    for (int id = 0; id < tok.vocab_size() && id < 300; ++id) (void)tok.piece(id);
  });
}

void sqm_file(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  fix_sqm_checksums(bytes);
  expect_input_error_or_success(kSqmSource, [&] {
    const auto f = SqmFile::open(
        MappedFile::from_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), kSqmSource),
        /*verify_checksums=*/false);
    for (const SqmTensorInfo& t : f->tensors()) {
      if (t.offset + t.stored_bytes > f->file_size()) throw FuzzFinding("accepted tensor '" + t.name + "' lies outside the file");
      expect_input_error_or_success(kSqmSource, [&] {
        const SqmBytes raw = f->raw(t.name);
        if (raw.size != t.raw_bytes) throw FuzzFinding("raw() of '" + t.name + "' has the wrong size");
        uint8_t acc = 0;
        for (size_t i = 0; i < raw.size; ++i) acc ^= raw.data[i];
        g_sink = g_sink + acc;
      });
      expect_input_error_or_success(kSqmSource, [&] { f->verify_checksum(t); });
    }
  });
}

void calibration(const uint8_t* data, size_t size) {
  ByteStream in(data, size);
  std::vector<std::string> names(in.u8());
  for (std::string& n : names) {
    const uint8_t kind = in.u8(), x = in.u8();
    if (kind % 2 == 0) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "layer_%03u", static_cast<unsigned>(x));
      n = buf;
    } else {
      n = in.str(x);
    }
  }
  expect_input_error_or_success(kCalibrationSource, [&] {
    const size_t n_layers = std::min(calibration_layer_count(names, kCalibrationSource), kMaxFuzzLayers);
    std::vector<LayerStats> layers(n_layers);
    for (size_t i = 0; i < n_layers; ++i) {
      LayerStats& l = layers[i];
      ChannelStats* sites[6] = {nullptr, nullptr, nullptr, nullptr, &l.keys, &l.values};
      l.inputs.resize(kActivationSites);
      for (int s = 0; s < kActivationSites; ++s) sites[s] = &l.inputs[static_cast<size_t>(s)];
      char prefix[32];
      std::snprintf(prefix, sizeof prefix, "/layer_%03zu/", i);
      for (int s = 0; s < 6; ++s) {
        size_t percentiles = 0;
        *sites[s] = decode_stats(in, percentiles);
        check_calibration_channel_stats(*sites[s], percentiles, prefix + std::string(kSiteGroups[s]), kCalibrationSource);
      }
      l.output_absmax.resize(kProjections);
      for (auto& v : l.output_absmax) v.assign(in.u8(), 1.0f);
      check_calibration_layer(layers, i, kCalibrationSource);
    }
    if (in.u8() != 0) {  // Fisher data (sq-calibrate --fisher)
      const int64_t max_tokens = in.i64();
      CalibrationProvenance provenance;
      provenance.seq_len = in.i64();
      provenance.samples = in.i64();
      for (size_t i = 0; i < n_layers; ++i) {
        LayerStats& l = layers[i];
        l.kv_fisher = decode_fisher(in);
        char group[48];
        std::snprintf(group, sizeof group, "/layer_%03zu/kv_fisher", i);
        check_calibration_kv_fisher(l.kv_fisher, l.keys.channels, max_tokens, provenance,
                                    i == 0 ? nullptr : &layers[0].kv_fisher, group, kCalibrationSource);
      }
    }
  });
}

void convert_spec(const uint8_t* data, size_t size) {
  ConvertFlags flags;
  if (size > 0) {
    flags.alpha_given = data[0] & 1;
    flags.no_smooth = data[0] & 2;
    std::string* fields[] = {&flags.scheme, &flags.alpha, &flags.preset, &flags.weight, &flags.act};
    std::stringstream rest(std::string(as_text(data + 1, size - 1)));
    for (std::string* f : fields)
      if (!std::getline(rest, *f)) f->clear();
  }
  try {
    const ConvertSpec spec = parse_convert_flags(flags);
    if (!spec.alpha_auto && !(spec.alpha >= 0.0f && spec.alpha <= 1.0f))
      throw FuzzFinding("accepted --alpha " + flags.alpha + " outside [0, 1]");
    if (flags.no_smooth && flags.alpha_given) throw FuzzFinding("accepted --alpha together with --no-smooth");
    if (std::string(scheme_name(spec.scheme)) != flags.scheme) throw FuzzFinding("accepted --scheme " + flags.scheme);
  } catch (const UsageError& e) {
    if (std::string_view(e.what()).find("--") == std::string_view::npos)
      throw FuzzFinding(std::string("usage error does not name the option: ") + e.what());
  }
}

/// Reads every element of a GGUF metadata value (arrays recursively) so that the sanitizers check
/// each access into the mapping.
void walk_gguf_value(const GgufValue& v) {
  uint64_t acc = v.integer + v.str.size();
  if (v.type == GgufValueType::ARRAY) {
    if (v.count != v.strings.size() + v.items.size() && !v.elems)
      throw FuzzFinding("gguf array of " + std::to_string(v.count) + " elements holds none of them");
    if (v.elems) {
      for (uint64_t i = 0; i < v.count; ++i)
        acc += (v.elem_type == GgufValueType::F32 || v.elem_type == GgufValueType::F64)
                   ? static_cast<uint64_t>(v.real_element(i) != 0)
                   : v.integer_element(i);
    }
    for (std::string_view s : v.strings)
      for (char c : s) acc += static_cast<unsigned char>(c);
    for (const GgufValue& item : v.items) walk_gguf_value(item);
  }
  g_sink = g_sink + static_cast<float>(acc & 1);
}

void gguf(const uint8_t* data, size_t size) {
  expect_input_error_or_success(kGgufSource, [&] {
    const GgufFile f(MappedFile::from_bytes(data, size, kGgufSource));
    for (const auto& kv : f.metadata()) {
      const std::string& key = kv.first;
      walk_gguf_value(kv.second);
      // Every typed getter either returns or rejects with an InputError naming the file and the key
      // (quoted with control bytes replaced and long keys cut, so only "metadata key '" is checked).
      const auto getter = [&](auto&& get) {
        try {
          get();
        } catch (const InputError& e) {
          if (std::string_view(e.what()).find(kGgufSource) == std::string_view::npos ||
              std::string_view(e.what()).find("metadata key '") == std::string_view::npos)
            throw FuzzFinding(std::string("getter error does not name the input and the key: ") + e.what());
        }
      };
      getter([&] { f.get_u32(key); });
      getter([&] { f.get_i64(key); });
      getter([&] { f.get_f32(key); });
      getter([&] { f.get_bool(key); });
      getter([&] { f.get_string(key); });
      getter([&] { f.get_string_array(key); });
      getter([&] { f.get_f32_array(key); });
      getter([&] { f.get_i32_array(key); });
    }
    if (f.alignment() == 0 || (f.alignment() & (f.alignment() - 1)) != 0)
      throw FuzzFinding("accepted alignment " + std::to_string(f.alignment()));
    std::vector<float> all, part;
    for (const GgufTensorInfo& t : f.tensors()) {
      const GgmlTypeTraits* tr = ggml_type_traits(static_cast<uint32_t>(t.type));
      if (!tr || t.dims.empty() || t.dims.size() > 4 || t.dims[0] % tr->block_size != 0 ||
          t.nbytes != static_cast<uint64_t>(t.numel / tr->block_size * tr->type_size) || t.offset % f.alignment() != 0 ||
          f.data_offset() + t.offset + t.nbytes > size)
        throw FuzzFinding("accepted tensor '" + t.name + "' with an inconsistent info");
      if (!ggml_can_dequantize(t.type)) continue;
      // The whole tensor, then its second half of rows alone: the same values, bit for bit.
      all.assign(static_cast<size_t>(t.numel), 0.0f);
      dequantize_tensor_rows(f, t, 0, t.rows(), all.data());
      const int64_t half = t.rows() / 2;
      part.assign(static_cast<size_t>((t.rows() - half) * t.row_length()), 0.0f);
      dequantize_tensor_rows(f, t, half, t.rows(), part.data());
      if (!part.empty() &&
          std::memcmp(part.data(), all.data() + half * t.row_length(), part.size() * sizeof(float)) != 0)
        throw FuzzFinding("rows [" + std::to_string(half) + ", end) of '" + t.name + "' differ from the whole tensor's");
      float acc = 0.0f;
      for (float x : all) acc += x;
      g_sink = g_sink + acc;
    }
  });
}

namespace {

constexpr const char* kBpeSource = "fuzz-bpe-vocab.gguf";
constexpr const char* kSpmSource = "fuzz-spm-vocab.gguf";
constexpr const char* kJsonSource = "fuzz-input/tokenizer.json";
constexpr const char* kGgufTokSource = "fuzz-input-tokenizer.gguf";

std::string gguf_i32_array(const std::vector<int32_t>& v) {
  using W = sq::test::GgufWriter;
  std::string e;
  for (int32_t x : v) e += W::i32(x);
  return W::array(W::I32, v.size(), e);
}

/// The fixed byte-level vocabulary of bpe_text: 256 byte characters, then merges-made tokens, a
/// control token (id 264) and a user-defined one (id 265).
std::string bpe_vocab_gguf(const std::string& pre) {
  using W = sq::test::GgufWriter;
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(byte_level_char(static_cast<uint8_t>(b)));
  for (const char* t : {"Ġt", "he", "Ġthe", "in", "ĠĠ", "12", "Ã©", "ĊĊ", "<|endoftext|>", "hello"}) tokens.push_back(t);
  std::vector<int32_t> types(tokens.size(), 1);
  types[264] = 3;
  types[265] = 4;
  W w;
  w.kv_string("tokenizer.ggml.model", "gpt2").kv_string("tokenizer.ggml.pre", pre).kv_strings("tokenizer.ggml.tokens", tokens);
  w.kv("tokenizer.ggml.token_type", W::ARRAY, gguf_i32_array(types));
  w.kv_strings("tokenizer.ggml.merges", {"Ġ t", "h e", "Ġt he", "i n", "Ġ Ġ", "1 2", "Ã ©", "Ċ Ċ"});
  w.kv_u32("tokenizer.ggml.bos_token_id", 264).kv_u32("tokenizer.ggml.eos_token_id", 264);
  return w.bytes();
}

/// The fixed SentencePiece vocabulary of spm_text: <unk> <s> </s>, 256 byte pieces (3..258), scored
/// pieces (259..264), a user-defined "  " (id 265) and a control "<ctl>" (id 266).
std::string spm_vocab_gguf(bool space_prefix) {
  using W = sq::test::GgufWriter;
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  std::string scores = W::f32(0) + W::f32(0) + W::f32(0);
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    tokens.push_back(buf);
    types.push_back(6);
    scores += W::f32(0);
  }
  const std::vector<std::pair<const char*, float>> pieces = {{"\xE2\x96\x81", -1}, {"a", -2}, {"b", -2}, {"\xE2\x96\x81" "a", -1.5f},
                                                              {"ab", -3}, {"\xC3\xA9", -4}, {"  ", 0}, {"<ctl>", 0}};
  for (auto [p, sc] : pieces) {
    tokens.push_back(p);
    types.push_back(1);
    scores += W::f32(sc);
  }
  types[265] = 4;
  types[266] = 3;
  W w;
  w.kv_string("tokenizer.ggml.model", "llama").kv_strings("tokenizer.ggml.tokens", tokens);
  w.kv("tokenizer.ggml.scores", W::ARRAY, W::array(W::F32, tokens.size(), scores));
  w.kv("tokenizer.ggml.token_type", W::ARRAY, gguf_i32_array(types));
  w.kv_u32("tokenizer.ggml.bos_token_id", 1).kv_u32("tokenizer.ggml.eos_token_id", 2).kv_u32("tokenizer.ggml.unknown_token_id", 0);
  w.kv_bool("tokenizer.ggml.add_space_prefix", space_prefix);
  return w.bytes();
}

std::unique_ptr<Tokenizer> tokenizer_from(const std::string& bytes, const char* source) {
  return load_tokenizer_from_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), source);
}

/// Encodes `text`, checks every id is in range and not in `forbidden`, decodes; returns the text.
std::string encode_decode(const Tokenizer& tok, std::string_view text, std::initializer_list<int> forbidden) {
  const std::vector<int> ids = tok.encode(text, false, false);
  for (int id : ids) {
    if (id < 0 || id >= tok.vocab_size()) throw FuzzFinding("encode produced token " + std::to_string(id));
    for (int f : forbidden) {
      if (id == f) throw FuzzFinding("encode produced special token " + std::to_string(id) + " from plain text");
    }
  }
  return tok.decode(ids);
}

}  // namespace

void bpe_text(const uint8_t* data, size_t size) {
  static const std::vector<std::unique_ptr<Tokenizer>> toks = [] {
    std::vector<std::unique_ptr<Tokenizer>> v;
    for (const char* pre : {"gpt-2", "smollm", "llama-bpe", "qwen2"}) v.push_back(tokenizer_from(bpe_vocab_gguf(pre), kBpeSource));
    return v;
  }();
  if (size == 0) return;
  const Tokenizer& tok = *toks[data[0] % toks.size()];
  const std::string_view text = as_text(data + 1, size - 1);
  if (encode_decode(tok, text, {264, 265}) != text) throw FuzzFinding("byte-level BPE: decode(encode(text)) != text");
}

void spm_text(const uint8_t* data, size_t size) {
  static const std::unique_ptr<Tokenizer> toks[2] = {tokenizer_from(spm_vocab_gguf(false), kSpmSource),
                                                     tokenizer_from(spm_vocab_gguf(true), kSpmSource)};
  if (size == 0) return;
  const Tokenizer& tok = *toks[data[0] & 1];
  const std::string_view text = as_text(data + 1, size - 1);
  const std::string back = encode_decode(tok, text, {266});
  // SentencePiece replaces invalid UTF-8 with U+FFFD and stops at NUL, and a '▁' (U+2581) in the
  // text decodes as ' ': the round trip holds for valid UTF-8 without NUL or U+2581.
  const bool exact = find_invalid_utf8(text) < 0 && text.find('\0') == std::string_view::npos &&
                     text.find("\xE2\x96\x81") == std::string_view::npos;
  if (exact && back != text) throw FuzzFinding("SentencePiece: decode(encode(text)) != text for valid UTF-8");
}

void tokenizer_json(const uint8_t* data, size_t size) {
  expect_input_error_or_success(kJsonSource, [&] {
    const auto tok = load_tokenizer_from_bytes(data, size, kJsonSource);
    const std::string_view tail = as_text(data, size).substr(size > 64 ? size - 64 : 0);
    for (std::string_view text : {std::string_view("Once upon a time, there was a caf\xC3\xA9 12345.\n\n\xff\xc3"), tail}) {
      (void)encode_decode(*tok, text, {});
    }
    for (int id = 0; id < tok->vocab_size() && id < 300; ++id) (void)tok->piece(id);
  });
}

void token_ids(const uint8_t* data, size_t size) {
  const int64_t vocab = size > 0 ? 4 * int64_t(data[0]) : 0;
  const std::string_view text = size > 0 ? as_text(data + 1, size - 1) : std::string_view();
  expect_input_error_or_success(kTokenIdsSource, [&] {
    const std::vector<int32_t> ids = parse_token_ids(text, kTokenIdsSource, vocab);
    if (ids.empty()) throw FuzzFinding("accepted an input without token ids");
    std::string spaced, array = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || (vocab > 0 && ids[i] >= vocab))
        throw FuzzFinding("accepted token id " + std::to_string(ids[i]) + " outside [0, " + std::to_string(vocab) + ")");
      if (i) {
        spaced += ' ';
        array += ',';
      }
      spaced += std::to_string(ids[i]);
      array += std::to_string(ids[i]);
    }
    array += "]";
    if (parse_token_ids(spaced, kTokenIdsSource, vocab) != ids || parse_token_ids(array, kTokenIdsSource, vocab) != ids)
      throw FuzzFinding("accepted token ids do not round-trip through the whitespace and JSON forms");
  });
}

void gguf_tokenizer(const uint8_t* data, size_t size) {
  expect_input_error_or_success(kGgufTokSource, [&] {
    if (size < 4 || std::memcmp(data, "GGUF", 4) != 0) return;  // other formats have their own targets
    const auto tok = load_tokenizer_from_bytes(data, size, kGgufTokSource);
    (void)encode_decode(*tok, "Once upon a time, there was a caf\xC3\xA9 12345.\n\n\xff\xc3", {});
    for (int id = 0; id < tok->vocab_size() && id < 300; ++id) (void)tok->piece(id);
  });
}


// ---- seeds ----------------------------------------------------------------------------------------

namespace {

std::vector<std::string> safetensors_seeds() {
  TempDir dir;
  std::vector<std::string> out;
  const std::string a = dir.file("a.safetensors"), b = dir.file("b.safetensors");
  write_safetensors(a,
                    {{"model.embed_tokens.weight", "F32", Tensor::from_vector({2, 3}, {1, 2, 3, 4, 5, 6})},
                     {"model.norm.weight", "F16", Tensor::from_vector({4}, {0.5f, -1, 65504, 1e-7f})},
                     {"lm_head.weight", "BF16", Tensor::from_vector({}, {3.0f})},
                     {"empty", "F32", Tensor::zeros({0, 5})}},
                    {{"format", "pt"}});
  write_safetensors(b, {{"x", "F32", Tensor::from_vector({3}, {1, 2, 3})}});
  out.push_back(slurp(a));
  out.push_back(slurp(b));
  // Hand-made: an I8 tensor, a gap between tensors, an unaligned F32 view.
  const std::string hdr =
      R"({"i8":{"dtype":"I8","shape":[3],"data_offsets":[0,3]},"f":{"dtype":"F32","shape":[2],"data_offsets":[5,13]}})";
  std::string c(8, '\0');
  const uint64_t n = hdr.size();
  std::memcpy(c.data(), &n, 8);
  c += hdr + std::string(13, '\x01');
  out.push_back(c);
  return out;
}

std::vector<std::string> hf_config_seeds() {
  std::vector<std::string> out;
  ModelConfig c;
  c.dim = 64;
  c.hidden_dim = 172;
  c.n_layers = 2;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.head_dim = 8;
  c.vocab_size = 512;
  c.max_seq_len = 512;
  c.rope_layout = RopeLayout::HalfSplit;
  for (const char* arch : {"llama", "mistral", "qwen2"}) {
    c.architecture = arch;
    c.qkv_bias = std::string(arch) == "qwen2";
    c.tied_embeddings = std::string(arch) != "mistral";
    out.push_back(make_hf_config_json(c, "bfloat16").dump(2));
  }
  out.push_back(R"({"model_type":"llama","hidden_size":4096,"intermediate_size":11008,"num_hidden_layers":32,)"
                R"("num_attention_heads":32,"rope_scaling":{"rope_type":"default"},"eos_token_id":[2,3],)"
                R"("attention_bias":true,"torch_dtype":"float16"})");
  out.push_back(R"({"architectures":["MistralForCausalLM"],"hidden_size":4096,"intermediate_size":14336,)"
                R"("num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"sliding_window":4096,)"
                R"("max_position_embeddings":32768,"rms_norm_eps":1e-05,"rope_theta":1000000.0})");
  return out;
}

std::vector<std::string> safetensors_index_seeds() {
  return {R"({"metadata":{"total_size":1234},"weight_map":{"model.embed_tokens.weight":"model-00001-of-00002.safetensors",)"
          R"("lm_head.weight":"model-00002-of-00002.safetensors"}})",
          R"({"weight_map":{"a":"../escape.safetensors","b":"sub/dir.safetensors"}})",
          R"({"weight_map":{}})"};
}

std::vector<std::string> llama2c_checkpoint_seeds() {
  return {tiny_llama2c(0, true), tiny_llama2c(0, false), tiny_llama2c(1, true), tiny_llama2c(1, false)};
}

std::vector<std::string> llama2c_tokenizer_seeds() { return {tiny_tokenizer(true), tiny_tokenizer(false)}; }

std::vector<std::string> sqm_file_seeds() {
  TempDir dir;
  std::vector<std::string> out;
  for (bool compress : {false, true}) {
    const std::string path = dir.file(compress ? "z.sqm" : "a.sqm");
    SqmWriteOptions o;
    o.compress = compress;
    SqmWriter w(path, o);
    const std::vector<float> f32 = {1, 2, 3, 4, 5, 6};
    w.add_tensor("model.embed_tokens.weight", SqmDType::F32, {2, 3}, f32.data(), f32.size() * 4);
    const std::vector<float> zeros(256, 0.0f);
    w.add_tensor("model.norm.weight", SqmDType::F32, {256}, zeros.data(), zeros.size() * 4);
    const int8_t i8[4] = {-128, -1, 0, 127};
    w.add_tensor("model.layers.0.mlp.up_proj.weight", SqmDType::I8, {2, 2}, i8, 4);
    const uint8_t i4[2] = {0x7f, 0x08};
    w.add_tensor("model.layers.0.mlp.up_proj.qweight", SqmDType::I4x2, {3}, i4, 2);
    const std::string tok = tiny_tokenizer(false);
    w.add_tensor("tokenizer.bin", SqmDType::U8, {static_cast<int64_t>(tok.size())}, tok.data(), tok.size());
    w.finish({{"producer", "sqkit fuzz seed"},
              {"tokenizer", {{"format", "llama2c"}, {"tensor", "tokenizer.bin"}}},
              {"model_config", {{"dim", 64}, {"n_layers", 1}}}});
    out.push_back(slurp(path));
  }
  return out;
}

std::vector<std::string> calibration_seeds() {
  std::string with_fisher = encode_calibration(2, 8, 8, 4, 16);
  {
    ByteWriter w;
    encode_fisher(w, 2, 4, 5);
    with_fisher += w.out;
  }
  return {encode_calibration(2, 8, 8, 4, 16), encode_calibration(1, 16, 32, 8, 48, /*extra_name=*/true),
          encode_calibration(3, 4, 4, 2, 8), with_fisher};
}

/// Small valid GGUF files (tests/support/gguf_writer.h): every metadata value type with nested
/// arrays; one tensor of each dequantizable type (one block or a few values, sane f16 scales) with
/// general.alignment 64; a version 2 file with tokenizer-like arrays and a 2-row Q8_0 tensor; an
/// empty file (no keys, no tensors).
std::vector<std::string> gguf_seeds() {
  using W = sq::test::GgufWriter;
  std::vector<std::string> out;
  {
    W w;
    w.kv("u8", W::U8, W::u8(200)).kv("i8", W::I8, W::i8(-3)).kv("u16", W::U16, W::u16(65535));
    w.kv("i16", W::I16, W::i16(-2)).kv_u32("llama.block_count", 2).kv_i32("i32", -7).kv_f32("f32", 0.5f);
    w.kv_bool("bool", true).kv_string("general.architecture", "llama").kv_u64("u64", 1ull << 40);
    w.kv("i64", W::I64, W::i64(-1)).kv("f64", W::F64, W::f64(0.25));
    w.kv("arr", W::ARRAY, W::array(W::I32, 3, W::i32(1) + W::i32(-2) + W::i32(3)));
    w.kv("nested", W::ARRAY, W::array(W::ARRAY, 2, W::array(W::U8, 1, W::u8(9)) + W::array(W::STRING, 1, W::str("s"))));
    std::string f32, f16, bf16;
    for (int i = 0; i < 6; ++i) f32 += W::f32(float(i) - 2.5f);
    for (int i = 0; i < 4; ++i) f16 += W::u16(static_cast<uint16_t>(0x3C00 + i));
    for (int i = 0; i < 4; ++i) bf16 += W::u16(static_cast<uint16_t>(0x3F80 + i));
    w.tensor("a.weight", {3, 2}, 0, f32).tensor("b.weight", {4}, 1, f16).tensor("c.weight", {2, 2}, 30, bf16);
    out.push_back(w.bytes());
  }
  {
    W w;
    w.alignment = 64;
    w.kv_u32("general.alignment", 64);
    struct Q {
      const char* name;
      uint32_t id;
      std::vector<size_t> scale_offsets;
    };
    const Q types[] = {{"q8_0", 8, {0}},  {"q4_0", 2, {0}},     {"q4_1", 3, {0, 2}}, {"q5_0", 6, {0}},
                       {"q5_1", 7, {0, 2}}, {"q2_k", 10, {80, 82}}, {"q3_k", 11, {108}}, {"q4_k", 12, {0, 2}},
                       {"q5_k", 13, {0, 2}}, {"q6_k", 14, {208}}, {"iq4_nl", 20, {0}}};
    for (const Q& q : types) {
      const GgmlTypeTraits* tr = ggml_type_traits(q.id);
      std::string block(static_cast<size_t>(tr->type_size), '\0');
      for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<char>((i * 37 + q.id) & 0xff);
      for (size_t off : q.scale_offsets) {
        block[off] = 0x00;
        block[off + 1] = 0x30;  // f16 0.125
      }
      w.tensor(q.name, {static_cast<uint64_t>(tr->block_size)}, q.id, block);
    }
    out.push_back(w.bytes());
  }
  {
    W w;
    w.version = 2;
    w.kv_string("tokenizer.ggml.model", "llama").kv_strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a", "b"});
    w.kv("tokenizer.ggml.scores", W::ARRAY, W::array(W::F32, 5, W::f32(0) + W::f32(-1) + W::f32(-2) + W::f32(-3) + W::f32(-4)));
    std::string q8;
    for (int k = 0; k < 2; ++k) {
      q8 += W::u16(0x3800);
      for (int i = 0; i < 32; ++i) q8 += static_cast<char>(i - 16 + k);
    }
    w.tensor("token_embd.weight", {32, 2}, 8, q8);
    out.push_back(w.bytes());
  }
  out.push_back(W().bytes());
  return out;
}

std::vector<std::string> bpe_text_seeds() {
  const std::string mixed =
      "In 1990, the price was $12,345.67 (about 3.5%).\n\xD0\x9F\xD1\x80\xD0\xB8, \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x99\x82\n"
      "\tdef f(x):  return x**2   # done\n\n\n  end <|endoftext|>hello she's";
  return {std::string(1, '\0') + mixed, std::string(1, '\1') + mixed, std::string(1, '\2') + mixed,
          std::string(1, '\3') + mixed, std::string("\0\xff\xfe\xc3 the\x80", 8)};
}

std::vector<std::string> spm_text_seeds() {
  return {std::string("\0ab a  b caf\xC3\xA9\n<ctl>\xE6\x97\xA5"), std::string("\1 a ab  \xC3\xA9"),
          std::string("\0\xff\xc3 a", 5)};
}

std::vector<std::string> tokenizer_json_seeds() {
  return {R"({"version": "1.0", "normalizer": null,
 "added_tokens": [{"id": 6, "content": "<|endoftext|>", "special": true}],
 "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true},
   {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}]},
 "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}]},
 "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "\u0120": 4, "\u0120a": 5, "<|endoftext|>": 6},
           "merges": ["a b", ["\u0120", "a"]]}})",
          R"({"model": {"type": "BPE", "vocab": {"x": 0, "y": 1, "xy": 2}, "merges": [["x", "y"]]},
 "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\s+|\\p{L}+"}, "behavior": "Isolated", "invert": false}})"};
}

std::vector<std::string> token_ids_seeds() {
  using namespace std::string_literals;
  return {"\0"s + "1 2 3\n", "\x80"s + "[1, 345, 7]\n", "\x01"s + "0 1 2 3 4", "\0"s + " \n\t[\n 4 ,5 ]  ", "\0"s + "[]",
          "\0"s + "1 -2", "\0"s + "[1, 2.5]", "\0"s + "99999999999 1", "\x02"s + "[7, 8]"};
}

std::vector<std::string> gguf_tokenizer_seeds() { return {bpe_vocab_gguf("smollm"), spm_vocab_gguf(false)}; }

std::vector<std::string> convert_spec_seeds() {
  return {std::string("\0w8a8\n0.5\n\n\n", 12), std::string("\1w8a8\nauto\nO1\n\n", 15),
          std::string("\0w8a8\n0.85\nO3\nper-channel\nper-token", 35), std::string("\2f16\n\n\n\n", 8),
          std::string("\0bf16\n1\nO2\nper-tensor\nper-tensor-static", 38)};
}

}  // namespace

const std::vector<FuzzTarget>& fuzz_targets() {
  static const std::vector<FuzzTarget> targets = {
      {"safetensors", safetensors, safetensors_seeds, {}},
      {"hf_config", hf_config, hf_config_seeds, {}},
      {"safetensors_index", safetensors_index, safetensors_index_seeds, {}},
      {"llama2c_checkpoint", llama2c_checkpoint, llama2c_checkpoint_seeds, {"stories260K/stories260K.bin"}},
      {"llama2c_tokenizer", llama2c_tokenizer, llama2c_tokenizer_seeds, {"stories260K/tok512.bin"}},
      {"sqm_file", sqm_file, sqm_file_seeds, {}},
      {"calibration", calibration, calibration_seeds, {}},
      {"convert_spec", convert_spec, convert_spec_seeds, {}},
      {"gguf", gguf, gguf_seeds, {}},
      {"bpe_text", bpe_text, bpe_text_seeds, {}},
      {"spm_text", spm_text, spm_text_seeds, {}},
      {"tokenizer_json", tokenizer_json, tokenizer_json_seeds, {}},
      {"gguf_tokenizer", gguf_tokenizer, gguf_tokenizer_seeds, {}},
      {"token_ids", token_ids, token_ids_seeds, {}},
  };
  return targets;
}

void run_on(const FuzzTarget& target, const std::string& input) {
  target.run(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

}  // namespace sq::fuzz
