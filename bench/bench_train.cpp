// Training-step figures with their reference measured in the same run (bench/train_bench.sh
// prints the ratios): the rate of tessel's f32 products (oneDNN) on the shapes the models use,
// with all cores, then one train step of DotReluDot (batch 512, 1024 -> 4096 -> 1024, MSE, SGD)
// and of a small LM (vocab 256, embed 256, 4 layers, 4 heads, MLP 1024, seq 128, batch 16, AdamW)
// on 1 device and on 8 virtual devices with each parallelism.
#include <cblas.h>

#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include "train_models.h"
#include "tessel/models/train.h"
#include "tessel/ops/detail/local.h"
#include "tessel/runtime/runtime.h"

namespace {

using namespace tessel;

// The LM has 4 heads, which tensor=8 cannot split: its tensor-parallel case is data=2,tensor=4.
const std::vector<std::string> kMeshes = {"data=1", "data=8", "fsdp=8", "tensor=8", "data=2,fsdp=2,tensor=2",
                                          "data=2,tensor=4"};

// C[m,n] = op(A) op(B) with every core on one product (no device split), as a 1-device op runs
// it (inside its spread region): the machine's rate.
void BM_Sgemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const bool ta = state.range(3) & 1, tb = state.range(3) & 2;
  std::vector<float> a(static_cast<size_t>(m * k), 0.5f), b(static_cast<size_t>(k * n), 0.25f),
      c(static_cast<size_t>(m * n));
  const Runtime rt = Runtime::host(1);
  ops::detail::run_spread(rt, [&] {
    for (auto _ : state) {
      ops::detail::gemm(DType::kF32, ta, tb, m, n, k, reinterpret_cast<const std::byte*>(a.data()),
                        reinterpret_cast<const std::byte*>(b.data()), reinterpret_cast<std::byte*>(c.data()), false);
      benchmark::ClobberMemory();
    }
  });
  state.counters["flops"] = benchmark::Counter(2.0 * static_cast<double>(m * n * k), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(ops::detail::sgemm_runs_dnnl(m, n, k) ? "oneDNN" : ops::detail::blas_core());
}
// The same products on OpenBLAS's own threads, one per core (tessel's f32 path before oneDNN): the
// library oneDNN replaced, measured beside it.
void BM_SgemmOpenBlas(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const bool ta = state.range(3) & 1, tb = state.range(3) & 2;
  std::vector<float> a(static_cast<size_t>(m * k), 0.5f), b(static_cast<size_t>(k * n), 0.25f),
      c(static_cast<size_t>(m * n));
  ops::detail::set_blas_threads(static_cast<int>(std::thread::hardware_concurrency()));  // sets OpenBLAS up too
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
                static_cast<int>(n), static_cast<int>(k), 1.0f, a.data(), static_cast<int>(ta ? m : k), b.data(),
                static_cast<int>(tb ? k : n), 0.0f, c.data(), static_cast<int>(n));
    benchmark::ClobberMemory();
  }
  ops::detail::set_blas_threads(1);
  state.counters["flops"] = benchmark::Counter(2.0 * static_cast<double>(m * n * k), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(ops::detail::blas_core());
}
// The MLP's products (forward, and the two gradient forms), then the LM's.
void model_gemms(benchmark::internal::Benchmark* b) {
  for (const char* name : {"mlp", "lm"}) {
    for (const bench::Gemm& g : bench::train_model(name).gemms) b->Args({g.m, g.n, g.k, g.trans_a + 2 * g.trans_b});
  }
}
BENCHMARK(BM_Sgemm)->Apply(model_gemms)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
BENCHMARK(BM_SgemmOpenBlas)->Apply(model_gemms)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);

void BM_TrainStep(benchmark::State& state) {
  const int64_t which = state.range(0);
  const std::string& mesh_text = kMeshes[static_cast<size_t>(state.range(1))];
  const LogicalRules rules = models::default_rules();
  const Mesh mesh = Mesh::parse(mesh_text, rules.mesh_axes());
  Runtime rt = Runtime::host(mesh.device_count());
  const bench::TrainModel m = bench::train_model(which == 0 ? "mlp" : "lm");
  models::Trainer t(rt, m.config(), mesh, rules, m.optimizer);
  State s = t.init(0);
  const nn::ByteDataset data = nn::ByteDataset::open(nn::ByteDataset::default_path());
  const int64_t batch = m.batch, seq = m.seq;
  const nn::Batch b = t.batch(&data, {}, batch, seq);
  int64_t step = 0;
  t.step(s, b, step++);  // warm the allocator's cache
  for (auto _ : state) t.step(s, b, step++);
  state.SetLabel(std::string(which == 0 ? "mlp " : "lm ") + mesh_text);
  state.counters["tokens"] = benchmark::Counter(static_cast<double>(which == 0 ? batch : batch * seq),
                                                benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_TrainStep)->ArgsProduct({{0}, {0, 1, 2, 3, 4}})->ArgsProduct({{1}, {0, 1, 2, 5, 4}})->Unit(benchmark::kMillisecond)->UseRealTime()
    ->MinTime(2.0);

}  // namespace

BENCHMARK_MAIN();
