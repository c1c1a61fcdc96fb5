// Corrupt, truncated, missing and hostile checkpoint contents give clear errors, never a crash,
// and nothing is read or written outside the checkpoint directory.
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../runtime/runtime_test_util.h"
#include "test_util.h"
#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/codec.h"
#include "tessel/checkpoint/detail/store/ocdbt.h"
#include "tessel/checkpoint/detail/store/zarr.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {
using detail::OcdbtDatabase;
using detail::OcdbtEntry;
using detail::ZarrArray;
namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using testing::TempDir;

struct Saved {
  TempDir tmp;
  Runtime rt = Runtime::host(4);
  fs::path dir;
  State target;
  HostArray value;

  // The plain layout unless `ocdbt`: these tests reach into the chunk files.
  explicit Saved(Compression compression = {}, bool ocdbt = false, const Shape& shape = {8, 4})
      : value(testing::iota(shape, DType::kF32)) {
    const Mesh mesh = Mesh::parse("x=4");
    State s;
    s.insert("enc/w", Variable(kParam, device_put(rt, value, NamedSharding(mesh, {{"x"}}))));
    dir = tmp.path() / "c";
    save(dir, s, {.compression = compression, .use_ocdbt = ocdbt});
    target.insert("enc/w", Variable::abstract(kParam, shape, DType::kF32, NamedSharding(mesh, {{"x"}})));
  }
  fs::path chunk(const std::string& key) const { return dir / "enc.w" / key; }
  void overwrite(const fs::path& p, const std::string& text) const {
    fs::permissions(p, fs::perms::owner_write, fs::perm_options::add);
    std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
  }
  State restore_it() const { return restore(rt, dir, target); }
};

void flip_byte(const fs::path& p, size_t offset) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x10));
}

TEST(CheckpointBadInput, BitFlipsFailTheChecksumNamingParameterAndChunk) {
  for (Compression c : {Compression::none(), Compression::zstd()}) {
    Saved s(c);
    flip_byte(s.chunk("1.0"), 3);
    EXPECT_THAT([&] { s.restore_it(); }, ThrowsMessage<ValueError>(HasSubstr("'enc/w' chunk 1.0")));
    EXPECT_THAT([&] { s.restore_it(); }, ThrowsMessage<ValueError>(HasSubstr("CRC-32C mismatch")));
    const VerifyReport r = verify(CheckpointItem::open(s.dir));
    ASSERT_EQ(r.faults.size(), 1u) << c.to_string();
    EXPECT_THAT(r.faults[0], HasSubstr("'enc/w' chunk 1.0"));
    EXPECT_EQ(r.chunks, 4);
    EXPECT_EQ(r.checksums, 4);
    EXPECT_EQ(r.unchecked, 0);
  }
}

// The same faults inside an OCDBT database: a flipped bit in a chunk's value, a data file cut
// short or gone, a chunk key missing from the tree.
TEST(CheckpointBadInput, CorruptOcdbtValuesNameParameterAndChunk) {
  for (Compression c : {Compression::none(), Compression::zstd()}) {
    Saved s(c, /*ocdbt=*/true, {8, 1024});  // 8 KiB chunks: out of line
    ASSERT_TRUE(fs::exists(s.dir / "manifest.ocdbt"));
    const OcdbtDatabase db = OcdbtDatabase::open(s.dir);
    const OcdbtEntry* e = db.find("enc.w/1.0");
    ASSERT_NE(e, nullptr);
    ASSERT_FALSE(e->is_inline) << "32-byte chunks would be inline: the test needs a value in a data file";
    flip_byte(db.data_file(*e).local(), e->offset + 3);
    EXPECT_THAT([&] { s.restore_it(); }, ThrowsMessage<ValueError>(HasSubstr("'enc/w' chunk 1.0")));
    EXPECT_THAT([&] { s.restore_it(); }, ThrowsMessage<ValueError>(HasSubstr("CRC-32C mismatch")));
    const VerifyReport r = verify(CheckpointItem::open(s.dir));
    ASSERT_EQ(r.faults.size(), 1u) << c.to_string();
    EXPECT_THAT(r.faults[0], HasSubstr("'enc/w' chunk 1.0"));
    EXPECT_EQ(r.checksums, 4);
  }
  Saved t({}, /*ocdbt=*/true, {8, 1024});
  const OcdbtDatabase db = OcdbtDatabase::open(t.dir);
  // The last value of a data file, so that cutting the file short damages it alone (parallel
  // writers share files in an order that varies from run to run).
  const OcdbtEntry* e = nullptr;
  for (const OcdbtEntry& x : db.entries()) {
    if (!x.is_inline && x.key.starts_with("enc.w/") && (!e || (x.file == e->file && x.offset > e->offset))) e = &x;
  }
  ASSERT_NE(e, nullptr);
  fs::resize_file(db.data_file(*e).local(), static_cast<std::uintmax_t>(e->offset + 5));
  EXPECT_THAT([&] { t.restore_it(); }, ThrowsMessage<ValueError>(HasSubstr("key '" + e->key + "'")));
  EXPECT_THAT([&] { t.restore_it(); }, ThrowsMessage<ValueError>(HasSubstr("past the end")));
  EXPECT_FALSE(verify(CheckpointItem::open(t.dir)).faults.empty());
  fs::remove(db.data_file(*e).local());
  EXPECT_THAT([&] { t.restore_it(); }, ThrowsMessage<IoError>(HasSubstr(db.data_file(*e).filename())));
}

TEST(CheckpointBadInput, TruncatedMissingAndOversizedChunks) {
  Saved s;
  fs::resize_file(s.chunk("2.0"), 10);
  EXPECT_THAT([&] { s.restore_it(); }, ThrowsMessage<ValueError>(HasSubstr("10 bytes, an uncompressed chunk")));
  fs::remove(s.chunk("2.0"));
  EXPECT_THAT([&] { s.restore_it(); }, ThrowsMessage<ValueError>(HasSubstr("'enc/w' chunk 2.0")));
  EXPECT_THAT([&] { s.restore_it(); }, ThrowsMessage<ValueError>(HasSubstr("is missing")));
  EXPECT_EQ(verify(CheckpointItem::open(s.dir)).faults.size(), 1u);

  Saved z(Compression::zstd());
  z.overwrite(z.chunk("0.0"), std::string(5 << 20, 'x'));
  EXPECT_THAT([&] { z.restore_it(); }, ThrowsMessage<ValueError>(HasSubstr("not a compressed chunk of this array")));
}

TEST(CheckpointBadInput, CorruptCompressedDataIsCaughtByTheDecoder) {
  std::vector<std::byte> raw(4096, std::byte{7});
  auto packed = compress(Compression::zstd(), raw);
  std::vector<std::byte> out(raw.size());
  decompress(Compression::zstd(), packed, out, "w chunk 0");
  EXPECT_EQ(out, raw);
  std::vector<std::byte> small(100);
  EXPECT_THAT([&] { decompress(Compression::zstd(), packed, small, "w chunk 0"); },
              ThrowsMessage<ValueError>(HasSubstr("w chunk 0: the zstd frame holds 4096 bytes")));
  std::vector<std::byte> garbage(64, std::byte{0x5a});
  EXPECT_THAT([&] { decompress(Compression::zstd(), garbage, out, "w chunk 0"); },
              ThrowsMessage<ValueError>(HasSubstr("not a zstd frame")));
  EXPECT_THAT([&] { decompress({Compression::Kind::kBlosc, 0}, garbage, out, "w chunk 0"); },
              ThrowsMessage<ValueError>(HasSubstr("not a valid blosc buffer")));
  packed.resize(packed.size() - 3);
  EXPECT_THROW(decompress(Compression::zstd(), packed, out, "w"), ValueError);
}

TEST(CheckpointBadInput, BadMetadataNamesTheFile) {
  Saved s;
  s.overwrite(s.dir / "_METADATA", "{\"tree_metadata\": [1, 2");
  try {
    s.restore_it();
    FAIL();
  } catch (const ParseError& e) {
    EXPECT_THAT(e.source(), HasSubstr("_METADATA"));
    EXPECT_GT(e.line(), 0);
  }
  s.overwrite(s.dir / "_METADATA", R"({"tree_metadata": {"x": {"key_metadata": []}}})");
  EXPECT_THAT([&] { s.restore_it(); }, ThrowsMessage<ValueError>(HasSubstr("non-empty 'key_metadata'")));
  // Without _METADATA the tree comes from the arrays' names (as Orbax restores it given a tree);
  // with no array either, the directory is not a checkpoint item.
  fs::remove(s.dir / "_METADATA");
  EXPECT_NO_THROW(s.restore_it());
  for (const auto& e : fs::directory_iterator(s.dir)) {
    if (e.is_directory()) fs::remove_all(e.path());
  }
  EXPECT_THAT([&] { s.restore_it(); }, ThrowsMessage<IoError>(HasSubstr("has no _METADATA")));

  Saved z;
  z.overwrite(z.chunk(".zarray"), R"({"zarr_format": 2, "shape": [8, 4], "chunks": [2, 4], "dtype": ">f4"})");
  EXPECT_THAT([&] { z.restore_it(); }, ThrowsMessage<ValueError>(HasSubstr(".zarray")));
  z.overwrite(z.chunk(".zarray"), R"({"zarr_format": 2, "shape": [8, 4], "chunks": [2], "dtype": "<f4"})");
  EXPECT_THAT([&] { z.restore_it(); }, ThrowsMessage<ValueError>(HasSubstr("do not match the rank")));
  z.overwrite(z.chunk(".zarray"), R"({"zarr_format": 2, "shape": [8, 4], "chunks": [2, 4], "dtype": "<f4", "order": "F"})");
  EXPECT_THAT([&] { z.restore_it(); }, ThrowsMessage<ValueError>(HasSubstr("order")));
  z.overwrite(z.chunk(".zarray"), R"({"zarr_format": 2, "shape": [8, 4], "chunks": [2, 4], "dtype": "<f4", "compressor": {"id": "gzip"}})");
  EXPECT_THAT([&] { z.restore_it(); }, ThrowsMessage<ValueError>(HasSubstr("compressor 'gzip' is not supported")));
}

TEST(CheckpointBadInput, AbsurdShapesAreRejectedBeforeAllocating) {
  Saved s;
  s.overwrite(s.chunk(".zarray"),
              R"({"zarr_format": 2, "shape": [4000000000000, 4000000000000], "chunks": [2, 4], "dtype": "<f4"})");
  EXPECT_THAT([&] { ZarrArray::parse(testing::read_file(s.chunk(".zarray")), "z"); },
              ThrowsMessage<ValueError>(HasSubstr("overflow")));
  s.overwrite(s.chunk(".zarray"), R"({"zarr_format": 2, "shape": [1000000000000], "chunks": [1000000000000], "dtype": "|i1"})");
  EXPECT_THAT([&] { ZarrArray::parse(testing::read_file(s.chunk(".zarray")), "z"); },
              ThrowsMessage<ValueError>(HasSubstr("more than the 16 GiB")));
  s.overwrite(s.chunk(".zarray"), R"({"zarr_format": 2, "shape": [10000000000000, 4], "chunks": [1000, 4], "dtype": "<f4"})");
  const int64_t before = s.rt.device(0).memory_stats().peak;
  EXPECT_THAT([&] { restore(s.rt, s.dir, TargetSpec{.placement = Placement::kReplicated}); },
              ThrowsMessage<ValueError>(HasSubstr("more than this machine's memory")));
  EXPECT_EQ(s.rt.device(0).memory_stats().peak, before);
}

TEST(CheckpointBadInput, NamesFromMetadataStayInsideTheDirectory) {
  Saved s;
  const std::string outside = (s.tmp.path() / "outside").string();
  fs::create_directories(outside);
  for (const char* key : {R"(["..", "x"])", R"([".."])", R"(["a/../../outside"])", R"(["."])"}) {
    nlohmann::json keys = nlohmann::json::array();
    for (const auto& k : nlohmann::json::parse(key)) keys.push_back({{"key", k}, {"key_type", 2}});
    nlohmann::json meta{{"tree_metadata", {{"k", {{"key_metadata", keys}, {"value_metadata", {{"value_type", "jax.Array"}}}}}}},
                        {"use_ocdbt", false}};
    s.overwrite(s.dir / "_METADATA", meta.dump());
    EXPECT_THROW(restore(s.rt, s.dir, TargetSpec{.placement = Placement::kReplicated}), Error) << key;
    bool flagged = false;
    try {
      flagged = !verify(CheckpointItem::open(s.dir)).faults.empty();
    } catch (const Error&) {
      flagged = true;
    }
    EXPECT_TRUE(flagged) << key;
  }
}

TEST(CheckpointBadInput, SymlinksAreNotFollowed) {
  Saved s;
  const fs::path secret = s.tmp.path() / "secret";
  std::ofstream(secret) << std::string(32, 's');
  fs::remove(s.chunk("0.0"));
  fs::create_symlink(secret, s.chunk("0.0"));
  EXPECT_THAT([&] { s.restore_it(); }, ThrowsMessage<IoError>(HasSubstr("refusing to follow the symlink")));
  Saved d;
  const fs::path elsewhere = d.tmp.path() / "elsewhere";
  fs::rename(d.dir / "enc.w", elsewhere);
  fs::create_directory_symlink(elsewhere, d.dir / "enc.w");
  EXPECT_THAT([&] { d.restore_it(); }, ThrowsMessage<IoError>(HasSubstr("refusing to follow the symlink")));
}

TEST(CheckpointBadInput, SavingRefusesCollidingNamesAndExistingDirectories) {
  Runtime rt = Runtime::host(1);
  TempDir tmp;
  const NamedSharding one(Mesh::parse("x=1"), {});
  State s;
  s.insert("a.b/c", Variable(kParam, device_put(rt, testing::iota({2}), one)));
  s.insert("a/b.c", Variable(kParam, device_put(rt, testing::iota({2}), one)));
  EXPECT_THAT([&] { save(tmp.path() / "c", s); }, ThrowsMessage<ValueError>(HasSubstr("both would be stored as 'a.b.c'")));
  EXPECT_FALSE(fs::exists(tmp.path() / "c"));
  EXPECT_FALSE(fs::exists(tmp.path() / "c.orbax-checkpoint-tmp"));
  State dots;
  dots.insert("..", Variable(kParam, device_put(rt, testing::iota({2}), one)));
  EXPECT_THROW(save(tmp.path() / "d", dots), ValueError);
  State ok;
  ok.insert("w", Variable(kParam, device_put(rt, testing::iota({2}), one)));
  save(tmp.path() / "e", ok);
  EXPECT_THAT([&] { save(tmp.path() / "e", ok); }, ThrowsMessage<IoError>(HasSubstr("already exists")));
  State abstract;
  abstract.insert("w", Variable::abstract(kParam, {2}, DType::kF32, one));
  EXPECT_THROW(save(tmp.path() / "f", abstract), ValueError);
}

}  // namespace
}  // namespace tessel
