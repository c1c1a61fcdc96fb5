// Key maps: parsed with clear errors, planned forward and backward, and applied on the host so that
// a round trip gives every tensor back bit for bit.
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../runtime/runtime_test_util.h"
#include "tessel/checkpoint/key_map.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr const char* kMap = R"(vars: {d: 2}
rules:
  - from: layers.{i}.w
    to: stacked.w
    transpose: [2, 0, 1]
    split: [2, [-1, "{d}"]]
    stack: 2
  - from: head
    to: out.kernel
    transpose: [1, 0]
  - from: blocks.{i}.b
    to: blocks_{i}.b
)";

State abstract(const std::map<std::string, HostArray>& values) {
  State s;
  for (const auto& [p, h] : values) s.insert(p, Variable::abstract(kParam, h.shape(), h.dtype()));
  return s;
}

std::map<std::string, HostArray> apply_plan(const MapPlan& plan, const std::map<std::string, HostArray>& values) {
  std::map<std::string, HostArray> out;
  for (const MappedTensor& t : plan.tensors) {
    std::vector<const HostArray*> in;
    for (const std::string& p : t.sources) in.push_back(&values.at(p));
    out.emplace(t.path, apply_mapped(t, in));
    EXPECT_EQ(out.at(t.path).shape(), t.shape) << t.path;
  }
  return out;
}

TEST(KeyMap, RoundTripsAreBitExact) {
  std::mt19937 rng(11);
  const KeyMap map = parse_key_map(kMap, "map.yml");
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI8, DType::kF64}) {
    std::map<std::string, HostArray> values;
    for (int i = 0; i < 3; ++i) {
      values.emplace("layers/" + std::to_string(i) + "/w", testing::random_host(rng, {3, 6, 4}, dtype));
      values.emplace("blocks/" + std::to_string(i) + "/b", testing::random_host(rng, {7}, dtype));
    }
    values.emplace("head", testing::random_host(rng, {6, 9}, dtype));
    const MapPlan fwd = plan_key_map(map, abstract(values));
    EXPECT_TRUE(fwd.forward);
    // layers: [3,6,4] -> transpose (2,0,1) [4,3,6] -> split axis 2 into (3,2) [4,3,3,2] -> stack 2: [4,3,3,3,2]
    const auto there = apply_plan(fwd, values);
    EXPECT_EQ(there.at("out/kernel").shape(), Shape({9, 6}));
    EXPECT_EQ(there.at("stacked/w").shape(), Shape({4, 3, 3, 3, 2}));
    EXPECT_TRUE(there.contains("blocks_2/b"));
    const MapPlan bwd = plan_key_map(map, abstract(there));
    EXPECT_FALSE(bwd.forward);
    const auto back = apply_plan(bwd, there);
    ASSERT_EQ(back.size(), values.size());
    for (const auto& [p, h] : values) EXPECT_EQ(back.at(p), h) << p;
  }
}

TEST(KeyMap, PlansRefuseWhatDoesNotFit) {
  const KeyMap map = parse_key_map(kMap, "map.yml");
  auto shapes = [](std::vector<std::pair<std::string, Shape>> s) {
    State st;
    for (auto& [p, shape] : s) st.insert(p, Variable::abstract(kParam, shape, DType::kF32));
    return st;
  };
  EXPECT_THAT([&] { plan_key_map(map, shapes({{"layers/0/w", {3, 6, 4}}, {"layers/2/w", {3, 6, 4}}, {"head", {2, 2}},
                                              {"blocks/0/b", {1}}})); },
              ThrowsMessage<ValueError>(HasSubstr("without gaps")));
  EXPECT_THAT([&] { plan_key_map(map, shapes({{"layers/0/w", {3, 6, 4}}, {"layers/1/w", {3, 6, 5}}, {"head", {2, 2}},
                                              {"blocks/0/b", {1}}})); },
              ThrowsMessage<ValueError>(HasSubstr("stack only when alike")));
  EXPECT_THAT([&] { plan_key_map(map, shapes({{"layers/0/w", {3, 5, 4}}, {"head", {2, 2}}, {"blocks/0/b", {1}}})); },
              ThrowsMessage<ValueError>(HasSubstr("does not split")));
  EXPECT_THAT([&] { plan_key_map(map, shapes({{"head", {2, 2}}, {"other", {1}}})); },
              ThrowsMessage<ValueError>(HasSubstr("other")));
  EXPECT_THAT([&] { plan_key_map(map, shapes({{"head", {2, 2}}})); },
              ThrowsMessage<ValueError>(HasSubstr("match none")));
  EXPECT_THAT([] { parse_key_map("rules:\n  - from: a\n    to: b.{i}\n", "m.yml"); },
              ThrowsMessage<ParseError>(HasSubstr("to has {i} but from has not")));
  EXPECT_THAT([] { parse_key_map("rules:\n  - from: a.{i}.{i}\n    to: b\n    stack: 0\n", "m.yml"); },
              ThrowsMessage<ParseError>(HasSubstr("twice")));
  EXPECT_EQ(parse_map_vars("d=4, h=2").at("h"), "2");
  EXPECT_THROW(parse_map_vars("d"), ValueError);
}

}  // namespace
}  // namespace tessel
