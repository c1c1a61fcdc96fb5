// Finding the PyTree item in what a user points at: items by any name, JSON items beside them,
// Orbax's item_handlers, and the errors that list what is there.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../runtime/runtime_test_util.h"
#include "test_util.h"
#include "tessel/checkpoint/items.h"
#include "tessel/checkpoint/manager.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {
namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using testing::TempDir;

State small_state(const Runtime& rt) {
  State s;
  s.insert("w", Variable(kParam, device_put(rt, testing::iota({8, 4}), NamedSharding(Mesh::parse("x=4"), {{"x"}}))));
  return s;
}

// A step directory as Orbax's CheckpointManager writes it with named items (MaxText's `items`).
fs::path composite_step(const Runtime& rt, const TempDir& tmp, const std::vector<std::string>& arrays) {
  const fs::path step = tmp.path() / "ckpt" / "7";
  fs::create_directories(step);
  std::string handlers;
  for (const auto& name : arrays) {
    save(step / name, small_state(rt));
    handlers += "\"" + name + "\": \"orbax.checkpoint._src.handlers.standard_checkpoint_handler.StandardCheckpointHandler\", ";
  }
  fs::create_directories(step / "meta");
  tmp.write("ckpt/7/meta/metadata", R"({"step": 7})");
  tmp.write("ckpt/7/_CHECKPOINT_METADATA",
            "{\"item_handlers\": {" + handlers +
                "\"meta\": \"orbax.checkpoint._src.handlers.json_checkpoint_handler.JsonCheckpointHandler\"}}");
  return step;
}

TEST(Items, AnyNameHoldingArraysIsAnItem) {
  Runtime rt = Runtime::host(4);
  TempDir tmp;
  const fs::path step = composite_step(rt, tmp, {"items"});
  const std::vector<ItemInfo> items = list_items(step);
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].name, "items");
  EXPECT_TRUE(items[0].holds_arrays);
  EXPECT_THAT(items[0].handler, HasSubstr("StandardCheckpointHandler"));
  EXPECT_EQ(items[1].name, "meta");
  EXPECT_FALSE(items[1].holds_arrays);
  // The only PyTree item is the default, from the step or from the root of steps.
  EXPECT_EQ(find_item_dir(step), step / "items");
  EXPECT_EQ(find_item_dir(tmp.path() / "ckpt"), step / "items");
  EXPECT_EQ(find_item_dir(tmp.path() / "ckpt", 7, "items"), step / "items");
  EXPECT_THAT([&] { find_item_dir(step, std::nullopt, "meta"); },
              ThrowsMessage<ValueError>(AllOf(HasSubstr("holds no arrays"), HasSubstr("JsonCheckpointHandler"))));
  EXPECT_THAT([&] { find_item_dir(step, std::nullopt, "params"); },
              ThrowsMessage<ValueError>(AllOf(HasSubstr("no item 'params'"), HasSubstr("'items', 'meta'"))));
  // The item itself with its own name is that item (MaxText users pass both); another name is not.
  EXPECT_EQ(find_item_dir(step / "items", std::nullopt, "items"), step / "items");
  EXPECT_THAT([&] { find_item_dir(step / "items", std::nullopt, "meta"); },
              ThrowsMessage<ValueError>(HasSubstr("--item is for a step directory")));
}

TEST(Items, SeveralPyTreeItemsNeedAName) {
  Runtime rt = Runtime::host(4);
  TempDir tmp;
  const fs::path step = composite_step(rt, tmp, {"items", "model_params"});
  EXPECT_THAT([&] { find_item_dir(step); },
              ThrowsMessage<ValueError>(AllOf(HasSubstr("several PyTree items ('items', 'model_params')"),
                                              HasSubstr("--item"))));
  EXPECT_EQ(find_item_dir(step, std::nullopt, "model_params"), step / "model_params");
}

TEST(Items, AnItemWithoutMetadataIsFoundByItsArrays) {
  Runtime rt = Runtime::host(4);
  TempDir tmp;
  SaveOptions files;
  files.use_ocdbt = false;
  fs::create_directories(tmp.path() / "7");
  save(tmp.path() / "7" / "params", small_state(rt), files);
  fs::remove(tmp.path() / "7" / "params" / "_METADATA");
  fs::remove(tmp.path() / "7" / "params" / "_sharding");
  EXPECT_TRUE(is_item_dir(tmp.path() / "7" / "params"));
  EXPECT_EQ(find_item_dir(tmp.path()), tmp.path() / "7" / "params");
}

TEST(Items, AStepSavedAsABareItemIsItsOwnItem) {
  Runtime rt = Runtime::host(4);
  TempDir tmp;
  save(tmp.path() / "7", small_state(rt));  // OCDBT: the item has subdirectories of its own
  EXPECT_EQ(find_item_dir(tmp.path()), tmp.path() / "7");
  EXPECT_EQ(find_item_dir(tmp.path(), 7), tmp.path() / "7");
  EXPECT_THAT([&] { find_item_dir(tmp.path(), std::nullopt, "default"); },
              ThrowsMessage<ValueError>(HasSubstr("is a single item")));
}

TEST(Items, AnItemNamedAsItsStepNamesItIsFoundWithItsName) {
  Runtime rt = Runtime::host(4);
  TempDir tmp;
  fs::create_directories(tmp.path() / "4");
  save(tmp.path() / "4" / "items", small_state(rt));
  for (const fs::path& given : {tmp.path() / "4" / "items", tmp.path() / "4" / "items/"})
    EXPECT_TRUE(fs::equivalent(find_item_dir(given, std::nullopt, "items").local(), tmp.path() / "4" / "items"));
  EXPECT_THAT([&] { find_item_dir(tmp.path() / "4" / "items", std::nullopt, "default"); },
              ThrowsMessage<ValueError>(HasSubstr("is a single checkpoint item")));
}

TEST(Items, MalformedCheckpointMetadataIsAParseError) {
  Runtime rt = Runtime::host(4);
  TempDir tmp;
  const fs::path step = composite_step(rt, tmp, {"items"});
  tmp.write("ckpt/7/_CHECKPOINT_METADATA", R"({"item_handlers": [1, 2]})");
  EXPECT_THAT([&] { list_items(step); }, ThrowsMessage<ParseError>(HasSubstr("item_handlers")));
  tmp.write("ckpt/7/_CHECKPOINT_METADATA", "{not json");
  EXPECT_THROW(list_items(step), ParseError);
}

TEST(Items, UnfinishedSavesAndSymlinksAreNotItems) {
  Runtime rt = Runtime::host(4);
  TempDir tmp;
  const fs::path step = composite_step(rt, tmp, {"items"});
  fs::create_directories(step / "other.orbax-checkpoint-tmp");
  tmp.write("ckpt/7/other.orbax-checkpoint-tmp/_METADATA", "{}");
  fs::create_directory_symlink(step / "items", step / "linked");
  const std::vector<ItemInfo> items = list_items(step);
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(find_item_dir(step), step / "items");
}

}  // namespace
}  // namespace tessel
