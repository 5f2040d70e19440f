#include "formats/hf_plan.h"

#include <cstring>

#include "core/error.h"

namespace sq {

std::vector<HfPlanEntry> hf_write_plan(const ModelConfig& c) {
  const HfArchitecture* arch = hf_architecture_named(c.architecture);
  if (!arch || !arch->hf_plan) {
    std::string writable;
    for (const auto& a : hf_architectures())
      if (a.hf_plan) writable += std::string(writable.empty() ? "" : ", ") + a.name;
    throw UnsupportedError("cannot write a Hugging Face checkpoint for architecture '" + c.architecture + "' (expected one of " +
                           writable + ")");
  }
  return arch->hf_plan(c);
}

std::vector<int64_t> half_split_row_order(int n_heads, int head_dim) {
  std::vector<int64_t> order(size_t(n_heads) * size_t(head_dim));
  const int half = head_dim / 2;
  for (int h = 0; h < n_heads; ++h)
    for (int j = 0; j < 2; ++j)
      for (int i = 0; i < half; ++i) order[size_t(h * head_dim + j * half + i)] = int64_t(h) * head_dim + 2 * i + j;
  return order;
}

namespace {

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

std::vector<PlanRow> plan_row_map(const ModelConfig& c, const HfPlanEntry& e, const std::vector<int64_t>& source_rows) {
  std::vector<PlanRow> concat;
  for (size_t s = 0; s < e.sources.size(); ++s) {
    const std::string& name = e.sources[s];
    std::vector<int64_t> order;
    if (c.rope_layout == RopeLayout::Interleaved && (contains(name, "self_attn.q_proj") || contains(name, "self_attn.k_proj"))) {
      const int heads = contains(name, "self_attn.q_proj") ? c.n_heads : c.n_kv_heads;
      if (source_rows[s] != int64_t(heads) * c.head_dim || c.head_dim % 2 != 0)
        throw InputError("'" + name + "' has " + std::to_string(source_rows[s]) + " rows, expected " + std::to_string(heads) + " heads of " +
                         std::to_string(c.head_dim));
      order = half_split_row_order(heads, c.head_dim);
    }
    for (int64_t r = 0; r < source_rows[s]; ++r) concat.push_back({int(s), order.empty() ? r : order[size_t(r)]});
  }
  if (e.rows.empty()) return concat;
  std::vector<PlanRow> out;
  out.reserve(e.rows.size());
  for (int64_t r : e.rows) {
    if (r < 0 || r >= int64_t(concat.size()))
      throw InputError("write plan of '" + e.name + "': row " + std::to_string(r) + " is outside its " + std::to_string(concat.size()) +
                       " source rows");
    out.push_back(concat[size_t(r)]);
  }
  return out;
}

namespace {

/// Rows of `parts` (rank 1 or 2, equal widths) by `map`, as one owned tensor.
Tensor gather_rows(const std::vector<Tensor>& parts, const std::vector<PlanRow>& map, const std::string& what) {
  const int rank = parts[0].rank();
  const int64_t width = rank == 2 ? parts[0].dim(1) : 1;
  for (const Tensor& t : parts)
    if (t.rank() != rank || (rank == 2 && t.dim(1) != width) || rank < 1 || rank > 2)
      throw InputError(what + ": its sources have shapes that cannot be stacked by rows (" + t.shape_string() + " vs " +
                       parts[0].shape_string() + ")");
  std::vector<float> v(map.size() * size_t(width));
  for (size_t r = 0; r < map.size(); ++r)
    std::memcpy(v.data() + r * size_t(width), parts[size_t(map[r].source)].data() + map[r].row * width, size_t(width) * sizeof(float));
  return Tensor::from_vector(rank == 2 ? std::vector<int64_t>{int64_t(map.size()), width} : std::vector<int64_t>{int64_t(map.size())},
                             std::move(v));
}

Tensor transposed(const Tensor& t) {
  const int64_t a = t.dim(0), b = t.dim(1);
  std::vector<float> v(size_t(a * b));
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j) v[size_t(j * a + i)] = t.data()[i * b + j];
  return Tensor::from_vector({b, a}, std::move(v));
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> plan_float_tensors(const ModelConfig& c, const std::vector<HfPlanEntry>& plan,
                                                               const CanonicalLookup& get, const std::string& source) {
  std::vector<std::pair<std::string, Tensor>> out;
  auto need = [&](const std::string& name) {
    Tensor t = get(name);
    if (t.empty()) throw InputError(source + ": tensor '" + name + "' is missing");
    return t;
  };
  for (const HfPlanEntry& e : plan) {
    std::vector<Tensor> parts;
    std::vector<int64_t> rows;
    for (const std::string& s : e.sources) {
      parts.push_back(need(e.linear ? s + ".weight" : s));
      rows.push_back(parts.back().dim(0));
    }
    const std::vector<PlanRow> map = plan_row_map(c, e, rows);
    Tensor t = gather_rows(parts, map, source + ": '" + e.name + "'");
    if (!e.linear) {
      if (e.add != 0.0f) {
        float* p = t.mutable_data();
        for (int64_t i = 0; i < t.numel(); ++i) p[i] += e.add;
      }
      out.emplace_back(e.name, std::move(t));
      continue;
    }
    out.emplace_back(e.name + ".weight", e.conv1d ? transposed(t) : std::move(t));
    bool any_bias = e.zero_bias;
    std::vector<Tensor> biases;
    for (size_t s = 0; s < e.sources.size(); ++s) {
      Tensor b = get(e.sources[s] + ".bias");
      if (!b.empty()) any_bias = true;
      biases.push_back(b.empty() ? Tensor::zeros({rows[s]}) : b);
    }
    if (any_bias) out.emplace_back(e.name + ".bias", gather_rows(biases, map, source + ": '" + e.name + ".bias'"));
  }
  return out;
}

}  // namespace sq
