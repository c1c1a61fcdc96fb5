// CheckpointManager: steps, retention, JSON items, the lock, leftovers, async saves.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../runtime/runtime_test_util.h"
#include "test_util.h"
#include "tessel/checkpoint/manager.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::TempDir;

State small_state(const Runtime& rt, int32_t offset) {
  const Mesh mesh = Mesh::parse("x=4");
  HostArray h = testing::iota({8, 4});
  for (int32_t& v : h.mutable_values<int32_t>()) v += offset;
  State s;
  s.insert("w", Variable(kParam, device_put(rt, h, NamedSharding(mesh, {{"x"}}))));
  return s;
}

State target_of(const State& s) {
  State t;
  for (const auto& [path, v] : s) t.insert(path, v.to_abstract());
  return t;
}

TEST(CheckpointManager, KeepsTheNewestStepsAndThePeriodicOnes) {
  Runtime rt = Runtime::host(4);
  TempDir tmp;
  CheckpointManager m(tmp.path() / "ckpt", {.max_to_keep = 2, .keep_period = 4});
  for (int64_t step = 1; step <= 9; ++step) m.save(step, small_state(rt, static_cast<int32_t>(step)));
  EXPECT_EQ(m.all_steps(), (std::vector<int64_t>{4, 8, 9}));
  EXPECT_EQ(m.latest_step(), 9);
  State got = m.restore(rt, 4, target_of(small_state(rt, 0)));
  EXPECT_EQ(to_host(got.at("w").array()), to_host(small_state(rt, 4).at("w").array()));
  EXPECT_TRUE(fs::exists(tmp.path() / "ckpt" / "9" / "_CHECKPOINT_METADATA"));
  EXPECT_TRUE(fs::exists(tmp.path() / "ckpt" / "9" / "default" / "_METADATA"));
  EXPECT_TRUE(fs::exists(tmp.path() / "ckpt" / "9" / "default" / "commit_success.txt"));
  EXPECT_TRUE(fs::exists(tmp.path() / "ckpt" / "9" / "commit_success.txt"));
  EXPECT_THAT([&] { m.save(9, small_state(rt, 0)); }, ::testing::ThrowsMessage<ValueError>(HasSubstr("already exists")));
  EXPECT_THAT([&] { m.restore(rt, 5, target_of(small_state(rt, 0))); },
              ::testing::ThrowsMessage<ValueError>(HasSubstr("no step 5")));
}

TEST(CheckpointManager, TheStatesItemMayBeNamedAndEmptyNodesRecorded) {
  Runtime rt = Runtime::host(4);
  TempDir tmp;
  CheckpointManagerOptions options{.item_name = "items"};
  options.save.sequence_nodes = {"opt"};
  options.save.empty_nodes = {"opt/1"};
  CheckpointManager m(tmp.path(), options);
  State s = small_state(rt, 5);
  s.insert("opt/0/w", s.at("w"));
  m.save(2, s, {{"data", "{}"}});
  EXPECT_TRUE(fs::exists(tmp.path() / "2" / "items" / "_METADATA"));
  EXPECT_FALSE(fs::exists(tmp.path() / "2" / "default"));
  auto meta = nlohmann::json::parse(testing::read_file(tmp.path() / "2" / "_CHECKPOINT_METADATA"));
  EXPECT_THAT(meta["item_handlers"]["items"].get<std::string>(), HasSubstr("PyTreeCheckpointHandler"));
  auto tree = nlohmann::json::parse(testing::read_file(tmp.path() / "2" / "items" / "_METADATA"))["tree_metadata"];
  const auto& empty = tree["('opt', '1')"];
  EXPECT_EQ(empty["value_metadata"]["value_type"], "None");
  EXPECT_EQ(empty["value_metadata"]["skip_deserialize"], true);
  EXPECT_EQ(empty["key_metadata"][1]["key_type"], 1);  // a sequence index
  EXPECT_EQ(tree["('opt', '0', 'w')"]["key_metadata"][1]["key_type"], 1);
  // The empty node holds nothing to restore; the arrays come back as saved.
  State got = m.restore(rt, 2, target_of(s));
  EXPECT_EQ(to_host(got.at("opt/0/w").array()), to_host(s.at("w").array()));
  EXPECT_THROW(m.save(3, s, {{"items", "{}"}}), ValueError);  // the state's own item name
  EXPECT_THROW(CheckpointManager(tmp.path() / "other", {.item_name = "../up"}), ValueError);
}

TEST(CheckpointManager, JsonItemsTravelWithTheStep) {
  Runtime rt = Runtime::host(4);
  TempDir tmp;
  CheckpointManager m(tmp.path());
  m.save(3, small_state(rt, 0), {{"data", R"({"position": 4096, "epoch": 1})"}});
  EXPECT_EQ(nlohmann::json::parse(m.restore_json(3, "data"))["position"], 4096);
  auto meta = nlohmann::json::parse(testing::read_file(tmp.path() / "3" / "_CHECKPOINT_METADATA"));
  EXPECT_THAT(meta["item_handlers"]["data"].get<std::string>(), HasSubstr("JsonCheckpointHandler"));
  EXPECT_THAT(meta["item_handlers"]["default"].get<std::string>(), HasSubstr("PyTreeCheckpointHandler"));
  EXPECT_THROW(m.save(4, small_state(rt, 0), {{"default", "{}"}}), ValueError);
  EXPECT_THROW(m.save(4, small_state(rt, 0), {{"../x", "{}"}}), ValueError);
  EXPECT_THROW(m.save(4, small_state(rt, 0), {{"data", "{not json"}}), ParseError);
  EXPECT_THROW(m.restore_json(3, "missing"), ValueError);
  EXPECT_EQ(m.all_steps(), std::vector<int64_t>{3});
}

TEST(CheckpointManager, OneWriterAtATimeAndLeftoversAreCleaned) {
  Runtime rt = Runtime::host(4);
  TempDir tmp;
  {
    CheckpointManager m(tmp.path());
    m.save(1, small_state(rt, 1));
    EXPECT_THAT([&] { CheckpointManager second(tmp.path()); },
                ::testing::ThrowsMessage<IoError>(HasSubstr("another CheckpointManager")));
    CheckpointManager reader(tmp.path(), {.read_only = true});
    EXPECT_EQ(reader.all_steps(), std::vector<int64_t>{1});
    EXPECT_THROW(reader.save(2, small_state(rt, 2)), ValueError);
  }
  // What a crashed save leaves: a tmp step, never listed, removed by the next writer.
  fs::create_directories(tmp.path() / "2.orbax-checkpoint-tmp" / "default");
  EXPECT_EQ(list_steps(tmp.path()), std::vector<int64_t>{1});
  CheckpointManager m(tmp.path());
  EXPECT_FALSE(fs::exists(tmp.path() / "2.orbax-checkpoint-tmp"));
  m.save(2, small_state(rt, 2));
  EXPECT_EQ(m.all_steps(), (std::vector<int64_t>{1, 2}));
}

TEST(CheckpointManager, AsyncSaveStagesThenWritesAndErrorsSurface) {
  Runtime rt = Runtime::host(4);
  TempDir tmp;
  CheckpointManager m(tmp.path());
  {
    State s = small_state(rt, 5);
    m.save_async(5, s);
  }  // the arrays are gone; the staged copy is what gets written
  m.wait();
  EXPECT_EQ(m.all_steps(), std::vector<int64_t>{5});
  State got = m.restore(rt, 5, target_of(small_state(rt, 0)));
  EXPECT_EQ(to_host(got.at("w").array()), to_host(small_state(rt, 5).at("w").array()));

  CheckpointManager bad(tmp.path() / "bad", {.save = {.max_chunk_bytes = 0}});
  bad.save_async(1, small_state(rt, 1));  // fails in the background
  EXPECT_THAT([&] { bad.wait(); }, ::testing::ThrowsMessage<ValueError>(HasSubstr("max_chunk_bytes")));
  EXPECT_EQ(bad.all_steps(), std::vector<int64_t>{});
  bad.save_async(2, small_state(rt, 1));
  EXPECT_THROW(bad.save(3, small_state(rt, 1)), ValueError);  // the next call reports it
}

TEST(CheckpointManager, FindItemDirAcceptsRootsStepsAndItems) {
  Runtime rt = Runtime::host(4);
  TempDir tmp;
  CheckpointManager m(tmp.path());
  m.save(10, small_state(rt, 0));
  m.save(20, small_state(rt, 0));
  EXPECT_EQ(find_item_dir(tmp.path()), tmp.path() / "20" / "default");
  EXPECT_EQ(find_item_dir(tmp.path(), 10), tmp.path() / "10" / "default");
  EXPECT_EQ(find_item_dir(tmp.path() / "10"), tmp.path() / "10" / "default");
  EXPECT_EQ(find_item_dir(tmp.path() / "10" / "default"), tmp.path() / "10" / "default");
  EXPECT_THAT([&] { find_item_dir(tmp.path(), 15); }, ::testing::ThrowsMessage<ValueError>(HasSubstr("no step 15")));
  EXPECT_THAT([&] { find_item_dir(tmp.path() / "10" / "default" / "d"); },
              ::testing::ThrowsMessage<ValueError>(HasSubstr("holds no checkpoint")));
}

}  // namespace
}  // namespace tessel
