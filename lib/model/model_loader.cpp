#include "model/model_loader.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "formats/hf_checkpoint.h"
#include "formats/llama2c_checkpoint.h"

namespace sq {

LoadedModel load_model(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw InputError("cannot open " + path + ": " + std::strerror(errno));
  Checkpoint ck;
  LoadedModel out;
  if (S_ISDIR(st.st_mode)) {
    ck = load_hf_checkpoint(path);
    const auto tok = std::filesystem::path(path) / "tokenizer.model";
    if (std::filesystem::exists(tok)) out.default_tokenizer = tok.string();
  } else if (looks_like_llama2c_checkpoint(path)) {
    ck = load_llama2c_checkpoint(path);
  } else {
    throw InputError(path + ": not a recognized model (expected a llama2.c checkpoint or a Hugging Face checkpoint "
                            "directory with config.json and *.safetensors)");
  }
  out.model = std::make_unique<LlamaModel>(LlamaModel::from_checkpoint(ck));
  out.path = path;
  out.format = ck.format;
  return out;
}

}  // namespace sq

#include "formats/tokenizer.h"

namespace sq {

std::unique_ptr<Tokenizer> open_tokenizer_for(const LoadedModel& loaded, const std::string& tokenizer_path) {
  const std::string path = tokenizer_path.empty() ? loaded.default_tokenizer : tokenizer_path;
  if (path.empty())
    throw UsageError("no tokenizer for " + loaded.path + ": give --tokenizer (a tokenizer.bin or tokenizer.model)");
  auto tok = load_tokenizer(path);
  const int model_vocab = loaded.model->config().vocab_size;
  if (tok->vocab_size() != model_vocab)
    throw InputError("tokenizer " + path + " has " + std::to_string(tok->vocab_size()) + " tokens but model " + loaded.path +
                     " has a vocabulary of " + std::to_string(model_vocab));
  return tok;
}

}  // namespace sq
