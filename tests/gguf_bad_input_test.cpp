// Issue #15's bad-input list, through the tools: each malformed GGUF file (truncated, wrong magic or
// version, a count or string length beyond the file, tensor data outside the file or misaligned, an
// element count overflowing int64, an unknown ggml type, a duplicated tensor name, a metadata key of
// the wrong type, a missing tokenizer key) makes sq-convert / sq-calibrate / sq-tokenize print one line
// on stderr and exit 2, leaving no output file. The reader's own messages are tested in
// gguf_file_test.cpp and bpe_tokenizer_test.cpp; this file checks what a user of the tools sees.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/support/cli.h"
#include "tests/support/gguf_writer.h"
#include "tests/support/process.h"
#include "tests/support/test_data.h"

namespace sq::test {
namespace {

using W = GgufWriter;

/// A one-layer llama GGUF with F32 tensors: d=4, 1 head of 4, hidden 4, vocab 4 (valid as written;
/// each case breaks one thing). `block_count_as_string` writes llama.block_count with the wrong type.
W tiny_llama(bool block_count_as_string = false) {
  W w;
  w.kv_string("general.architecture", "llama");
  if (block_count_as_string)
    w.kv_string("llama.block_count", "1");
  else
    w.kv_u32("llama.block_count", 1);
  w.kv_u32("llama.embedding_length", 4).kv_u32("llama.feed_forward_length", 4);
  w.kv_u32("llama.attention.head_count", 1).kv_u32("llama.attention.head_count_kv", 1);
  w.kv_u32("llama.context_length", 16).kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.kv_f32("llama.rope.freq_base", 10000.0f).kv_u32("llama.vocab_size", 4);
  auto add = [&](const std::string& name, uint64_t rows, uint64_t cols) {
    std::string data;
    for (uint64_t i = 0; i < rows * cols; ++i) data += W::f32(0.01f * float(i % 7));
    w.tensor(name, rows > 1 ? std::vector<uint64_t>{cols, rows} : std::vector<uint64_t>{cols}, /*F32*/ 0, data);
  };
  add("token_embd.weight", 4, 4);
  for (const char* n : {"attn_norm", "ffn_norm"}) add(std::string("blk.0.") + n + ".weight", 1, 4);
  for (const char* n : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"})
    add(std::string("blk.0.") + n + ".weight", 4, 4);
  add("output_norm.weight", 1, 4);
  return w;
}

/// A GPT-2 byte-level BPE tokenizer-only GGUF (the 256 byte tokens) without tokenizer.ggml.merges.
std::string tokenizer_without_merges() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back("<" + std::to_string(b) + ">");
  W w;
  w.kv_string("general.architecture", "llama").kv_string("tokenizer.ggml.model", "gpt2");
  w.kv_string("tokenizer.ggml.pre", "gpt-2").kv_strings("tokenizer.ggml.tokens", tokens);
  return w.bytes();
}

struct Case {
  const char* what;
  std::string bytes;
  std::string expected;  // part of the one stderr line
};

std::vector<Case> bad_files() {
  std::vector<Case> cases;
  const std::string good = tiny_llama().bytes();
  cases.push_back({"truncated in the tensor data", good.substr(0, good.size() - 10), "lies outside the file"});
  cases.push_back({"truncated in the header", good.substr(0, 60), "bad.gguf"});
  {
    W w = tiny_llama();
    w.magic = 0x46554746u;
    cases.push_back({"wrong magic", w.bytes(), "not a GGUF file"});
    w = tiny_llama();
    w.version = 7;
    cases.push_back({"wrong version", w.bytes(), "expected 2 or 3"});
  }
  {
    W w = tiny_llama();
    w.tensor_count_override = uint64_t(1) << 40;
    cases.push_back({"tensor count beyond the file", w.bytes(), "impossible"});
  }
  {
    W w = tiny_llama();
    w.kv("general.name", W::STRING, W::u64(uint64_t(1) << 40) + "abc");
    cases.push_back({"string length beyond the file", w.bytes(), "past the end"});
  }
  {
    W w = tiny_llama();
    w.tensor("extra.weight", {4}, 0, "", uint64_t(1) << 30);
    cases.push_back({"tensor data outside the file", w.bytes(), "lies outside the file"});
    w = tiny_llama();
    w.tensor("extra.weight", {4}, 0, std::string(16, '\0'), 8);
    cases.push_back({"misaligned tensor data", w.bytes(), "multiple of the alignment 32"});
  }
  {
    W w = tiny_llama();
    w.tensor("huge", {uint64_t(1) << 32, uint64_t(1) << 32}, 0, "");
    cases.push_back({"element count overflowing int64", w.bytes(), "overflows int64"});
  }
  {
    W w = tiny_llama();
    w.tensor("odd", {32}, 77, std::string(64, '\0'));
    cases.push_back({"unknown ggml type", w.bytes(), "unknown ggml type id 77"});
  }
  {
    W w = tiny_llama();
    w.tensor("blk.0.attn_norm.weight", {4}, 0, std::string(16, '\0'));
    cases.push_back({"duplicated tensor name", w.bytes(), "duplicated"});
  }
  cases.push_back({"metadata key with the wrong type", tiny_llama(true).bytes(), "llama.block_count"});
  return cases;
}

TEST(GgufBadInput, SqConvertAndSqCalibrateAreOneLineExit2WithoutOutput) {
  ScratchDir dir;
  const std::string text = dir.file("text.txt");
  write_file(text, "Some text to calibrate on.\n");
  // The valid file converts: the failures below come from the one thing each case breaks.
  write_file(dir.file("good.gguf"), tiny_llama().bytes());
  const ProcessResult ok = run_process({tool("sq-convert"), "-m", dir.file("good.gguf"), "--scheme", "f32", "-o",
                                        dir.file("good.sqm"), "-q"});
  ASSERT_EQ(ok.exit_status, 0) << ok.err;
  for (const Case& k : bad_files()) {
    SCOPED_TRACE(k.what);
    const std::string path = dir.file("bad.gguf"), out = dir.file("out.sqm"), calib = dir.file("out.h5");
    write_file(path, k.bytes);
    expect_one_line_exit2(run_process({tool("sq-convert"), "-m", path, "--scheme", "f32", "-o", out}), k.expected, out);
    expect_one_line_exit2(run_process({tool("sq-calibrate"), "-m", path, "-f", text, "--samples", "1", "--seq-len", "4", "-o", calib}),
                          k.expected, calib);
  }
}

TEST(GgufBadInput, MissingTokenizerKeyIsOneLineExit2) {
  ScratchDir dir;
  const std::string path = dir.file("tok.gguf");
  write_file(path, tokenizer_without_merges());
  expect_one_line_exit2(run_process({tool("sq-tokenize"), "-m", path, "-p", "hello"}), "tokenizer.ggml.merges");
  // A model GGUF without any tokenizer metadata: sq-tokenize names the first key it needs.
  write_file(path, tiny_llama().bytes());
  expect_one_line_exit2(run_process({tool("sq-tokenize"), "-m", path, "-p", "hello"}), "metadata key 'tokenizer.ggml.model' is missing");
}

}  // namespace
}  // namespace sq::test
