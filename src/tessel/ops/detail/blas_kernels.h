// Internal: which kernel family OpenBLAS runs. OpenBLAS built for many CPUs (DYNAMIC_ARCH, as
// Debian ships it) picks its kernels by the CPU's model number when it loads, and a model newer
// than the library falls back to Prescott's SSE3 kernels: Debian 12's OpenBLAS 0.3.21 on Sapphire
// and Emerald Rapids multiplies 4x slower than it can. tessel corrects that once, before its first
// product, unless the user chose a family (OPENBLAS_CORETYPE).
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
// select_blas_kernels() once per process, unless OPENBLAS_CORETYPE is set.
void ensure_blas_kernels();

}  // namespace tessel::ops::detail
