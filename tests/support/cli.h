// Test helpers shared by the tool (CLI) tests on stories260K: calibration, conversion, perplexity
// and the "one stderr line, exit status 2, no output file" check every bad-input case makes.
#pragma once

#include <string>
#include <vector>

#include "tests/support/process.h"

namespace sq::test {

/// Runs sq-calibrate on stories260K over `samples` windows × `seq_len` tokens of
/// tinystories-train-2MiB into `out` (extra flags, e.g. "--hessian", appended). Records a fatal
/// test failure when it does not exit 0.
void calibrate_stories(const std::string& out, int samples, int seq_len, const std::vector<std::string>& extra = {});

/// Runs sq-convert on stories260K (its tokenizer embedded) with `--scheme scheme -o out -q` and
/// `extra` flags.
ProcessResult convert_stories(const std::string& scheme, const std::vector<std::string>& extra, const std::string& out);

/// Windows-protocol PPL at -c 256 over the first `chunks` windows of tinystories-valid-1000 (the
/// JSON goes to `json`). Records a test failure when sq-eval does not exit 0.
double stories_ppl(const std::string& model, const std::string& json, int chunks = 40);

/// Expects exit status 2, exactly one stderr line containing `expected` and, when `out_path` is not
/// empty, no file at `out_path`.
void expect_one_line_exit2(const ProcessResult& r, const std::string& expected, const std::string& out_path = "");

}  // namespace sq::test
