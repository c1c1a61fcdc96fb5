#include "tessel/checkpoint/detail/store/ocdbt.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include <thread>

#include "../test_util.h"
#include "tessel/checkpoint/detail/io/crc32c.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {
using detail::OcdbtDatabase;
using detail::OcdbtWriter;
using detail::OcdbtEntry;
using detail::decode_ocdbt_node;
using detail::decode_ocdbt_manifest;
using detail::merge_ocdbt;
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

// Random keys sharing prefixes (as zarr keys do), values around the inline limit.
std::map<std::string, std::string> random_entries(std::mt19937& rng, size_t n) {
  std::map<std::string, std::string> out;
  const std::vector<std::string> stems = {"params.", "params.decoder.layers.", "opt_state.mu.", "a", "b.c/"};
  while (out.size() < n) {
    std::string key = stems[rng() % stems.size()] + std::to_string(rng() % 1000) + (rng() % 2 ? "/.zarray" : "/0.1");
    std::string value(rng() % 3 == 0 ? 0 : rng() % 2400, '\0');
    for (char& c : value) c = static_cast<char>(rng());
    out[key] = value;
  }
  return out;
}

TEST(Ocdbt, WrittenDatabasesReadBack) {
  std::mt19937 rng(7);
  for (size_t fan : {2u, 3u, 16u, 4096u}) {
    for (size_t n : {0u, 1u, 2u, 5u, 40u, 300u}) {
      SCOPED_TRACE("fan " + std::to_string(fan) + ", " + std::to_string(n) + " keys");
      testing::TempDir tmp;
      const auto entries = random_entries(rng, n);
      OcdbtWriter w(tmp.path() / "db", {.max_inline_value_bytes = 1024, .max_node_entries = fan, .zstd = n % 2 == 0,
                                        .durable = false});
      // Put in a shuffled order: the writer sorts.
      std::vector<std::pair<std::string, std::string>> order(entries.begin(), entries.end());
      std::shuffle(order.begin(), order.end(), rng);
      for (const auto& [k, v] : order) w.put(k, v);
      w.commit();
      const auto db = OcdbtDatabase::open(tmp.path() / "db");
      ASSERT_EQ(db.entries().size(), n);
      size_t i = 0, out_of_line = 0;
      for (const auto& [k, v] : entries) {
        const OcdbtEntry& e = db.entries()[i++];
        EXPECT_EQ(e.key, k);
        EXPECT_EQ(e.is_inline, v.size() <= 1024);
        out_of_line += !e.is_inline;
        EXPECT_EQ(db.read_all(e), v);
      }
      if (n >= 40 && fan <= 16) EXPECT_GE(db.version().root_height, 1);  // interior nodes
      if (n >= 40) EXPECT_GT(out_of_line, 0u);
      EXPECT_EQ(db.version().empty(), n == 0);
    }
  }
}

TEST(Ocdbt, WriterRefusesDuplicatesAndExistingDatabases) {
  testing::TempDir tmp;
  OcdbtWriter w(tmp.path() / "db", {.durable = false});
  w.put("a", "1");
  w.put("a", "2");
  EXPECT_THAT([&] { w.commit(); }, ::testing::ThrowsMessage<ValueError>(HasSubstr("'a' put twice")));
  OcdbtWriter ok(tmp.path() / "db2", {.durable = false});
  ok.put("a", "1");
  ok.commit();
  EXPECT_THROW(ok.put("b", "2"), ValueError);
  EXPECT_THROW(OcdbtWriter(tmp.path() / "db2"), IoError);
}

// A data file cut short, a node file removed, a path that would leave the directory: errors that
// name the file, never a read outside the database.
TEST(Ocdbt, DamagedDatabasesAreNamed) {
  testing::TempDir tmp;
  const fs::path dir = tmp.path() / "db";
  {
    OcdbtWriter w(dir, {.max_node_entries = 2, .durable = false});
    for (int i = 0; i < 10; ++i) w.put("k" + std::to_string(i), std::string(2000, static_cast<char>('a' + i)));
    w.commit();
  }
  const auto db = OcdbtDatabase::open(dir);
  const fs::path values = db.data_file(db.entries().back()).local();
  fs::resize_file(values, 5000);
  EXPECT_THAT([&] { db.read_all(db.entries().back()); }, ::testing::ThrowsMessage<ValueError>(HasSubstr("truncated")));
  for (const auto& e : fs::directory_iterator(dir / "d")) {
    if (e.path() != values) fs::remove(e.path());  // the nodes' file
  }
  EXPECT_THROW(OcdbtDatabase::open(dir), IoError);
}

// Threads putting at once, into data files that roll over at their target size.
TEST(Ocdbt, ParallelPutsFillSeveralDataFiles) {
  testing::TempDir tmp;
  std::mt19937 rng(11);
  const auto entries = random_entries(rng, 400);
  std::vector<std::pair<std::string, std::string>> all(entries.begin(), entries.end());
  OcdbtWriter w(tmp.path() / "db", {.target_data_file_bytes = 20000, .durable = false});
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t) {
    pool.emplace_back([&, t] {
      for (size_t i = static_cast<size_t>(t); i < all.size(); i += 4) w.put(all[i].first, all[i].second);
    });
  }
  for (auto& t : pool) t.join();
  w.commit();
  const auto db = OcdbtDatabase::open(tmp.path() / "db");
  ASSERT_EQ(db.entries().size(), entries.size());
  std::map<std::string, uint64_t> file_bytes;
  for (const auto& e : db.entries()) {
    EXPECT_EQ(db.read_all(e), entries.at(e.key)) << e.key;
    if (!e.is_inline) file_bytes[e.file] += e.length;
  }
  EXPECT_GT(file_bytes.size(), 2u);
  for (const auto& [file, bytes] : file_bytes) {
    // A file passes its target only by holding one value larger than it.
    EXPECT_LE(bytes, 20000u + 4096u) << file;
  }
}

// Orbax's merge: a root over per-process databases, whose large values stay where they are.
TEST(Ocdbt, MergedRootRefersIntoProcessDatabases) {
  testing::TempDir tmp;
  const fs::path root = tmp.path() / "item";
  std::map<std::string, std::string> expected;
  for (int p = 0; p < 3; ++p) {
    OcdbtWriter w(root / ("ocdbt.process_" + std::to_string(p)), {.durable = false});
    for (int i = 0; i < 5; ++i) {
      const std::string key = "w/" + std::to_string(i) + "." + std::to_string(p);
      const std::string value(i % 2 ? 3000 : 10, static_cast<char>('a' + p * 5 + i));
      w.put(key, value);
      expected[key] = value;
    }
    w.commit();
  }
  merge_ocdbt(root, {"ocdbt.process_0", "ocdbt.process_1", "ocdbt.process_2"}, {.max_node_entries = 4, .durable = false});
  const auto db = OcdbtDatabase::open(root);
  ASSERT_EQ(db.entries().size(), expected.size());
  EXPECT_GE(db.version().root_height, 1);
  for (const auto& e : db.entries()) {
    EXPECT_EQ(db.read_all(e), expected.at(e.key)) << e.key;
    if (!e.is_inline) {
      EXPECT_EQ(e.file.rfind("ocdbt.process_" + e.key.substr(e.key.size() - 1) + "/d/", 0), 0u) << e.file;
    }
  }
  // Two databases holding one key, and names that are not plain subdirectories.
  const fs::path dup = tmp.path() / "dup";
  for (const char* sub : {"ocdbt.process_0", "ocdbt.process_1"}) {
    OcdbtWriter w(dup / sub, {.durable = false});
    w.put("w/.zarray", "{}");
    w.commit();
  }
  EXPECT_THAT([&] { merge_ocdbt(dup, {"ocdbt.process_0", "ocdbt.process_1"}, {.durable = false}); },
              ::testing::ThrowsMessage<ValueError>(HasSubstr("'w/.zarray' put twice")));
  OcdbtWriter w(tmp.path() / "other", {.durable = false});
  EXPECT_THROW(w.copy_from(db, "../item"), ValueError);
  EXPECT_THROW(w.copy_from(db, ""), ValueError);
}

// An envelope (3.2) around `body`, uncompressed.
std::string seal(uint32_t magic, const std::string& body) {
  std::string out;
  for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>(magic >> shift);
  const uint64_t length = 4 + 8 + 2 + body.size() + 4;
  for (int i = 0; i < 8; ++i) out += static_cast<char>(length >> (8 * i));
  out += '\0';  // version
  out += '\0';  // raw
  out += body;
  const uint32_t crc = detail::crc32c(std::as_bytes(std::span(out.data(), out.size())));
  for (int i = 0; i < 4; ++i) out += static_cast<char>(crc >> (8 * i));
  return out;
}

// The numbered kind: `manifest.ocdbt` holds the config alone, the newest `manifest.<016x>` the
// versions. Made from a written database by moving its manifest to a numbered name.
TEST(Ocdbt, NumberedManifests) {
  testing::TempDir tmp;
  const fs::path dir = tmp.path() / "db";
  {
    OcdbtWriter w(dir, {.zstd = false, .durable = false});
    w.put("a", "1");
    w.put("b", std::string(5000, 'b'));
    w.commit();
  }
  const std::string single = testing::read_file(dir / "manifest.ocdbt");
  // The config: uuid, kind, two varints (1024: 2 bytes, 100000000: 4), arity, compression.
  std::string config = single.substr(14, 16 + 1 + 2 + 4 + 1 + 1);
  config[16] = 1;
  const uint32_t magic = 0x0cdb3a2a;
  {
    std::ofstream(dir / "manifest.ocdbt", std::ios::binary | std::ios::trunc) << seal(magic, config);
    std::ofstream(dir / "manifest.0000000000000001", std::ios::binary) << single;
    std::ofstream(dir / "manifest.000000000000000g", std::ios::binary) << "not a manifest name";
  }
  const auto db = OcdbtDatabase::open(dir);
  EXPECT_EQ(db.config().manifest_kind, 1);
  EXPECT_THAT(keys(db), ::testing::ElementsAre("a", "b"));
  EXPECT_EQ(db.read_all(*db.find("b")), std::string(5000, 'b'));
  // Another database's manifest beside the config, and no numbered manifest at all.
  std::string foreign = config;
  foreign[0] ^= 1;
  std::ofstream(dir / "manifest.ocdbt", std::ios::binary | std::ios::trunc) << seal(magic, foreign);
  EXPECT_THAT([&] { OcdbtDatabase::open(dir); }, ::testing::ThrowsMessage<ValueError>(HasSubstr("another database's uuid")));
  std::ofstream(dir / "manifest.ocdbt", std::ios::binary | std::ios::trunc) << seal(magic, config);
  fs::remove(dir / "manifest.0000000000000001");
  EXPECT_THAT([&] { OcdbtDatabase::open(dir); }, ::testing::ThrowsMessage<ValueError>(HasSubstr("no manifest.<generation>")));
}

}  // namespace
}  // namespace tessel
