// <immintrin.h> for the SIMD kernels, without GCC 12's false -W(maybe-)uninitialized warnings: its
// AVX-512 headers build vectors with an "undefined vector" idiom that the warning flags inside the
// header once inlined. The warnings are silenced for the header only, not for the including code.
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
