// Unit tests of the byte-level BPE tokenizer (formats/bpe_tokenizer.h) and of the GGUF tokenizer
// reader (formats/gguf_tokenizer.h) on small hand-made vocabularies: merge order, pre-tokenizer
// splitting, control tokens never produced from text, byte fallback and score-ordered merges of the
// SentencePiece path, tokenizer.json parsing, and bad metadata refused with the key named.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/error.h"
#include "formats/bpe_tokenizer.h"
#include "formats/gguf_file.h"
#include "formats/gguf_tokenizer.h"
#include "formats/mapped_file.h"
#include "formats/tokenizer.h"
#include "tests/support/gguf_writer.h"

namespace {

using W = sq::test::GgufWriter;

/// The 256 byte-level characters (ids 0..255 in byte order), then `extra` tokens.
std::vector<std::string> byte_vocab(const std::vector<std::string>& extra) {
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(sq::byte_level_char(static_cast<uint8_t>(b)));
  v.insert(v.end(), extra.begin(), extra.end());
  return v;
}

std::string i32s(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += W::i32(x);
  return W::array(W::I32, v.size(), s);
}
std::string f32s(const std::vector<float>& v) {
  std::string s;
  for (float x : v) s += W::f32(x);
  return W::array(W::F32, v.size(), s);
}

std::unique_ptr<sq::Tokenizer> from_gguf(const W& w, const std::string& name = "tiny.gguf") {
  const std::string bytes = w.bytes();
  return sq::load_tokenizer_from_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), name);
}

W gpt2_writer(const std::vector<std::string>& tokens, const std::vector<std::string>& merges, const std::string& pre = "gpt-2") {
  W w;
  w.kv_string("tokenizer.ggml.model", "gpt2").kv_string("tokenizer.ggml.pre", pre).kv_strings("tokenizer.ggml.tokens", tokens);
  w.kv_strings("tokenizer.ggml.merges", merges);
  return w;
}

template <typename E>
void expect_throw_naming(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one naming " << needle;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(BpeTokenizer, MergeOrderFollowsRank) {
  // "abc" with merges ranked (b c) before (a b): a + bc; the other order: ab + c.
  const auto tokens = byte_vocab({"ab", "bc"});
  EXPECT_EQ(from_gguf(gpt2_writer(tokens, {"b c", "a b"}))->encode("abc", false, false), (std::vector<int>{'a', 257}));
  EXPECT_EQ(from_gguf(gpt2_writer(tokens, {"a b", "b c"}))->encode("abc", false, false), (std::vector<int>{256, 'c'}));
}

TEST(BpeTokenizer, EqualRanksMergeLeftmostFirstAndChain) {
  const auto tokens = byte_vocab({"aa", "aaa", "aaaa"});
  auto tok = from_gguf(gpt2_writer(tokens, {"a a", "aa a", "aa aa"}));
  EXPECT_EQ(tok->encode("aaa", false, false), (std::vector<int>{257}));    // a a -> aa, aa a -> aaa
  EXPECT_EQ(tok->encode("aaaa", false, false), (std::vector<int>{258}));   // aa aa (rank 2) after (aa)(aa)
  // a a a a a: (a a) a a a -> aa (a a) a -> aa aa a: (aa a) rank 1 beats (aa aa) rank 2 -> aa aaa
  EXPECT_EQ(tok->encode("aaaaa", false, false), (std::vector<int>{256, 257}));
}

TEST(BpeTokenizer, Gpt2PreTokenizerSplitsWordsAndSpaces) {
  // "Ġb" would merge across a word boundary only if the pre-tokenizer let it.
  const auto tokens = byte_vocab({"Ġb", "aĠ"});
  auto tok = from_gguf(gpt2_writer(tokens, {"a Ġ", "Ġ b"}));
  // chunks: "a", " b", "  " (trailing spaces) -> a | Ġb | Ġ Ġ
  EXPECT_EQ(tok->encode("a b  ", false, false), (std::vector<int>{'a', 256, ' ', ' '}));
}

TEST(BpeTokenizer, SmollmPreSplitsDigitsOneByOne) {
  const auto tokens = byte_vocab({"12"});
  EXPECT_EQ(from_gguf(gpt2_writer(tokens, {"1 2"}, "gpt-2"))->encode("12", false, false), (std::vector<int>{256}));
  EXPECT_EQ(from_gguf(gpt2_writer(tokens, {"1 2"}, "smollm"))->encode("12", false, false), (std::vector<int>{'1', '2'}));
  EXPECT_EQ(from_gguf(gpt2_writer(tokens, {"1 2"}, "qwen2"))->encode("12", false, false), (std::vector<int>{'1', '2'}));
  EXPECT_EQ(from_gguf(gpt2_writer(tokens, {"1 2"}, "llama-bpe"))->encode("12", false, false), (std::vector<int>{256}));
}

TEST(BpeTokenizer, ControlAndUserDefinedTokensAreNeverProducedFromText) {
  auto tokens = byte_vocab({"<s>", "<", "s", ">", "<s", "hi"});
  W w = gpt2_writer(tokens, {"< s"});
  std::vector<int32_t> types(tokens.size(), 1);
  types[256] = 3;  // control "<s>"
  types[261] = 4;  // user-defined "hi"
  w.kv("tokenizer.ggml.token_type", W::ARRAY, i32s(types)).kv_u32("tokenizer.ggml.bos_token_id", 256);
  w.kv_bool("tokenizer.ggml.add_bos_token", true);
  auto tok = from_gguf(w);
  const auto ids = tok->encode("<s>hi", false, false);
  for (int id : ids) {
    EXPECT_NE(id, 256);
    EXPECT_NE(id, 261);
  }
  EXPECT_EQ(tok->decode(ids), "<s>hi");
  EXPECT_TRUE(tok->default_add_bos());
  EXPECT_EQ(tok->encode("hi", true, false).front(), 256);
  EXPECT_EQ(tok->decode_token(-1, 256), "");
  EXPECT_EQ(tok->decode_token(-1, 261), "hi");
}

TEST(BpeTokenizer, AnyBytesRoundTripIncludingInvalidUtf8) {
  auto tok = from_gguf(gpt2_writer(byte_vocab({"Ġa"}), {"Ġ a"}));
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  all += "\xC3 \xE6\x97\xA5\xFF\xFE a\n\n";
  const auto ids = tok->encode(all, false, false);
  EXPECT_EQ(tok->decode(ids), all);
  EXPECT_EQ(tok->encode("\xFF", false, false), (std::vector<int>{255}));
}

TEST(BpeTokenizer, UnknownPreIsRefused) {
  expect_throw_naming<sq::UnsupportedError>([] { from_gguf(gpt2_writer(byte_vocab({}), {}, "falcon")); }, "tokenizer.ggml.pre \"falcon\"");
}

TEST(BpeTokenizer, MissingMergesNamesTheKey) {
  W w;
  w.kv_string("tokenizer.ggml.model", "gpt2").kv_strings("tokenizer.ggml.tokens", byte_vocab({}));
  expect_throw_naming<sq::InputError>([&] { from_gguf(w); }, "tokenizer.ggml.merges");
}

TEST(BpeTokenizer, BadMetadataNamesTheKey) {
  const auto tokens = byte_vocab({"ab"});
  {
    W w = gpt2_writer(tokens, {"a b"});
    w.kv("tokenizer.ggml.token_type", W::ARRAY, i32s(std::vector<int32_t>(tokens.size() - 1, 1)));
    expect_throw_naming<sq::InputError>([&] { from_gguf(w); }, "tokenizer.ggml.token_type has 256 entries");
  }
  {
    W w = gpt2_writer(tokens, {"a b"});
    w.kv_u32("tokenizer.ggml.bos_token_id", 257);
    expect_throw_naming<sq::InputError>([&] { from_gguf(w); }, "tokenizer.ggml.bos_token_id = 257 is outside");
  }
  {
    W w = gpt2_writer(tokens, {"a b"});
    w.kv_i32("tokenizer.ggml.eos_token_id", -1);
    expect_throw_naming<sq::InputError>([&] { from_gguf(w); }, "tokenizer.ggml.eos_token_id = -1");
  }
  expect_throw_naming<sq::InputError>([&] { from_gguf(gpt2_writer(tokens, {"a c"})); }, "merge 0 (\"a c\")");
  expect_throw_naming<sq::InputError>([&] { from_gguf(gpt2_writer(tokens, {"ab"})); }, "tokenizer.ggml.merges[0]");
  {
    W w;
    w.kv_string("tokenizer.ggml.model", "wordpiece").kv_strings("tokenizer.ggml.tokens", tokens);
    expect_throw_naming<sq::UnsupportedError>([&] { from_gguf(w); }, "tokenizer.ggml.model \"wordpiece\"");
  }
}

// ---- SentencePiece from GGUF ("llama") ----

/// <unk> <s> </s>, the 256 byte pieces (ids 3..258), then `extra` normal pieces with `scores`.
W spm_writer(const std::vector<std::string>& extra, const std::vector<float>& extra_scores, bool space_prefix,
             const std::vector<std::pair<int, int32_t>>& type_overrides = {}) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  std::vector<float> scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    tokens.push_back(buf);
    types.push_back(6);
    scores.push_back(0);
  }
  for (size_t i = 0; i < extra.size(); ++i) {
    tokens.push_back(extra[i]);
    types.push_back(1);
    scores.push_back(extra_scores[i]);
  }
  for (auto [id, t] : type_overrides) types[id] = t;
  W w;
  w.kv_string("tokenizer.ggml.model", "llama").kv_strings("tokenizer.ggml.tokens", tokens);
  w.kv("tokenizer.ggml.scores", W::ARRAY, f32s(scores)).kv("tokenizer.ggml.token_type", W::ARRAY, i32s(types));
  w.kv_u32("tokenizer.ggml.bos_token_id", 1).kv_u32("tokenizer.ggml.eos_token_id", 2).kv_u32("tokenizer.ggml.unknown_token_id", 0);
  w.kv_bool("tokenizer.ggml.add_space_prefix", space_prefix);
  return w;
}

TEST(SpmGgufTokenizer, MergesByScoreAndFallsBackToBytes) {
  // 259 a, 260 b, 261 c, 262 ab, 263 bc, 264 ▁
  const std::vector<std::string> extra = {"a", "b", "c", "ab", "bc", "\xE2\x96\x81"};
  auto bc_first = from_gguf(spm_writer(extra, {-1, -1, -1, -5, -2, -1}, false));
  EXPECT_EQ(bc_first->encode("abc", false, false), (std::vector<int>{259, 263}));
  auto ab_first = from_gguf(spm_writer(extra, {-1, -1, -1, -2, -5, -1}, false));
  EXPECT_EQ(ab_first->encode("abc", false, false), (std::vector<int>{262, 261}));
  // é (C3 A9) is not a piece: byte fallback; ' ' is '▁'.
  EXPECT_EQ(ab_first->encode("a \xC3\xA9", false, false), (std::vector<int>{259, 264, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(ab_first->decode({259, 264, 3 + 0xC3, 3 + 0xA9}), "a \xC3\xA9");
  EXPECT_EQ(ab_first->encode("ab", true, true), (std::vector<int>{1, 262, 2}));
  EXPECT_TRUE(ab_first->default_add_bos());
}

TEST(SpmGgufTokenizer, DummyPrefixFollowsAddSpacePrefix) {
  const std::vector<std::string> extra = {"a", "\xE2\x96\x81", "\xE2\x96\x81" "a"};
  EXPECT_EQ(from_gguf(spm_writer(extra, {-1, -1, -0.5f}, true))->encode("a", false, false), (std::vector<int>{261}));
  EXPECT_EQ(from_gguf(spm_writer(extra, {-1, -1, -0.5f}, false))->encode("a", false, false), (std::vector<int>{259}));
  auto with_prefix = from_gguf(spm_writer(extra, {-1, -1, -0.5f}, true));
  EXPECT_EQ(with_prefix->decode(with_prefix->encode("a a", false, false)), "a a");  // dummy space dropped after BOS
}

TEST(SpmGgufTokenizer, UserDefinedPiecesMatchInTextControlPiecesDoNot) {
  // 259 a, 260 "  " (user-defined, spaces stored raw as in Gemma's GGUF), 261 "<ctl>" (control)
  auto tok = from_gguf(spm_writer({"a", "  ", "<ctl>"}, {-1, 0, 0}, false, {{260, 4}, {261, 3}}));
  EXPECT_EQ(tok->encode("a  a", false, false), (std::vector<int>{259, 260, 259}));
  for (int id : tok->encode("<ctl>", false, false)) EXPECT_NE(id, 261);
  EXPECT_EQ(tok->decode_token(-1, 260), "  ");
}

TEST(SpmGgufTokenizer, BadMetadataNamesTheKey) {
  {
    W w;
    w.kv_string("tokenizer.ggml.model", "llama").kv_strings("tokenizer.ggml.tokens", {"<unk>", "a", "b"});
    w.kv("tokenizer.ggml.scores", W::ARRAY, f32s({0, 1}));
    expect_throw_naming<sq::InputError>([&] { from_gguf(w); }, "tokenizer.ggml.scores has 2 entries but tokenizer.ggml.tokens has 3");
  }
  {
    W w;
    w.kv_string("tokenizer.ggml.model", "llama").kv_strings("tokenizer.ggml.tokens", {"<unk>", "a", "b"});
    w.kv("tokenizer.ggml.token_type", W::ARRAY, i32s({2, 1, 9}));
    expect_throw_naming<sq::InputError>([&] { from_gguf(w); }, "tokenizer.ggml.token_type[2] = 9");
  }
  {
    W w;
    w.kv_string("tokenizer.ggml.model", "llama").kv_strings("tokenizer.ggml.tokens", {"<unk>", "a", "b"});
    w.kv_u32("tokenizer.ggml.unknown_token_id", 3);
    expect_throw_naming<sq::InputError>([&] { from_gguf(w); }, "tokenizer.ggml.unknown_token_id = 3");
  }
  {
    W w;
    w.kv_string("tokenizer.ggml.model", "llama");
    expect_throw_naming<sq::InputError>([&] { from_gguf(w); }, "tokenizer.ggml.tokens");
  }
}

// ---- tokenizer.json ----

/// The byte-level symbols not among "a", "b", "c", "Ġ", as JSON vocabulary entries with ids 7, 8, ...
/// (every byte-level BPE needs all 256 byte symbols: issue 39 point 3).
std::string other_byte_entries() {
  std::string s;
  int id = 7;
  for (int b = 0; b < 256; ++b) {
    const std::string c = sq::byte_level_char(static_cast<uint8_t>(b));
    if (c == "a" || c == "b" || c == "c" || c == "\xC4\xA0") continue;
    const std::string escaped = c == "\"" ? "\\\"" : c == "\\" ? "\\\\" : c;
    s += ", \"" + escaped + "\": " + std::to_string(id++);
  }
  return s;
}

std::string tiny_json(const std::string& merges, const std::string& pre = R"({"type": "ByteLevel", "add_prefix_space": false})",
                      const std::string& model_type = "BPE") {
  return R"({"version": "1.0", "normalizer": null,
  "added_tokens": [{"id": 5, "content": "<|endoftext|>", "special": true}],
  "pre_tokenizer": )" + pre + R"(,
  "model": {"type": ")" + model_type + R"(", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "Ġ": 4, "<|endoftext|>": 5, "abc": 6)" +
         other_byte_entries() + R"(},
            "merges": )" + merges + "}}";
}

std::unique_ptr<sq::Tokenizer> from_json(const std::string& text) {
  return sq::load_tokenizer_from_bytes(reinterpret_cast<const uint8_t*>(text.data()), text.size(), "tokenizer.json");
}

TEST(BpeTokenizerJson, BothMergeSpellingsAndSpecialTokens) {
  auto tok = from_json(tiny_json(R"(["a b", ["ab", "c"]])"));
  EXPECT_EQ(tok->vocab_size(), 7 + 252);
  EXPECT_EQ(tok->encode("abc ab", false, false), (std::vector<int>{6, 4, 3}));  // "abc" | " ab" = Ġ (a b)
  EXPECT_EQ(tok->bos_id(), 5);
  EXPECT_EQ(tok->eos_id(), 5);
  EXPECT_FALSE(tok->default_add_bos());
  for (int id : tok->encode("<|endoftext|>", false, false)) EXPECT_NE(id, 5);
}

TEST(BpeTokenizerJson, SplitRegexAndDigitsPreTokenizers) {
  const std::string split = R"({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "b"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]})";
  EXPECT_EQ(from_json(tiny_json(R"(["a b", "ab c"])", split))->encode("abc", false, false), (std::vector<int>{0, 1, 2}));
}

TEST(BpeTokenizerJson, BadFilesNameTheField) {
  expect_throw_naming<sq::InputError>([] { from_json(tiny_json(R"(["a b", "abc"])")); }, "model.merges[1]");
  expect_throw_naming<sq::InputError>([] { from_json(tiny_json(R"(["a b", 3])")); }, "model.merges[1]");
  expect_throw_naming<sq::UnsupportedError>([] { from_json(tiny_json("[]", R"({"type": "ByteLevel"})", "WordPiece")); }, "model.type");
  expect_throw_naming<sq::UnsupportedError>([] { from_json(tiny_json("[]", R"({"type": "Metaspace"})")); }, "Metaspace");
  expect_throw_naming<sq::InputError>([] { from_json("{\"model\": 3}"); }, "model");
  expect_throw_naming<sq::InputError>([] { from_json("{ not json"); }, "tokenizer.json");
  expect_throw_naming<sq::InputError>([] { from_json(R"({"model": {"type": "BPE", "vocab": {"a": 7}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel"}})"); },
                                      "id 7 is outside");
}

TEST(BpeTokenizerJson, EmptyOrByteIncompleteVocabulariesAreRefused) {
  // Issue 39 point 3: an empty vocabulary and merges tokenized "hi" to [] with exit 0.
  const std::string bytelevel = R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false})";
  expect_throw_naming<sq::InputError>([&] { from_json(R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, )" + bytelevel + "}"); },
                                      "model.vocab");
  expect_throw_naming<sq::InputError>(
      [&] { from_json(R"({"model": {"type": "BPE", "vocab": {"h": 0, "i": 1}, "merges": []}, )" + bytelevel + "}"); },
      "lacks the byte-level symbols of 96 of the 98 plain-text bytes (tab, newline, carriage return, printable ASCII; first: 0x09)");
  // Only special tokens: nothing encodes text.
  expect_throw_naming<sq::InputError>(
      [&] {
        from_json(R"({"added_tokens": [{"id": 0, "content": "<s>", "special": true}], "model": {"type": "BPE", "vocab": {}, "merges": []}, )" +
                  bytelevel + "}");
      },
      "model.vocab");
  // The same through a GGUF gpt2 tokenizer: one byte missing.
  std::vector<std::string> tokens = byte_vocab({});
  tokens[0x41] = "A-but-not-a-byte";
  expect_throw_naming<sq::InputError>([&] { from_gguf(gpt2_writer(tokens, {})); }, "first: 0x41");
}

TEST(BpeTokenizerJson, EmbeddingBytesOfAJsonFileAndDirectory) {
  const auto dir = std::filesystem::temp_directory_path() / ("sq_bpe_json_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string text = tiny_json(R"(["a b"])");
  {
    std::FILE* f = std::fopen((dir / "tokenizer.json").c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  std::string format;
  EXPECT_EQ(sq::tokenizer_bytes_for_embedding(dir.string(), &format), text);
  EXPECT_EQ(format, "hf-json");
  EXPECT_EQ(sq::load_tokenizer(dir.string())->encode("ab", false, false), (std::vector<int>{3}));
  std::filesystem::remove_all(dir);
}

}  // namespace
