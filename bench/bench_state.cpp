// State-layer hot paths, with their reference measured in the same run (bench/state_bench.sh
// prints the ratios): sharded init of a 1 GiB model on 8 virtual devices against memset with the
// same threads, and eval_shape + plan of a 1000-parameter model.
#include <array>
#include <cmath>
#include <cstring>
#include <numbers>
#include <memory>
#include <vector>

#include <benchmark/benchmark.h>

#include "bench_util.h"

#include "tessel/runtime/device.h"
#include "tessel/sharding/logical_rules.h"
#include "tessel/state/init.h"
#include "tessel/models/maxtext.h"
#include "tessel/models/transformer.h"
#include "tessel/state/plan.h"
#include "tessel/state/detail/sampling.h"

namespace {

using namespace tessel;

LogicalRules rules() {
  return LogicalRules({{"vocab", {"tensor"}}, {"embed", {"fsdp"}}, {"mlp", {"tensor"}}, {"heads", {"tensor"}},
                       {"q_heads", {"tensor"}}, {"kv_heads", {"tensor"}}},
                      {"data", "fsdp", "tensor"});
}

Mesh mesh(const std::string& text) {
  std::vector<std::string> axes = {"data", "fsdp", "tensor"};
  return Mesh::parse(text, axes);
}

// 282M f32 parameters (1.05 GiB): two 32000 x 2048 embeddings and three layers.
TransformerConfig one_gib_model() {
  return {.vocab = 32000, .embed = 2048, .layers = 3, .heads = 16, .mlp = 8192};
}

void BM_Memset(benchmark::State& state) {
  const auto threads = static_cast<size_t>(state.range(0));
  const size_t bytes = size_t{1} << 30;
  std::unique_ptr<char[]> dst(new char[bytes]);
  std::memset(dst.get(), 1, bytes);  // fault the pages in: the fill is what is timed
  for (auto _ : state) {
    bench::over_thread_slices(threads, bytes, [&](size_t lo, size_t hi) {
      std::memset(dst.get() + lo, 2, hi - lo);
    });
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_Memset)->Arg(1)->Arg(2)->Iterations(5)->UseRealTime()->Unit(benchmark::kMillisecond);

// memset of fresh memory with 2 threads: the limit for an init that allocates its blocks, whose
// time is mostly the kernel handing out zeroed pages.
void BM_MemsetFresh(benchmark::State& state) {
  const size_t bytes = size_t{1} << 30;
  for (auto _ : state) {
    std::unique_ptr<char[]> dst(new char[bytes]);
    bench::over_thread_slices(2, bytes, [&](size_t lo, size_t hi) { std::memset(dst.get() + lo, 2, hi - lo); });
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_MemsetFresh)->Iterations(3)->UseRealTime()->Unit(benchmark::kMillisecond);

// init on a fresh runtime each time: allocation and first touch of the pages are part of it.
void BM_Init1GiB(benchmark::State& state) {
  Module model = transformer_lm(one_gib_model());
  const int64_t bytes = eval_shape(model, mesh("fsdp=4,tensor=2"), rules()).nbytes();
  for (auto _ : state) {
    Runtime rt = Runtime::host(8);
    State s = init(rt, model, 0, mesh("fsdp=4,tensor=2"), rules());
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * bytes);
}
BENCHMARK(BM_Init1GiB)->Iterations(3)->UseRealTime()->Unit(benchmark::kMillisecond);

// The same on a runtime whose device caches hold the previous state's blocks: generation only.
void BM_Init1GiBWarm(benchmark::State& state) {
  Module model = transformer_lm(one_gib_model());
  const int64_t bytes = eval_shape(model, mesh("fsdp=4,tensor=2"), rules()).nbytes();
  Runtime rt = Runtime::host(8);
  { State warm = init(rt, model, 0, mesh("fsdp=4,tensor=2"), rules()); }
  for (auto _ : state) {
    State s = init(rt, model, 0, mesh("fsdp=4,tensor=2"), rules());
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * bytes);
}
BENCHMARK(BM_Init1GiBWarm)->Iterations(3)->UseRealTime()->Unit(benchmark::kMillisecond);

// The sampling kernel alone on one thread, into 128 KiB that stays in cache: uniform, normal and
// a normal truncated to 2 sigma (the generation cost per element, without memory traffic).
void BM_SampleF32(benchmark::State& state) {
  using Kind = detail::SampleSpec::Kind;
  const detail::SampleSpec specs[] = {
      {Kind::kUniform, -1, 1, 0.02f},
      {Kind::kErfinv, std::nextafter(-1.0f, 0.0f), 1, 0.02f},
      {Kind::kErfinv, static_cast<float>(std::erf(-std::numbers::sqrt2)), static_cast<float>(std::erf(std::numbers::sqrt2)),
       0.02f, std::nextafter(-0.04f, 0.0f), std::nextafter(0.04f, 0.0f)}};
  const detail::SampleSpec& spec = specs[state.range(0)];
  const ArsKey key = parameter_key(0, "w");
  std::vector<float> out(size_t{1} << 15);
  uint64_t first = 0;
  for (auto _ : state) {
    detail::sample_f32(key, first, out.size(), spec, out.data());
    first += out.size();
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * out.size()));
  state.SetLabel(std::array{"uniform", "normal", "truncated_normal"}[static_cast<size_t>(state.range(0))]);
}
BENCHMARK(BM_SampleF32)->DenseRange(0, 2)->Repetitions(5)->ReportAggregatesOnly()->UseRealTime();

// 125 unstacked layers of 8 parameters plus embedding, final norm and logits: 1003 parameters.
void BM_EvalShapePlan1000(benchmark::State& state) {
  Module model = transformer_lm({.vocab = 32000, .embed = 1024, .layers = 125, .heads = 8, .mlp = 4096,
                                 .scan_layers = false});
  Mesh m = mesh("data=2,fsdp=2,tensor=2");
  for (auto _ : state) {
    MemoryPlan p = plan(eval_shape(model, m, rules()), {.optimizer = Optimizer::kAdamW});
    benchmark::DoNotOptimize(p);
  }
  state.counters["params"] = static_cast<double>(model.num_params());
}
BENCHMARK(BM_EvalShapePlan1000)->Unit(benchmark::kMillisecond);

// MaxText's largest models from their own files on 8192 devices (ici_fsdp_parallelism -1).
const char* const kMaxTextModels[] = {"deepseek3-671b", "llama3.1-405b"};

MaxTextConfig maxtext(int64_t which) {
  const std::string dir = std::string(TESSEL_TESTDATA_DIR) + "/maxtext/";
  return load_maxtext_config({.model = dir + "models/" + kMaxTextModels[which] + ".yml", .base = dir + "base.yml"});
}

// Reading base.yml (1400 lines) and the model file, merging, deriving.
void BM_MaxTextConfig(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(maxtext(state.range(0)));
  state.SetLabel(kMaxTextModels[state.range(0)]);
}
BENCHMARK(BM_MaxTextConfig)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// The parameter tree and eval_shape with shardings on the 8192-device mesh (the peer's work).
void BM_MaxTextEvalShape8192(benchmark::State& state) {
  const MaxTextConfig c = maxtext(state.range(0));
  const Mesh m = c.mesh(8192);
  for (auto _ : state) benchmark::DoNotOptimize(eval_shape(maxtext_model(c), m, c.rules));
  state.SetLabel(kMaxTextModels[state.range(0)]);
}
BENCHMARK(BM_MaxTextEvalShape8192)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// The same and the AdamW plan (bytes per device over all 8192 devices).
void BM_MaxTextEvalShapePlan8192(benchmark::State& state) {
  const MaxTextConfig c = maxtext(state.range(0));
  const Mesh m = c.mesh(8192);
  for (auto _ : state) {
    MemoryPlan p = plan(eval_shape(maxtext_model(c), m, c.rules), {.optimizer = Optimizer::kAdamW});
    benchmark::DoNotOptimize(p);
  }
  state.SetLabel(kMaxTextModels[state.range(0)]);
}
BENCHMARK(BM_MaxTextEvalShapePlan8192)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
