// Random calibration windows of L tokens drawn from a text file (sq-calibrate -f TEXT -n N -L L), or
// from a sequence of token ids (sq-calibrate --token-ids FILE; sample_token_id_windows).
//
// Procedure (docs/formats.md, "Calibration file (HDF5)", "Calibration windows"):
//  1. The file is read as a stream of documents (TextDocuments: plain text, JSON Lines, zstd).
//  2. Each document is tokenized with BOS prepended when the tokenizer adds one (Tokenizer::default_add_bos(); SmolLM2: no) and no EOS; the token streams are conceptually
//     concatenated in file order into one stream of T tokens.
//  3. N start offsets are drawn by draw_window_starts(T, N, L, seed) from [0, T − L].
//  4. Window i is tokens [start_i, start_i + L) of the stream (it may span documents, and windows
//     may overlap or repeat).
// Two streaming passes over the file: pass 1 counts T, pass 2 extracts the windows, so memory is
// O(N·L + one document) whatever the file size. Single-threaded; the result depends only on the
// file, the tokenizer, N, L and the seed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace sq {

class Tokenizer;

/// The N window start offsets, in draw order, for a token stream of `total_tokens` tokens.
/// Fully specified so that other tools can reproduce it (libstdc++'s
/// uniform_int_distribution is not specified by the standard, so it is not used):
///
///     rng   = std::mt19937_64(seed)            // standard-specified engine, default-seeded by `seed`
///     range = total_tokens − seq_len + 1       // number of possible starts
///     limit = 2^64 − (2^64 mod range)          // largest multiple of range ≤ 2^64
///     repeat N times: draw u = rng() until u < limit; start = u mod range
///
/// (rejection sampling: every start in [0, total_tokens − seq_len] is exactly equally likely).
/// Throws std::invalid_argument when n_samples < 0, seq_len < 1 or total_tokens < seq_len.
std::vector<int64_t> draw_window_starts(int64_t total_tokens, int64_t n_samples, int64_t seq_len, uint64_t seed);

/// Samples `n_samples` windows of `seq_len` tokens from the text file `path` (see the file
/// comment): sample i is the window at the i-th drawn start (draw order, not sorted). Windows are
/// extracted in a second pass in order of their starts (ties by draw index), and the read stops
/// as soon as the last window is complete.
///
/// `progress`, when set, is called after every document with the number of file bytes read so
/// far, counted over both passes (it goes from 0 to 2 × file size; the second pass may stop
/// early).
///
/// Throws UsageError when n_samples < 1 or seq_len < 1; InputError naming the file when it cannot
/// be read or is malformed (TextDocuments::next), when it holds too little text ("PATH: too little
/// text for calibration: 300 tokens, need at least seq_len = 512"), or when it changed between the
/// two passes.
std::vector<std::vector<int32_t>> sample_calibration_windows(const std::string& path, const Tokenizer& tok,
                                                             int64_t n_samples, int64_t seq_len, uint64_t seed,
                                                             std::function<void(int64_t bytes_done)> progress = {});

/// The same windows cut from a token stream given as ids (pre-tokenized input, `sq-calibrate
/// --token-ids`; formats/token_ids_file.h): the stream is `ids` exactly as given (no BOS added),
/// starts are drawn by draw_window_starts(ids.size(), n_samples, seq_len, seed), and window i is
/// ids[start_i, start_i + seq_len). Throws UsageError when n_samples < 1 or seq_len < 1, and
/// InputError "SOURCE: too few token ids for calibration: T, need at least seq_len = L".
std::vector<std::vector<int32_t>> sample_token_id_windows(const std::vector<int32_t>& ids, const std::string& source,
                                                          int64_t n_samples, int64_t seq_len, uint64_t seed);

}  // namespace sq
