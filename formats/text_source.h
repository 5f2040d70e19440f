// Calibration / evaluation text as a stream of documents: plain text or JSON Lines, optionally
// zstd-compressed, read in one streaming pass with bounded memory (docs/formats.md, "Calibration file (HDF5)").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace sq {

/// A forward-only stream of documents read from one text file.
///
/// Input kinds, detected from the file content (never from the name alone):
///  - **zstd compression**: a file whose first 4 bytes are the zstd frame magic (28 B5 2F FD) or a
///    skippable-frame magic (50..5F 2A 4D 18) is decompressed on the fly with
///    ZSTD_decompressStream (concatenated frames are read one after the other); it is never
///    decompressed in memory as a whole. A name ending in ".zst" without zstd magic is an error.
///  - **JSON Lines**: when the first byte of the (decompressed) text that is not ASCII whitespace
///    (space, \t, \r, \n) is '{'. Every line (split at '\n') that is not empty or whitespace-only
///    is one JSON object, and its string field "text" is one document (possibly the empty
///    string). Any other line — invalid JSON, not an object, no "text", "text" not a string — is an
///    InputError "PATH:LINE: ..." with the 1-based line number.
///  - **plain text** otherwise. A text of at most kWholeFileBytes (16 MiB, after decompression) is
///    one document. A longer one is cut into documents of at most kChunkBytes (1 MiB): each
///    document is the longest prefix of the remaining text of at most 1 MiB that ends with '\n'
///    (the newline stays in the document); when those 1 MiB hold no '\n', the cut is made at 1 MiB,
///    moved back to the start of a UTF-8 character if it would split one. Once at most 1 MiB
///    remains, the remainder is the last document. So the documents concatenate back to exactly
///    the file's text. An empty file (or an empty decompressed text) has no documents.
///
/// Memory is bounded by max(one document, 17 MiB) plus I/O buffers. Not thread-safe.
class TextDocuments {
 public:
  /// Plain text of at most this many bytes is a single document.
  static constexpr size_t kWholeFileBytes = size_t{16} << 20;
  /// Longer plain text is cut into documents of at most this many bytes.
  static constexpr size_t kChunkBytes = size_t{1} << 20;

  /// The kind of text detected by open().
  enum class Format { PlainText, JsonLines };

  /// Opens `path` and detects its kind (reading only as far as the first non-whitespace byte).
  /// Throws InputError naming the file when it is missing, unreadable, a directory, has a ".zst"
  /// name but no zstd magic, or its zstd stream is corrupt.
  static std::unique_ptr<TextDocuments> open(const std::string& path);

  ~TextDocuments();
  TextDocuments(const TextDocuments&) = delete;
  TextDocuments& operator=(const TextDocuments&) = delete;

  /// Stores the next document in `doc` and returns true, or returns false at the end of the
  /// file. Throws InputError naming the file (and line for JSON Lines) for malformed input, a
  /// corrupt or truncated zstd stream, or a read error.
  bool next(std::string& doc);

  /// The detected text kind.
  Format format() const;
  /// True when the file is zstd-compressed.
  bool compressed() const;
  /// The path given to open().
  const std::string& path() const;
  /// Size of the file on disk in bytes (compressed size for zstd).
  int64_t file_size() const;
  /// Bytes of the file read from disk so far (compressed bytes for zstd; includes read-ahead, so
  /// it runs slightly ahead of the documents returned). Reaches file_size() at the end. For
  /// progress display.
  int64_t bytes_read() const;

 private:
  struct Impl;
  explicit TextDocuments(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sq
