// Internal: TESSEL_VECTOR_CLONES marks a hot element loop to be compiled for AVX-512, AVX2 and the
// baseline, the version picked at load time (g++'s target_clones; x86-64 only). Files whose loops
// must give the baseline's bits compile without FMA contraction (src/CMakeLists.txt). Defining
// TESSEL_NO_VECTOR_CLONES first builds the baseline alone (the tests' reference copies).
#pragma once

// Not under clang: clang 14 (Debian 12's) builds a target_clones function whose earlier
// declaration lacks the attribute (ours are declared in headers) as its first clone alone, under
// the plain name: the AVX-512 version, run on every CPU (SIGILL on AVX2-only ones, seen in the
// sanitizer build on an AMD Zen 3). The baseline gives the same bits, so clang builds get it.
#if defined(__x86_64__) && !defined(TESSEL_NO_VECTOR_CLONES) && !defined(__clang__)
#define TESSEL_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TESSEL_VECTOR_CLONES
#endif
