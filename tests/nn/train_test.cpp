// Training end to end: the same losses on every mesh, resume on another mesh, eval_shape of a
// step, and the optimizers against host references.
#include <chrono>
#include <cmath>
#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"
#include "tessel/checkpoint/manager.h"
#include "tessel/core/error.h"
#include "tessel/nn/train.h"
#include "tessel/runtime/runtime.h"
#include "tessel/state/init.h"

namespace tessel {
namespace {

ModelConfig small_lm() {
  return parse_model_config(R"(
model: transformer
vocab: 256
embed: 32
layers: 2
heads: 8
kv_heads: 4
mlp: 64
)", "small_lm");
}

nn::OptimizerConfig adamw() {
  return {.kind = nn::OptimizerKind::kAdamW, .schedule = {.peak = 3e-3, .warmup = 5, .decay_steps = 50}};
}

std::vector<double> train(const Runtime& rt, const Mesh& mesh, int64_t from, int64_t to, State* state,
                          const nn::Trainer& t, const nn::ByteDataset& data) {
  std::vector<double> losses;
  for (int64_t s = from; s < to; ++s) {
    const nn::Batch b = t.batch(&data, {.seed = 3, .step = s}, 8, 16);
    losses.push_back(t.step(*state, b, s).loss);
  }
  (void)rt;
  (void)mesh;
  return losses;
}

TEST(Train, LmLossesAgreeAcrossMeshes) {
  Runtime rt = Runtime::host(8);
  const nn::ByteDataset data = nn::ByteDataset::open(nn::ByteDataset::default_path());
  std::vector<double> one;
  for (const char* m : {"data=1", "data=8", "fsdp=8", "tensor=8", "data=2,fsdp=2,tensor=2"}) {
    SCOPED_TRACE(m);
    const LogicalRules rules = nn::default_rules();
    const Mesh mesh = Mesh::parse(m, rules.mesh_axes());
    nn::Trainer t(rt, small_lm(), mesh, rules, adamw());
    State state = t.init(1);
    auto t0 = std::chrono::steady_clock::now();
    const std::vector<double> losses = train(rt, mesh, 0, 20, &state, t, data);
    std::cerr << m << ": " << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s, loss "
              << losses.front() << " -> " << losses.back() << "\n";
    if (one.empty()) {
      one = losses;
      EXPECT_LT(losses.back(), losses.front() - 0.5);
      continue;
    }
    for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(losses[i], one[i], 1e-4 * std::abs(one[i])) << "step " << i;
  }
}

}  // namespace
}  // namespace tessel
