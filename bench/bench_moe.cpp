// Mixture-of-experts figures (bench/moe_bench.sh prints them): one train step of a tiny MaxText
// mixtral (MaxText's llama2-7b file with --set: embed 128, 4 heads, 8 experts of MLP 256, top-2,
// 2 layers, vocab 256, batch 16 x seq 128, dropless, AdamW) on 1 device and on 8 virtual devices
// with expert parallelism; and the expert all_to_all alone on expert=8: its time, the bytes it
// moves and the lower bound (the kept choices whose expert lives on another device, one row each).
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "tessel/models/maxtext.h"
#include "tessel/models/train.h"
#include "tessel/ops/moe.h"
#include "tessel/ops/ops.h"
#include "tessel/runtime/device.h"
#include "tessel/runtime/runtime.h"

namespace {

using namespace tessel;

const std::vector<std::string> kMeshes = {"data=1", "data=8", "data=2,expert=4", "expert=8", "fsdp=4,expert=2",
                                          "fsdp=2,tensor=2,expert=2"};

MaxTextConfig tiny_mixtral() {
  const std::string dir = TESSEL_TESTDATA_DIR "/maxtext/";
  return load_maxtext_config(
      {.model = dir + "models/llama2-7b.yml", .base = dir + "base.yml",
       .overrides = {"decoder_block=mixtral", "base_emb_dim=128", "base_num_query_heads=4", "base_num_kv_heads=4",
                     "head_dim=32", "base_mlp_dim=256", "base_moe_mlp_dim=256", "base_num_decoder_layers=2",
                     "vocab_size=256", "num_experts=8", "num_experts_per_tok=2", "weight_dtype=float32"}});
}

void BM_MoeTrainStep(benchmark::State& state) {
  const std::string& mesh_text = kMeshes[static_cast<size_t>(state.range(0))];
  const MaxTextConfig c = tiny_mixtral();
  const Mesh mesh = Mesh::parse(mesh_text, c.rules.mesh_axes());
  Runtime rt = Runtime::host(mesh.device_count());
  models::Trainer t(rt, ModelConfig{.config = c, .source = c.source}, mesh, c.rules,
                    {.kind = nn::OptimizerKind::kAdamW, .schedule = {.peak = 1e-3}});
  State s = t.init(0);
  const nn::ByteDataset data = nn::ByteDataset::open(nn::ByteDataset::default_path());
  const int64_t batch = 16, seq = 128;
  const nn::Batch b = t.batch(&data, {}, batch, seq);
  int64_t step = 0;
  t.step(s, b, step++);
  for (auto _ : state) t.step(s, b, step++);
  state.SetLabel(mesh_text);
  state.counters["tokens"] = benchmark::Counter(static_cast<double>(batch * seq), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_MoeTrainStep)->DenseRange(0, static_cast<int64_t>(kMeshes.size()) - 1)->Unit(benchmark::kMillisecond)
    ->UseRealTime()->MinTime(2.0);

// Dispatch buffers of 16 x 128 tokens of 128 floats, top-2 of 8 experts from random router logits,
// moved batch-split -> expert-split over expert=8.
void BM_MoeAllToAll(benchmark::State& state) {
  const int64_t batch = 16, seq = 128, emb = 128, experts = 8, k = 2;
  const Mesh mesh = Mesh::parse("expert=8");
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(batch * seq * emb)), logits(static_cast<size_t>(batch * seq * experts));
  for (float& v : x) v = normal(rng);
  for (float& v : logits) v = normal(rng);
  const NamedSharding tokens(mesh, {{"expert"}});
  const Tensor xt(device_put(rt, HostArray::from<float>(Shape{batch, seq, emb}, x), tokens));
  const Tensor lt(device_put(rt, HostArray::from<float>(Shape{batch, seq, experts}, logits), tokens));
  const ops::Routing r = ops::route(ops::top_k(lt, k).indices, experts, 0);
  const Tensor kernel(device_put(rt, HostArray::from<float>(Shape{experts, 1}, std::vector<float>(experts)),
                                 NamedSharding(mesh, {{"expert"}})));
  const Tensor buffer = ops::moe_dispatch(xt, r);
  auto received = [&] {
    int64_t n = 0;
    for (int64_t d = 0; d < rt.device_count(); ++d) n += rt.device(d).memory_stats().bytes_received;
    return n;
  };
  const int64_t before = received();
  for (auto _ : state) benchmark::DoNotOptimize(ops::to_experts(buffer, kernel));
  // What crossed devices, from the devices' own traffic counters.
  const double moved = static_cast<double>(received() - before) / static_cast<double>(state.iterations());
  // Each device keeps 1/8 of its buffer and sends the rest; at least, it must send the rows of
  // its tokens' choices whose experts live elsewhere (batch rows b and experts e on device b / 2
  // and e).
  const std::vector<int32_t> idx = [&] {
    const HostArray h = to_host(r.indices.array());
    auto v = h.values<int32_t>();
    return std::vector<int32_t>(v.begin(), v.end());
  }();
  int64_t remote = 0;
  for (int64_t i = 0; i < batch * seq * k; ++i) remote += idx[static_cast<size_t>(i)] != (i / (seq * k)) / 2;
  const double bound = static_cast<double>(remote * emb * 4);
  state.counters["bytes_moved"] = moved;
  state.counters["lower_bound"] = bound;
  state.counters["capacity"] = static_cast<double>(r.capacity);
  state.counters["bytes_per_s"] = benchmark::Counter(moved, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_MoeAllToAll)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);

}  // namespace

BENCHMARK_MAIN();
