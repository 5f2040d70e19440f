#include "model/model_loader.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/finite.h"
#include "formats/gguf_checkpoint.h"
#include "formats/gguf_file.h"
#include "formats/hf_checkpoint.h"
#include "formats/llama2c_checkpoint.h"
#include "formats/sqm_file.h"
#include "model/decoder_linears.h"
#include "model/sqm_model.h"

namespace sq {

std::string default_hf_tokenizer(const std::string& dir) {
  for (const char* name : {"tokenizer.model", "tokenizer.json"}) {  // SentencePiece first, else byte-level BPE
    const auto tok = std::filesystem::path(dir) / name;
    if (std::filesystem::exists(tok)) return tok.string();
  }
  return "";
}

namespace {
/// The packed-copy policy of kPrepackMaxModelBytes (model/linear.h).
void keep_packed_copies_if_small(Decoder& model) {
  if (dense_linear_bytes(model) > kPrepackMaxModelBytes) set_model_prepack(model, false);
}
}  // namespace

LoadedModel load_model(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw InputError("cannot open " + path + ": " + std::strerror(errno));
  Checkpoint ck;
  LoadedModel out;
  out.path = path;
  if (!S_ISDIR(st.st_mode) && looks_like_sqm(path)) {
    out.sqm = SqmFile::open(path);
    check_sqm_finite(*out.sqm);
    out.sqm->mapping()->release(0, static_cast<size_t>(out.sqm->file_size()));  // read again when touched
    out.model = build_model_from_sqm(out.sqm);
    out.kv = kv_quantization_from_sqm(*out.sqm, out.model->config());
    out.format = "sqm";
    keep_packed_copies_if_small(*out.model);
    return out;
  }
  if (S_ISDIR(st.st_mode)) {
    ck = load_hf_checkpoint(path);
    out.default_tokenizer = default_hf_tokenizer(path);
  } else if (looks_like_gguf(path)) {
    const GgufFile file(path);
    ck = load_gguf_checkpoint(file);
    // The tokenizer lives in the GGUF metadata (tokenizer.ggml.*): load_tokenizer reads it from the
    // file. A GGUF without tokenizer metadata has none (tools then ask for --tokenizer).
    if (file.has("tokenizer.ggml.model")) out.default_tokenizer = path;
  } else if (looks_like_llama2c_checkpoint(path)) {
    ck = load_llama2c_checkpoint(path);
  } else {
    throw InputError(path + ": not a recognized model (expected a llama2.c checkpoint, a GGUF file, a .sqm file or a "
                            "Hugging Face checkpoint directory with config.json and *.safetensors)");
  }
  check_checkpoint_finite(ck);
  out.model = std::make_unique<Decoder>(Decoder::from_checkpoint(ck));
  keep_packed_copies_if_small(*out.model);
  out.path = path;
  out.format = ck.format;
  out.checkpoint = std::move(ck);
  return out;
}

}  // namespace sq

#include "formats/tokenizer.h"

namespace sq {

std::unique_ptr<Tokenizer> open_tokenizer_for(const LoadedModel& loaded, const std::string& tokenizer_path) {
  std::unique_ptr<Tokenizer> tok;
  std::string path = tokenizer_path.empty() ? loaded.default_tokenizer : tokenizer_path;
  if (tokenizer_path.empty() && loaded.sqm) {
    tok = tokenizer_from_sqm(*loaded.sqm);
    if (!tok)
      throw InputError(loaded.path + " has no embedded tokenizer (converted without one); give --tokenizer FILE");
    path = loaded.path + " (embedded tokenizer)";
  }
  if (!tok && path.empty())
    throw UsageError("no tokenizer for " + loaded.path + ": give --tokenizer (a tokenizer.bin, tokenizer.model, tokenizer.json or GGUF file)");
  if (!tok) tok = load_tokenizer(path);
  const int model_vocab = loaded.model->config().vocab_size;
  if (tok->vocab_size() != model_vocab)
    throw InputError("tokenizer " + path + " has " + std::to_string(tok->vocab_size()) + " tokens but model " + loaded.path +
                     " has a vocabulary of " + std::to_string(model_vocab));
  return tok;
}

std::unique_ptr<Tokenizer> open_tokenizer_if_any(const LoadedModel& loaded, const std::string& tokenizer_path) {
  if (tokenizer_path.empty()) {
    if (loaded.sqm && !tokenizer_from_sqm(*loaded.sqm)) return nullptr;
    if (!loaded.sqm && loaded.default_tokenizer.empty()) return nullptr;
  }
  return open_tokenizer_for(loaded, tokenizer_path);
}

}  // namespace sq
