// HellaSwag task files (`sq-eval --task hellaswag FILE`): the plain-text layout that llama.cpp's
// `llama-perplexity --hellaswag` reads (../shared/data/hellaswag/hellaswag_val_full.txt holds the
// 10,042 validation tasks of Zellers et al. 2019 in it).
//
// Format: UTF-8 text, six lines per task, in order:
//   1. the context: `activity_label + ": " + ctx` (lm-evaluation-harness's preprocessing);
//   2. the gold ending's index: exactly one of `0`, `1`, `2`, `3`;
//   3.–6. the four endings.
// A trailing '\r' on a line is dropped (CRLF files); a final newline is optional; no line may be
// empty. Tasks are numbered from 0 in file order; line numbers in messages count from 1.
//
// Errors are thrown as InputError (lib/core/error.h), one sentence naming the file and line:
//  * the file cannot be read: "cannot open PATH: REASON" (formats/mapped_file.h);
//  * "PATH: no HellaSwag task (the file is empty)";
//  * "PATH:13: task 2 is incomplete: the file ends after its context line, the gold label and
//    the 4 endings are missing" (the line count is not a multiple of six);
//  * "PATH:8: task 1: the gold label must be 0, 1, 2 or 3, got '4'";
//  * "PATH:9: task 1: ending 0 is empty" / "PATH:7: task 1: the context is empty".
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sq {

/// One HellaSwag task.
struct HellaswagTask {
  int64_t index = 0;  ///< 0-based position of the task in its file
  int64_t line = 0;   ///< 1-based line number of its context line
  std::string context;
  int gold = 0;       ///< index of the correct ending, 0…3
  std::array<std::string, 4> endings;
};

/// Parses the layout above; `source` names the text in errors. Throws InputError as listed above.
std::vector<HellaswagTask> parse_hellaswag_tasks(std::string_view text, const std::string& source);

/// parse_hellaswag_tasks of a file's contents; InputError when it cannot be read.
std::vector<HellaswagTask> read_hellaswag_tasks(const std::string& path);

}  // namespace sq
