// Internal: OpenBLAS's defaults that tessel corrects once per process, before its first product.
//
// Its kernel family. OpenBLAS built for many CPUs (DYNAMIC_ARCH, as Debian ships it) picks its
// kernels by the CPU's model number when it loads, and a model newer than the library falls back
// to Prescott's SSE3 kernels: Debian 12's OpenBLAS 0.3.21 on Sapphire and Emerald Rapids multiplies
// 4x slower than it can. Unless the user chose a family (OPENBLAS_CORETYPE).
//
// How its idle threads wait. Its pthreads build keeps a thread that has done its part of a product
// calling sched_yield for the next one for 2^28 cycles (about 0.1 s) before it sleeps. tessel ran
// OpenBLAS's threads for products of at least 2^30 multiply-adds (no longer: ops keep it at one
// thread) and its own worker pool between them, whose threads then shared the cores with the
// polling ones: DotReluDot's step took 1.18x its GEMM bound instead of 1.09x (10 alternating
// process pairs on the 2-core Intel VM). A user's own OpenBLAS calls may still start them.
// Its threads sleep at once (OpenBLAS's shortest wait, 2^4 cycles); waking one costs microseconds
// against a product of milliseconds. Unless the user chose a wait (OPENBLAS_THREAD_TIMEOUT).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tessel::ops::detail {

// What this CPU (and its operating system) can run, as far as the choice of kernels goes.
struct CpuFeatures {
  bool avx = false;
  bool avx2_fma = false;
  bool avx512 = false;  // F, CD, BW, DQ and VL: what OpenBLAS's SkylakeX kernels use
  bool avx512_bf16 = false;

  static CpuFeatures of_this_cpu();
};

// The families worth trying for a CPU with `features`, best first, when OpenBLAS picked
// `current`; empty unless `current` is one of the families of CPUs without AVX (Prescott, Core2,
// Nehalem, ...): a family that uses the vector units (Sandybridge on, AMD's included, and any name
// this list does not know) stays as OpenBLAS picked it.
std::vector<std::string> better_blas_kernels(std::string_view current, const CpuFeatures& features);

// Makes OpenBLAS run the family `name` (OpenBLAS's spelling) if it is a multi-CPU build that
// carries it and exports its re-initialisation; true when it then runs it. Not while another
// thread is inside OpenBLAS.
bool switch_blas_kernels(const std::string& name);
// Reselects OpenBLAS's kernels when better_blas_kernels() names any and the library can switch
// (switch_blas_kernels, best first); returns the family in use afterwards.
std::string select_blas_kernels();
// The wait tessel gives OpenBLAS's idle threads: 2^kBlasThreadTimeout cycles.
constexpr int kBlasThreadTimeout = 4;
// Restarts OpenBLAS's threads with a wait of 2^log2_cycles cycles (OpenBLAS clamps it to 4..30),
// through its own stop and start, as if OPENBLAS_THREAD_TIMEOUT had been set at load time (the
// process's environment is left as it was). True when done: false for a build without its own
// threads (sequential, OpenMP) or without those entry points. Not while another thread is inside
// OpenBLAS.
bool set_blas_thread_timeout(int log2_cycles);
// The wait OpenBLAS starts its threads with, as the power of two it read (0: its default, 2^28);
// -1 when this build does not say.
int blas_thread_timeout();

// Once per process: select_blas_kernels() unless OPENBLAS_CORETYPE is set, then
// set_blas_thread_timeout(kBlasThreadTimeout) unless OPENBLAS_THREAD_TIMEOUT is set.
void ensure_blas_setup();

}  // namespace tessel::ops::detail
