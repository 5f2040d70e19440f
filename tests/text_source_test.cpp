// Tests of the calibration text stream (plain text, JSON Lines, zstd) and of the calibration
// window sampler, against direct in-memory tokenization of real text.
#include <gtest/gtest.h>

#include "tests/support/expect_error.h"
#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "calib/window_sampler.h"
#include "core/error.h"
#include "formats/text_source.h"
#include "formats/tokenizer.h"
#include "support/process.h"
#include "support/test_data.h"

namespace {

using sq::InputError;
using sq::TextDocuments;
using sq::test::read_file;
using sq::test::ScratchDir;
using sq::test::shared_data;
using sq::test::write_file;

std::string train_text() { return shared_data("tinystories/tinystories-train-2MiB.txt"); }

std::string zstd_compress(const std::string& s, int level = 3) {
  std::string out(ZSTD_compressBound(s.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), s.data(), s.size(), level);
  EXPECT_FALSE(ZSTD_isError(n)) << ZSTD_getErrorName(n);
  out.resize(n);
  return out;
}

std::vector<std::string> all_docs(const std::string& path) {
  auto docs = TextDocuments::open(path);
  std::vector<std::string> out;
  std::string d;
  while (docs->next(d)) out.push_back(d);
  EXPECT_EQ(docs->bytes_read(), docs->file_size());
  return out;
}


/// The first `n` TinyStories validation stories (split at "<|endoftext|>", trimmed of newlines).
std::vector<std::string> stories(size_t n) {
  const std::string all = read_file(sq::test::tinystories_valid());
  std::vector<std::string> out;
  size_t pos = 0;
  while (out.size() < n) {
    const size_t end = all.find("<|endoftext|>", pos);
    std::string s = all.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    while (!s.empty() && (s.front() == '\n' || s.front() == ' ')) s.erase(0, 1);
    while (!s.empty() && s.back() == '\n') s.pop_back();
    if (!s.empty()) out.push_back(s);
    if (end == std::string::npos) break;
    pos = end + 13;
  }
  return out;
}

/// JSON string literal of `s` (escapes quotes, backslashes and control characters).
std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string jsonl_of(const std::vector<std::string>& docs) {
  std::string out;
  for (size_t i = 0; i < docs.size(); ++i) {
    out += "{\"id\": " + std::to_string(i) + ", \"text\": " + json_quote(docs[i]) + ", \"meta\": {\"x\": [1, 2]}}\n";
    if (i % 7 == 3) out += "\n";  // blank lines are skipped
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// TextDocuments

TEST(TextDocuments, PlainTextIsOneDocument) {
  ScratchDir dir;
  const std::string text = "Once upon a time.\n\nThe end.\n";
  write_file(dir.file("a.txt"), text);
  auto docs = TextDocuments::open(dir.file("a.txt"));
  EXPECT_EQ(docs->format(), TextDocuments::Format::PlainText);
  EXPECT_FALSE(docs->compressed());
  std::string d;
  ASSERT_TRUE(docs->next(d));
  EXPECT_EQ(d, text);
  EXPECT_FALSE(docs->next(d));
  EXPECT_FALSE(docs->next(d));

  write_file(dir.file("empty.txt"), "");
  EXPECT_TRUE(all_docs(dir.file("empty.txt")).empty());

  // Real 2 MiB text: one document, byte-identical.
  const std::vector<std::string> real = all_docs(train_text());
  ASSERT_EQ(real.size(), 1u);
  EXPECT_TRUE(real[0] == read_file(train_text()));
}

TEST(TextDocuments, JsonLines) {
  ScratchDir dir;
  const std::string jsonl =
      "  \n{\"text\": \"first \\\"doc\\\"\\nline two\", \"meta\": {\"pile_set_name\": \"Wikipedia\"}}\n"
      "\r\n"
      "{\"meta\": 1, \"text\": \"caf\\u00e9 \xe2\x82\xac\"}\r\n"
      "{\"text\": \"\"}\n"
      "{\"text\": \"no final newline\"}";
  write_file(dir.file("d.jsonl"), jsonl);
  auto docs = TextDocuments::open(dir.file("d.jsonl"));
  EXPECT_EQ(docs->format(), TextDocuments::Format::JsonLines);
  std::vector<std::string> got;
  std::string d;
  while (docs->next(d)) got.push_back(d);
  const std::vector<std::string> want = {"first \"doc\"\nline two", "caf\xc3\xa9 \xe2\x82\xac", "", "no final newline"};
  EXPECT_EQ(got, want);

  // Real stories round-trip through JSON Lines.
  const std::vector<std::string> s = stories(50);
  write_file(dir.file("stories.jsonl"), jsonl_of(s));
  EXPECT_EQ(all_docs(dir.file("stories.jsonl")), s);
}

TEST(TextDocuments, BadJsonLineNamesFileAndLine) {
  ScratchDir dir;
  const std::string p = dir.file("bad.jsonl");
  const std::string good = "{\"text\": \"ok\"}\n";
  struct Case {
    std::string line;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"{\"text\": \"unterminated}", "not valid JSON"},
      {"[1, 2, 3]", "expected a JSON object"},
      {"{\"body\": \"x\"}", "no \"text\" field"},
      {"{\"text\": 42}", "\"text\" field is a JSON number"},
      {"plain words", "not valid JSON"},
  };
  for (const Case& c : cases) {
    write_file(p, good + "\n" + good + c.line + "\n" + good);  // the bad line is line 4
    auto docs = TextDocuments::open(p);
    std::string d;
    ASSERT_TRUE(docs->next(d));
    ASSERT_TRUE(docs->next(d));
    const std::string msg = sq::test::expect_error<sq::InputError>([&] { docs->next(d); });
    EXPECT_NE(msg.find(p + ":4: "), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
  }
}

TEST(TextDocuments, ZstdOfPlainAndJsonLines) {
  ScratchDir dir;
  const std::string plain = read_file(train_text());
  write_file(dir.file("train.txt.zst"), zstd_compress(plain));
  auto docs = TextDocuments::open(dir.file("train.txt.zst"));
  EXPECT_TRUE(docs->compressed());
  EXPECT_EQ(docs->format(), TextDocuments::Format::PlainText);
  const std::vector<std::string> got = all_docs(dir.file("train.txt.zst"));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0] == plain);

  const std::vector<std::string> s = stories(200);
  const std::string jsonl = jsonl_of(s);
  write_file(dir.file("stories.jsonl.zst"), zstd_compress(jsonl));
  EXPECT_EQ(TextDocuments::open(dir.file("stories.jsonl.zst"))->format(), TextDocuments::Format::JsonLines);
  EXPECT_EQ(all_docs(dir.file("stories.jsonl.zst")), s);

  // Detected by the magic bytes, not the name.
  write_file(dir.file("stories.data"), zstd_compress(jsonl, 19));
  EXPECT_TRUE(TextDocuments::open(dir.file("stories.data"))->compressed());
  EXPECT_EQ(all_docs(dir.file("stories.data")), s);

  // Concatenated frames (as `cat a.zst b.zst` makes) are one stream.
  const std::string half1 = jsonl.substr(0, jsonl.size() / 2), half2 = jsonl.substr(jsonl.size() / 2);
  write_file(dir.file("two-frames.zst"), zstd_compress(half1) + zstd_compress(half2));
  EXPECT_EQ(all_docs(dir.file("two-frames.zst")), s);
}

TEST(TextDocuments, ZstdErrors) {
  ScratchDir dir;
  const std::string z = zstd_compress(jsonl_of(stories(100)));
  write_file(dir.file("cut.jsonl.zst"), z.substr(0, z.size() - 100));
  std::string msg = sq::test::expect_error<sq::InputError>([&] { all_docs(dir.file("cut.jsonl.zst")); });
  EXPECT_NE(msg.find(dir.file("cut.jsonl.zst")), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated zstd stream"), std::string::npos) << msg;

  std::string corrupt = z;
  for (size_t i = 20; i < 60; ++i) corrupt[i] = static_cast<char>(corrupt[i] ^ 0x5A);
  write_file(dir.file("corrupt.zst"), corrupt);
  msg = sq::test::expect_error<sq::InputError>([&] { all_docs(dir.file("corrupt.zst")); });
  EXPECT_NE(msg.find(dir.file("corrupt.zst")), std::string::npos) << msg;

  write_file(dir.file("not-really.txt.zst"), "just text\n");
  msg = sq::test::expect_error<sq::InputError>([&] { TextDocuments::open(dir.file("not-really.txt.zst")); });
  EXPECT_NE(msg.find("not zstd-compressed"), std::string::npos) << msg;

  msg = sq::test::expect_error<sq::InputError>([&] { TextDocuments::open(dir.file("missing.txt")); });
  EXPECT_NE(msg.find(dir.file("missing.txt")), std::string::npos) << msg;
  msg = sq::test::expect_error<sq::InputError>([&] { TextDocuments::open(dir.path()); });
  EXPECT_NE(msg.find("directory"), std::string::npos) << msg;
}

/// Checks the > 16 MiB chunking rule on `docs` of `text`.
void expect_chunked(const std::vector<std::string>& docs, const std::string& text, bool newline_cuts) {
  ASSERT_GT(docs.size(), 16u);
  std::string joined;
  for (size_t i = 0; i < docs.size(); ++i) {
    const std::string& d = docs[i];
    ASSERT_LE(d.size(), TextDocuments::kChunkBytes) << i;
    ASSERT_FALSE(d.empty()) << i;
    // No document starts inside a UTF-8 character.
    ASSERT_NE(static_cast<uint8_t>(d[0]) & 0xC0, 0x80) << i;
    if (i + 1 < docs.size()) {
      if (newline_cuts) {
        ASSERT_EQ(d.back(), '\n') << i;
        // It is the longest such prefix: the next newline lies beyond the 1 MiB limit.
        const size_t next_nl = docs[i + 1].find('\n');
        ASSERT_TRUE(next_nl == std::string::npos || d.size() + next_nl + 1 > TextDocuments::kChunkBytes) << i;
      } else {
        ASSERT_GE(d.size(), TextDocuments::kChunkBytes - 3) << i;
      }
    }
    joined += d;
  }
  EXPECT_TRUE(joined == text);
}

TEST(TextDocuments, LargePlainTextIsCutAtNewlines) {
  ScratchDir dir;
  const std::string wp = read_file(shared_data("longtext/war-and-peace.txt"));
  std::string big;
  while (big.size() <= TextDocuments::kWholeFileBytes) big += wp;  // ~19.6 MB, real UTF-8 prose
  write_file(dir.file("big.txt"), big);
  const std::vector<std::string> docs = all_docs(dir.file("big.txt"));
  expect_chunked(docs, big, true);

  write_file(dir.file("big.txt.zst"), zstd_compress(big, 1));
  EXPECT_EQ(all_docs(dir.file("big.txt.zst")), docs);

  // Exactly 16 MiB is still one document.
  write_file(dir.file("16m.txt"), big.substr(0, TextDocuments::kWholeFileBytes));
  EXPECT_EQ(all_docs(dir.file("16m.txt")).size(), 1u);
}

TEST(TextDocuments, LargeTextWithoutNewlinesIsCutAtCharacterBoundaries) {
  ScratchDir dir;
  std::string big = "a";  // offsets the 2-byte characters so that 1 MiB cuts would split one
  while (big.size() <= TextDocuments::kWholeFileBytes + 12345) big += "\xc3\xa9";  // 'é'
  write_file(dir.file("nonl.txt"), big);
  expect_chunked(all_docs(dir.file("nonl.txt")), big, false);
}

// ---------------------------------------------------------------------------------------------
// Window sampling

/// The concatenated BOS-prefixed token stream of `docs`, computed in memory.
std::vector<int32_t> token_stream(const sq::Tokenizer& tok, const std::vector<std::string>& docs) {
  std::vector<int32_t> out;
  for (const std::string& d : docs)
    for (int t : tok.encode(d, true, false)) out.push_back(t);
  return out;
}

void expect_slices(const std::vector<std::vector<int32_t>>& windows, const std::vector<int32_t>& stream, int64_t n,
                   int64_t len, uint64_t seed) {
  const std::vector<int64_t> starts = sq::draw_window_starts(static_cast<int64_t>(stream.size()), n, len, seed);
  ASSERT_EQ(windows.size(), static_cast<size_t>(n));
  for (size_t i = 0; i < windows.size(); ++i) {
    ASSERT_EQ(windows[i].size(), static_cast<size_t>(len));
    ASSERT_LE(starts[i] + len, static_cast<int64_t>(stream.size()));
    const std::vector<int32_t> want(stream.begin() + starts[i], stream.begin() + starts[i] + len);
    ASSERT_EQ(windows[i], want) << "window " << i << " (start " << starts[i] << ")";
  }
}

TEST(WindowSampler, DrawProcedure) {
  // range = 2^k: no rejection, start = rng() mod range.
  std::mt19937_64 rng(99);
  const std::vector<int64_t> s = sq::draw_window_starts(1024 + 15, 50, 16, 99);
  for (int64_t v : s) EXPECT_EQ(v, static_cast<int64_t>(rng() % 1024));
  // Bounds, reproducibility, every start possible.
  const std::vector<int64_t> a = sq::draw_window_starts(20, 5000, 8, 1), b = sq::draw_window_starts(20, 5000, 8, 1);
  EXPECT_EQ(a, b);
  EXPECT_EQ(*std::min_element(a.begin(), a.end()), 0);
  EXPECT_EQ(*std::max_element(a.begin(), a.end()), 12);
  EXPECT_NE(sq::draw_window_starts(20, 5000, 8, 2), a);
  // total == L: only one possible window.
  for (int64_t v : sq::draw_window_starts(64, 10, 64, 5)) EXPECT_EQ(v, 0);
  EXPECT_THROW(sq::draw_window_starts(10, 1, 11, 0), std::invalid_argument);
}

TEST(WindowSampler, TinyStoriesWindowsAreSlicesOfTheTokenStream) {
  const auto tok = sq::load_tokenizer(sq::test::stories_tokenizer());
  const std::string path = train_text();
  const int64_t n = 24, len = 256;
  std::vector<int64_t> progress;
  const auto w = sq::sample_calibration_windows(path, *tok, n, len, 1234, [&](int64_t b) { progress.push_back(b); });
  // The file is <= 16 MiB: one document, tokenized with one BOS.
  const std::vector<int32_t> stream = token_stream(*tok, {read_file(path)});
  ASSERT_GT(stream.size(), 400000u);
  EXPECT_EQ(stream[0], tok->bos_id());
  expect_slices(w, stream, n, len, 1234);

  // Deterministic for a seed, different for another.
  EXPECT_EQ(sq::sample_calibration_windows(path, *tok, n, len, 1234), w);
  const auto other = sq::sample_calibration_windows(path, *tok, n, len, 1235);
  EXPECT_NE(other, w);
  expect_slices(other, stream, n, len, 1235);

  // Sample i is the i-th draw: asking for fewer samples gives a prefix.
  const auto fewer = sq::sample_calibration_windows(path, *tok, 5, len, 1234);
  EXPECT_EQ(fewer, std::vector<std::vector<int32_t>>(w.begin(), w.begin() + 5));

  // Progress: non-decreasing, over both passes.
  ASSERT_FALSE(progress.empty());
  EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
  EXPECT_GT(progress.back(), static_cast<int64_t>(read_file(path).size()));
  EXPECT_LE(progress.back(), 2 * static_cast<int64_t>(read_file(path).size()));
}

TEST(WindowSampler, JsonLinesWindowsSpanDocuments) {
  ScratchDir dir;
  const auto tok = sq::load_tokenizer(sq::test::stories_tokenizer());
  const std::vector<std::string> docs = stories(300);
  const std::string jsonl = jsonl_of(docs);
  write_file(dir.file("s.jsonl"), jsonl);
  write_file(dir.file("s.jsonl.zst"), zstd_compress(jsonl));
  const std::vector<int32_t> stream = token_stream(*tok, docs);
  // Stories are ~150-250 tokens, so 512-token windows span several documents (several BOS).
  const int64_t n = 40, len = 512;
  const auto w = sq::sample_calibration_windows(dir.file("s.jsonl"), *tok, n, len, 7);
  expect_slices(w, stream, n, len, 7);
  EXPECT_GE(std::count(w[0].begin(), w[0].end(), tok->bos_id()), 1);
  EXPECT_EQ(sq::sample_calibration_windows(dir.file("s.jsonl.zst"), *tok, n, len, 7), w);

  // Many overlapping windows (N·L much larger than the text) are fine too.
  const auto dense = sq::sample_calibration_windows(dir.file("s.jsonl"), *tok, 400, len, 8);
  expect_slices(dense, stream, 400, len, 8);
}

TEST(WindowSampler, TooLittleText) {
  ScratchDir dir;
  const auto tok = sq::load_tokenizer(sq::test::stories_tokenizer());
  const std::string p = dir.file("short.txt");
  write_file(p, "Once upon a time there was a cat.");
  const int64_t total = static_cast<int64_t>(tok->encode("Once upon a time there was a cat.", true, false).size());
  const std::string msg = sq::test::expect_error<sq::InputError>([&] { sq::sample_calibration_windows(p, *tok, 4, 512, 0); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(total) + " tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("512"), std::string::npos) << msg;
  // Exactly enough text: the only window is the whole stream.
  const auto w = sq::sample_calibration_windows(p, *tok, 3, total, 0);
  ASSERT_EQ(w.size(), 3u);
  for (const auto& win : w) EXPECT_EQ(win, token_stream(*tok, {read_file(p)}));
  EXPECT_THROW(sq::sample_calibration_windows(p, *tok, 0, 4, 0), sq::UsageError);
  EXPECT_THROW(sq::sample_calibration_windows(p, *tok, 1, 0, 0), sq::UsageError);
}

}  // namespace
