// Shared by the fuzz harnesses in this folder. Each harness defines LLVMFuzzerTestOneInput: under
// EDL_FUZZ=ON (clang) libFuzzer drives it (bench/fuzz.sh); otherwise replay_main.cc runs the files
// named on its command line, which is how ctest replays the seed corpora in every build.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

// A property every accepted input must have (a round trip, a bound). Aborts, so libFuzzer and
// the sanitizers report the input that broke it; assert() would vanish in Release builds.
#define FUZZ_CHECK(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
