// sq-tokenize: the token ids of a text under a model's tokenizer, printed like llama.cpp's
// llama-tokenize: one line per token "ID -> 'PIECE'" (PIECE is the token's decoded text), or with
// --ids the list "[ID, ID, ...]". -m takes a GGUF model (its tokenizer.* metadata only, no weights
// are read), a tokenizer.json / tokenizer.model / tokenizer.bin file, a Hugging Face checkpoint
// directory (tokenizer.model, else tokenizer.json) or a .sqm with an embedded tokenizer. BOS/EOS
// follow the model (GGUF tokenizer.ggml.add_bos_token ...) unless --add-bos / --no-bos is given.
// Special-token strings in the text are not parsed (encoded as plain text).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "core/tool_main.h"
#include "formats/mapped_file.h"
#include "formats/sqm_file.h"
#include "formats/tokenizer.h"
#include "model/sqm_model.h"
#include "tool_cli.h"

namespace {

/// The tokenizer of `path`: a .sqm's embedded one, else load_tokenizer (GGUF, tokenizer files,
/// directories). Throws InputError naming the file.
std::unique_ptr<sq::Tokenizer> open_tokenizer(const std::string& path) {
  if (sq::looks_like_sqm(path)) {
    const auto file = sq::SqmFile::open(path, false);
    auto tok = sq::tokenizer_from_sqm(*file);
    if (!tok) throw sq::InputError(path + " has no embedded tokenizer (converted without one)");
    return tok;
  }
  return sq::load_tokenizer(path);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sq-tokenize: print the token ids of a text under a model's tokenizer (like llama.cpp's llama-tokenize)."};
  std::string model, prompt, file;
  bool ids_only = false, add_bos = false, no_bos = false;
  app.add_option("-m,--model", model,
                 "GGUF model, tokenizer.json / tokenizer.model / tokenizer.bin, Hugging Face directory or .sqm")
      ->required();
  auto* p = app.add_option("-p,--prompt", prompt, "The text to tokenize");
  auto* f = app.add_option("-f,--file", file, "Read the text from FILE (verbatim)");
  p->excludes(f);
  f->excludes(p);
  app.add_flag("--ids", ids_only, "Print only the id list [ID, ID, ...]");
  auto* ab = app.add_flag("--add-bos", add_bos, "Put BOS first even if the model does not");
  auto* nb = app.add_flag("--no-bos", no_bos, "Never put BOS first");
  ab->excludes(nb);
  nb->excludes(ab);
  bool special = false;
  app.add_flag("--special", special,
               "Parse special-token text (e.g. <|im_start|>) into its token id, as transformers' tokenizers and llama.cpp's "
               "llama-tokenize do; without it such text is tokenized as plain characters");
  sq::add_version_flag(app, "sq-tokenize");
  if (const int status = sq::parse_tool_args(app, "sq-tokenize", argc, argv); status >= 0) return status;

  return sq::run_tool("sq-tokenize", [&]() {
    if (p->count() == 0 && f->count() == 0) throw sq::UsageError("give the text with -p TEXT or -f FILE");
    const std::string text = f->count() ? sq::read_file_to_string(file) : prompt;
    const auto tok = open_tokenizer(model);
    const bool bos = add_bos || (!no_bos && tok->default_add_bos());
    const std::vector<int> ids = special ? tok->encode_special(text, bos, tok->default_add_eos()) : tok->encode(text, bos, tok->default_add_eos());
    std::string out;
    if (ids_only) {
      out = "[";
      for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
      out += "]\n";
    } else {
      char buf[32];
      for (int id : ids) {
        std::snprintf(buf, sizeof buf, "%6d -> '", id);
        out += buf;
        const std::string t = tok->decode_token(-1, id);
        out += t.empty() ? tok->piece(id) : t;  // control tokens (BOS/EOS) show their name
        out += "'\n";
      }
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  });
}
