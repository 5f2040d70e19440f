// Tests for layer-by-layer conversion and Hessian files (issue 19, item 4: a LLaMA-7B shape in
// bounded memory): convert_model on a streamed LayerStream (calib/converter.h) must write the
// whole-model conversion's bytes; a calibration file whose Hessians were written layer by layer
// (CalibrationH5Writer) must read back as write_calibration_h5's; deferred Hessians
// (CalibrationHessians::Defer + read_calibration_hessians) must be the eagerly read ones.
#include <gtest/gtest.h>

#include <filesystem>

#include "calib/calibration_run.h"
#include "calib/converter.h"
#include "core/error.h"
#include "formats/calibration_h5.h"
#include "model/layer_stream.h"
#include "runtime/kv_cache.h"
#include "support/hf_tiny.h"
#include "support/process.h"
#include "support/small_config.h"
#include "support/test_data.h"

namespace {

using sq::test::ScratchDir;

std::string token_ids_file(const ScratchDir& dir, int vocab, int n) { return sq::test::write_random_token_ids(dir, vocab, n, 9); }

sq::CalibrationOptions calibration_options(const ScratchDir& dir, const sq::ModelConfig& c) {
  sq::CalibrationOptions o;
  o.token_ids = true;  // windows re-drawn from the ids: sequential GPTQ needs no tokenizer
  o.text_path = token_ids_file(dir, c.vocab_size, 400);
  o.samples = 4;
  o.seq_len = std::min(24, c.max_seq_len);
  o.hessian = true;
  return o;
}

std::string bytes_of(const std::string& path) { return sq::test::read_file(path); }

class StreamedConvert : public ::testing::TestWithParam<const char*> {};

// Every architecture, three recipes that read different parts of the calibration: W4A16 GPTQ with
// the file's Hessians (read one layer at a time), W4A16 GPTQ with sequential Hessians (the layers
// re-run through the already-quantized ones), W8A8 SmoothQuant (statistics, LM head quantized).
// The streamed conversion reads one layer at a time and frees each weight once quantized; its
// output must be the whole-model conversion's, byte for byte.
TEST_P(StreamedConvert, WritesTheWholeModelConversionsBytes) {
  const std::string path = sq::test::hf_tiny(GetParam());
  const sq::LayerStream streamed(path), whole(path, false);
  ASSERT_TRUE(streamed.streamed());
  ScratchDir dir;
  const std::string calib = dir.file("calib.h5");
  sq::write_calibration_h5(calib, sq::run_calibration(whole.model(), nullptr, calibration_options(dir, whole.config())));

  struct Recipe {
    const char* name;
    sq::ConvertOptions o;
  };
  std::vector<Recipe> recipes;
  for (const char* mode : {"file", "sequential"}) {
    sq::ConvertOptions o;
    o.scheme = sq::ConvertScheme::W4A16;
    o.int4.group_size = 32;
    o.int4.gptq = true;
    o.gptq_hessians = mode;
    o.calib_path = calib;
    recipes.push_back({mode, o});
  }
  {
    sq::ConvertOptions o;
    o.scheme = sq::ConvertScheme::W8A8;
    o.calib_path = calib;
    o.quantize_head = true;
    recipes.push_back({"w8a8", o});
  }
  for (const Recipe& r : recipes) {
    const std::string a = dir.file(std::string("streamed-") + r.name + ".sqm"), b = dir.file(std::string("whole-") + r.name + ".sqm");
    const sq::ConvertSummary sa = sq::convert_model(streamed, r.o, a);
    const sq::ConvertSummary sb = sq::convert_model(whole.model(), r.o, b);
    EXPECT_EQ(sa.file_bytes, sb.file_bytes) << r.name;
    EXPECT_TRUE(bytes_of(a) == bytes_of(b)) << r.name << ": the streamed conversion differs from the whole model's";
    ASSERT_EQ(sa.int4.size(), sb.int4.size()) << r.name;
    for (size_t i = 0; i < sa.int4.size(); ++i) {
      EXPECT_EQ(sa.int4[i].hessian_error, sb.int4[i].hessian_error) << r.name << " " << sa.int4[i].name;
      EXPECT_TRUE(sa.int4[i].weights.packed.empty()) << "weights are written, not kept";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(HfTiny, StreamedConvert, ::testing::ValuesIn(sq::test::kHfTinyCheckpoints), sq::test::HfTinyParamName());

TEST(StreamedConvert, ChecksTheCalibrationFingerprintAfterTheLastLayerAndLeavesNoOutput) {
  ScratchDir dir;
  const sq::LayerStream other(sq::test::hf_tiny("qwen2"), false);
  const std::string calib = dir.file("calib.h5");
  sq::write_calibration_h5(calib, sq::run_calibration(other.model(), nullptr, calibration_options(dir, other.config())));
  const sq::LayerStream streamed(sq::test::hf_tiny("llama-gqa"));
  sq::ConvertOptions o;
  o.scheme = sq::ConvertScheme::W8A8;
  o.calib_path = calib;
  const std::string out = dir.file("out.sqm");
  try {
    sq::convert_model(streamed, o, out);
    FAIL() << "a calibration file of another model was accepted";
  } catch (const sq::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("recorded for another model"), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    // llama-gqa and qwen2 differ in layer count or widths: an earlier check may name that instead
    SUCCEED() << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(StreamedConvert, RefusesWholeModelRecipesOnAStreamedModel) {
  const sq::LayerStream streamed(sq::test::hf_tiny("llama-gqa"));
  ScratchDir dir;
  sq::ConvertOptions o;
  o.scheme = sq::ConvertScheme::W8A8;
  o.alpha_auto = true;
  EXPECT_THROW(sq::convert_model(streamed, o, dir.file("a.sqm")), sq::UsageError);
  EXPECT_FALSE(std::filesystem::exists(dir.file("a.sqm")));
}

// sq-calibrate --hessian on a streamed model hands each layer's Hessians to a CalibrationH5Writer
// as the layer finishes: the file must read back as the whole-model run written in one go.
TEST(CalibrationH5Writer, LayerByLayerHessiansReadBackAsTheWholeFile) {
  const std::string path = sq::test::hf_tiny("llama-gqa");
  const sq::LayerStream streamed(path), whole(path, false);
  ScratchDir dir;
  sq::CalibrationOptions o = calibration_options(dir, whole.config());
  const sq::CalibrationData reference = sq::run_calibration(whole.model(), nullptr, o);
  sq::write_calibration_h5(dir.file("whole.h5"), reference);

  {
    sq::CalibrationH5Writer writer(dir.file("streamed.h5"));
    int calls = 0;
    o.on_layer_hessians = [&](int l, sq::LayerStats& ls) {
      EXPECT_EQ(l, calls++) << "layers in order";
      writer.write_hessians(l, ls.hessians, ls.hessian_tokens);
      ls.hessians.clear();
    };
    const sq::CalibrationData data = sq::run_calibration(streamed, nullptr, o);
    EXPECT_EQ(calls, whole.config().n_layers);
    for (const auto& l : data.layers) EXPECT_TRUE(l.hessians.empty());
    EXPECT_FALSE(std::filesystem::exists(dir.file("streamed.h5"))) << "nothing under the path before finish()";
    writer.finish(data);
  }
  const sq::CalibrationData a = sq::read_calibration_h5(dir.file("streamed.h5"));
  const sq::CalibrationData b = sq::read_calibration_h5(dir.file("whole.h5"));
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    EXPECT_EQ(a.layers[l].hessians, b.layers[l].hessians) << "layer " << l;
    EXPECT_EQ(a.layers[l].hessian_tokens, b.layers[l].hessian_tokens) << "layer " << l;
    EXPECT_EQ(a.layers[l].inputs[0].sum_sq, b.layers[l].inputs[0].sum_sq) << "layer " << l;
    EXPECT_EQ(a.layers[l].hessians, reference.layers[l].hessians) << "layer " << l;
  }

  // Deferred: presence and token counts now, each layer's Hessians on request.
  const sq::CalibrationData d = sq::read_calibration_h5(dir.file("streamed.h5"), sq::CalibrationHessians::Defer);
  for (size_t l = 0; l < d.layers.size(); ++l) {
    ASSERT_EQ(d.layers[l].hessians.size(), 4u);
    for (const auto& h : d.layers[l].hessians) EXPECT_TRUE(h.empty());
    EXPECT_EQ(d.layers[l].hessian_tokens, b.layers[l].hessian_tokens);
    EXPECT_EQ(sq::read_calibration_hessians(dir.file("streamed.h5"), int(l), d.layers[l]), b.layers[l].hessians) << "layer " << l;
  }
}

TEST(CalibrationH5Writer, AnUnfinishedWriterLeavesNothingAndBadInputIsRefused) {
  ScratchDir dir;
  const std::string out = dir.file("c.h5");
  {
    sq::CalibrationH5Writer w(out);
    EXPECT_THROW(w.write_hessians(0, {{1.0}, {1.0}, {1.0}}, 4), std::invalid_argument);                  // 3 sites
    EXPECT_THROW(w.write_hessians(0, {{1.0}, {1.0}, {1.0, 2.0}, {1.0}}, 4), std::invalid_argument);      // not C²
    EXPECT_THROW(w.write_hessians(0, {{1.0}, {1.0}, {1.0}, {1.0}}, 0), std::invalid_argument);           // no tokens
    w.write_hessians(0, {{1.0}, {1.0}, {1.0}, {1.0}}, 4);
    EXPECT_THROW(w.write_hessians(0, {{1.0}, {1.0}, {1.0}, {1.0}}, 4), std::invalid_argument);           // twice
  }
  EXPECT_FALSE(std::filesystem::exists(out));
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) ADD_FAILURE() << "left behind: " << e.path();
}

TEST(KVCacheLazyLayers, ALayerIsAllocatedByItsFirstWriteAndUnwrittenLayersCannotBeRead) {
  const sq::ModelConfig c = sq::test::small_config(8, 3, 2, 2, 16, 8);
  sq::KVCache cache(c, 4);
  const std::vector<float> k(8, 0.5f), v(8, -0.25f);
  cache.write(1, k.data(), v.data(), 1);
  std::vector<float> kb, vb;
  const auto view = cache.read(1, 1, kb, vb);
  EXPECT_FLOAT_EQ(view.values[3], -0.25f);
  EXPECT_THROW(cache.read(0, 1, kb, vb), std::logic_error);
  EXPECT_NO_THROW(cache.read(2, 0, kb, vb));
  EXPECT_EQ(cache.layer_storage(2).keys, nullptr);
  EXPECT_NE(cache.layer_storage(1).keys, nullptr);
}

}  // namespace
