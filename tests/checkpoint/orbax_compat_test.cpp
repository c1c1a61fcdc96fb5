// Orbax's own compatibility checkpoints (../shared/testdata/orbax/compat_checkpoints): OCDBT with
// zarr v2 (v0 API) and zarr3 (v1 API), direct and composite, with metadata removed or altered.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "test_util.h"
#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/metadata.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;

const fs::path& root() {
  static const fs::path r = testing::testdata("orbax/compat_checkpoints");
  return r;
}

// The PyTree item of a checkpoint directory: itself (direct) or its `state` item (composite).
fs::path item_of(const fs::path& ckpt) { return fs::is_directory(ckpt / "state") ? ckpt / "state" : ckpt; }

// Every checkpoint: the directories two levels below `<v>_checkpoints/<kind>/`.
std::vector<fs::path> checkpoints(const std::string& group) {
  std::vector<fs::path> out;
  for (const char* api : {"v0_checkpoints", "v1_checkpoints"}) {
    for (const char* kind : {"direct_checkpoint", "composite_checkpoint"}) {
      const fs::path dir = root() / api / kind / group;
      if (!fs::exists(dir)) continue;
      for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

State target(const Mesh& mesh) {
  State t;
  t.insert("a", Variable::abstract(kParam, {8}, DType::kI32, NamedSharding(mesh, {{"x"}})));
  t.insert("b/c", Variable::abstract(kParam, {3}, DType::kI32, NamedSharding(mesh, {})));
  return t;
}

void expect_values(const State& got) {
  EXPECT_EQ(to_host(got.at("a").array()), HostArray::from<int32_t>({8}, {0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(to_host(got.at("b/c").array()), HostArray::from<int32_t>({3}, {1, 2, 3}));
}

TEST(OrbaxCompat, ReadableCheckpointsRestoreOntoAnyMesh) {
  Runtime rt = Runtime::host(4);
  std::vector<fs::path> all = checkpoints("checkpoint_metadata_present");
  for (const auto& group : {"checkpoint_metadata_missing", "non_critical_metadata_alterations"}) {
    for (auto& p : checkpoints(group)) all.push_back(p);
  }
  ASSERT_EQ(all.size(), 2u * 3 + 2u * 3 + 8u * 3);
  for (const auto& ckpt : all) {
    SCOPED_TRACE(ckpt.string());
    const fs::path item = item_of(ckpt);
    const ItemMetadata meta = read_item_metadata(item);
    EXPECT_TRUE(meta.use_ocdbt);
    EXPECT_EQ(meta.use_zarr3, ckpt.string().find("v1_checkpoints") != std::string::npos);
    for (const char* mesh : {"x=1", "x=2", "x=4"}) expect_values(restore(rt, item, target(Mesh::parse(mesh))));
    expect_values(restore(rt, item, {.fallback = Placement::kReplicated}));
    const VerifyReport report = verify(item);
    EXPECT_TRUE(report.faults.empty()) << report.faults.front();
    EXPECT_EQ(report.chunks, 2);
    const auto info = describe_item(item);
    ASSERT_EQ(info.size(), 2u);
    EXPECT_EQ(info[0].shape, Shape({8}));
    EXPECT_GT(info[0].stored_bytes, 0);
  }
}

TEST(OrbaxCompat, CriticalAlterationsAreClearErrors) {
  Runtime rt = Runtime::host(2);
  const auto all = checkpoints("critical_metadata_alterations");
  ASSERT_EQ(all.size(), 6u);
  for (const auto& ckpt : all) {
    SCOPED_TRACE(ckpt.string());
    const fs::path item = item_of(ckpt);
    const bool no_manifest = ckpt.filename() == "missing_pytree_data_file_manifest.ocdbt";
    try {
      restore(rt, item, target(Mesh::parse("x=2")));
      ADD_FAILURE() << "restored";
    } catch (const Error& e) {
      // The manifest names what is missing; without d/, the root node's file is named.
      EXPECT_THAT(e.what(), HasSubstr(no_manifest ? "no manifest.ocdbt" : "/d/"));
    }
    EXPECT_THROW(verify(item), Error);
  }
  // An added checkpointable with a _METADATA that is not JSON: its own read fails by name, the
  // state item is untouched.
  const fs::path dummy = root() / "v1_checkpoints/composite_checkpoint/critical_general_alterations/dummy_checkpointable_added";
  EXPECT_THAT([&] { read_item_metadata(dummy / "dummy"); }, ::testing::ThrowsMessage<ParseError>(HasSubstr("dummy/_METADATA")));
  expect_values(restore(rt, dummy / "state", target(Mesh::parse("x=2"))));
  // A deleted checkpointable is absent, and says so.
  const fs::path deleted = root() / "v1_checkpoints/composite_checkpoint/non_critical_general_alterations/deleted_checkpointable";
  EXPECT_THAT([&] { restore(rt, deleted / "state", target(Mesh::parse("x=2"))); },
              ::testing::ThrowsMessage<IoError>(HasSubstr("has no _METADATA")));
}

}  // namespace
}  // namespace tessel
