// Key maps: parsed with clear errors, planned forward and backward, and applied on the host so that
// a round trip gives every tensor back bit for bit.
#include <cmath>
#include <cstring>
#include <random>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../runtime/runtime_test_util.h"
#include "tessel/checkpoint/key_map.h"
#include "tessel/core/box_copy.h"
#include "tessel/core/error.h"
#include "tessel/core/half.h"

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

// The target made a piece at a time, as a streaming conversion makes it: each piece from its
// source's box alone.
HostArray apply_by_pieces(const MappedTensor& t, const std::map<std::string, HostArray>& values, int64_t max_bytes,
                          bool source_slabs) {
  HostArray out(t.shape, t.dtype);
  const size_t item = item_size(t.dtype);
  for (const MapPiece& p : map_pieces(t, values.at(t.sources.front()).shape(), max_bytes, source_slabs)) {
    std::vector<HostArray> parts;
    for (const MapPiece::Read& r : p.reads) {
      const HostArray& whole = values.at(t.sources.at(r.source));
      HostArray part(r.box.shape(), whole.dtype());
      copy_region(whole.bytes().data(), Box::full(whole.shape()), part.mutable_bytes().data(), r.box, r.box, item);
      parts.push_back(std::move(part));
    }
    const HostArray made = apply_piece(t, p, std::move(parts));
    EXPECT_EQ(made.shape(), p.target_box.shape()) << t.path;
    copy_region(made.bytes().data(), p.target_box, out.mutable_bytes().data(), Box::full(t.shape), p.target_box, item);
  }
  return out;
}

std::map<std::string, HostArray> apply_plan(const MapPlan& plan, const std::map<std::string, HostArray>& values) {
  std::map<std::string, HostArray> out;
  for (const MappedTensor& t : plan.tensors) {
    std::vector<const HostArray*> in;
    for (const std::string& p : t.sources) in.push_back(&values.at(p));
    out.emplace(t.path, apply_mapped(t, in));
    EXPECT_EQ(out.at(t.path).shape(), t.shape) << t.path;
    // Whole pieces, and slabs of at most 24 bytes where a tensor is only transposed or copied.
    for (int64_t max_bytes : {int64_t{0}, int64_t{24}})
      for (bool source_slabs : {false, true})
        EXPECT_EQ(apply_by_pieces(t, values, max_bytes, source_slabs), out.at(t.path))
            << t.path << (plan.forward ? " forward" : " backward") << " pieces of " << max_bytes
            << (source_slabs ? " (source slabs)" : "");
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

// Experts and layers stacked into one tensor (MaxText's [experts, layers, in, out]), an expert
// index kept apart per unscanned layer, and the way back, bit for bit; a missing expert is named.
TEST(KeyMap, ExpertsStackWithLayers) {
  std::mt19937 rng(5);
  const KeyMap map = parse_key_map(R"(rules:
  - from: layers.{i}.experts.{e}.w
    to: moe.wi
    transpose: [1, 0]
    stack_experts: 0
    stack: 1
  - from: blocks.{i}.experts.{e}.w
    to: blocks_{i}.wi
    stack_experts: 1
)", "moe.yml");
  std::map<std::string, HostArray> values;
  for (int i = 0; i < 3; ++i)
    for (int e = 0; e < 4; ++e) {
      values.emplace(fmt::format("layers/{}/experts/{}/w", i, e), testing::random_host(rng, {5, 2}, DType::kF32));
      values.emplace(fmt::format("blocks/{}/experts/{}/w", i, e), testing::random_host(rng, {6}, DType::kF32));
    }
  const auto there = apply_plan(plan_key_map(map, abstract(values)), values);
  ASSERT_EQ(there.at("moe/wi").shape(), Shape({4, 3, 2, 5}));
  EXPECT_EQ(there.at("blocks_1/wi").shape(), Shape({6, 4}));
  // moe/wi[e, i, a, b] = layers/i/experts/e/w[b, a]
  const auto wi = there.at("moe/wi").values<float>();
  for (int i = 0; i < 3; ++i)
    for (int e = 0; e < 4; ++e) {
      const auto w = values.at(fmt::format("layers/{}/experts/{}/w", i, e)).values<float>();
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 5; ++b)  // random bits: compare them, NaNs included
          ASSERT_EQ(std::memcmp(&wi[((e * 3 + i) * 2 + a) * 5 + b], &w[b * 2 + a], sizeof(float)), 0);
    }
  const auto back = apply_plan(plan_key_map(map, abstract(there)), there);
  ASSERT_EQ(back.size(), values.size());
  for (const auto& [p, h] : values) EXPECT_EQ(back.at(p), h) << p;
  values.erase("layers/1/experts/2/w");
  EXPECT_THAT([&] { plan_key_map(map, abstract(values)); },
              ThrowsMessage<ValueError>(HasSubstr("'moe/wi' has no source for expert 2, layer 1")));
  EXPECT_THAT([] { parse_key_map("rules:\n  - from: a.{e}\n    to: b\n", "m.yml"); },
              ThrowsMessage<ParseError>(HasSubstr("stack_experts: AXIS")));
  EXPECT_THAT([] { parse_key_map("rules:\n  - from: a.{i}.{e}\n    to: b\n    stack: 0\n    stack_experts: 0\n", "m.yml"); },
              ThrowsMessage<ParseError>(HasSubstr("different axes")));
}

// Layer ranges split one source stack into two targets (DeepSeek's dense then MoE layers), each
// counted from 0, and the way back restores the source's layer numbers.
TEST(KeyMap, LayerRangesSplitAStack) {
  std::mt19937 rng(9);
  const KeyMap map = parse_key_map(R"(vars: {k: 2}
rules:
  - from: layers.{i}.w
    to: dense.w
    stack: 0
    layers: [0, "{k}"]
  - from: layers.{i}.w
    to: moe.w
    stack: 0
    layers: ["{k}"]
)", "ranges.yml");
  std::map<std::string, HostArray> values;
  for (int i = 0; i < 5; ++i) values.emplace(fmt::format("layers/{}/w", i), testing::random_host(rng, {3}, DType::kF32));
  const auto there = apply_plan(plan_key_map(map, abstract(values)), values);
  ASSERT_EQ(there.at("dense/w").shape(), Shape({2, 3}));
  ASSERT_EQ(there.at("moe/w").shape(), Shape({3, 3}));
  EXPECT_EQ(std::memcmp(there.at("moe/w").bytes().data(), values.at("layers/2/w").bytes().data(), 12), 0);
  const auto back = apply_plan(plan_key_map(map, abstract(there)), there);
  ASSERT_EQ(back.size(), values.size());
  for (const auto& [p, h] : values) EXPECT_EQ(back.at(p), h) << p;
  EXPECT_THAT([] { parse_key_map("rules:\n  - from: a\n    to: b\n    layers: [0]\n", "m.yml"); },
              ThrowsMessage<ParseError>(HasSubstr("layers needs {i} in from")));
  EXPECT_THAT([] { parse_key_map("rules:\n  - from: a.{i}\n    to: b\n    stack: 0\n    layers: [3, 1]\n", "m.yml"); },
              ThrowsMessage<ParseError>(HasSubstr("0 <= START <= STOP")));
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
  const KeyMap twice = parse_key_map("rules:\n  - {from: a, to: c}\n  - {from: b, to: c}\n", "twice.yml");
  EXPECT_THAT([&] { plan_key_map(twice, shapes({{"a", {2}}, {"b", {2}}})); },
              ThrowsMessage<ValueError>(HasSubstr("twice.yml: two tensors map to 'c'")));
  EXPECT_THAT([] { parse_key_map("rules:\n  - from: a\n    to: b.{i}\n", "m.yml"); },
              ThrowsMessage<ParseError>(HasSubstr("to has {i} but from has not")));
  EXPECT_THAT([] { parse_key_map("rules:\n  - from: a.{i}.{i}\n    to: b\n    stack: 0\n", "m.yml"); },
              ThrowsMessage<ParseError>(HasSubstr("twice")));
  EXPECT_EQ(parse_map_vars("d=4, h=2").at("h"), "2");
  EXPECT_THROW(parse_map_vars("d"), ValueError);
}

// Normal values (no NaN, infinity or subnormal, where a scale would round) of a float dtype.
HostArray normal_values(std::mt19937& rng, const Shape& shape, DType dtype) {
  std::normal_distribution<float> normal;
  HostArray h(shape, dtype);
  for (int64_t i = 0; i < shape.num_elements(); ++i) {
    const float v = normal(rng);
    std::byte* p = h.mutable_bytes().data() + i * static_cast<int64_t>(item_size(dtype));
    if (dtype == DType::kF64) { const double d = v; std::memcpy(p, &d, 8); }
    if (dtype == DType::kF32) std::memcpy(p, &v, 4);
    if (dtype == DType::kBF16) { const uint16_t b = f32_to_bf16(v); std::memcpy(p, &b, 2); }
    if (dtype == DType::kF16) { const uint16_t b = f32_to_f16(v); std::memcpy(p, &b, 2); }
  }
  return h;
}

double value_at(const HostArray& h, int64_t i) {
  const std::byte* p = h.bytes().data() + i * static_cast<int64_t>(item_size(h.dtype()));
  uint16_t b = 0;
  float f = 0;
  double d = 0;
  switch (h.dtype()) {
    case DType::kF64: std::memcpy(&d, p, 8); return d;
    case DType::kF32: std::memcpy(&f, p, 4); return f;
    case DType::kBF16: std::memcpy(&b, p, 2); return bf16_to_f32(b);
    default: std::memcpy(&b, p, 2); return f16_to_f32(b);
  }
}

TEST(KeyMap, ScaleMultipliesForwardAndDividesBackward) {
  const KeyMap map = parse_key_map("vars: {d: 16}\nrules:\n  - from: q\n    to: k\n    scale: \"1/sqrt({d})\"\n",
                                   "map.yml");
  ASSERT_TRUE(map.rules[0].scale);
  EXPECT_DOUBLE_EQ(*map.rules[0].scale, 0.25);
  EXPECT_DOUBLE_EQ(*parse_key_map("rules:\n  - {from: a, to: b, scale: 'sqrt(2)/0.5'}\n", "m").rules[0].scale,
                   std::sqrt(2.0) / 0.5);
  std::mt19937 rng(3);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64}) {
    const std::map<std::string, HostArray> values{{"q", normal_values(rng, {5, 3}, dtype)}};
    const auto there = apply_plan(plan_key_map(map, abstract(values)), values);
    const auto back = apply_plan(plan_key_map(map, abstract(there)), there);
    for (int64_t i = 0; i < 15; ++i) {
      const double v = value_at(values.at("q"), i);
      EXPECT_EQ(value_at(there.at("k"), i), v * 0.25) << name(dtype);  // a power of two: exact
      EXPECT_EQ(value_at(back.at("q"), i), v) << name(dtype);
    }
  }
  const std::map<std::string, HostArray> ints{{"q", HostArray(Shape{2}, DType::kI32)}};
  EXPECT_THAT([&] { apply_plan(plan_key_map(map, abstract(ints)), ints); },
              ThrowsMessage<ValueError>(HasSubstr("scale applies to")));
  for (const char* bad : {"0", "-2", "x", "1/0", "sqrt(-1)", "{e}", "nan"}) {
    EXPECT_THAT([&] { parse_key_map(std::string("rules:\n  - {from: a, to: b, scale: '") + bad + "'}\n", "m.yml"); },
                ThrowsMessage<ParseError>(HasSubstr("scale"))) << bad;
  }
}

TEST(KeyMap, InterleaveTurnsHalvesIntoNeighboursAndBack) {
  const KeyMap map = parse_key_map("rules:\n  - {from: q, to: k, split: [1, [2, -1]], interleave: 2}\n", "map.yml");
  // [3, 2*4] split into [3, 2, 4]; along the last axis (a b c d) -> (a c b d).
  std::vector<int32_t> v(24);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(i);
  const std::map<std::string, HostArray> values{{"q", HostArray::from<int32_t>({3, 8}, v)}};
  const auto there = apply_plan(plan_key_map(map, abstract(values)), values);
  EXPECT_EQ(there.at("k").shape(), Shape({3, 2, 4}));
  const auto k = there.at("k").values<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(k.begin(), k.begin() + 8), (std::vector<int32_t>{0, 2, 1, 3, 4, 6, 5, 7}));
  const auto back = apply_plan(plan_key_map(map, abstract(there)), there);
  EXPECT_EQ(back.at("q"), values.at("q"));
  const std::map<std::string, HostArray> odd{{"q", HostArray(Shape{3, 6}, DType::kF32)}};
  EXPECT_THAT([&] { plan_key_map(map, abstract(odd)); }, ThrowsMessage<ValueError>(HasSubstr("interleave axis 2")));
  EXPECT_THAT([] { parse_key_map("rules:\n  - {from: a, to: b, interleave: -1}\n", "m.yml"); },
              ThrowsMessage<ParseError>(HasSubstr("interleave")));
}

// One fused source into two targets by alternating columns (HF's gate_up_proj into MaxText's
// wi_0 and wi_1), stacked per layer, and back into one tensor, bit for bit, whole or by pieces.
TEST(KeyMap, TakesSplitAFusedTensorAndPutItBack) {
  const KeyMap map = parse_key_map(R"(rules:
  - from: layers.{i}.gate_up
    to: wi_0
    transpose: [0, 2, 1]
    take: [1, 0, 2]
    stack: 1
  - from: layers.{i}.gate_up
    to: wi_1
    transpose: [0, 2, 1]
    take: [1, 1, 2]
    stack: 1
  - from: head
    to: out
)",
                                   "map.yml");
  std::mt19937 rng(17);
  std::map<std::string, HostArray> values;
  for (int i = 0; i < 3; ++i) values.emplace("layers/" + std::to_string(i) + "/gate_up",
                                             testing::random_host(rng, {2, 5, 6}, DType::kBF16));
  values.emplace("head", testing::random_host(rng, {4}, DType::kF32));
  const auto there = apply_plan(plan_key_map(map, abstract(values)), values);
  // [experts 2, in 5, 2*3] -> transpose [2, 6, 5] -> rows 0, 2, 4 (wi_0) or 1, 3, 5 (wi_1): [2, 3, 5],
  // stacked on axis 1: [2, 3 layers, 3, 5].
  ASSERT_EQ(there.at("wi_0").shape(), Shape({2, 3, 3, 5}));
  const size_t item = 2;
  for (int layer = 0; layer < 3; ++layer) {
    const HostArray& src = values.at("layers/" + std::to_string(layer) + "/gate_up");
    for (int64_t e = 0; e < 2; ++e)
      for (int64_t c = 0; c < 6; ++c)
        for (int64_t k = 0; k < 5; ++k) {
          const HostArray& dst = there.at(c % 2 ? "wi_1" : "wi_0");
          const int64_t from = (e * 5 + k) * 6 + c, to = ((e * 3 + layer) * 3 + c / 2) * 5 + k;
          EXPECT_EQ(std::memcmp(src.bytes().data() + from * item, dst.bytes().data() + to * item, item), 0)
              << layer << " " << e << " " << c << " " << k;
        }
  }
  const auto back = apply_plan(plan_key_map(map, abstract(there)), there);
  ASSERT_EQ(back.size(), values.size());
  for (const auto& [p, h] : values) EXPECT_EQ(back.at(p), h) << p;
  // Backward, a part missing; forward, a size the step does not divide; a bad take.
  std::map<std::string, HostArray> half = there;
  half.erase("wi_1");
  EXPECT_THAT([&] { plan_key_map(map, abstract(half)); },
              ThrowsMessage<ValueError>(HasSubstr("comes back from the parts its takes made, 2 alike parts")));
  std::map<std::string, HostArray> odd{{"layers/0/gate_up", HostArray(Shape{2, 5, 7}, DType::kBF16)},
                                       {"head", HostArray(Shape{4}, DType::kF32)}};
  EXPECT_THAT([&] { plan_key_map(map, abstract(odd)); }, ThrowsMessage<ValueError>(HasSubstr("divides by 2")));
  EXPECT_THAT([] { parse_key_map("rules:\n  - {from: a, to: b, take: [0, 2, 2]}\n", "m.yml"); },
              ThrowsMessage<ParseError>(HasSubstr("0 <= start < step")));
}

}  // namespace
}  // namespace tessel
