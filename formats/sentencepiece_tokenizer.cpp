#include "formats/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <stdexcept>

#include "core/error.h"
#include "formats/mapped_file.h"

namespace sq {

namespace {

/// `piece` with every '▁' (U+2581, UTF-8 E2 96 81) replaced by ' '.
std::string unescape_spaces(const std::string& piece) {
  static constexpr std::string_view kSpace = "\xE2\x96\x81";
  std::string out;
  out.reserve(piece.size());
  for (size_t i = 0; i < piece.size();) {
    if (std::string_view(piece).substr(i, kSpace.size()) == kSpace) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += piece[i++];
    }
  }
  return out;
}

/// The byte value of a "<0xXX>" piece, or -1.
int byte_value(const std::string& piece) {
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
  try {
    size_t used = 0;
    int v = std::stoi(piece.substr(3, 2), &used, 16);
    return used == 2 ? v : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& path)
    : SentencePieceTokenizer(read_file_to_string(path), path) {}  // InputError "cannot open PATH: ..."

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& bytes, const std::string& path)
    : SentencePieceTokenizer(bytes, path, SentencePieceOptions{}) {}

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& bytes, const std::string& path,
                                               const SentencePieceOptions& options)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()), opt_(options) {
  if (bytes.empty()) throw InputError(path + ": empty file, expected a SentencePiece tokenizer.model");
  const auto status = sp_->LoadFromSerializedProto(bytes);
  if (!status.ok()) {
    std::string reason = status.ToString();
    while (!reason.empty() && reason.back() == ' ') reason.pop_back();
    throw InputError(path + ": not a valid SentencePiece model: " + reason);
  }
  const int n = sp_->GetPieceSize();
  if (n <= 0) throw InputError(path + ": SentencePiece model has no pieces");
  bos_ = sp_->bos_id() >= 0 ? sp_->bos_id() : 1;
  eos_ = sp_->eos_id() >= 0 ? sp_->eos_id() : 2;
  if (opt_.bos >= 0) bos_ = opt_.bos;
  if (opt_.eos >= 0) eos_ = opt_.eos;
  if (bos_ >= n || eos_ >= n) {
    throw InputError(path + ": BOS id " + std::to_string(bos_) + " / EOS id " + std::to_string(eos_) +
                     " outside the vocabulary of " + std::to_string(n) + " pieces");
  }
  text_.resize(n);
  for (int id = 0; id < n; ++id) {
    if (sp_->IsControl(id) || sp_->IsUnknown(id)) continue;
    const std::string& p = sp_->IdToPiece(id);
    const int b = sp_->IsByte(id) ? byte_value(p) : -1;
    text_[id] = b >= 0 ? std::string(1, static_cast<char>(b)) : unescape_spaces(p);
  }
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int> SentencePieceTokenizer::encode(std::string_view text, bool add_bos, bool add_eos) const {
  std::vector<int> ids;
  auto run = [&](std::string_view part) {
    if (part.empty()) return;
    std::vector<int> out;
    const auto status = sp_->Encode(part, &out);
    if (!status.ok()) throw Error("SentencePiece failed to encode text: " + status.ToString());
    ids.insert(ids.end(), out.begin(), out.end());
  };
  if (!opt_.split_at_newlines) {
    run(text);
  } else {
    size_t start = 0;
    for (size_t i = 1; i <= text.size(); ++i) {
      if (i == text.size() || ((text[i] == '\n') != (text[i - 1] == '\n'))) {
        run(text.substr(start, i - start));
        start = i;
      }
    }
  }
  if (add_bos) ids.insert(ids.begin(), bos_);
  if (add_eos) ids.push_back(eos_);
  return ids;
}

void SentencePieceTokenizer::check(int token) const {
  if (token < 0 || token >= vocab_size()) {
    throw std::out_of_range("SentencePieceTokenizer: token " + std::to_string(token) + " outside [0, " +
                            std::to_string(vocab_size()) + ")");
  }
}

std::string SentencePieceTokenizer::decode_token(int prev_token, int token) const {
  check(token);
  const std::string& t = text_[token];
  if (opt_.strip_space_after_bos && prev_token == bos_ && !sp_->IsByte(token) && !t.empty() && t[0] == ' ') return t.substr(1);
  return t;
}

int SentencePieceTokenizer::vocab_size() const { return sp_->GetPieceSize(); }

std::string SentencePieceTokenizer::piece(int token) const {
  check(token);
  return sp_->IdToPiece(token);
}

std::vector<std::pair<std::string, int>> SentencePieceTokenizer::special_token_texts() const {
  std::vector<std::pair<std::string, int>> out;
  const int n = sp_->GetPieceSize();
  for (int id = 0; id < n; ++id)
    if (sp_->IsControl(id) && !sp_->IdToPiece(id).empty()) out.emplace_back(sp_->IdToPiece(id), id);
  return out;
}

float SentencePieceTokenizer::score(int token) const {
  check(token);
  return sp_->GetScore(token);
}

}  // namespace sq
