// ProgressBar off a terminal: plain progress lines with rate and ETA, at most one per interval, so
// that runs under nohup or CI log where they are (the bar itself needs a terminal).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "core/progress.h"

namespace sq {
namespace {

/// Runs `body` with stderr (fd 2) redirected to a temporary file and returns what it wrote.
template <typename Body>
std::string capture_stderr(const Body& body) {
  std::fflush(stderr);
  FILE* tmp = std::tmpfile();
  const int saved = dup(2);
  dup2(fileno(tmp), 2);
  body();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::string out;
  std::rewind(tmp);
  for (int c; (c = std::fgetc(tmp)) != EOF;) out += static_cast<char>(c);
  std::fclose(tmp);
  return out;
}

TEST(ProgressBar, OffATerminalPrintsPlainLinesWithoutTheBar) {
  const std::string every = capture_stderr([] {
    ProgressBar p("eval", 4, "chunks", true, 0.0);  // interval 0: a line at every update
    p.update(1, 512, "tok");
    p.update(4, 2048, "tok");
    p.finish();
  });
  // Two lines, no carriage return and no bar; ETA 0:00 when done.
  EXPECT_EQ(every.find('\r'), std::string::npos) << every;
  EXPECT_EQ(every.find('#'), std::string::npos) << every;
  ASSERT_EQ(every.rfind("eval 25% 1/4 chunks, ", 0), 0u) << every;
  const size_t second = every.find('\n') + 1;
  EXPECT_EQ(every.compare(second, 20, "eval 100% 4/4 chunks"), 0) << every;
  EXPECT_NE(every.find("ETA 0:00\n"), std::string::npos) << every;
  EXPECT_EQ(every.back(), '\n');

  // The default interval (30 s): a short run prints nothing, not even at the end.
  const std::string quiet = capture_stderr([] {
    ProgressBar p("eval", 4, "chunks");
    for (int i = 1; i <= 4; ++i) p.update(i, 512.0 * i, "tok");
  });
  EXPECT_EQ(quiet, "");
  // Disabled (-q), a negative interval, or nothing to count: silent.
  EXPECT_EQ(capture_stderr([] { ProgressBar p("eval", 4, "chunks", false, 0.0); p.update(2); }), "");
  EXPECT_EQ(capture_stderr([] { ProgressBar p("eval", 4, "chunks", true, -1.0); p.update(2); }), "");
  EXPECT_EQ(capture_stderr([] { ProgressBar p("eval", 0, "chunks", true, 0.0); p.update(0); }), "");
}

}  // namespace
}  // namespace sq
