#include "formats/text_source.h"

#include <sys/stat.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace sq {

namespace {

constexpr size_t kReadBytes = size_t{1} << 20;  // bytes appended to the text buffer per fill

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// zstd frame magic 0xFD2FB528 or a skippable frame 0x184D2A50..0x184D2A5F (little-endian).
bool has_zstd_magic(const std::string& head) {
  if (head.size() < 4) return false;
  const auto b = [&](int i) { return static_cast<uint32_t>(static_cast<uint8_t>(head[static_cast<size_t>(i)])); };
  const uint32_t magic = b(0) | (b(1) << 8) | (b(2) << 16) | (b(3) << 24);
  return magic == ZSTD_MAGICNUMBER || (magic & ZSTD_MAGIC_SKIPPABLE_MASK) == ZSTD_MAGIC_SKIPPABLE_START;
}

}  // namespace

struct TextDocuments::Impl {
  std::string path;
  std::FILE* file = nullptr;
  int64_t size = 0;
  int64_t consumed = 0;  // bytes read from the file
  bool file_eof = false;

  // Bytes read during detection, served before the file's remaining bytes.
  std::string head;
  size_t head_pos = 0;

  // zstd state
  bool zstd = false;
  ZSTD_DCtx* dctx = nullptr;
  std::vector<char> in_buf;
  ZSTD_inBuffer in{nullptr, 0, 0};
  size_t last_ret = 0;          // last ZSTD_decompressStream result (0: frame complete)
  bool flush_pending = false;   // the last call filled the output; the decoder may hold more

  // Decoded text not yet returned: buf[pos, buf.size()).
  std::string buf;
  size_t pos = 0;
  bool text_eof = false;

  Format format = Format::PlainText;
  // plain text state
  bool decided = false;     // whole-file vs chunked decided
  bool chunked = false;
  bool done = false;
  // JSON Lines state
  int64_t line = 0;
  size_t scan = 0;          // bytes after pos already known to hold no '\n'

  ~Impl() {
    if (dctx) ZSTD_freeDCtx(dctx);
    if (file) std::fclose(file);
  }

  [[noreturn]] void read_error(int e) const { throw InputError("cannot read " + path + ": " + std::strerror(e)); }

  /// Raw file bytes (head first). Returns 0 at the end of the file.
  size_t read_file(char* dst, size_t n) {
    size_t got = 0;
    if (head_pos < head.size()) {
      got = std::min(n, head.size() - head_pos);
      std::memcpy(dst, head.data() + head_pos, got);
      head_pos += got;
      if (got == n) return got;
    }
    if (file_eof) return got;
    const size_t r = std::fread(dst + got, 1, n - got, file);
    consumed += static_cast<int64_t>(r);
    if (r < n - got) {
      if (std::ferror(file)) read_error(errno);
      file_eof = true;
    }
    return got + r;
  }

  /// Decompressed bytes. Returns 0 at the end of the stream.
  size_t read_zstd(char* dst, size_t n) {
    ZSTD_outBuffer out{dst, n, 0};
    while (out.pos < out.size) {
      if (in.pos == in.size && !flush_pending) {
        in.size = read_file(in_buf.data(), in_buf.size());
        in.pos = 0;
        if (in.size == 0) {
          if (last_ret != 0)
            throw InputError(path + ": truncated zstd stream (the file ends inside a compressed frame)");
          break;
        }
      }
      const size_t ret = ZSTD_decompressStream(dctx, &out, &in);
      if (ZSTD_isError(ret)) throw InputError(path + ": corrupt zstd stream: " + ZSTD_getErrorName(ret));
      last_ret = ret;
      // Output full mid-frame: the decoder may hold more output even without new input. (Not
      // after a complete frame: calling again with no input would start reading a next frame.)
      flush_pending = out.pos == out.size && ret != 0;
    }
    return out.pos;
  }

  /// Appends up to kReadBytes of text to buf (compacting it first). Returns false at the end.
  bool fill() {
    if (text_eof) return false;
    if (pos > 0 && pos >= buf.size() / 2) {
      buf.erase(0, pos);
      pos = 0;
    }
    const size_t old = buf.size();
    buf.resize(old + kReadBytes);
    const size_t n = zstd ? read_zstd(buf.data() + old, kReadBytes) : read_file(buf.data() + old, kReadBytes);
    buf.resize(old + n);
    if (n == 0) text_eof = true;
    return n > 0;
  }

  size_t avail() const { return buf.size() - pos; }

  void take(std::string& doc, size_t n) {
    doc.assign(buf, pos, n);
    pos += n;
  }

  bool next_plain(std::string& doc) {
    if (done) return false;
    if (!decided) {
      while (avail() <= kWholeFileBytes && fill()) {
      }
      decided = true;
      if (avail() <= kWholeFileBytes) {
        done = true;
        if (avail() == 0) return false;
        take(doc, avail());
        return true;
      }
      chunked = true;
    }
    while (avail() <= kChunkBytes && fill()) {
    }
    if (avail() == 0) {
      done = true;
      return false;
    }
    if (avail() <= kChunkBytes) {  // only at the end of the text
      done = true;
      take(doc, avail());
      return true;
    }
    const size_t nl = buf.rfind('\n', pos + kChunkBytes - 1);
    size_t n;
    if (nl != std::string::npos && nl >= pos) {
      n = nl + 1 - pos;
    } else {
      // No newline: cut at 1 MiB, moved back over at most 3 UTF-8 continuation bytes.
      n = kChunkBytes;
      while (n > kChunkBytes - 3 && (static_cast<uint8_t>(buf[pos + n]) & 0xC0) == 0x80) --n;
      if ((static_cast<uint8_t>(buf[pos + n]) & 0xC0) == 0x80) n = kChunkBytes;  // not UTF-8 anyway
    }
    take(doc, n);
    return true;
  }

  [[noreturn]] void bad_line(const std::string& what) const {
    throw InputError(path + ":" + std::to_string(line) + ": " + what);
  }

  bool next_jsonl(std::string& doc) {
    for (;;) {
      size_t nl = std::string::npos;
      for (;;) {
        nl = buf.find('\n', pos + scan);
        if (nl != std::string::npos) break;
        scan = avail();
        if (!fill()) break;
      }
      size_t len;
      if (nl != std::string::npos) {
        len = nl - pos;
      } else {
        if (avail() == 0) return false;
        len = avail();
      }
      const std::string_view text(buf.data() + pos, len);
      pos += (nl != std::string::npos) ? len + 1 : len;
      scan = 0;
      ++line;
      if (std::all_of(text.begin(), text.end(), is_space)) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(text.begin(), text.end());
      } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
        std::string msg = e.what();
        const size_t p = msg.find("] ");
        if (p != std::string::npos) msg = msg.substr(p + 2);
        bad_line("not valid JSON (" + msg + ")");
      }
      if (!j.is_object()) bad_line("expected a JSON object with a string \"text\" field, got a JSON " + std::string(j.type_name()));
      auto it = j.find("text");
      if (it == j.end()) bad_line("JSON object has no \"text\" field");
      if (!it->is_string()) bad_line("the \"text\" field is a JSON " + std::string(it->type_name()) + ", expected a string");
      doc = std::move(it->get_ref<std::string&>());
      return true;
    }
  }
};

TextDocuments::TextDocuments(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TextDocuments::~TextDocuments() = default;

std::unique_ptr<TextDocuments> TextDocuments::open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError("cannot read " + path + ": it is a directory");
  impl->file = std::fopen(path.c_str(), "rb");
  if (!impl->file) throw InputError("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(::fileno(impl->file), &st) == 0) impl->size = static_cast<int64_t>(st.st_size);

  // Detect compression from the first 4 bytes.
  std::string head(4, '\0');
  head.resize(impl->read_file(head.data(), head.size()));
  impl->head = std::move(head);
  impl->head_pos = 0;
  impl->zstd = has_zstd_magic(impl->head);
  if (!impl->zstd && ends_with(path, ".zst"))
    throw InputError(path + ": the name ends in .zst but the file is not zstd-compressed (no zstd magic bytes)");
  if (impl->zstd) {
    impl->dctx = ZSTD_createDCtx();
    if (!impl->dctx) throw InputError(path + ": cannot create a zstd decompression context");
    impl->in_buf.resize(std::max<size_t>(ZSTD_DStreamInSize(), 1 << 17));
    impl->in = ZSTD_inBuffer{impl->in_buf.data(), 0, 0};
  }

  // Detect JSON Lines from the first non-whitespace byte.
  size_t i = 0;
  for (;;) {
    while (i < impl->buf.size() && is_space(impl->buf[i])) ++i;
    if (i < impl->buf.size() || !impl->fill()) break;
  }
  impl->format = (i < impl->buf.size() && impl->buf[i] == '{') ? Format::JsonLines : Format::PlainText;
  return std::unique_ptr<TextDocuments>(new TextDocuments(std::move(impl)));
}

bool TextDocuments::next(std::string& doc) {
  return impl_->format == Format::JsonLines ? impl_->next_jsonl(doc) : impl_->next_plain(doc);
}

TextDocuments::Format TextDocuments::format() const { return impl_->format; }
bool TextDocuments::compressed() const { return impl_->zstd; }
const std::string& TextDocuments::path() const { return impl_->path; }
int64_t TextDocuments::file_size() const { return impl_->size; }
int64_t TextDocuments::bytes_read() const { return impl_->consumed; }

}  // namespace sq
