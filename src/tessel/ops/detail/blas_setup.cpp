#include "tessel/ops/detail/blas_setup.h"

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

// An environment variable set to `value` for the scope, then as it was (child processes see no
// change): OpenBLAS reads its settings from the environment only.
class ScopedVariable {
 public:
  ScopedVariable(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name_)) previous_ = old;
    setenv(name_, value.c_str(), 1);
  }
  ~ScopedVariable() {
    if (previous_) {
      setenv(name_, previous_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedVariable(const ScopedVariable&) = delete;
  ScopedVariable& operator=(const ScopedVariable&) = delete;

 private:
  const char* name_;
  std::optional<std::string> previous_;
};

// OpenBLAS's entry point `name` (nullptr when this build lacks it).
template <class Fn>
Fn* openblas_entry(const char* name) {
  void* lib = openblas_handle();
  if (lib == nullptr) return nullptr;
  void* fn = dlsym(lib, name);
  dlclose(lib);  // the library stays loaded: tessel links it
  return reinterpret_cast<Fn*>(fn);
}

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
  auto* quit = openblas_entry<void()>("gotoblas_dynamic_quit");
  auto* init = openblas_entry<void()>("gotoblas_dynamic_init");
  // Only families this build carries (its kernel table gotoblas_<NAME>): asking for another would
  // make OpenBLAS warn and fall back to Prescott.
  std::string table = "gotoblas_";
  for (char c : name) table += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (quit == nullptr || init == nullptr || openblas_entry<void>(table.c_str()) == nullptr) return false;
  {
    // The same path as OPENBLAS_CORETYPE set at load time: OpenBLAS reads it when it initialises.
    ScopedVariable variable("OPENBLAS_CORETYPE", name);
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

bool set_blas_thread_timeout(int log2_cycles) {
  auto* read_env = openblas_entry<void()>("openblas_read_env");
  auto* stop = openblas_entry<int()>("blas_thread_shutdown_");
  auto* start = openblas_entry<int()>("blas_thread_init");
  // 1: OpenBLAS's own threads (0 is a sequential build, 2 OpenMP, which has no such wait).
  if (openblas_get_parallel() != 1 || read_env == nullptr || stop == nullptr || start == nullptr) return false;
  {
    // OpenBLAS keeps a copy of its variables, read at load time; its threads' start reads the wait
    // from that copy, and so does their restart after a fork.
    ScopedVariable variable("OPENBLAS_THREAD_TIMEOUT", std::to_string(log2_cycles));
    read_env();
  }
  stop();
  start();
  return true;
}

int blas_thread_timeout() {
  auto* timeout = openblas_entry<unsigned()>("openblas_thread_timeout");
  return timeout ? static_cast<int>(timeout()) : -1;
}

void ensure_blas_setup() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("OPENBLAS_CORETYPE") == nullptr) select_blas_kernels();
    if (std::getenv("OPENBLAS_THREAD_TIMEOUT") == nullptr) set_blas_thread_timeout(kBlasThreadTimeout);
  });
}

}  // namespace tessel::ops::detail
