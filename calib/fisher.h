// Diagonal Fisher information of the K/V cache activations (KVQuant, Hooper et al. 2024, §3.3 and
// Eq. 2: the sensitivity-weighted k-means objective Σ_i F_ii·(A_i − Q(A_i))², with F_ii the
// diagonal Fisher information of activation element A_i, estimated as the squared gradient of the
// loss). `sq-calibrate --fisher` records it; a KVQuant converter fits its per-layer non-uniform
// codebooks on the stored (activation, weight) pairs.
//
// Definition used here. Every calibration window w (N windows of L tokens) gives one loss
// L_w = mean next-token NLL of the window (lib/model/decoder_backward.h, any DecoderSpec). The K
// (as the KV cache receives it: after QK-norm, before RoPE) and V element a = A[w, t, c] at layer l
// exists in window w only, so the expectation over calibration samples that defines the
// empirical Fisher, F = E_w[(∂L_w/∂a)²], has a single non-zero term for it. We store that term,
// F(a) = (∂L_w/∂a)², per element, and do not divide by N: the factor 1/N (or the (L−1)² that
// relates the mean-NLL to the summed-NLL gradient) is one constant for the whole file, and a
// constant factor on all weights changes neither the weighted k-means centroids nor its
// assignments.
//
// Subsampling. Tokens at position L−1 (the last of their window) have ∂L_w/∂a = 0 exactly (their
// K/V reach only the last position's logits, which L_w does not score), so the candidates are the
// N·(L−1) pairs (window, position ≤ L−2). At most `max_tokens` of them are kept, the same tokens in
// every layer, chosen uniformly without replacement by select_fisher_tokens (deterministic given
// the seed); each kept token stores its whole K and V rows with their weights, its position and its
// window. File size: 16·T·kvw + 8·T bytes per layer (T ≤ max_tokens).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "calib/kv_fisher_samples.h"
#include "model/decoder.h"

namespace sq {

/// Default cap on the Fisher tokens kept per layer (sq-calibrate --fisher-tokens): 2,048 tokens
/// = 1 MiB per layer for stories260K (kvw 32), 128 MiB per layer for kvw 4096.
inline constexpr int64_t kDefaultFisherTokens = 2048;

/// One kept calibration token.
struct FisherToken {
  int32_t window = 0;    ///< index into the calibration windows
  int32_t position = 0;  ///< position within the window, 0 … L−2
};

/// The tokens kept for `windows` windows of `seq_len` tokens, at most `max_tokens` of the
/// C = windows·(seq_len−1) candidates (window, position ≤ seq_len−2), sorted by (window, position).
/// All of them when C ≤ max_tokens; otherwise exactly max_tokens, uniformly without replacement,
/// by selection sampling (Knuth, TAOCP vol. 2, §3.4.2, Algorithm S) over the candidates in order
/// i = window·(seq_len−1) + position:
///
///     rng = std::mt19937_64(seed ^ 0x9E3779B97F4A7C15)      // decorrelated from the window draws
///     for i in 0 … C−1: u = (rng() >> 11) · 2⁻⁵³; keep i if (C − i)·u < (max_tokens − kept so far)
///
/// Throws std::invalid_argument when windows < 1, seq_len < 2 or max_tokens < 1, or a window index
/// or position does not fit int32.
std::vector<FisherToken> select_fisher_tokens(int64_t windows, int64_t seq_len, int64_t max_tokens, uint64_t seed);

/// What collect_kv_fisher returns.
struct KVFisherResult {
  std::vector<KVFisherSamples> layers;  ///< [n_layers], the same tokens in every layer
  double mean_loss = 0.0;               ///< mean over windows of each window's mean NLL (nats)
};

/// Runs the forward and backward pass (DecoderKVBackward<float>) over every window and keeps, for
/// the tokens select_fisher_tokens(windows.size(), L, max_tokens, seed) picks, their K (pre-RoPE)
/// and V rows and the squared gradients (see the file comment). All windows must have the same
/// length L ≥ 2. Small models (dim < 1024) run windows in parallel, one per thread; each window
/// writes only its own rows, so the result is bit-identical for any thread count. Memory: the kept
/// rows plus one window's activations and gradients per thread. `progress(done, total)` is called
/// after each group of windows.
/// Throws std::invalid_argument for no windows or windows of different lengths, UnsupportedError
/// for a model that is not FP32 (DecoderKVBackward), and what DecoderKVBackward::gradients throws.
KVFisherResult collect_kv_fisher(const Decoder& model, const std::vector<std::vector<int32_t>>& windows,
                                 int64_t max_tokens, uint64_t seed,
                                 const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace sq
