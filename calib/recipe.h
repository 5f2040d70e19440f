// sq-convert as a pipeline of recipe steps, each in its own file and driven by the model's
// DecoderSpec through model/decoder_linears.h (never by a hand-written list of projections):
//
//   calib/recipe_inputs.cpp     load: option checks, the calibration file (fingerprint-checked), the
//                               calibration text and re-drawn windows (ConvertInputs)
//   calib/recipe_layer_inputs.cpp  calibration data per layer: GPTQ Hessians (sequential, from the
//                               already-converted layers, or the calibration file's), calibration rows
//   calib/recipe_smoothing.cpp  transform: SmoothQuant smoothing (W8A8), --alpha auto; AWQ scaling (w4a16 --awq, calib/awq.h)
//   calib/recipe_rotation.cpp   transform: Hadamard rotation (--rotate hadamard; QuaRot)
//   calib/recipe_float.cpp, recipe_w8a8.cpp, recipe_int4.cpp, recipe_atom.cpp
//                               per-linear quantizers (LinearQuantizer), one per scheme; Atom's channel
//                               reordering is part of its quantizer (calib/atom_layer_quantizer.h)
//   calib/recipe_kv.cpp         KV quantizer: the --kv format and its nuq tables
//   calib/recipe_writer.cpp     writer: float tensors, header (model_config, source, tokenizer, calibration)
//   calib/recipe_schemes.cpp    the table scheme -> quantizer factory
//   calib/converter.cpp         convert_model: runs the steps in order
//
// Adding a scheme is one quantizer file plus a row in recipe_schemes.cpp; adding an architecture
// touches none of these (its DecoderSpec drives decoder_layer_linears).
#pragma once

#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "calib/calibration_text.h"
#include "calib/converter.h"
#include "calib/layerwise_runner.h"
#include "model/layer_stream.h"
#include "model/decoder_linears.h"

namespace sq {

/// The load and calibration-data steps' result: everything the other steps read.
struct ConvertInputs {
  const LoadedModel& src;
  const ConvertOptions& o;
  const Checkpoint& base;     ///< src.checkpoint (FP32 canonical tensors)
  const ModelConfig& config;
  CalibrationData calib;      ///< empty without --calib
  bool can_redraw = false;    ///< the calibration windows can be re-drawn (token-ids calibration or a tokenizer)
  std::string hessian_mode;   ///< "sequential" / "file" (resolved --gptq-hessians)
  ResolvedCalibrationText text;  ///< the calibration text once something re-read it

  /// Set when the model is read layer by layer (convert_model(const LayerStream&, …)): src is then
  /// stream->model() (globals only: base holds no layer and no untied LM head).
  const LayerStream* stream = nullptr;
  /// Streamed: the shapes of the global tensors and of every layer read so far (the fingerprint's
  /// inventory, complete once every layer has been converted).
  TensorShapes shapes;

  ConvertInputs(const LoadedModel& s, const ConvertOptions& opt) : src(s), o(opt), base(s.checkpoint), config(s.checkpoint.config) {}
  /// True when layers come from a streamed LayerStream one at a time.
  bool streamed() const { return stream != nullptr && stream->streamed(); }
  /// The untied LM head (from base, or read now from a streamed model).
  Tensor lm_head() const { return streamed() ? stream->lm_head() : base.tensors.at(names::kLmHead); }
  /// model_fingerprint of the source: streamed, from `shapes` (call it after every layer was read).
  std::string fingerprint() const;
  /// GPTQ Hessians of layer l stored in the calibration file (sq-calibrate --hessian), or all null.
  /// The file's Hessians are read one layer at a time (read_calibration_hessians) and held until the
  /// next layer's are asked for (a LLaMA-7B layer: 1.4 GB; the whole file: 44 GB).
  std::array<const std::vector<double>*, kActivationSites> file_hessians(int l);
  /// Frees the file Hessian of `site` of layer l once its last linear is quantized (pointers from
  /// file_hessians(l) to it become dangling).
  void release_file_hessian(int l, ActivationSite site);

 private:
  int file_hessian_layer_ = -1;  ///< the layer whose file Hessians are held

 public:
  /// The calibration text (resolved and SHA-256-checked once; calib/calibration_text.h). `purpose`
  /// names what needs it, `alternative` is a hint for the not-found message.
  const std::string& calibration_text(const std::string& purpose, const std::string& alternative);
  /// The calibration windows again (n of them, the calibration's seq_len and seed) from `path`.
  std::vector<std::vector<int32_t>> redraw_windows(const std::string& path, int64_t n) const;
  /// Statistics of layer l, or nullptr without a calibration file.
  const LayerStats* stats(int l) const { return calib.layers.empty() ? nullptr : &calib.layers[size_t(l)]; }
};

/// Load step: checks the options against the model (UsageError / InputError as convert_model
/// documents) and reads the calibration file.
void load_convert_inputs(ConvertInputs& in);
/// Throws InputError when the calibration file's model fingerprint is not in.fingerprint().
void check_calibration_fingerprint(const ConvertInputs& in);

/// One layer on its way through the pipeline.
struct LayerWork {
  int layer = 0;
  Checkpoint tensors;  ///< this layer's canonical FP32 tensors (transforms replace what they touch)
  const DecoderLayer* fp32 = nullptr;  ///< the unconverted layer of the source model
  /// SmoothQuant factors by input site: for every site a smoothing mapping's balance linears read,
  /// the factors its activations were divided by, one per input channel of the site (v → o's
  /// per-KV-channel factors expanded to o_proj's columns; under a shared input norm the FFN input
  /// holds the attn_input mapping's factors). The O3 static steps read them.
  std::map<ActivationSite, std::vector<float>> smoothing;
  /// Hadamard rotations by input site (calib/recipe_rotation.h): the block of R at every site whose
  /// linears' weights hold W·R (the FFN hidden activation, rotated online; o_proj's input, offline).
  std::map<ActivationSite, int64_t> rotation;
  std::vector<LinearSlot> linears;  ///< decoder_layer_linears(config, layer)
  /// Owner of *fp32 when the layer was read for this step alone (a streamed model), else empty.
  std::shared_ptr<const DecoderLayer> fp32_owner;

  /// Lets go of the unconverted layer once a quantizer no longer needs it (after its sequential
  /// Hessians and copy_layer_tensors): with a streamed model its weights then live in `tensors`
  /// only, and a quantizer can free each linear's weight once quantized (release_weight).
  void release_fp32() {
    fp32 = nullptr;
    fp32_owner.reset();
  }
  /// Drops linear `s`'s FP32 weight from `tensors` (call it once the weight is quantized and written).
  void release_weight(const LinearSlot& s) { tensors.tensors.erase(s.name + ".weight"); }
};

/// Per-layer calibration data for the quantizers that need it (GPTQ's Hessians, Atom's --clip
/// search rows), sequential (GPTQ §4: layer l's inputs come from the already-converted layers
/// 0 … l−1) or from the calibration file.
class LayerInputs {
 public:
  /// `sequential`: re-run the calibration windows layer by layer (needs re-drawable windows).
  LayerInputs(ConvertInputs& in, bool sequential, const std::string& text_purpose, const std::string& text_alternative);
  bool sequential() const { return runner_ != nullptr; }
  /// Hessians of layer l's input sites computed on the current hidden states (sequential). Held until the next call.
  std::array<const std::vector<double>*, kActivationSites> sequential_hessians(int l, const DecoderLayer& fp32);
  /// Every k-th row of each input site of layer l (at most max_rows per site), on the current hidden states.
  std::array<SiteRows, kActivationSites> rows(int l, const DecoderLayer& fp32, int64_t max_rows) const;
  /// The converted layer l produces the next layer's inputs.
  void advance(int l, const DecoderLayer& converted);
  /// Frees the held sequential Hessian of `site` (once its last linear is quantized).
  void release_hessian(ActivationSite site);

 private:
  std::unique_ptr<LayerwiseRunner> runner_;
  std::array<std::vector<double>, kActivationSites> held_;
};

/// The first layer whose GPTQ Hessians the calibration file does not hold (sq-calibrate --hessian
/// records all of them or none), or −1 when it holds every layer's (or has no layers).
int64_t first_layer_without_hessians(const ConvertInputs& in);

/// GPTQ's Hessians, for a quantizer's prepare step (after load_convert_inputs resolved
/// in.hessian_mode): "sequential" returns a LayerInputs that re-runs the calibration windows (UsageError
/// when the windows cannot be re-drawn: no tokenizer); "file" checks that the calibration file holds
/// every layer's Hessians (InputError naming the file and layer) and returns null. Records the mode
/// in summary.hessian_source.
std::unique_ptr<LayerInputs> prepare_gptq_hessians(ConvertInputs& in, ConvertSummary& summary);

/// A per-linear quantizer: one scheme's treatment of every linear of a layer.
class LinearQuantizer {
 public:
  virtual ~LinearQuantizer() = default;
  /// Float encoding of norms, embeddings and FP linears (F32 for quantized schemes).
  virtual ConvertScheme float_encoding() const { return ConvertScheme::F32; }
  /// Option checks of the scheme before the calibration file is read (UsageError / UnsupportedError).
  virtual void check(const ConvertInputs& in) const {}
  /// Whether this scheme with these options re-reads the calibration text (--calib-text is refused otherwise).
  virtual bool rereads_calibration_text(const ConvertInputs& in) const { return false; }
  /// Before any layer (after load): option checks and calibration data of the scheme.
  virtual void prepare(ConvertInputs& in, ConvertSummary& summary) {}
  /// Whether the W8A8 smoothing transform runs (and its statistics are needed).
  virtual bool smooths() const { return false; }
  /// Whether the --quantize-head rows are those of a weight-only scheme: each row's step
  /// Δ = absmax/127 rounded to FP16 before coding (write_int8_rows_fp16_steps: the GGUF Q8_0 export
  /// then holds exactly the runner's weights) and the header's head_activations "fp32" (the runner's
  /// W8A16 head). True for w4a16 and w4a4-atom; W8A8 keeps FP32 steps and its W8A8 head.
  virtual bool weight_only_head() const { return true; }
  /// Whether the scheme takes a mixed-precision budget (ConvertOptions::mixed: W4A16 with INT8 rows).
  virtual bool mixes_precision() const { return false; }
  /// The token embedding's stored format: "fp32" (no --quantize-head), "int8" or, where the scheme
  /// has one, "int4" (ConvertOptions::token_embedding_type). Throws UsageError for a type the
  /// scheme does not offer or one given without --quantize-head.
  virtual std::string embedding_format(const ConvertInputs& in) const;
  /// Writes the token embedding: the float tensor, or with --quantize-head INT8 rows with one FP32
  /// step per row (per-channel of a tied head; dequantized on lookup), whatever the scheme.
  virtual void write_embedding(const ConvertInputs& in, SqmWriter& out);
  /// Writes an untied LM head: the float tensor, or with --quantize-head a per-channel INT8 linear,
  /// whatever the scheme. The runner runs an INT8 head (tied or not) as W8A16 (FP32 activations,
  /// model/w8a16_linear.h) when the header records head_activations "fp32" (weight_only_head),
  /// else as W8A8 with the file's activation mode.
  virtual void write_head(const ConvertInputs& in, SqmWriter& out);
  /// Converts and writes layer `w`'s linears (its other tensors are already written).
  virtual void convert_layer(ConvertInputs& in, LayerWork& w, SqmWriter& out, ConvertSummary& summary) = 0;
  /// header.quantization ({"scheme": …} plus the scheme's parameters).
  virtual nlohmann::json describe(const ConvertInputs& in, const ConvertSummary& summary) const = 0;
};

/// The quantizer of `scheme` (calib/recipe_schemes.cpp).
std::unique_ptr<LinearQuantizer> make_linear_quantizer(ConvertScheme scheme);

// --- shared helpers of the steps ---
/// Writes a float tensor in the scheme's float dtype (F32 for any non-float scheme).
void write_float(SqmWriter& w, const std::string& name, const Tensor& t, ConvertScheme encoding);
/// Writes an INT8 linear (SmoothQuant Eq. 3.1 weights): `base`.weight I8 [out, in], `base`.weight_scale
/// F32 [out] (per-channel) or [1] (per-tensor), `base`.input_scale F32 [1] = `step` when `act` is
/// per-tensor static, `base`.bias F32 [out] when `bias` is given. W: [out, in] FP32.
void write_int8_linear(SqmWriter& w, const Tensor& W, const Tensor* bias, const std::string& base, WeightGranularity weight,
                       ActQuant act, float step);
/// Writes an INT8 linear from codes [out, in] (row-major, −127…127) and their steps: `scales` [out]
/// (per-channel) or [1] (per-tensor); the other tensors as write_int8_linear (GPTQ's codes, which
/// are not round(W/Δ)).
void write_int8_linear_codes(SqmWriter& w, const std::vector<int8_t>& codes, const std::vector<float>& scales, int64_t out,
                             int64_t in, const Tensor* bias, const std::string& base, ActQuant act, float step);
/// Writes W [out, in] as INT8 rows `base`.weight I8 [out, in] with `base`.weight_scale F32 [out]: per
/// row Δ = FP16(absmax / 127) (an FP16 value stored as F32; 0 for a zero row), q = clamp(round(w/Δ),
/// −127, 127) (Eq. 3.1 per channel with an FP16-exact step, as GGML's Q8_0 stores d). Throws
/// InputError naming the tensor and row for a non-finite weight or a step beyond FP16.
void write_int8_rows_fp16_steps(SqmWriter& w, const Tensor& W, const std::string& base);
/// INT8 rows with FP16-exact steps (the rule of write_int8_rows_fp16_steps): codes [out, in]
/// row-major, steps [out] (FP16 values as FP32).
struct Int8Rows {
  std::vector<int8_t> codes;
  std::vector<float> steps;
};
/// W [out, in] as INT8 rows by the rule of write_int8_rows_fp16_steps (same errors).
Int8Rows quantize_int8_rows_fp16_steps(const Tensor& W, const std::string& base);
/// Writes rows `r` of an [out, in] weight as `base`.weight I8 [out, in] and `base`.weight_scale F32 [out].
void write_int8_rows(SqmWriter& w, const Int8Rows& r, int64_t out, int64_t in, const std::string& base);
/// Writes linear `s` unquantized (weight and bias) in `encoding`.
void write_float_linear(SqmWriter& w, const Checkpoint& ck, const LinearSlot& s, ConvertScheme encoding);
/// FP32 DenseLinear of `s` from `ck` (weight + bias): unquantized linears of a converted layer
/// (no packed copy: the layer runs once, model/linear.h).
std::unique_ptr<Linear> dense_linear(const Checkpoint& ck, const LinearSlot& s);

}  // namespace sq
