// Checkpoints across MPI ranks (run under mpirun with the runtime's MPI tests): every process writes
// its own blocks and process 0 commits; a restore reads only the blocks of the process's devices
// and gives, bit for bit, what one process restores.
#include <mpi.h>

#include <algorithm>
#include <fstream>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"
#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/manager.h"
#include "tessel/checkpoint/safetensors.h"
#include "mpi_test_util.h"
#include "tessel/core/error.h"
#include "tessel/runtime/collectives.h"
#include "tessel/runtime/mpi.h"
#include "tessel/runtime/process_group.h"

namespace tessel {
namespace {
namespace fs = std::filesystem;

constexpr int64_t kDevices = testing::kMpiDevices;
using testing::mpi;
using testing::reference;

// A directory every process sees: process 0's temporary directory.
class SharedDir {
 public:
  SharedDir() {
    if (mpi().processes().is_leader()) mine_.emplace();
    path_ = mpi().processes().all_gather(mine_ ? mine_->path().string() : "", "sharing a directory")[0];
  }
  ~SharedDir() { mpi().processes().all_gather("", "leaving a shared directory"); }  // no one still reads it
  fs::path path() const { return path_; }

 private:
  std::optional<testing::TempDir> mine_;
  fs::path path_;
};

// Values fixed by position, so every runtime builds the same arrays.
Array values(const Runtime& rt, const Shape& shape, const NamedSharding& s, uint32_t seed) {
  return make_array_from_callback(rt, shape, DType::kF32, s, [&](const Box& box, std::span<std::byte> out) {
    auto* f = reinterpret_cast<float*>(out.data());
    int64_t i = 0;
    std::vector<int64_t> at(box.starts().begin(), box.starts().end());
    for (int64_t n = 0; n < box.volume(); ++n) {
      std::mt19937 rng(seed + static_cast<uint32_t>(Box::full(shape).offset_of(at)));
      f[i++] = static_cast<float>(rng() % 10000) / 100.0f;
      for (size_t d = box.rank(); d-- > 0;) {
        if (++at[d] < box.stop(d)) break;
        at[d] = box.start(d);
      }
    }
  });
}

State train_state(const Runtime& rt) {
  const Mesh mesh = Mesh::parse("data=2,fsdp=2,tensor=2");
  State s;
  s.insert("params/w", Variable("param", values(rt, {64, 32}, NamedSharding(mesh, {{"fsdp"}, {"tensor"}}), 1)));
  s.insert("params/b", Variable("param", values(rt, {32}, NamedSharding(mesh, {}), 2)));
  s.insert("opt/mu/w", Variable("opt_state", values(rt, {64, 32}, NamedSharding(mesh, {{"data", "fsdp"}}), 3)));
  return s;
}

// The target: the same leaves on another mesh, every one sharded over all 8 devices.
State target_state() {
  const Mesh mesh = Mesh::parse("fsdp=4,tensor=2");
  State t;
  t.insert("params/w", Variable::abstract("param", {64, 32}, DType::kF32, NamedSharding(mesh, {{"fsdp"}, {"tensor"}})));
  t.insert("params/b", Variable::abstract("param", {32}, DType::kF32, NamedSharding(mesh, {{"fsdp", "tensor"}})));
  t.insert("opt/mu/w", Variable::abstract("opt_state", {64, 32}, DType::kF32, NamedSharding(mesh, {{"tensor"}, {"fsdp"}})));
  return t;
}

void expect_same_state(const State& got, const State& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [path, v] : want) {
    const Array& w = v.array(path);
    const Array& g = got.at(path).array(path);
    ASSERT_EQ(g.sharding(), w.sharding()) << path;
    for (const Shard& s : g.shards()) {
      if (!s.is_addressable()) continue;
      const auto a = s.buffer.bytes(), b = w.shard(s.device).buffer.bytes();
      EXPECT_TRUE(std::ranges::equal(a, b)) << path << " device " << s.device;
    }
  }
}

int64_t local_bytes(const State& state) {
  int64_t n = 0;
  for (const auto& [path, v] : state) {
    for (const Shard* s : v.array(path).addressable_shards()) n += s->buffer.size();
  }
  return n;
}

TEST(MpiCheckpoint, EachProcessWritesItsBlocksAndRestoresOnlyItsOwn) {
  SharedDir dir;
  for (bool ocdbt : {true, false}) {
    SCOPED_TRACE(ocdbt ? "ocdbt" : "files");
    const fs::path item = dir.path() / (ocdbt ? "ocdbt" : "files");
    save(item, train_state(mpi()), {.use_ocdbt = ocdbt});
    // Every process's database, under the root process 0 merged.
    if (ocdbt) {
      for (int p = 0; p < mpi().process_count(); ++p) EXPECT_TRUE(fs::is_directory(item / ("ocdbt.process_" + std::to_string(p))));
    }
    // What one process saves and restores is the reference.
    const fs::path one = dir.path() / (std::string("one-") + (ocdbt ? "ocdbt" : "files"));
    if (mpi().processes().is_leader()) save(one, train_state(reference()), {.use_ocdbt = ocdbt});
    mpi().processes().all_gather("", "the reference save");
    const State want = restore(reference(), one, target_state());
    RestoreStats stats;
    const State got = restore(mpi(), item, target_state(), {}, &stats);
    expect_same_state(got, want);
    expect_same_state(restore(reference(), item, target_state()), want);
    // Each process read its own devices' bytes, no more: the target has no replicas.
    EXPECT_EQ(stats.target_bytes, local_bytes(got));
    EXPECT_EQ(stats.bytes_read, stats.target_bytes);
    EXPECT_EQ(stats.target_bytes * mpi().process_count(), (64 * 32 * 2 + 32) * 4);
    EXPECT_TRUE(verify(CheckpointItem::open(item)).faults.empty());
  }
}

TEST(MpiCheckpoint, SafetensorsFromEveryProcessAreOneSetOfFiles) {
  SharedDir dir;
  for (int64_t limit : {int64_t{0}, int64_t{4096}}) {
    SCOPED_TRACE(limit);
    const fs::path out = dir.path() / ("st" + std::to_string(limit));
    save_safetensors(out, train_state(mpi()), {.max_file_bytes = limit});
    EXPECT_FALSE(fs::exists(fs::path(out) += ".tmp"));
    // The same files as one process writes, byte for byte.
    const fs::path one = dir.path() / ("one" + std::to_string(limit));
    if (mpi().processes().is_leader()) save_safetensors(one, train_state(reference()), {.max_file_bytes = limit});
    mpi().processes().all_gather("", "the reference save");
    for (const auto& e : fs::directory_iterator(one)) {
      std::ifstream a(e.path(), std::ios::binary), b(out / e.path().filename(), std::ios::binary);
      const std::string x((std::istreambuf_iterator<char>(a)), {}), y((std::istreambuf_iterator<char>(b)), {});
      EXPECT_TRUE(!x.empty() && x == y) << e.path().filename();
    }
    // Each process reads only its devices' byte ranges.
    RestoreStats stats;
    const State got = restore(mpi(), out, target_state(), {}, &stats);
    expect_same_state(got, restore(reference(), one, target_state()));
    EXPECT_EQ(stats.bytes_read, local_bytes(got));
  }
}

TEST(MpiCheckpoint, BackgroundSavesRunBesideCollectives) {
  SharedDir dir;
  const State state = train_state(mpi());
  {
    CheckpointManager ckpt(mpi(), dir.path() / "run", {.max_to_keep = 2});
    const Array x = values(mpi(), {64, 32}, NamedSharding(Mesh::parse("x=8"), {}), 9);
    const Array r = values(reference(), {64, 32}, NamedSharding(Mesh::parse("x=8"), {}), 9);
    for (int64_t step = 1; step <= 4; ++step) {
      ckpt.save_async(step, state, {{"data", "{\"step\": " + std::to_string(step) + "}"}});
      // The main thread's collectives share no messages with the save's meetings.
      const Array got = all_reduce(x, {"x"}, Reduction::kSum), want = all_reduce(r, {"x"}, Reduction::kSum);
      for (const Shard* s : got.addressable_shards()) {
        EXPECT_TRUE(std::ranges::equal(s->buffer.bytes(), want.shard(s->device).buffer.bytes()));
      }
    }
    ckpt.wait();
    EXPECT_EQ(ckpt.all_steps(), (std::vector<int64_t>{3, 4}));
    EXPECT_EQ(ckpt.restore_json(4, "data"), "{\"step\": 4}");
    expect_same_state(ckpt.restore(mpi(), 4, target_state()), restore(reference(), ckpt.item_dir(4), target_state()));
  }
  // Without the runtime, a manager cannot save a state that spans processes.
  if (mpi().process_count() > 1) {
    const fs::path root = dir.path() / ("alone" + std::to_string(mpi().process_index()));
    CheckpointManager alone(root);
    EXPECT_THAT([&] { alone.save(1, state); },
                ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("construct it with the state's runtime")));
  }
}

TEST(MpiCheckpoint, AFailureOnOneProcessFailsTheSaveOnAllAndLeavesNoStep) {
  SharedDir dir;
  State state = train_state(mpi());
  const int last = mpi().process_count() - 1;
  // The last process saves a leaf the others lack: process 0 cannot record its checksums.
  if (mpi().process_index() == last && last > 0) {
    const Mesh mesh = Mesh::parse("data=2,fsdp=2,tensor=2");
    state.insert("params/extra", Variable("param", values(mpi(), {8 * kDevices}, NamedSharding(mesh, {{"data", "fsdp", "tensor"}}), 5)));
  }
  if (last == 0) GTEST_SKIP() << "needs two processes";
  CheckpointManager ckpt(mpi(), dir.path() / "run");
  EXPECT_THROW(ckpt.save(1, state), Error);
  EXPECT_TRUE(ckpt.all_steps().empty());
  mpi().processes().all_gather("", "after the failed save");
  EXPECT_FALSE(fs::exists(dir.path() / "run" / "1"));
}

}  // namespace
}  // namespace tessel
