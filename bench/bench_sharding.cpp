// Resolving logical axis rules: the whole MaxText qwen3-0.6b state (42 entries) against base.yml.
// bench/sharding_bench.sh runs this beside a Python transcription of Flax's algorithm and the
// CLI's whole-process time, and prints the ratios.
#include <benchmark/benchmark.h>

#include <string>

#include "tessel/sharding/named_sharding.h"
#include "tessel/sharding/rules_io.h"
#include "tessel/sharding/spec_io.h"

namespace {

const std::string kData = TESSEL_TESTDATA_DIR "/maxtext/";

struct Qwen3 {
  tessel::LogicalRules rules = tessel::load_rules(kData + "base.yml");
  std::vector<tessel::LogicalEntry> entries =
      tessel::load_logical_dump(kData + "qwen3-0.6b_tpu7x-16_default/logical_shardings.json");
  tessel::Mesh mesh = tessel::Mesh::parse("fsdp=16", rules.mesh_axes());
};

const Qwen3& qwen3() {
  static const Qwen3 q;
  return q;
}

void per_entry(benchmark::State& state, size_t entries) {
  state.counters["per_entry"] = benchmark::Counter(static_cast<double>(state.iterations() * entries),
                                                   benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_ResolveQwen3State(benchmark::State& state) {
  const Qwen3& q = qwen3();
  tessel::ResolveOptions options{.remove_size_one_axes = state.range(0) != 0};
  for (auto _ : state)
    for (const auto& e : q.entries) benchmark::DoNotOptimize(q.rules.resolve(e.axes, q.mesh, options, e.shape));
  per_entry(state, q.entries.size());
}
BENCHMARK(BM_ResolveQwen3State)->Arg(0)->Arg(1)->ArgName("remove_size_one");

void BM_ExplainQwen3State(benchmark::State& state) {
  const Qwen3& q = qwen3();
  for (auto _ : state)
    for (const auto& e : q.entries) benchmark::DoNotOptimize(q.rules.explain(e.axes, q.mesh, {}, e.shape));
  per_entry(state, q.entries.size());
}
BENCHMARK(BM_ExplainQwen3State);

// Resolution plus every device's box: what init and restore will ask for per parameter.
void BM_ResolveAndPlaceQwen3State(benchmark::State& state) {
  const Qwen3& q = qwen3();
  for (auto _ : state)
    for (const auto& e : q.entries) {
      tessel::NamedSharding s(q.mesh, q.rules.resolve(e.axes, q.mesh, {}, e.shape));
      benchmark::DoNotOptimize(s.devices_indices_map(e.shape));
    }
  per_entry(state, q.entries.size());
}
BENCHMARK(BM_ResolveAndPlaceQwen3State);

void BM_LoadBaseYml(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(tessel::load_rules(kData + "base.yml"));
}
BENCHMARK(BM_LoadBaseYml)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
