// Internal: TESSEL_VECTOR_CLONES marks a hot element loop to be compiled for AVX-512, AVX2 and the
// baseline, the version picked at load time (g++'s target_clones; x86-64 only). Files whose loops
// must give the baseline's bits compile without FMA contraction (src/CMakeLists.txt). Defining
// TESSEL_NO_VECTOR_CLONES first builds the baseline alone (the tests' reference copies).
#pragma once

#if defined(__x86_64__) && !defined(TESSEL_NO_VECTOR_CLONES)
#define TESSEL_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TESSEL_VECTOR_CLONES
#endif
