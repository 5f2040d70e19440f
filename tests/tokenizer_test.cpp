// Tests of the tokenizers: llama2.c tokenizer.bin (llama.cpp-exact BPE), SentencePiece
// tokenizer.model, format detection, round trips and malformed inputs.
#include <gtest/gtest.h>

#include "tests/support/expect_error.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/llama2c_tokenizer.h"
#include "formats/sentencepiece_tokenizer.h"
#include "formats/tokenizer.h"
#include "support/process.h"
#include "support/test_data.h"

namespace {

using sq::InputError;
using sq::Llama2cTokenizer;
using sq::SentencePieceTokenizer;
using sq::test::ScratchDir;
using sq::test::shared_data;

std::string wikitext() { return shared_data("wikitext2/wiki.test.raw"); }
std::string war_and_peace() { return shared_data("longtext/war-and-peace.txt"); }

/// The first `n` bytes of `s`, shortened to end on a UTF-8 character boundary.
std::string utf8_prefix(const std::string& s, size_t n) {
  if (n >= s.size()) return s;
  while (n > 0 && (static_cast<uint8_t>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

std::string read_prefix(const std::string& path, size_t n) { return utf8_prefix(sq::test::read_file(path), n); }

void append_i32(std::string& out, int32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
void append_f32(std::string& out, float v) { out.append(reinterpret_cast<const char*>(&v), 4); }

/// A llama2.c tokenizer.bin image: int32 max_token_length, then (float32 score, int32 length, bytes)
/// per piece.
std::string llama2c_bytes(const std::vector<std::pair<std::string, float>>& vocab, int32_t max_len = -1) {
  int32_t longest = 0;
  for (const auto& [p, s] : vocab) longest = std::max<int32_t>(longest, static_cast<int32_t>(p.size()));
  std::string out;
  append_i32(out, max_len >= 0 ? max_len : longest);
  for (const auto& [p, s] : vocab) {
    append_f32(out, s);
    append_i32(out, static_cast<int32_t>(p.size()));
    out += p;
  }
  return out;
}

/// Writes `sp`'s vocabulary in llama2.c tokenizer.bin layout the way llama2.c's own exporter
/// (tokenizer.py `export`) does: piece with '▁' replaced by ' ', BOS/EOS written as "\n<s>\n" and
/// "\n</s>\n", the model's score, max_token_length = the longest piece in bytes.
void write_llama2c_from_sentencepiece(const SentencePieceTokenizer& sp, const std::string& path) {
  std::vector<std::pair<std::string, float>> vocab;
  for (int id = 0; id < sp.vocab_size(); ++id) {
    std::string p = sp.piece(id);
    if (id == sp.bos_id()) p = "\n<s>\n";
    if (id == sp.eos_id()) p = "\n</s>\n";
    std::string spaced;
    for (size_t i = 0; i < p.size();) {
      if (p.compare(i, 3, "\xE2\x96\x81") == 0) {
        spaced += ' ';
        i += 3;
      } else {
        spaced += p[i++];
      }
    }
    vocab.emplace_back(spaced, sp.score(id));
  }
  sq::test::write_file(path, llama2c_bytes(vocab));
}


/// Index of the first difference of two id sequences (or the shorter length), for messages.
size_t first_difference(const std::vector<int>& a, const std::vector<int>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

// Shared fixtures: the tokenizers are immutable, so load each once for the whole suite.
const Llama2cTokenizer& tok512() {
  static const Llama2cTokenizer t(sq::test::stories_tokenizer());
  return t;
}
const SentencePieceTokenizer& llama2_sp() {
  static const SentencePieceTokenizer t(sq::test::llama2_tokenizer());
  return t;
}

// ---------------------------------------------------------------- llama2.c tokenizer.bin

TEST(Llama2cTokenizer, ReadsTok512Vocabulary) {
  const auto& t = tok512();
  EXPECT_EQ(t.vocab_size(), 512);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.max_token_length(), 7);
  EXPECT_EQ(t.piece(0), "<unk>");
  EXPECT_EQ(t.piece(1), "\n<s>\n");
  EXPECT_EQ(t.piece(2), "\n</s>\n");
  EXPECT_EQ(t.piece(3), "<0x00>");
  EXPECT_EQ(t.piece(258), "<0xFF>");
  EXPECT_EQ(t.piece(403), " Once");
  EXPECT_EQ(t.score(259), 0.0f);  // merge scores count down from 0 after the byte pieces
  EXPECT_EQ(t.score(260), -1.0f);
  EXPECT_EQ(t.score(511), -252.0f);
  EXPECT_THROW(t.piece(512), std::out_of_range);
  EXPECT_THROW(t.piece(-1), std::out_of_range);
  EXPECT_THROW(t.decode_token(1, 512), std::out_of_range);
}

// Expected ids below come from an independent Python reference (tok512.bin parsed with struct;
// llama2.c-style naive BPE: prepend ' ', split into code points, repeatedly merge the adjacent pair
// whose concatenation is the highest-scoring mergeable piece (ids > 2, not "<0xXX>"), leftmost on
// ties, until none is left; unmatched symbols -> one "<0xXX>" id per UTF-8 byte). That rescanning
// algorithm picks the same merges as the priority queue, so it checks encode() without sharing code.
TEST(Llama2cTokenizer, EncodesOnceUponATime) {
  const auto ids = tok512().encode("Once upon a time", /*add_bos=*/true, /*add_eos=*/false);
  EXPECT_EQ(ids, (std::vector<int>{1, 403, 407, 261, 378}));  // <s> " Once" " upon" " a" " time"
}

TEST(Llama2cTokenizer, EncodesPunctuationAndNewline) {
  // Python reference (see above): " Lily" " said" "," " \"" "H" "i" "!" "\"" <0x0A> "T" "om" " s" "m" "il" "ed" "."
  EXPECT_EQ(tok512().encode("Lily said, \"Hi!\"\nTom smiled.", true, false),
            (std::vector<int>{1, 317, 336, 432, 313, 440, 417, 443, 436, 13, 434, 287, 262, 423, 290, 266, 426}));
}

TEST(Llama2cTokenizer, ByteFallbackForCharactersOutsideVocabulary) {
  // Python reference: " He" "ll" "o" "," " " <0xE6><0x97><0xA5> (日) <0xE6><0x9C><0xAC> (本) "!" " "
  // <0xF0><0x9F><0x99><0x82> (🙂); byte piece "<0xXX>" has id 3 + XX.
  EXPECT_EQ(tok512().encode("Hello, 日本! 🙂", true, false),
            (std::vector<int>{1, 346, 306, 414, 432, 410, 233, 154, 168, 233, 159, 175, 443, 410, 243, 162, 156, 133}));
  EXPECT_EQ(tok512().encode("a\x01" "b", true, false), (std::vector<int>{1, 261, 4, 430}));  // " a" <0x01> "b"
  EXPECT_EQ(tok512().encode("𠜎", false, false), (std::vector<int>{410, 243, 163, 159, 145}));  // " " F0 A0 9C 8E
}

TEST(Llama2cTokenizer, BosEosFlags) {
  const auto& t = tok512();
  EXPECT_TRUE(t.encode("", false, false).empty());
  EXPECT_EQ(t.encode("", true, false), (std::vector<int>{1}));
  EXPECT_EQ(t.encode("", false, true), (std::vector<int>{2}));
  EXPECT_EQ(t.encode("", true, true), (std::vector<int>{1, 2}));
  EXPECT_EQ(t.encode("Once upon a time", false, false), (std::vector<int>{403, 407, 261, 378}));
  EXPECT_EQ(t.encode("Once upon a time", false, true), (std::vector<int>{403, 407, 261, 378, 2}));
  EXPECT_EQ(t.encode("Once upon a time", true, true), (std::vector<int>{1, 403, 407, 261, 378, 2}));
}

TEST(Llama2cTokenizer, DecodeToken) {
  const auto& t = tok512();
  EXPECT_EQ(t.decode_token(1, 403), "Once");     // leading space dropped after BOS
  EXPECT_EQ(t.decode_token(403, 403), " Once");  // kept elsewhere
  EXPECT_EQ(t.decode_token(403, 407), " upon");
  EXPECT_EQ(t.decode_token(261, 13), "\n");      // <0x0A> -> raw byte
  EXPECT_EQ(t.decode_token(1, 3 + 0x20), " ");   // a byte piece keeps its space even after BOS
  EXPECT_EQ(t.decode_token(403, 0), "");         // <unk>
  EXPECT_EQ(t.decode_token(403, 1), "");         // BOS
  EXPECT_EQ(t.decode_token(403, 2), "");         // EOS
  EXPECT_EQ(t.decode({1, 403, 407, 261, 378, 2}), "Once upon a time");
  EXPECT_EQ(t.decode({403, 407, 261, 378}), "Once upon a time");  // decode starts as if after BOS
  EXPECT_EQ(t.decode({}), "");
}

// A tiny hand-made vocabulary pins the merge order: higher score first, leftmost on ties, stale
// queue entries skipped, byte fallback to <unk> when the vocabulary has no byte pieces.
TEST(Llama2cTokenizer, MergeOrderFollowsScoresThenLeftmost) {
  ScratchDir dir;
  auto make = [&](float ab, float ba) {
    const std::string path = dir.file("tie.bin");
    sq::test::write_file(path, llama2c_bytes({{"<unk>", 0}, {"\n<s>\n", 0}, {"\n</s>\n", 0}, {" ", -10},
                                              {"a", -10}, {"b", -10}, {"ab", ab}, {"ba", ba}}));
    return std::make_unique<Llama2cTokenizer>(path);
  };
  EXPECT_EQ(make(-1, -1)->encode("aba", false, false), (std::vector<int>{3, 6, 4}));  // tie: left pair "ab" wins
  EXPECT_EQ(make(-2, -1)->encode("aba", false, false), (std::vector<int>{3, 4, 7}));  // "ba" scores higher
  EXPECT_EQ(make(-1, -1)->encode("z", false, false), (std::vector<int>{3, 0}));       // no byte pieces -> <unk>

  // "ab" (3) merges first, which makes the queued "bc" (2) stale; then "abc" (1) merges.
  const std::string path = dir.file("stale.bin");
  sq::test::write_file(path, llama2c_bytes({{"<unk>", 0}, {"\n<s>\n", 0}, {"\n</s>\n", 0}, {" ", -10}, {"a", -10},
                                            {"b", -10}, {"c", -10}, {"ab", 3}, {"bc", 2}, {"abc", 1}}));
  EXPECT_EQ(Llama2cTokenizer(path).encode("abc", false, false), (std::vector<int>{3, 9}));
}

// Control pieces and byte pieces are never merge targets, even when the text spells them.
TEST(Llama2cTokenizer, ControlAndBytePiecesAreNotMergeable) {
  ScratchDir dir;
  const std::string path = dir.file("ctl.bin");
  sq::test::write_file(path, llama2c_bytes({{"<unk>", 0}, {"<s>", 0}, {"</s>", 0}, {"<0x41>", 0}, {"<", -1},
                                            {"s", -1}, {">", -1}, {" ", -1}, {"<s", 5}}));
  // Symbols " " "<" "s" ">": "<s" merges, "<s>" (id 1) must not.
  const Llama2cTokenizer t(path);
  EXPECT_EQ(t.encode("<s>", false, false), (std::vector<int>{7, 8, 6}));
  EXPECT_EQ(t.encode("A", false, false), (std::vector<int>{7, 3}));  // 'A' is not a piece: byte fallback
}

// Full TinyStories validation text with BOS, as llama.cpp's perplexity tokenizes it (one call on
// the whole file). 404,019 tokens and the checksum come from the Python reference above, run per
// newline-delimited segment (no tok512 merge piece contains '\n', so segments are independent);
// llama.cpp reports 1578 chunks of 256 tokens for this file, i.e. a count in [403968, 404224).
TEST(Llama2cTokenizer, TinyStoriesTokenCountMatchesReference) {
  const std::string text = sq::test::read_file(sq::test::tinystories_valid());
  const auto ids = tok512().encode(text, true, false);
  ASSERT_EQ(ids.size(), 404019u);
  EXPECT_GE(ids.size(), 1578u * 256u);
  EXPECT_LT(ids.size(), 1579u * 256u);
  EXPECT_EQ(std::vector<int>(ids.begin(), ids.begin() + 20),
            (std::vector<int>{1, 301, 427, 309, 426, 301, 427, 309, 394, 265, 262, 415, 271, 422, 280, 295, 269, 336,
                              432, 313}));
  int64_t sum = 0, weighted = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    sum += ids[i];
    weighted = (weighted + static_cast<int64_t>(i + 1) * ids[i]) % 1000000007;
  }
  EXPECT_EQ(sum, 141065525);
  EXPECT_EQ(weighted, 404605538);
}

// ---------------------------------------------------------------- SentencePiece tokenizer.model

TEST(SentencePieceTokenizer, ReadsLlama2Model) {
  const auto& t = llama2_sp();
  EXPECT_EQ(t.vocab_size(), 32000);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.piece(1), "<s>");
  EXPECT_EQ(t.piece(13), "<0x0A>");
  EXPECT_EQ(t.piece(15043), "\xE2\x96\x81Hello");  // "▁Hello": stored form
  EXPECT_EQ(t.score(1000), -741.0f);
  EXPECT_EQ(t.score(29871), -1e9f);  // single characters ("▁") never come from a merge
  EXPECT_THROW(t.piece(32000), std::out_of_range);
  EXPECT_THROW(t.score(-1), std::out_of_range);
}

// Expected ids from the Python `sentencepiece` package 0.2.x:
//   spm.SentencePieceProcessor(model_file=".../tokenizer.model").encode(text)
TEST(SentencePieceTokenizer, MatchesPythonSentencePiece) {
  const auto& t = llama2_sp();
  EXPECT_EQ(t.encode("Hello world", false, false), (std::vector<int>{15043, 3186}));
  EXPECT_EQ(t.encode("Ünïcödé 日本語 🙂", false, false),
            (std::vector<int>{7189, 29876, 30085, 29883, 9289, 29948, 29871, 30325, 30346, 30968, 29871, 243, 162, 156,
                              133}));
  EXPECT_EQ(t.encode("line1\nline2", false, false), (std::vector<int>{1196, 29896, 13, 1220, 29906}));
  EXPECT_EQ(t.encode("  two  spaces\t", false, false), (std::vector<int>{259, 1023, 29871, 8162, 12}));
  EXPECT_EQ(t.encode("\x01", false, false), (std::vector<int>{29871, 4}));
  EXPECT_EQ(t.encode("Once upon a time", true, false), (std::vector<int>{1, 9038, 2501, 263, 931}));
}

TEST(SentencePieceTokenizer, BosEosFlags) {
  const auto& t = llama2_sp();
  EXPECT_TRUE(t.encode("", false, false).empty());
  EXPECT_EQ(t.encode("", true, false), (std::vector<int>{1}));
  EXPECT_EQ(t.encode("", false, true), (std::vector<int>{2}));
  EXPECT_EQ(t.encode("", true, true), (std::vector<int>{1, 2}));
  EXPECT_EQ(t.encode("Hello world", true, true), (std::vector<int>{1, 15043, 3186, 2}));
}

TEST(SentencePieceTokenizer, DecodeToken) {
  const auto& t = llama2_sp();
  EXPECT_EQ(t.decode_token(1, 15043), "Hello");
  EXPECT_EQ(t.decode_token(15043, 15043), " Hello");
  EXPECT_EQ(t.decode_token(15043, 3186), " world");
  EXPECT_EQ(t.decode_token(29896, 13), "\n");           // <0x0A>
  EXPECT_EQ(t.decode_token(1, 3 + 0x20), " ");          // byte piece <0x20> keeps its space
  EXPECT_EQ(t.decode_token(1, 259), " ");               // "▁▁" after BOS
  EXPECT_EQ(t.decode_token(15043, 0), "");              // <unk>
  EXPECT_EQ(t.decode_token(15043, 1), "");              // <s>
  EXPECT_EQ(t.decode_token(15043, 2), "");              // </s>
  EXPECT_EQ(t.decode({1, 15043, 3186, 2}), "Hello world");
  EXPECT_THROW(t.decode_token(1, 32000), std::out_of_range);
}

TEST(SentencePieceTokenizer, RejectsNonModelFiles) {
  sq::test::expect_error<InputError>([] { SentencePieceTokenizer t(sq::test::stories_tokenizer()); },
                     {sq::test::stories_tokenizer(), "SentencePiece"});
  const std::string missing = shared_data("no/such/tokenizer.model");
  sq::test::expect_error<InputError>([&] { SentencePieceTokenizer t(missing); }, {"cannot open " + missing});
}

// ---------------------------------------------------------------- round trips

void expect_round_trip(const sq::Tokenizer& t, const std::string& text, const std::string& label) {
  const auto ids = t.encode(text, true, false);
  const std::string back = t.decode(ids);
  if (back != text) {
    size_t i = 0;
    while (i < back.size() && i < text.size() && back[i] == text[i]) ++i;
    ADD_FAILURE() << label << ": round trip differs at byte " << i << " of " << text.size();
  }
}

TEST(TokenizerRoundTrip, SharedTextsBothTokenizers) {
  for (const auto& path : {sq::test::tinystories_valid(), wikitext(), war_and_peace()}) {
    const std::string text = read_prefix(path, 100 * 1024);
    expect_round_trip(tok512(), text, "tok512 " + path);
    expect_round_trip(llama2_sp(), text, "llama2 sentencepiece " + path);
  }
}

TEST(TokenizerRoundTrip, SpecialStrings) {
  const std::vector<std::string> texts = {
      "", "a", " ", "  leading and trailing  ", "tab\tand\nnew\n\nlines\n", "\x01 control \x7f bytes",
      "rare CJK 𠜎𠝹 龘 and emoji 🙂👍🏽", "Ünïcödé 日本語", "<s> and </s> and <0x41> spelled out", "\n<s>\n"};
  for (const auto& text : texts) {
    expect_round_trip(tok512(), text, "tok512 '" + text + "'");
    expect_round_trip(llama2_sp(), text, "llama2 sentencepiece '" + text + "'");
  }
  // Malformed UTF-8 survives through byte fallback in the llama2.c tokenizer. (SentencePiece
  // replaces malformed bytes with U+FFFD while normalizing, so it cannot round-trip them.)
  for (const std::string& text : {std::string("\xff\xfe"), std::string("\xc3" "a"), std::string("x\x80y\xe2\x96")}) {
    expect_round_trip(tok512(), text, "tok512 malformed UTF-8");
  }
}

// ---------------------------------------------------------------- llama2.c BPE vs SentencePiece

// The Llama-2 vocabulary exported to tokenizer.bin (as llama2.c's tokenizer.py does) and encoded by
// our llama.cpp-style BPE must give exactly SentencePiece's ids: both run the same greedy
// best-score-first merge with leftmost ties (sentencepiece bpe_model.cc / llama.cpp
// llm_tokenizer_spm), exclude control/byte pieces from merges and fall back to bytes. They could
// only differ on malformed UTF-8 (SentencePiece substitutes U+FFFD) or a vocabulary with
// user-defined pieces (Llama-2 has none). Checked by hand on the whole of all three files too.
TEST(TokenizerCrossCheck, Llama2cBpeMatchesSentencePieceOnLlama2Vocabulary) {
  ScratchDir dir;
  const std::string bin = dir.file("llama2-tokenizer.bin");
  write_llama2c_from_sentencepiece(llama2_sp(), bin);
  const Llama2cTokenizer ours(bin);
  ASSERT_EQ(ours.vocab_size(), 32000);
  EXPECT_EQ(ours.piece(15043), " Hello");
  for (const auto& path : {sq::test::tinystories_valid(), wikitext(), war_and_peace()}) {
    const std::string text = read_prefix(path, 20 * 1024);
    const auto expected = llama2_sp().encode(text, true, true);
    const auto got = ours.encode(text, true, true);
    EXPECT_GT(got.size(), 3000u) << path;
    EXPECT_EQ(got, expected) << path << ": first difference at token " << first_difference(got, expected);
  }
  EXPECT_EQ(ours.encode("Ünïcödé 日本語 🙂", false, false), llama2_sp().encode("Ünïcödé 日本語 🙂", false, false));
}

// ---------------------------------------------------------------- load_tokenizer and bad input

TEST(LoadTokenizer, DetectsFormatByContent) {
  auto a = sq::load_tokenizer(sq::test::stories_tokenizer());
  EXPECT_NE(dynamic_cast<Llama2cTokenizer*>(a.get()), nullptr);
  EXPECT_EQ(a->vocab_size(), 512);
  auto b = sq::load_tokenizer(sq::test::llama2_tokenizer());
  EXPECT_NE(dynamic_cast<SentencePieceTokenizer*>(b.get()), nullptr);
  EXPECT_EQ(b->vocab_size(), 32000);
}

// max_token_length 10 makes a tokenizer.bin start with byte 0x0A, like a protobuf.
TEST(LoadTokenizer, Llama2cFileStartingWith0x0A) {
  ScratchDir dir;
  const std::string path = dir.file("ten.bin");
  sq::test::write_file(path, llama2c_bytes({{"<unk>", 0}, {"\n<s>\n", 0}, {"\n</s>\n", 0}, {" ", -1},
                                            {"0123456789", -2}}, /*max_len=*/10));
  ASSERT_EQ(sq::test::read_file(path)[0], '\x0A');
  auto t = sq::load_tokenizer(path);
  EXPECT_NE(dynamic_cast<Llama2cTokenizer*>(t.get()), nullptr);
  EXPECT_EQ(t->vocab_size(), 5);
}

TEST(LoadTokenizer, MissingAndEmptyFiles) {
  const std::string missing = shared_data("no/such/tokenizer.bin");
  sq::test::expect_error<InputError>([&] { sq::load_tokenizer(missing); }, {"cannot open " + missing});
  sq::test::expect_error<InputError>([&] { Llama2cTokenizer t(missing); }, {"cannot open " + missing});
  ScratchDir dir;
  const std::string empty = dir.file("empty.bin");
  sq::test::write_file(empty, "");
  sq::test::expect_error<InputError>([&] { sq::load_tokenizer(empty); }, {empty, "empty"});
  sq::test::expect_error<InputError>([&] { Llama2cTokenizer t(empty); }, {empty, "empty"});
  sq::test::expect_error<InputError>([&] { SentencePieceTokenizer t(empty); }, {empty, "empty"});
}

TEST(LoadTokenizer, MalformedTokenizerBin) {
  ScratchDir dir;
  const std::string good = sq::test::read_file(sq::test::stories_tokenizer());
  // tok512.bin is 6227 bytes: 4 + 512 * 8 + 2127 piece bytes; the last token (511) ends the file.
  const std::string cut_piece = dir.file("cut_piece.bin");
  sq::test::write_file(cut_piece, good.substr(0, good.size() - 1));
  sq::test::expect_error<InputError>([&] { sq::load_tokenizer(cut_piece); }, {cut_piece, "token 511", "past the end"});

  const std::string cut_header = dir.file("cut_header.bin");
  sq::test::write_file(cut_header, good + std::string("\0\0\0", 3));
  sq::test::expect_error<InputError>([&] { sq::load_tokenizer(cut_header); }, {cut_header, "token 512", "truncated"});

  std::string negative = llama2c_bytes({{"<unk>", 0}, {"\n<s>\n", 0}, {"\n</s>\n", 0}});
  append_f32(negative, 0);
  append_i32(negative, -5);
  const std::string neg = dir.file("negative.bin");
  sq::test::write_file(neg, negative);
  sq::test::expect_error<InputError>([&] { sq::load_tokenizer(neg); }, {neg, "token 3", "negative length -5"});

  const std::string few = dir.file("few.bin");
  sq::test::write_file(few, llama2c_bytes({{"<unk>", 0}, {"\n<s>\n", 0}}));
  sq::test::expect_error<InputError>([&] { Llama2cTokenizer t(few); }, {few, "2 tokens"});

  const std::string zero = dir.file("zero.bin");
  sq::test::write_file(zero, llama2c_bytes({{"<unk>", 0}, {"\n<s>\n", 0}, {"\n</s>\n", 0}}, /*max_len=*/0));
  sq::test::expect_error<InputError>([&] { Llama2cTokenizer t(zero); }, {zero, "max_token_length is 0"});
}

TEST(LoadTokenizer, GarbageBytes) {
  ScratchDir dir;
  const std::string garbage = dir.file("garbage.bin");
  sq::test::write_file(garbage, "\xff\xfe\x12\x34 this is not a tokenizer at all");
  sq::test::expect_error<InputError>([&] { sq::load_tokenizer(garbage); }, {garbage, "not a tokenizer", "FF FE 12 34"});

  // Starts like a protobuf (0x0A) but is not a SentencePiece model.
  const std::string fake_proto = dir.file("fake.model");
  sq::test::write_file(fake_proto, "\x0a\x05hello world, still not a model");
  sq::test::expect_error<InputError>([&] { sq::load_tokenizer(fake_proto); }, {fake_proto, "SentencePiece"});

  // Too short for even max_token_length.
  const std::string short_file = dir.file("short.bin");
  sq::test::write_file(short_file, std::string("\x07\x00", 2));
  sq::test::expect_error<InputError>([&] { sq::load_tokenizer(short_file); }, {short_file, "not a tokenizer"});
  sq::test::expect_error<InputError>([&] { Llama2cTokenizer t(short_file); }, {short_file, "2 bytes"});
}

}  // namespace
