// Mixture-of-experts ops on random meshes (f64): top-k against a host sort, dispatch -> experts ->
// combine against a host loop over every token's choices (dropless and with a capacity), expert
// parallelism by all_to_all, and every gradient against finite differences.
#include <algorithm>
#include <numeric>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ops/ops_test_util.h"
#include "tessel/core/error.h"
#include "tessel/ops/moe.h"

namespace tessel {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using testing::check_gradient;
using testing::expect_near;
using testing::Host;
using testing::put;
using testing::put_ids;
using testing::random_host;
using testing::values;

std::vector<int32_t> ints(const Tensor& t) {
  const HostArray h = to_host(t.array());
  auto v = h.values<int32_t>();
  return {v.begin(), v.end()};
}

TEST(Moe, TopKMatchesAHostSortWithTiesToTheLowerIndex) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(5);
  for (int iter = 0; iter < 6; ++iter) {
    const Mesh mesh = testing::random_mesh(rng);
    Host x = random_host(rng, {3, 4, 7});
    for (size_t i = 0; i < x.v.size(); i += 5) x.v[i] = 0.25;  // ties
    const int64_t k = 1 + iter % 4;
    SCOPED_TRACE(mesh.to_string() + " k=" + std::to_string(k));
    const ops::TopK top = ops::top_k(put(rt, x, NamedSharding(mesh, testing::random_spec(rng, mesh, 3))), k);
    std::vector<double> want_v;
    std::vector<int32_t> want_i;
    for (int64_t row = 0; row < 12; ++row) {
      std::vector<int32_t> order(7);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x.v[row * 7 + a] > x.v[row * 7 + b]; });
      for (int64_t j = 0; j < k; ++j) {
        want_i.push_back(order[j]);
        want_v.push_back(x.v[row * 7 + order[j]]);
      }
    }
    EXPECT_EQ(ints(top.indices), want_i);
    expect_near(values(top.values), want_v);
    check_gradient(rt, rng, mesh, {x}, [&](const std::vector<Tensor>& in) {
      return ops::take_along_last(in[0], top.indices);
    });
  }
  const Tensor small = put(Runtime::host(1), random_host(rng, {2, 3}), NamedSharding(Mesh({{"x", 1}}), {}));
  EXPECT_THAT([&] { ops::top_k(small, 4); }, ThrowsMessage<ValueError>(HasSubstr("k = 4 is not in [1, 3]")));
}

struct Problem {
  int64_t b = 4, s = 5, k = 2, experts = 4, emb = 3, out = 2;
  Host x, w, kernel;
  std::vector<int32_t> idx;
};

Problem random_problem(std::mt19937& rng) {
  Problem p;
  p.x = random_host(rng, {p.b, p.s, p.emb});
  p.w = random_host(rng, {p.b, p.s, p.k});
  p.kernel = random_host(rng, {p.experts, p.emb, p.out});
  for (int64_t t = 0; t < p.b * p.s; ++t) {
    // k distinct experts per token, skewed towards expert 0 so capacities bite.
    std::vector<int32_t> all(static_cast<size_t>(p.experts));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin() + 1, all.end(), rng);
    if (rng() % 3 == 0) std::shuffle(all.begin(), all.end(), rng);
    for (int64_t j = 0; j < p.k; ++j) p.idx.push_back(all[static_cast<size_t>(j)]);
  }
  return p;
}

// y[b, s] = sum over kept choices of w * x[b, s] @ kernel[expert]; a choice is kept while its
// expert has had fewer than `capacity` earlier choices in the row (token, then choice order).
std::vector<double> host_moe(const Problem& p, int64_t capacity) {
  std::vector<double> y(static_cast<size_t>(p.b * p.s * p.out));
  for (int64_t b = 0; b < p.b; ++b) {
    std::vector<int64_t> count(static_cast<size_t>(p.experts));
    for (int64_t s = 0; s < p.s; ++s)
      for (int64_t j = 0; j < p.k; ++j) {
        const int64_t at = (b * p.s + s) * p.k + j, e = p.idx[static_cast<size_t>(at)];
        if (capacity > 0 && count[static_cast<size_t>(e)]++ >= capacity) continue;
        for (int64_t o = 0; o < p.out; ++o) {
          double dot = 0;
          for (int64_t i = 0; i < p.emb; ++i)
            dot += p.x.v[static_cast<size_t>((b * p.s + s) * p.emb + i)] *
                   p.kernel.v[static_cast<size_t>((e * p.emb + i) * p.out + o)];
          y[static_cast<size_t>((b * p.s + s) * p.out + o)] += p.w.v[static_cast<size_t>(at)] * dot;
        }
      }
  }
  return y;
}

Tensor moe(const Tensor& x, const Tensor& w, const Tensor& kernel, const ops::Routing& r) {
  const int64_t b = x.shape()[0], e = x.shape()[2], n = r.num_experts, cap = r.capacity;
  const Tensor buf = ops::to_experts(ops::moe_dispatch(x, r), kernel);
  const Tensor rows = ops::matmul(ops::reshape(buf, Shape{n, b * cap, e}), kernel);
  const Tensor out = ops::reshape(rows, Shape{n, b, cap, kernel.shape()[2]});
  return ops::moe_combine(ops::from_experts(out, r), w, r);
}

TEST(Moe, DispatchExpertsCombineMatchTheHostOnAnyMesh) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(11);
  for (int iter = 0; iter < 8; ++iter) {
    const Problem p = random_problem(rng);
    const Mesh mesh = testing::random_mesh(rng);
    auto spec = [&](size_t rank) { return NamedSharding(mesh, testing::random_spec(rng, mesh, rank)); };
    const Tensor ids = put_ids(rt, {p.b, p.s, p.k}, p.idx, spec(3));
    for (int64_t capacity : {0, 1, 2}) {
      SCOPED_TRACE(mesh.to_string() + " capacity " + std::to_string(capacity));
      const ops::Routing r = ops::route(ids, p.experts, capacity);
      if (capacity == 0) {
        // Dropless: the fullest expert buffer of any row.
        int64_t fullest = 0;
        for (int64_t b = 0; b < p.b; ++b)
          for (int64_t e = 0; e < p.experts; ++e)
            fullest = std::max<int64_t>(fullest, std::count(p.idx.begin() + b * p.s * p.k,
                                                            p.idx.begin() + (b + 1) * p.s * p.k, e));
        EXPECT_EQ(r.capacity, fullest);
      }
      const Tensor y = moe(put(rt, p.x, spec(3)), put(rt, p.w, spec(3)), put(rt, p.kernel, spec(3)), r);
      expect_near(values(y), host_moe(p, capacity));
      check_gradient(rt, rng, mesh, {p.x, p.w, p.kernel},
                     [&](const std::vector<Tensor>& in) { return moe(in[0], in[1], in[2], r); });
    }
  }
}

TEST(Moe, ExpertParallelismExchangesTokensByAllToAll) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(3);
  for (const char* m : {"data=2,expert=4", "expert=8", "data=2,expert=2,tensor=2"}) {
    SCOPED_TRACE(m);
    const Mesh mesh = Mesh::parse(m);
    Problem p;
    p.b = 8;
    p.experts = 8;
    p.x = random_host(rng, {p.b, p.s, p.emb});
    p.w = random_host(rng, {p.b, p.s, p.k});
    p.kernel = random_host(rng, {p.experts, p.emb, p.out});
    for (int64_t t = 0; t < p.b * p.s * p.k; ++t) p.idx.push_back(static_cast<int32_t>(rng() % p.experts));
    DimSharding batch = mesh.has_axis("data") ? DimSharding{"data", "expert"} : DimSharding{"expert"};
    const NamedSharding tokens(mesh, {batch});
    const NamedSharding experts(mesh, {{"expert"}});
    const ops::Routing r = ops::route(put_ids(rt, {p.b, p.s, p.k}, p.idx, tokens), p.experts, 0);
    const Tensor kernel = put(rt, p.kernel, experts);
    const Tensor buf = ops::to_experts(ops::moe_dispatch(put(rt, p.x, tokens), r), kernel);
    // Each device now holds its expert's buffers of its data group's rows.
    DimSharding rest = mesh.has_axis("data") ? DimSharding{"data"} : DimSharding{};
    const PartitionSpec& spec = buf.sharding().spec();
    EXPECT_EQ(spec[0], DimSharding{"expert"});
    EXPECT_EQ(spec.size() > 1 ? spec[1] : DimSharding{}, rest);
    const Tensor y = moe(put(rt, p.x, tokens), put(rt, p.w, tokens), kernel, r);
    EXPECT_EQ(y.sharding().spec()[0], batch);
    expect_near(values(y), host_moe(p, 0));
    check_gradient(rt, rng, mesh, {p.x, p.w, p.kernel}, [&](const std::vector<Tensor>& in) {
      return moe(ops::reshard(in[0], tokens), ops::reshard(in[1], tokens), ops::reshard(in[2], experts), r);
    });
  }
}

TEST(Moe, BadRoutingIsRefusedByName) {
  Runtime rt = Runtime::host(1);
  const Mesh mesh({{"x", 1}});
  const Tensor ids = put_ids(rt, {1, 2, 1}, {0, 5}, NamedSharding(mesh, {}));
  EXPECT_THAT([&] { ops::route(ids, 4, 0); }, ThrowsMessage<ValueError>(HasSubstr("index 5 is out of range [0, 4)")));
  const ops::Routing r = ops::route(put_ids(rt, {1, 2, 1}, {0, 1}, NamedSharding(mesh, {})), 4, 0);
  std::mt19937 rng(1);
  const Tensor x = put(rt, random_host(rng, {1, 3, 2}), NamedSharding(mesh, {}));
  EXPECT_THAT([&] { ops::moe_dispatch(x, r); }, ThrowsMessage<ValueError>(HasSubstr("the routing is for [batch, seq] = [1, 2]")));
}

}  // namespace
}  // namespace tessel
