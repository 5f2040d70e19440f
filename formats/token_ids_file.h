// Pre-tokenized input (`--token-ids FILE` of sq-eval, sq-calibrate and sq-run): a file of token ids
// that the tools use exactly as given — no tokenizer, no BOS added — for checkpoints without a
// tokenizer and for data that is already tokenized.
//
// Format (UTF-8 / ASCII text; the first character that is not whitespace decides):
//  * `[` — a JSON array of integers: `[1, 345, 7]`. Whitespace is allowed around elements and after
//    the closing `]`, nothing else.
//  * anything else — the ids separated by whitespace (space, tab, newline, CR, VT, FF), any number
//    per line: `1 345 7\n`.
// An id is written in decimal digits only (leading zeros are accepted; no sign, no fraction, no
// exponent). Positions in messages count the ids from 0.
//
// Errors are thrown as InputError (lib/core/error.h), one sentence naming the file (`source`):
//  * the file cannot be read: "cannot open PATH: REASON" (formats/mapped_file.h);
//  * no ids at all: "PATH: no token ids (the file is empty)", "(the file holds only whitespace)" or
//    "(the JSON array is empty)";
//  * an id that is not a non-negative integer: "PATH: the token id at position P (byte offset B)
//    is not a non-negative integer: 'TEXT'";
//  * a negative id: "PATH: token id -3 at position P is negative";
//  * an id outside the vocabulary: "PATH: token id 600 at position P is outside the model's
//    vocabulary of 512 ids (0..511)";
//  * a malformed JSON array: "PATH: not a JSON array of integers: expected ',' or ']' after
//    position P at byte offset B", "... no closing ']'", "... text after the closing ']' at byte
//    offset B", "... expected a token id at byte offset B".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sq {

/// Parses `text` in the format above; `source` names it in messages (the file path). With
/// `vocab_size` > 0 every id must be below it (check_token_ids_in_vocabulary); with 0 only ids up to
/// INT32_MAX are accepted ("... is larger than 2147483647"). Throws InputError as listed above.
std::vector<int32_t> parse_token_ids(std::string_view text, const std::string& source, int64_t vocab_size = 0);

/// Reads and parses the file `path` (parse_token_ids with source = path).
std::vector<int32_t> read_token_ids_file(const std::string& path, int64_t vocab_size = 0);

/// Throws InputError "SOURCE: token id ID at position P is outside the model's vocabulary of V ids
/// (0..V-1)" for the first id >= vocab_size (ids from parse_token_ids are never negative). For tools
/// that read the file before loading the model, and check it once the vocabulary is known.
void check_token_ids_in_vocabulary(const std::vector<int32_t>& ids, int64_t vocab_size, const std::string& source);

}  // namespace sq
