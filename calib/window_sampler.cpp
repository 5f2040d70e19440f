#include "calib/window_sampler.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>

#include "core/error.h"
#include "formats/text_source.h"
#include "formats/tokenizer.h"

namespace sq {

std::vector<int64_t> draw_window_starts(int64_t total_tokens, int64_t n_samples, int64_t seq_len, uint64_t seed) {
  if (n_samples < 0) throw std::invalid_argument("draw_window_starts: negative sample count");
  if (seq_len < 1) throw std::invalid_argument("draw_window_starts: seq_len must be at least 1");
  if (total_tokens < seq_len) throw std::invalid_argument("draw_window_starts: fewer tokens than seq_len");
  const uint64_t range = static_cast<uint64_t>(total_tokens - seq_len) + 1;
  // 2^64 mod range, computed without 128-bit arithmetic: (2^64 - range) mod range.
  const uint64_t rem = (0 - range) % range;
  std::mt19937_64 rng(seed);
  std::vector<int64_t> starts;
  starts.reserve(static_cast<size_t>(n_samples));
  for (int64_t i = 0; i < n_samples; ++i) {
    uint64_t u = rng();
    // Accept u < limit = 2^64 - rem, i.e. u <= ~0 - rem (when rem == 0 every u is accepted).
    while (rem != 0 && u > ~uint64_t{0} - rem) u = rng();
    starts.push_back(static_cast<int64_t>(u % range));
  }
  return starts;
}

std::vector<std::vector<int32_t>> sample_calibration_windows(const std::string& path, const Tokenizer& tok,
                                                             int64_t n_samples, int64_t seq_len, uint64_t seed,
                                                             std::function<void(int64_t)> progress) {
  if (n_samples < 1) throw UsageError("the number of calibration samples must be at least 1 (got " + std::to_string(n_samples) + ")");
  if (seq_len < 1) throw UsageError("the calibration sequence length must be at least 1 (got " + std::to_string(seq_len) + ")");

  // Pass 1: count the tokens of the BOS-prefixed documents.
  int64_t total = 0;
  int64_t pass1_bytes = 0;
  {
    auto docs = TextDocuments::open(path);
    std::string doc;
    while (docs->next(doc)) {
      total += static_cast<int64_t>(tok.encode(doc, tok.default_add_bos(), /*add_eos=*/false).size());
      if (progress) progress(docs->bytes_read());
    }
    pass1_bytes = docs->bytes_read();
  }
  if (total < seq_len)
    throw InputError(path + ": too little text for calibration: " + std::to_string(total) +
                     " tokens (BOS per document included), need at least seq_len = " + std::to_string(seq_len));

  const std::vector<int64_t> starts = draw_window_starts(total, n_samples, seq_len, seed);
  std::vector<size_t> order(starts.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return starts[a] < starts[b]; });

  std::vector<std::vector<int32_t>> windows(starts.size(), std::vector<int32_t>(static_cast<size_t>(seq_len)));

  // Pass 2: copy each document's tokens into the windows that overlap it. Windows sorted by start
  // are also sorted by end (same length), so the finished ones form a prefix of `order`.
  {
    auto docs = TextDocuments::open(path);
    std::string doc;
    int64_t pos = 0;        // stream offset of the current document's first token
    size_t first = 0;       // first unfinished window in `order`
    while (first < order.size() && docs->next(doc)) {
      const std::vector<int> toks = tok.encode(doc, tok.default_add_bos(), /*add_eos=*/false);
      const int64_t end = pos + static_cast<int64_t>(toks.size());
      for (size_t k = first; k < order.size(); ++k) {
        const int64_t s = starts[order[k]];
        if (s >= end) break;
        const int64_t lo = std::max(s, pos), hi = std::min(s + seq_len, end);
        if (lo < hi)
          std::copy(toks.begin() + (lo - pos), toks.begin() + (hi - pos), windows[order[k]].begin() + (lo - s));
      }
      while (first < order.size() && starts[order[first]] + seq_len <= end) ++first;
      pos = end;
      if (progress) progress(pass1_bytes + docs->bytes_read());
    }
    if (first < order.size() || pos > total)
      throw InputError(path + ": the file changed while it was read (" + std::to_string(total) +
                       " tokens in the first pass, a different count in the second)");
  }
  return windows;
}

std::vector<std::vector<int32_t>> sample_token_id_windows(const std::vector<int32_t>& ids, const std::string& source,
                                                          int64_t n_samples, int64_t seq_len, uint64_t seed) {
  if (n_samples < 1) throw UsageError("the number of calibration samples must be at least 1 (got " + std::to_string(n_samples) + ")");
  if (seq_len < 1) throw UsageError("the calibration sequence length must be at least 1 (got " + std::to_string(seq_len) + ")");
  const int64_t total = static_cast<int64_t>(ids.size());
  if (total < seq_len)
    throw InputError(source + ": too few token ids for calibration: " + std::to_string(total) + ", need at least seq_len = " +
                     std::to_string(seq_len));
  const std::vector<int64_t> starts = draw_window_starts(total, n_samples, seq_len, seed);
  std::vector<std::vector<int32_t>> windows;
  windows.reserve(starts.size());
  for (const int64_t s : starts) windows.emplace_back(ids.begin() + s, ids.begin() + s + seq_len);
  return windows;
}

}  // namespace sq
