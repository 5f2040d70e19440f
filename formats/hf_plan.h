// Applying an architecture's Hugging Face write plan (HfPlanEntry, formats/hf_architecture.h):
// which canonical row becomes which HF row. Shared by save_hf_checkpoint (float tensors) and the
// exporters of formats/hf_export.h (quantized linears, whose per-row scales, zero points and
// biases follow the same row map).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/model_config.h"
#include "core/tensor.h"
#include "formats/hf_architecture.h"

namespace sq {

/// The plan of `config`'s architecture (HfArchitecture::hf_plan). Throws UnsupportedError naming
/// the architecture when sqkit does not write it ("cannot write a Hugging Face checkpoint for
/// architecture 'gpt2' (expected one of llama, mistral, qwen2)").
std::vector<HfPlanEntry> hf_write_plan(const ModelConfig& config);

/// Row order that takes q/k rows (or biases) of `n_heads` heads from the interleaved RoPE layout
/// to HF's half-split one: new row h·hd + j·hd/2 + i reads old row h·hd + 2i + j (the permutation
/// of permute_qk_rows_for_half_split, formats/hf_checkpoint.h). head_dim must be even.
std::vector<int64_t> half_split_row_order(int n_heads, int head_dim);

/// One HF row: source index in the entry and row of that (canonical) source.
struct PlanRow {
  int source = 0;
  int64_t row = 0;
};

/// HF row r of plan entry `e` → (source, canonical row), given each source's row count. Applies
/// the entry's `rows` gather and, when config.rope_layout is Interleaved, the half-split reorder of
/// sources named "*self_attn.q_proj*" / "*self_attn.k_proj*" (n_heads / n_kv_heads heads). Throws
/// InputError naming the entry when a gather index is out of range or a source's rows do not match
/// its heads.
std::vector<PlanRow> plan_row_map(const ModelConfig& config, const HfPlanEntry& e, const std::vector<int64_t>& source_rows);

/// Canonical FP32 tensor by name, or an empty Tensor when the model has none.
using CanonicalLookup = std::function<Tensor(const std::string& name)>;

/// The float tensors of `plan` (HF name, owned FP32 tensor, file order): tensor entries and each
/// linear's NAME.weight (transposed for conv1d) and NAME.bias. Every source tensor must exist
/// (InputError "SOURCE: tensor 'NAME' is missing"), sources of one entry must have equal widths
/// (InputError). `source` names the model in messages.
std::vector<std::pair<std::string, Tensor>> plan_float_tensors(const ModelConfig& config, const std::vector<HfPlanEntry>& plan,
                                                               const CanonicalLookup& get, const std::string& source);

}  // namespace sq
