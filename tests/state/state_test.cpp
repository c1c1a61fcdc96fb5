#include "tessel/state/state.h"

#include <algorithm>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessel/core/error.h"

namespace tessel {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

Variable abstract(std::string kind = kParam, Shape shape = {4, 2}) {
  return Variable::abstract(std::move(kind), std::move(shape), DType::kF32);
}

State sample_state() {
  State s;
  s.insert("decoder/layers/10/mlp/wi/kernel", abstract());
  s.insert("decoder/layers/2/mlp/wi/kernel", abstract());
  s.insert("decoder/layers/2/mlp/wi/bias", abstract(kParam, {2}));
  s.insert("decoder/layers/2/norm/mean", abstract("batch_stat", {2}));
  s.insert("opt/mu/decoder/layers/2/mlp/wi/kernel", abstract("opt_state"));
  s.insert("token_embedder/embedding", abstract());
  return s;
}

TEST(PathLess, OrdersDigitRunsAsNumbersAndKeepsChildrenTogether) {
  PathLess less;
  EXPECT_TRUE(less("layers/2", "layers/10"));
  EXPECT_FALSE(less("layers/10", "layers/2"));
  EXPECT_TRUE(less("a/b", "a_b"));          // '/' first: a's children stay together
  EXPECT_TRUE(less("a", "a/b"));
  EXPECT_FALSE(less("a", "a"));
  EXPECT_TRUE(less("x1", "x01") != less("x01", "x1"));  // strict: distinct strings are ordered
  std::vector<std::string> paths = {"l/10/w", "l/9/w", "l/1/w", "l/100/w", "l/9/v"};
  std::sort(paths.begin(), paths.end(), less);
  EXPECT_THAT(paths, ElementsAre("l/1/w", "l/9/v", "l/9/w", "l/10/w", "l/100/w"));
}

TEST(State, KeepsNaturalOrderAndRejectsBadOrRepeatedPaths) {
  State s = sample_state();
  EXPECT_THAT(s.paths(), ElementsAre("decoder/layers/2/mlp/wi/bias", "decoder/layers/2/mlp/wi/kernel",
                                     "decoder/layers/2/norm/mean", "decoder/layers/10/mlp/wi/kernel",
                                     "opt/mu/decoder/layers/2/mlp/wi/kernel", "token_embedder/embedding"));
  EXPECT_THAT([&] { s.insert("token_embedder/embedding", abstract()); },
              ThrowsMessage<ValueError>(HasSubstr("defined twice")));
  for (std::string bad : {"", "/a", "a/", "a//b"})
    EXPECT_THROW(s.insert(bad, abstract()), ValueError) << bad;
  EXPECT_THAT([&] { (void)s.at("token_embedder/embeding"); },
              ThrowsMessage<ValueError>(HasSubstr("no variable 'token_embedder/embeding'")));
  EXPECT_EQ(s.at("decoder/layers/2/norm/mean").kind(), "batch_stat");
}

TEST(Filter, SelectsByKindPathAndRegexAndCombines) {
  State s = sample_state();
  EXPECT_EQ(s.filter(Filter::kind(kParam)).size(), 4u);
  EXPECT_EQ(s.filter(Filter::kind("opt_state")).size(), 1u);
  EXPECT_EQ(s.filter(Filter::path_contains("mlp")).size(), 4u);
  EXPECT_THAT(s.filter(Filter::path_regex("bias$")).paths(), ElementsAre("decoder/layers/2/mlp/wi/bias"));
  EXPECT_EQ(s.filter(Filter::kind(kParam) & Filter::path_contains("mlp")).size(), 3u);
  EXPECT_EQ(s.filter(Filter::kind("batch_stat") | Filter::kind("opt_state")).size(), 2u);
  EXPECT_EQ(s.filter(!Filter::kind(kParam)).size(), 2u);
  EXPECT_EQ(s.filter(Filter::all()).size(), s.size());
  EXPECT_TRUE(s.filter(Filter::none()).empty());
  EXPECT_EQ(s.filter(Filter::all_of({})).size(), s.size());  // vacuous truth, as Python's all([])
  EXPECT_TRUE(s.filter(Filter::any_of({})).empty());
  EXPECT_EQ((Filter::kind(kParam) & !Filter::path_regex("bias$")).description(),
            "(kind(param) & !path ~ /bias$/)");
  EXPECT_THAT([] { Filter::path_regex("(unclosed"); }, ThrowsMessage<ValueError>(HasSubstr("(unclosed")));
}

TEST(State, SplitAndMergeRoundTrip) {
  State s = sample_state();
  auto [params, stats, rest] = s.split(Filter::kind(kParam), Filter::kind("batch_stat"), Filter::all());
  EXPECT_EQ(params.size(), 4u);
  EXPECT_EQ(stats.size(), 1u);
  EXPECT_EQ(rest.size(), 1u);
  State merged = State::merge({rest, params, stats});
  EXPECT_EQ(merged.paths(), s.paths());
  for (const auto& [p, v] : s) EXPECT_EQ(merged.at(p).kind(), v.kind()) << p;

  // First matching filter wins, so overlapping filters still partition.
  auto parts = s.split({Filter::path_contains("mlp"), Filter::kind(kParam), Filter::all()});
  EXPECT_EQ(parts[0].size(), 4u);
  EXPECT_EQ(parts[1].size(), 1u);
  EXPECT_EQ(parts[2].size(), 1u);

  EXPECT_THAT([&] { s.split({Filter::kind(kParam)}); },
              ThrowsMessage<ValueError>(HasSubstr("matches none of the filters")));
  const auto merge_twice = [&params = params] { State::merge({params, params}); };
  EXPECT_THAT(merge_twice, ThrowsMessage<ValueError>(HasSubstr("more than one state")));
}

TEST(State, RandomSplitsMergeBack) {
  std::mt19937 rng(3);
  State s;
  for (int i = 0; i < 60; ++i)
    s.insert("m" + std::to_string(i % 7) + "/p" + std::to_string(i), abstract(i % 3 ? kParam : "opt_state"));
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<Filter> filters;
    int n = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int k = 0; k < n; ++k)
      filters.push_back(Filter::path_contains("m" + std::to_string(std::uniform_int_distribution<int>(0, 6)(rng))));
    filters.push_back(Filter::all());
    std::vector<State> parts = s.split(filters);
    size_t total = 0;
    for (const State& p : parts) total += p.size();
    EXPECT_EQ(total, s.size());
    EXPECT_EQ(State::merge(parts).paths(), s.paths());
  }
}

TEST(Variable, AbstractAndConcreteShareFieldsAndCheckRanks) {
  Variable v = Variable::abstract(kParam, {8, 4}, DType::kBF16, NamedSharding(Mesh::parse("x=2"), {{"x"}}),
                                  Partitioning::by_logical({"embed", "mlp"}));
  EXPECT_TRUE(v.is_abstract());
  EXPECT_EQ(v.nbytes(), 64);
  EXPECT_EQ(v.to_string(), "param bf16[8,4] PartitionSpec('x') (abstract)");
  EXPECT_THAT([&] { (void)v.array("w"); }, ThrowsMessage<ValueError>(HasSubstr("w: is abstract")));
  EXPECT_THROW(Variable::abstract(kParam, {8}, DType::kF32, std::nullopt, Partitioning::by_logical({"a", "b"})),
               ValueError);
  EXPECT_THROW(Variable::abstract("", {8}, DType::kF32), ValueError);
  EXPECT_THROW(Variable::abstract(kParam, {8}, DType::kF32, NamedSharding(Mesh::parse("x=2"), {{"x"}, {}})),
               ValueError);
}

}  // namespace
}  // namespace tessel
