// UTF-8 validation of input text (evaluation / calibration text, prompts).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace sq {

/// Byte offset of the first byte that does not start a well-formed UTF-8 sequence in `text`, or -1
/// when the whole text is well-formed. Well-formed is the Unicode Standard's definition (chapter 3,
/// Table 3-7): no overlong encodings, no surrogates (U+D800..U+DFFF), nothing above U+10FFFF, no
/// truncated sequence at the end.
int64_t find_invalid_utf8(std::string_view text);

/// A one-line warning for a text that is not plain UTF-8, or "" when it is: names `source`, the byte
/// offset of the first invalid UTF-8 sequence and/or of the first NUL byte (a NUL is valid UTF-8 but
/// means a binary file more often than text). Tools print it and go on (documented in
/// docs/reliability.md): the tokenizer still sees every byte (byte fallback), so the result is
/// defined, just probably not what the user meant.
std::string text_encoding_warning(std::string_view text, const std::string& source);

/// text_encoding_warning() for a whole text file read as TextDocuments (formats/text_source.h:
/// plain text, JSON Lines or zstd), in one streaming pass with bounded memory. Offsets count bytes of
/// the document text (the decompressed file for plain text; for JSON Lines the warning names the
/// document instead). Throws what TextDocuments throws (InputError naming the file).
std::string text_file_encoding_warning(const std::string& path);

}  // namespace sq
