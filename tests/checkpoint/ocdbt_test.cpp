#include "tessel/checkpoint/ocdbt.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "../test_util.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;

const char* kV0 = "orbax/compat_checkpoints/v0_checkpoints/direct_checkpoint/checkpoint_metadata_present/"
                  "pytree_checkpointable_has_metadata";
const char* kV1 = "orbax/compat_checkpoints/v1_checkpoints/composite_checkpoint/checkpoint_metadata_present/"
                  "pytree_checkpointable_has_metadata/state";

std::vector<std::string> keys(const OcdbtDatabase& db) {
  std::vector<std::string> out;
  for (const auto& e : db.entries()) out.push_back(e.key);
  return out;
}

TEST(Ocdbt, ReadsOrbaxRootDatabase) {
  const auto db = OcdbtDatabase::open(testing::testdata(kV0));
  EXPECT_EQ(db.config().max_inline_value_bytes, 1024u);
  EXPECT_EQ(db.config().max_decoded_node_bytes, 100000000u);
  EXPECT_EQ(db.config().version_tree_arity_log2, 4);
  EXPECT_TRUE(db.config().zstd);
  EXPECT_EQ(db.version().generation, 1u);
  EXPECT_THAT(keys(db), ::testing::ElementsAre("a/.zarray", "a/0", "b.c/.zarray", "b.c/0"));
  const OcdbtEntry* zarray = db.find("a/.zarray");
  ASSERT_NE(zarray, nullptr);
  EXPECT_THAT(db.read_all(*zarray), HasSubstr("\"dtype\":\"<i4\""));
  EXPECT_EQ(db.find("a/1"), nullptr);
  EXPECT_EQ(db.find("a"), nullptr);
}

TEST(Ocdbt, ReadsEveryGenerationOfAPerProcessDatabase) {
  const fs::path dir = testing::testdata(kV0) / "ocdbt.process_0";
  const auto latest = OcdbtDatabase::open(dir);
  ASSERT_EQ(latest.inline_versions().size(), 4u);
  EXPECT_EQ(latest.version().generation, 4u);
  EXPECT_EQ(latest.entries().size(), 4u);
  for (uint64_t g = 1; g <= 4; ++g) {
    EXPECT_EQ(OcdbtDatabase::open(dir, g).entries().size(), g);
  }
  EXPECT_THAT([&] { OcdbtDatabase::open(dir, 9); }, ::testing::ThrowsMessage<ValueError>(HasSubstr("no generation 9")));
}

TEST(Ocdbt, ReadsZarr3Keys) {
  const auto db = OcdbtDatabase::open(testing::testdata(kV1));
  EXPECT_THAT(keys(db), ::testing::ElementsAre("a/c/0", "a/zarr.json", "b.c/c/0", "b.c/zarr.json"));
  EXPECT_EQ(db.find("a/c/0")->length, 61u);
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// Every single-bit flip and every truncation of a real manifest and node is an error, not a crash.
TEST(Ocdbt, CorruptBlobsAreErrors) {
  const fs::path dir = testing::testdata(kV0);
  const std::string manifest = slurp(dir / "manifest.ocdbt");
  const std::string node = slurp(dir / "d/9f51d9b77c0c771353c577b65dc7bba5");
  EXPECT_NO_THROW(decode_ocdbt_manifest(as_bytes(manifest), "m"));
  EXPECT_NO_THROW(decode_ocdbt_node(as_bytes(node), "", 1 << 20, "n"));
  for (const std::string* blob : {&manifest, &node}) {
    for (size_t bit = 0; bit < blob->size() * 8; ++bit) {
      std::string bad = *blob;
      bad[bit / 8] = static_cast<char>(bad[bit / 8] ^ (1 << (bit % 8)));
      if (blob == &manifest) {
        EXPECT_THROW(decode_ocdbt_manifest(as_bytes(bad), "m"), ValueError) << "bit " << bit;
      } else {
        EXPECT_THROW(decode_ocdbt_node(as_bytes(bad), "", 1 << 20, "n"), ValueError) << "bit " << bit;
      }
    }
    for (size_t n = 0; n < blob->size(); ++n) {
      const std::string cut = blob->substr(0, n);
      if (blob == &manifest) {
        EXPECT_THROW(decode_ocdbt_manifest(as_bytes(cut), "m"), ValueError);
      } else {
        EXPECT_THROW(decode_ocdbt_node(as_bytes(cut), "", 1 << 20, "n"), ValueError);
      }
    }
  }
  EXPECT_THAT([&] { decode_ocdbt_node(as_bytes(manifest), "", 1 << 20, "x.ocdbt"); },
              ::testing::ThrowsMessage<ValueError>(HasSubstr("x.ocdbt: magic 0x0cdb3a2a, expected 0x0cdb20de")));
}

TEST(Ocdbt, MissingPiecesAreNamed) {
  EXPECT_THROW(OcdbtDatabase::open(testing::testdata(
                   "orbax/compat_checkpoints/v0_checkpoints/direct_checkpoint/critical_metadata_alterations/"
                   "missing_pytree_data_dir_d")),
               IoError);
  EXPECT_THROW(OcdbtDatabase::open(testing::testdata(
                   "orbax/compat_checkpoints/v0_checkpoints/direct_checkpoint/critical_metadata_alterations/"
                   "missing_pytree_data_file_manifest.ocdbt")),
               IoError);
}

}  // namespace
}  // namespace tessel
