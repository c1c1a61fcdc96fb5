// The forward pass on host arrays: the same logits on any mesh, and clear errors for weights and
// inputs that do not fit the model.
#include <cmath>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"
#include "tessel/core/error.h"
#include "tessel/models/forward.h"
#include "tessel/models/train.h"
#include "tessel/runtime/array.h"
#include "tessel/state/init.h"

namespace tessel {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

ModelConfig lm() {
  return parse_model_config("model: transformer\nvocab: 64\nembed: 32\nlayers: 2\nheads: 4\nkv_heads: 2\nmlp: 48\n"
                            "gated_mlp: true\nqk_norm: true\n",
                            "lm");
}

std::map<std::string, HostArray> weights_of(const ModelConfig& model, uint64_t seed) {
  const Runtime rt = Runtime::host(1);
  const Mesh one = Mesh::parse("data=1,fsdp=1,tensor=1");
  std::map<std::string, HostArray> out;
  for (const auto& [path, v] : init(rt, model.build(), seed, one, models::default_rules()))
    out.emplace(path, to_host(v.array(path)));
  return out;
}

HostArray tokens(int64_t batch, int64_t seq, int64_t vocab) {
  std::mt19937 rng(5);
  std::vector<int32_t> t(static_cast<size_t>(batch * seq));
  for (auto& x : t) x = std::uniform_int_distribution<int32_t>(0, static_cast<int32_t>(vocab) - 1)(rng);
  return HostArray::from<int32_t>({batch, seq}, t);
}

TEST(Forward, GivesTheSameLogitsOnEveryMesh) {
  const ModelConfig model = lm();
  const auto w = weights_of(model, 7);
  const HostArray in = tokens(4, 6, 64);
  const Runtime rt = Runtime::host(8);
  const HostArray one = forward_on_host(rt, model, Mesh::parse("data=1,fsdp=1,tensor=1"), models::default_rules(), w, in);
  ASSERT_EQ(one.shape(), Shape({4, 6, 64}));
  for (const char* mesh : {"data=2,fsdp=2,tensor=2", "data=1,fsdp=4,tensor=2", "data=1,fsdp=1,tensor=2", "data=4,fsdp=1,tensor=1"}) {
    const HostArray got = forward_on_host(rt, model, Mesh::parse(mesh), models::default_rules(), w, in);
    ASSERT_EQ(got.shape(), one.shape());
    double worst = 0, scale = 0;
    for (size_t i = 0; i < one.values<float>().size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(got.values<float>()[i] - one.values<float>()[i])));
      scale = std::max(scale, static_cast<double>(std::abs(one.values<float>()[i])));
    }
    EXPECT_LE(worst, 1e-5 * scale) << mesh;
  }
}

TEST(Forward, RefusesWeightsAndInputsThatDoNotFit) {
  const ModelConfig model = lm();
  const auto w = weights_of(model, 1);
  const Runtime rt = Runtime::host(4);
  const Mesh mesh = Mesh::parse("data=2,fsdp=1,tensor=2");
  const LogicalRules rules = models::default_rules();
  auto without = w;
  without.erase("decoder/decoder_norm/scale");
  EXPECT_THAT([&] { forward_on_host(rt, model, mesh, rules, without, tokens(2, 3, 64)); },
              ThrowsMessage<ValueError>(HasSubstr("no weights for decoder/decoder_norm/scale")));
  auto extra = w;
  extra.emplace("decoder/extra", HostArray(Shape{2}, DType::kF32));
  EXPECT_THAT([&] { forward_on_host(rt, model, mesh, rules, extra, tokens(2, 3, 64)); },
              ThrowsMessage<ValueError>(HasSubstr("no parameter decoder/extra")));
  auto wrong = w;
  wrong.at("decoder/decoder_norm/scale") = HostArray(Shape{31}, DType::kF32);
  EXPECT_THAT([&] { forward_on_host(rt, model, mesh, rules, wrong, tokens(2, 3, 64)); },
              ThrowsMessage<ValueError>(HasSubstr("'decoder/decoder_norm/scale' is f32[31]; the model's is f32[32]")));
  EXPECT_THAT([&] { forward_on_host(rt, model, mesh, rules, w, HostArray::from<int32_t>({2, 2}, {1, 2, 64, 3})); },
              ThrowsMessage<ValueError>(HasSubstr("token 64 at [1, 0] is outside the vocabulary [0, 64)")));
  EXPECT_THAT([&] { forward_on_host(rt, model, mesh, rules, w, tokens(3, 3, 64)); },
              ThrowsMessage<ValueError>(HasSubstr("a batch of 3 does not divide")));
  EXPECT_THAT([&] { forward_on_host(rt, model, mesh, rules, w, HostArray(Shape{2, 3}, DType::kF32)); },
              ThrowsMessage<ValueError>(HasSubstr("int32 tokens [batch, seq], not f32[2,3]")));
}

}  // namespace
}  // namespace tessel
