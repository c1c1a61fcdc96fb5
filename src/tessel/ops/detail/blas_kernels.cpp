#include "tessel/ops/detail/blas_kernels.h"

#include <cblas.h>
#include <dlfcn.h>
#include <strings.h>

#include <array>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <optional>

namespace tessel::ops::detail {

CpuFeatures CpuFeatures::of_this_cpu() {
  // __builtin_cpu_supports also checks that the operating system saves the vector registers.
  CpuFeatures f;
  f.avx = __builtin_cpu_supports("avx");
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
  f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
  return f;
}

namespace {

// OpenBLAS's names of the families for CPUs without AVX, and its name for an unknown CPU.
constexpr std::array<const char*, 17> kPreAvx = {"Unknown", "Katmai", "Coppermine", "Northwood", "Prescott", "Banias",
                                                 "Atom", "Core2", "Penryn", "Dunnington", "Nehalem", "Athlon",
                                                 "Opteron", "Opteron_SSE3", "Barcelona", "Nano", "Bobcat"};

bool pre_avx(std::string_view name) {
  for (const char* known : kPreAvx)
    if (name.size() == std::string_view(known).size() && strncasecmp(name.data(), known, name.size()) == 0) return true;
  return false;
}

// The library holding OpenBLAS's API, opened again (it is loaded already) to look up the
// re-initialisation its multi-CPU builds export. Through a handle, not the global scope: inside a
// Python extension OpenBLAS is not in the global scope.
void* openblas_handle() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&openblas_get_corename), &info) == 0 || info.dli_fname == nullptr) return nullptr;
  return dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
}

// OPENBLAS_CORETYPE set to `name` for the scope, then as it was (child processes see no change).
class CoreTypeVariable {
 public:
  explicit CoreTypeVariable(const std::string& name) {
    if (const char* old = std::getenv(kName)) previous_ = old;
    setenv(kName, name.c_str(), 1);
  }
  ~CoreTypeVariable() {
    if (previous_) {
      setenv(kName, previous_->c_str(), 1);
    } else {
      unsetenv(kName);
    }
  }
  CoreTypeVariable(const CoreTypeVariable&) = delete;
  CoreTypeVariable& operator=(const CoreTypeVariable&) = delete;

 private:
  static constexpr const char* kName = "OPENBLAS_CORETYPE";
  std::optional<std::string> previous_;
};

}  // namespace

std::vector<std::string> better_blas_kernels(std::string_view current, const CpuFeatures& features) {
  if (!pre_avx(current)) return {};
  std::vector<std::string> out;
  if (features.avx512_bf16) out.push_back("Cooperlake");
  if (features.avx512) out.push_back("SkylakeX");
  if (features.avx2_fma) out.push_back("Haswell");
  if (features.avx) out.push_back("Sandybridge");
  return out;
}

bool switch_blas_kernels(const std::string& name) {
  void* lib = openblas_handle();
  if (lib == nullptr) return false;
  using Hook = void (*)();
  auto quit = reinterpret_cast<Hook>(dlsym(lib, "gotoblas_dynamic_quit"));
  auto init = reinterpret_cast<Hook>(dlsym(lib, "gotoblas_dynamic_init"));
  // Only families this build carries (its kernel table gotoblas_<NAME>): asking for another would
  // make OpenBLAS warn and fall back to Prescott.
  std::string table = "gotoblas_";
  for (char c : name) table += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const bool carried = dlsym(lib, table.c_str()) != nullptr;
  dlclose(lib);
  if (quit == nullptr || init == nullptr || !carried) return false;
  {
    // The same path as OPENBLAS_CORETYPE set at load time: OpenBLAS reads it when it initialises.
    CoreTypeVariable variable(name);
    quit();
    init();
  }
  return strcasecmp(openblas_get_corename(), name.c_str()) == 0;
}

std::string select_blas_kernels() {
  for (const std::string& name : better_blas_kernels(openblas_get_corename(), CpuFeatures::of_this_cpu()))
    if (switch_blas_kernels(name)) break;
  return openblas_get_corename();
}

void ensure_blas_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("OPENBLAS_CORETYPE") == nullptr) select_blas_kernels();
  });
}

}  // namespace tessel::ops::detail
