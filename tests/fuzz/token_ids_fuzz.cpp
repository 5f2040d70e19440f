// libFuzzer target: sq::fuzz::token_ids (tests/fuzz/fuzz_targets.h). Built with -DSQ_FUZZ=ON (clang);
// run with scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sq::fuzz::token_ids(data, size);
  return 0;
}
