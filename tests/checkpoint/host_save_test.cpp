// Saves of host leaves (what the Python package hands over), sequence keys in Orbax's metadata,
// and restore targets built from what an item recorded.
#include <condition_variable>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../runtime/runtime_test_util.h"
#include "test_util.h"
#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/target.h"
#include "tessel/core/box_copy.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {
// The ladder on `mesh` for the item in `dir`.
State restore_target(const std::filesystem::path& dir, const Mesh& mesh, TargetSpec spec = {}) {
  spec.mesh = mesh;
  return make_target(CheckpointItem::open(dir), spec);
}

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using testing::TempDir;

// The leaf's distinct blocks cut from `host`, as a caller holding the whole array would.
struct Blocks {
  std::vector<std::vector<std::byte>> owned;
  HostLeaf leaf;
};
Blocks cut(const std::string& path, const HostArray& host, const NamedSharding& sharding) {
  Blocks b{{}, {path, host.shape(), host.dtype(), sharding, {}}};
  const size_t item = item_size(host.dtype());
  for (const ShardPlacement& p : sharding.distinct_shards(host.shape())) {
    std::vector<std::byte> bytes(static_cast<size_t>(p.box.volume()) * item);
    copy_region(host.bytes().data(), Box::full(host.shape()), bytes.data(), p.box, p.box, item);
    b.owned.push_back(std::move(bytes));
  }
  size_t i = 0;
  for (const ShardPlacement& p : sharding.distinct_shards(host.shape())) b.leaf.blocks.emplace_back(p.box, b.owned[i++]);
  return b;
}

TEST(HostSave, RandomLeavesRestoreBitIdenticalOnAnyMesh) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(20261123);
  for (int iter = 0; iter < 20; ++iter) {
    TempDir tmp;
    std::vector<Blocks> blocks;
    std::map<std::string, HostArray> values;
    const Mesh mesh = testing::random_mesh(rng);
    for (int i = 0; i < 3; ++i) {
      const Shape shape = testing::random_shape(rng);
      HostArray h = testing::random_host(rng, shape, all_dtypes()[rng() % all_dtypes().size()]);
      const std::string path = "layers/" + std::to_string(i) + "/w";
      blocks.push_back(cut(path, h, NamedSharding(mesh, testing::random_spec(rng, mesh, shape.rank()))));
      values.emplace(path, std::move(h));
    }
    std::vector<HostLeaf> leaves;
    for (const auto& b : blocks) leaves.push_back(b.leaf);
    SaveOptions options;
    options.use_ocdbt = iter % 2 == 0;
    options.use_zarr3 = iter % 3 == 0;
    options.sequence_nodes = {"layers"};
    save(tmp.path() / "item", stage_host(std::move(leaves)), options);
    // The saved specs name the saved mesh's axes: the new mesh has them, with other sizes.
    std::vector<MeshAxis> axes;
    for (const MeshAxis& a : mesh.axes()) axes.push_back({a.name, int64_t{1} << (rng() % 2)});
    const Mesh other(axes);
    const State got = restore(rt, tmp.path() / "item", restore_target(tmp.path() / "item", other));
    for (const auto& [path, h] : values) {
      EXPECT_EQ(to_host(got.at(path).array()), h) << path;
      EXPECT_EQ(got.at(path).array().mesh(), other) << path;
    }
    // Orbax's key types: the children of `layers` are sequence indices, the rest dict keys.
    const ItemMetadata meta = read_item_metadata(tmp.path() / "item");
    for (const auto& p : meta.params) EXPECT_EQ(p.key_types, (std::vector<int>{kDictKey, kSequenceKey, kDictKey})) << p.path;
  }
}

TEST(HostSave, BlocksMustBeExactlyTheShardingsBlocks) {
  const NamedSharding rows(Mesh::parse("x=4"), {{"x"}});
  const HostArray h = testing::iota({8, 2});
  auto expect_refused = [](std::vector<HostLeaf> leaves, const std::string& message) {
    SCOPED_TRACE(message);
    EXPECT_THAT([&] { stage_host(leaves); }, ThrowsMessage<ValueError>(HasSubstr(message)));
  };
  Blocks b = cut("w", h, rows);
  HostLeaf missing = b.leaf;
  missing.blocks.pop_back();
  expect_refused({missing}, "block [6:8, 0:2] is missing");
  HostLeaf twice = b.leaf;
  twice.blocks.push_back(twice.blocks.front());
  expect_refused({twice}, "is given twice");
  HostLeaf wrong_box = b.leaf;
  wrong_box.blocks[1].first = Box({1, 0}, {3, 2});
  expect_refused({wrong_box}, "is not one of the blocks");
  HostLeaf short_bytes = b.leaf;
  short_bytes.blocks[0].second = short_bytes.blocks[0].second.first(4);
  expect_refused({short_bytes}, "has 4 bytes, not the 16 of int32");
  expect_refused({b.leaf, b.leaf}, "the leaf 'w' is given twice");
  HostLeaf bad_spec = b.leaf;
  bad_spec.sharding = NamedSharding(Mesh::parse("x=4"), {{"x"}, {}, {}});
  expect_refused({bad_spec}, "'w'");
  // A 0-sized array has nothing to write: its empty blocks may be left out.
  const HostArray empty({0, 3}, DType::kF32);
  HostLeaf none{"e", empty.shape(), empty.dtype(), rows, {}};
  EXPECT_NO_THROW(stage_host({none}));
}

// The processes of a job as threads of this test: all_gather meets at a shared table, a round
// at a time (what JAX's key-value store does for the Python package).
class ThreadMeeting {
 public:
  explicit ThreadMeeting(int count) : count_(count) {}
  std::vector<std::string> all_gather(int round, int index, const std::string& mine) {
    std::unique_lock lock(mu_);
    std::vector<std::string>& parts = rounds_[round];
    parts.resize(static_cast<size_t>(count_));
    parts[static_cast<size_t>(index)] = mine;
    if (++arrived_[round] == count_) cv_.notify_all();
    cv_.wait(lock, [&] { return arrived_[round] == count_; });
    return parts;
  }

 private:
  const int count_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, std::vector<std::string>> rounds_;
  std::map<int, int> arrived_;
};

class ThreadGroup final : public ProcessGroup {
 public:
  ThreadGroup(ThreadMeeting& meeting, int index, int count) : meeting_(meeting), index_(index), count_(count) {}
  int index() const override { return index_; }
  int count() const override { return count_; }
  std::vector<std::string> all_gather(const std::string& mine, std::string_view) override {
    return meeting_.all_gather(round_++, index_, mine);
  }

 private:
  ThreadMeeting& meeting_;
  int index_, count_, round_ = 0;
};

// This process's part of a leaf: the distinct blocks whose replica 0 is on one of its devices.
HostLeaf part_of(const Blocks& whole, const std::set<int64_t>& local) {
  HostLeaf leaf = whole.leaf;
  leaf.blocks.clear();
  const std::vector<ShardPlacement> distinct = whole.leaf.sharding.distinct_shards(whole.leaf.shape);
  for (size_t i = 0; i < distinct.size(); ++i) {
    for (int64_t d : distinct[i].devices) {
      if (whole.leaf.sharding.replica_id(d, whole.leaf.shape) != 0) continue;
      if (local.contains(d)) leaf.blocks.push_back(whole.leaf.blocks[i]);
      break;
    }
  }
  return leaf;
}

TEST(HostSave, EachProcessOfAJobWritesTheBlocksWhoseReplicaZeroItHolds) {
  // 2 processes owning the mesh's devices in no particular order (JAX's ids: sparse).
  const Mesh mesh({{"x", 2}, {"y", 4}}, {2049, 0, 3, 2048, 1, 2050, 2051, 2});
  const std::vector<std::set<int64_t>> local = {{0, 1, 2, 3}, {2048, 2049, 2050, 2051}};
  std::mt19937 rng(20261201);
  std::vector<Blocks> leaves;
  std::map<std::string, HostArray> values;
  const std::vector<PartitionSpec> specs = {{{"x"}, {"y"}}, {{"y"}}, {{}, {"x"}}, {}};
  for (size_t i = 0; i < specs.size(); ++i) {
    const Shape shape = specs[i].size() == 1 ? Shape{8} : Shape{4, 8};
    HostArray h = testing::random_host(rng, shape, DType::kF32);
    const std::string path = "p" + std::to_string(i);
    leaves.push_back(cut(path, h, NamedSharding(mesh, specs[i])));
    values.emplace(path, std::move(h));
  }
  TempDir tmp;
  const fs::path dir = tmp.path() / "7";
  ThreadMeeting meeting(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> processes;
  for (int p = 0; p < 2; ++p) {
    processes.emplace_back([&, p] {
      try {
        ThreadGroup group(meeting, p, 2);
        std::vector<HostLeaf> mine;
        for (const Blocks& b : leaves) mine.push_back(part_of(b, local[static_cast<size_t>(p)]));
        save(dir, stage_host(mine, {&group, local[static_cast<size_t>(p)]}));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(p)] = e.what();
      }
    });
  }
  for (auto& t : processes) t.join();
  EXPECT_EQ(errors, std::vector<std::string>(2));
  // Orbax's multi-process layout: each process's blocks in its own database.
  EXPECT_TRUE(fs::is_directory(dir / "ocdbt.process_0"));
  EXPECT_TRUE(fs::is_directory(dir / "ocdbt.process_1"));
  const Runtime rt = Runtime::host(8);
  TargetSpec spec;
  spec.mesh = Mesh::parse("x=8");
  spec.placement = Placement::kReplicated;
  const State restored = restore(rt, CheckpointItem::open(dir), spec);
  for (const auto& [path, h] : values) EXPECT_TRUE(to_host(restored.at(path).array(path)) == h) << path;

  // A process may give only its own blocks, and must give all of them.
  ThreadMeeting unused(2);
  ThreadGroup group(unused, 0, 2);
  std::vector<HostLeaf> all_blocks = {leaves[0].leaf};
  EXPECT_THAT([&] { stage_host(all_blocks, {&group, local[0]}); },
              ThrowsMessage<ValueError>(HasSubstr("is not this process's to write")));
  HostLeaf short_of_one = part_of(leaves[0], local[0]);
  short_of_one.blocks.pop_back();
  EXPECT_THAT([&] { stage_host({short_of_one}, {&group, local[0]}); },
              ThrowsMessage<ValueError>(HasSubstr("is missing")));
}

TEST(RestoreTarget, LogicalAxesResolveThroughTheSavedRules) {
  Runtime rt = Runtime::host(8);
  TempDir tmp;
  const Mesh saved_mesh = Mesh::parse("fsdp=4");
  State s;
  s.insert("w", Variable(kParam, device_put(rt, testing::iota({8, 4}), NamedSharding(saved_mesh, {{"fsdp"}})),
                         Partitioning::by_logical({"embed", "mlp"})));
  s.insert("b", Variable(kParam, device_put(rt, testing::iota({4}), NamedSharding(saved_mesh, {{"fsdp"}}))));
  SaveOptions options;
  options.rules = LogicalRules({{"embed", {"fsdp"}}, {"mlp", {"tensor"}}});
  save(tmp.path() / "item", s, options);

  const Mesh mesh = Mesh::parse("fsdp=2,tensor=4");
  const State target = restore_target(tmp.path() / "item", mesh);
  EXPECT_EQ(target.at("w").sharding()->spec(), (PartitionSpec{{"fsdp"}, {"tensor"}}));  // the saved rules
  EXPECT_EQ(target.at("b").sharding()->spec(), (PartitionSpec{{"fsdp"}}));               // the saved spec
  TargetSpec other;
  other.rules = LogicalRules({{"mlp", {"fsdp"}}});
  other.paths = {"w"};
  const State only_w = restore_target(tmp.path() / "item", mesh, other);
  EXPECT_EQ(only_w.size(), 1u);
  EXPECT_EQ(only_w.at("w").sharding()->spec(), (PartitionSpec{{}, {"fsdp"}}));
  other.paths = {"nope"};
  EXPECT_THAT([&] { restore_target(tmp.path() / "item", mesh, other); },
              ThrowsMessage<ValueError>(HasSubstr("'nope' is not in")));
  other.paths = {"b"};
  EXPECT_THAT([&] { restore_target(tmp.path() / "item", Mesh::parse("data=2"), other); },
              ThrowsMessage<ValueError>(HasSubstr("b i32[4] (saved PartitionSpec('fsdp') on Mesh(fsdp=4); Mesh(data=2) lacks fsdp)")));
  EXPECT_THROW(restore_target(tmp.path() / "item", Mesh::parse("data=2")), ShardingError);  // w's rules name fsdp
}

}  // namespace
}  // namespace tessel
