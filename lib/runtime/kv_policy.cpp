#include "runtime/kv_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <numeric>

#include "core/error.h"
#include "runtime/kv_cache.h"

namespace sq {

namespace {

const char* kind_name(KVPolicyKind k) {
  switch (k) {
    case KVPolicyKind::Dense: return "dense";
    case KVPolicyKind::Window: return "window";
    case KVPolicyKind::Sink: return "sink";
    case KVPolicyKind::Recompute: return "recompute";
    case KVPolicyKind::H2O: return "h2o";
    case KVPolicyKind::QHitter: return "qhitter";
  }
  return "?";
}

[[noreturn]] void bad(const std::string& text, const std::string& why) {
  throw UsageError("--kv-policy '" + text + "': " + why +
                   " (expected dense, window:W, sink:S,window:W, recompute:W[,stride:K], h2o:B,recent:R or qhitter:B,recent:R,lambda:L)");
}

/// A positive token count, or "N%" (0 < N ≤ 100) returning the percentage in `percent`.
int64_t parse_count(const std::string& text, const std::string& key, const std::string& v, double* percent) {
  if (percent && !v.empty() && v.back() == '%') {
    char* end = nullptr;
    const double p = std::strtod(v.c_str(), &end);
    if (end != v.c_str() + v.size() - 1 || !(p > 0 && p <= 100)) bad(text, key + " must be a percentage in (0, 100]");
    *percent = p;
    return 0;
  }
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || end != v.c_str() + v.size() || n <= 0 || n > (int64_t(1) << 40)) bad(text, key + " must be a positive integer");
  return n;
}

void validate(const KVPolicy& p, const std::string& text) {
  if (p.kind == KVPolicyKind::Sink && p.sinks >= p.window)
    bad(text, "sink:" + std::to_string(p.sinks) + " must be smaller than window:" + std::to_string(p.window));
  if (p.kind == KVPolicyKind::Recompute && p.stride > p.window)
    bad(text, "stride:" + std::to_string(p.stride) + " must not exceed recompute:" + std::to_string(p.window));
  if ((p.kind == KVPolicyKind::H2O || p.kind == KVPolicyKind::QHitter) && p.budget_percent < 0 && p.recent_percent < 0 &&
      p.recent > p.budget)
    bad(text, "recent:" + std::to_string(p.recent) + " is larger than the budget " + std::to_string(p.budget));
  if (p.kind == KVPolicyKind::QHitter && !(p.lambda >= 0 && p.lambda <= 1)) bad(text, "lambda must be in [0, 1]");
}

}  // namespace

int64_t KVPolicy::capacity(int64_t stream_length) const {
  switch (kind) {
    case KVPolicyKind::Dense: return stream_length;
    case KVPolicyKind::Window: return std::min(window, stream_length);
    case KVPolicyKind::Sink: return std::min(sinks + window, stream_length);
    case KVPolicyKind::Recompute: return std::min(window, stream_length);
    case KVPolicyKind::H2O:
    case KVPolicyKind::QHitter: return std::min(budget, stream_length);
  }
  return stream_length;
}

KVPolicy parse_kv_policy(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> fields;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string f = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t colon = f.find(':');
    fields.emplace_back(f.substr(0, colon), colon == std::string::npos ? std::string() : f.substr(colon + 1));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  KVPolicy p;
  const std::string head = fields.empty() ? "" : fields[0].first;
  auto expect_keys = [&](std::vector<std::string> keys) {
    if (fields.size() != keys.size()) bad(text, "wrong number of fields for " + head);
    for (size_t i = 0; i < keys.size(); ++i)
      if (fields[i].first != keys[i]) bad(text, "expected '" + keys[i] + ":' as field " + std::to_string(i + 1));
  };
  if (head == "dense") {
    if (fields.size() != 1 || !fields[0].second.empty()) bad(text, "dense takes no value");
    return p;
  }
  if (head == "window") {
    expect_keys({"window"});
    p.kind = KVPolicyKind::Window;
    p.window = parse_count(text, "window", fields[0].second, nullptr);
  } else if (head == "sink") {
    expect_keys({"sink", "window"});
    p.kind = KVPolicyKind::Sink;
    p.sinks = parse_count(text, "sink", fields[0].second, nullptr);
    p.window = parse_count(text, "window", fields[1].second, nullptr);
  } else if (head == "recompute") {
    expect_keys(fields.size() == 2 ? std::vector<std::string>{"recompute", "stride"} : std::vector<std::string>{"recompute"});
    p.kind = KVPolicyKind::Recompute;
    p.window = parse_count(text, "recompute", fields[0].second, nullptr);
    if (fields.size() == 2) p.stride = parse_count(text, "stride", fields[1].second, nullptr);
  } else if (head == "h2o" || head == "qhitter") {
    const bool q = head == "qhitter";
    expect_keys(q ? std::vector<std::string>{"qhitter", "recent", "lambda"} : std::vector<std::string>{"h2o", "recent"});
    p.kind = q ? KVPolicyKind::QHitter : KVPolicyKind::H2O;
    p.budget = parse_count(text, head, fields[0].second, &p.budget_percent);
    p.recent = parse_count(text, "recent", fields[1].second, &p.recent_percent);
    if (q) {
      char* end = nullptr;
      const std::string& v = fields[2].second;
      p.lambda = std::strtod(v.c_str(), &end);
      if (v.empty() || end != v.c_str() + v.size()) bad(text, "lambda must be a number in [0, 1]");
    }
  } else {
    bad(text, "unknown policy '" + head + "'");
  }
  validate(p, text);
  return p;
}

KVPolicy resolve_kv_policy(KVPolicy p, int64_t length) {
  auto pct = [&](double percent) { return std::max<int64_t>(1, std::llround(percent / 100.0 * double(length))); };
  if (p.budget_percent > 0) p.budget = pct(p.budget_percent);
  if (p.recent_percent > 0) p.recent = pct(p.recent_percent);
  p.budget_percent = p.recent_percent = -1;
  validate(p, kv_policy_name(p));
  return p;
}

std::string kv_policy_name(const KVPolicy& p) {
  auto count = [](int64_t n, double percent) {
    if (percent > 0) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g%%", percent);
      return std::string(buf);
    }
    return std::to_string(n);
  };
  switch (p.kind) {
    case KVPolicyKind::Dense: return "dense";
    case KVPolicyKind::Window: return "window:" + std::to_string(p.window);
    case KVPolicyKind::Sink: return "sink:" + std::to_string(p.sinks) + ",window:" + std::to_string(p.window);
    case KVPolicyKind::Recompute:
      return "recompute:" + std::to_string(p.window) + (p.stride > 1 ? ",stride:" + std::to_string(p.stride) : "");
    case KVPolicyKind::H2O:
    case KVPolicyKind::QHitter: {
      std::string s = std::string(kind_name(p.kind)) + ":" + count(p.budget, p.budget_percent) + ",recent:" +
                      count(p.recent, p.recent_percent);
      if (p.kind == KVPolicyKind::QHitter) {
        char buf[32];
        std::snprintf(buf, sizeof buf, ",lambda:%g", p.lambda);
        s += buf;
      }
      return s;
    }
  }
  return "?";
}

void check_cache_fits_learned_positions(const ModelConfig& c, const KVPolicy& p, int64_t capacity, int64_t stream) {
  if (c.spec.position != PositionKind::Learned || capacity <= c.max_seq_len) return;
  const std::string table = "model '" + c.architecture + "' has learned absolute positions for " + std::to_string(c.max_seq_len) +
                            " tokens only (a token takes the position of its cache row; docs/protocols.md)";
  if (p.kind == KVPolicyKind::Dense)
    throw UsageError("--kv-policy dense keeps all " + std::to_string(stream > 0 ? stream : capacity) + " tokens of the stream, but " +
                     table + ": use -c " + std::to_string(c.max_seq_len) + " or less, or an eviction policy" +
                     (c.max_seq_len > 8 ? " such as sink:4,window:" + std::to_string(c.max_seq_len - 4) : std::string()));
  throw UsageError("--kv-policy " + kv_policy_name(p) + " keeps up to " + std::to_string(capacity) + " tokens, but " + table +
                   ": use a cache of at most " + std::to_string(c.max_seq_len) + " tokens");
}

void evict_for_next_token(const KVPolicy& p, KVCache& cache, KVRowScores& scores) {
  const int64_t len = cache.length();
  std::vector<int64_t> keep;
  switch (p.kind) {
    case KVPolicyKind::Dense:
    case KVPolicyKind::Recompute: return;
    case KVPolicyKind::Window:
    case KVPolicyKind::Sink: {
      const int64_t allowed = p.kind == KVPolicyKind::Window ? p.window : p.sinks + p.window;
      if (len < allowed) return;
      // Keep the first S rows (sinks) and the newest W − 1: the next token is the W-th recent.
      const int64_t s = p.kind == KVPolicyKind::Sink ? p.sinks : 0;
      for (int64_t r = 0; r < s; ++r) keep.push_back(r);
      for (int64_t r = len - (p.window - 1); r < len; ++r)
        if (r >= s) keep.push_back(r);
      break;
    }
    case KVPolicyKind::H2O:
    case KVPolicyKind::QHitter: {
      if (len < p.budget) return;
      // Candidates: every row except the R − 1 newest (the next token completes the recent set).
      const int64_t n_cand = std::max<int64_t>(0, len - (p.recent - 1));
      const int64_t evict = len - (p.budget - 1);  // rows to drop (1 in steady state)
      std::vector<double> score(static_cast<size_t>(n_cand));
      if (p.kind == KVPolicyKind::H2O) {
        for (int64_t r = 0; r < n_cand; ++r) score[size_t(r)] = scores.attention[size_t(r)];
      } else {
        // Algorithm 1: each term normalized to [0, 1] by its maximum over the candidates.
        double ms = 0, mk = 0, mv = 0;
        for (int64_t r = 0; r < n_cand; ++r) {
          ms = std::max(ms, scores.attention[size_t(r)]);
          mk = std::max(mk, double(cache.key_quantization_error(r)));
          mv = std::max(mv, double(cache.value_quantization_error(r)));
        }
        for (int64_t r = 0; r < n_cand; ++r) {
          const double s_s = ms > 0 ? scores.attention[size_t(r)] / ms : 0.0;
          const double s_k = mk > 0 ? cache.key_quantization_error(r) / mk : 0.0;
          const double s_v = mv > 0 ? cache.value_quantization_error(r) / mv : 0.0;
          score[size_t(r)] = p.lambda * s_s + (1.0 - p.lambda) * ((1.0 - s_k) + (1.0 - s_v));
        }
      }
      // Drop the `evict` lowest-scoring candidates (ties: the older row goes first).
      std::vector<int64_t> order(static_cast<size_t>(n_cand));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return score[size_t(a)] < score[size_t(b)]; });
      std::vector<char> drop(static_cast<size_t>(len), 0);
      for (int64_t i = 0; i < std::min(evict, n_cand); ++i) drop[size_t(order[size_t(i)])] = 1;
      for (int64_t r = 0; r < len; ++r)
        if (!drop[size_t(r)]) keep.push_back(r);
      break;
    }
  }
  std::vector<double> kept_att;
  kept_att.reserve(keep.size());
  for (int64_t r : keep) kept_att.push_back(r < static_cast<int64_t>(scores.attention.size()) ? scores.attention[size_t(r)] : 0.0);
  scores.attention = std::move(kept_att);
  cache.keep_rows(keep);
}

}  // namespace sq
