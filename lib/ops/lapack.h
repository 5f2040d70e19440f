// The LAPACK routines sqkit calls, from OpenBLAS (Debian installs no lapack.h). Fortran ABI: every
// argument by pointer, column-major matrices, and the trailing hidden lengths of the character
// arguments (OpenBLAS's C implementations ignore them). Call them under ops::OneLibraryThread
// (ops/library_threads.h) where the bits must not depend on the thread count.
#pragma once

#include <cstddef>

extern "C" {
/// Cholesky factorization A = UᵀU ("U") or L·Lᵀ ("L") of the n × n symmetric positive definite A,
/// in place in that triangle; info > 0: the leading minor of that order is not positive definite.
void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info, size_t uplo_len);
/// A⁻¹ from dpotrf's factor, in place in the same triangle; info > 0: A is singular.
void dpotri_(const char* uplo, const int* n, double* a, const int* lda, int* info, size_t uplo_len);
/// Inverse of the triangular A ("U"/"L"; diag "N" = non-unit), in place; info > 0: A(info, info) = 0.
void dtrtri_(const char* uplo, const char* diag, const int* n, double* a, const int* lda, int* info, size_t uplo_len,
             size_t diag_len);
}
