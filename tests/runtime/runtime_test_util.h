// Helpers for the runtime suites: random meshes and specs, per-device test values, and the
// memory-account invariant.
#pragma once

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tessel/runtime/array.h"
#include "tessel/runtime/device.h"

namespace tessel::testing {

// 1 to 3 axes, 1 to 8 devices in all.
inline Mesh random_mesh(std::mt19937& rng) {
  static const char* kNames[] = {"x", "y", "z"};
  for (;;) {
    size_t rank = std::uniform_int_distribution<size_t>(1, 3)(rng);
    std::vector<MeshAxis> axes;
    int64_t n = 1;
    for (size_t i = 0; i < rank; ++i) {
      int64_t size = std::uniform_int_distribution<int64_t>(1, 4)(rng);
      axes.push_back({kNames[i], size});
      n *= size;
    }
    if (n <= 8) return Mesh(axes);
  }
}

// The same device count, shuffled into another axis layout and device order.
inline Mesh random_mesh_over(std::mt19937& rng, const Mesh& like) {
  std::vector<int64_t> ids = like.device_ids();
  std::shuffle(ids.begin(), ids.end(), rng);
  int64_t n = like.device_count();
  std::vector<MeshAxis> axes;
  static const char* kNames[] = {"p", "q", "r"};
  for (int i = 0; i < 2 && n > 1; ++i) {
    std::vector<int64_t> divisors;
    for (int64_t d = 1; d <= n; ++d)
      if (n % d == 0) divisors.push_back(d);
    int64_t s = divisors[std::uniform_int_distribution<size_t>(0, divisors.size() - 1)(rng)];
    axes.push_back({kNames[i], s});
    n /= s;
  }
  axes.push_back({kNames[2], n});
  return Mesh(axes, ids);
}

// Each axis goes to a random dimension (or none), in random order: tuples and replication.
inline PartitionSpec random_spec(std::mt19937& rng, const Mesh& mesh, size_t rank) {
  std::vector<DimSharding> dims(rank);
  std::vector<std::string> names = mesh.axis_names();
  std::shuffle(names.begin(), names.end(), rng);
  for (const std::string& a : names) {
    size_t slot = std::uniform_int_distribution<size_t>(0, rank)(rng);  // rank = unused
    if (slot < rank) dims[slot].push_back(a);
  }
  return PartitionSpec(dims);
}

inline Shape random_shape(std::mt19937& rng) {
  size_t rank = std::uniform_int_distribution<size_t>(0, 4)(rng);
  std::vector<int64_t> dims(rank);
  for (auto& d : dims) d = std::uniform_int_distribution<int64_t>(0, 9)(rng);
  return Shape(dims);
}

// Random bytes (bool: 0 or 1).
inline HostArray random_host(std::mt19937& rng, const Shape& shape, DType dtype) {
  HostArray h(shape, dtype);
  for (auto& b : h.mutable_bytes()) b = static_cast<std::byte>(rng());
  if (dtype == DType::kBool) {
    for (auto& b : h.mutable_bytes()) b = static_cast<std::byte>(static_cast<unsigned>(b) & 1);
  }
  return h;
}

// Bytes in use on each device equal the sum of the distinct live buffers held by `live`.
inline void expect_accounts_match(const Runtime& rt, const std::vector<const Array*>& live) {
  std::map<int64_t, std::set<const std::byte*>> seen;
  std::map<int64_t, int64_t> bytes;
  for (const Array* a : live)
    for (const Shard& s : a->shards())
      if (s.is_addressable() && s.buffer.size() > 0 && seen[s.device].insert(s.buffer.data()).second)
        bytes[s.device] += s.buffer.size();
  for (int64_t d = 0; d < rt.device_count(); ++d)
    EXPECT_EQ(rt.device(d).memory_stats().in_use, bytes[d]) << "device " << d;
}

// Host data whose every element is distinct: i -> i + 1 (as the dtype holds it).
inline HostArray iota(const Shape& shape, DType dtype = DType::kI32) {
  HostArray h(shape, dtype);
  auto n = static_cast<size_t>(shape.num_elements());
  std::byte* p = h.mutable_bytes().data();
  for (size_t i = 0; i < n; ++i) {
    auto v = static_cast<int64_t>(i + 1);
    switch (dtype) {
      case DType::kF32: { float f = static_cast<float>(v); std::memcpy(p + 4 * i, &f, 4); break; }
      case DType::kF64: { double f = static_cast<double>(v); std::memcpy(p + 8 * i, &f, 8); break; }
      case DType::kI64: std::memcpy(p + 8 * i, &v, 8); break;
      case DType::kI32: { auto x = static_cast<int32_t>(v); std::memcpy(p + 4 * i, &x, 4); break; }
      default: for (size_t b = 0; b < item_size(dtype); ++b) p[i * item_size(dtype) + b] = std::byte(i * 7 + b);
    }
  }
  return h;
}

}  // namespace tessel::testing
