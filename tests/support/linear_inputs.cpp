#include "tests/support/linear_inputs.h"

#include <stdexcept>

#include "formats/llama2c_checkpoint.h"
#include "formats/tokenizer.h"
#include "model/linear.h"
#include "model/decoder.h"
#include "ops/ops.h"
#include "tests/support/test_data.h"

namespace sq::test {

StoriesLinearInputs stories_linear_inputs(int64_t n) {
  if (n < 1) throw std::invalid_argument("stories_linear_inputs: n must be >= 1");
  const Checkpoint ck = load_llama2c_checkpoint(stories_model());
  const Decoder model = Decoder::from_checkpoint(ck);
  auto tok = load_tokenizer(stories_tokenizer());
  const std::vector<int> ids =
      tok->encode("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. "
                  "One day, she saw a big red ball under a tree and ran to get it.",
                  true, false);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) tokens[size_t(t)] = ids[size_t(t) % ids.size()];
  const ModelConfig& c = model.config();
  const DecoderLayer& L = model.layers()[0];
  auto dense = [](const Linear& l) { return dynamic_cast<const DenseLinear&>(l).weight().clone(); };
  StoriesLinearInputs in;
  in.n = n;
  std::vector<float> emb(size_t(n) * size_t(c.dim));
  model.embed(tokens.data(), n, emb.data());
  in.x64.resize(emb.size());
  ops::rms_norm(emb.data(), L.attn_norm.data(), in.x64.data(), n, c.dim, c.norm_eps);
  std::vector<float> gate(size_t(n) * size_t(c.hidden_dim)), up(gate.size());
  L.gate_proj->forward(in.x64.data(), n, gate.data());
  L.up_proj->forward(in.x64.data(), n, up.data());
  ops::swiglu(gate.data(), up.data(), int64_t(gate.size()));
  in.x172 = gate;
  in.wq = dense(*L.q_proj);
  in.wgate = dense(*L.gate_proj);
  in.wdown = dense(*L.down_proj);
  in.whead = dense(model.lm_head());
  return in;
}

}  // namespace sq::test
