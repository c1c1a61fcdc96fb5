// Orbax's own compatibility checkpoints (../shared/testdata/orbax/compat_checkpoints): OCDBT with
// zarr v2 (v0 API) and zarr3 (v1 API), direct and composite, with metadata removed or altered.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "../runtime/runtime_test_util.h"
#include "test_util.h"
#include "tessel/checkpoint/codec.h"
#include "tessel/checkpoint/detail/io/crc32c.h"
#include "tessel/checkpoint/detail/store/ocdbt.h"
#include "tessel/checkpoint/detail/store/zarr.h"
#include "tessel/core/box_copy.h"
#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/metadata.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {
using detail::OcdbtWriter;
using detail::ZarrArray;
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
    expect_values(restore(rt, item, TargetSpec{.placement = Placement::kReplicated}));
    const VerifyReport report = verify(CheckpointItem::open(item));
    EXPECT_TRUE(report.faults.empty()) << report.faults.front();
    EXPECT_EQ(report.chunks, 2);
    // Orbax wrote no checksum into these: said, not hidden.
    EXPECT_EQ(report.checksums, 0);
    EXPECT_EQ(report.unchecked, 2);
    const auto info = CheckpointItem::open(item).describe();
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
    EXPECT_THROW(verify(CheckpointItem::open(item)), Error);
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

// An item as Orbax lays it out by default: arrays inside an OCDBT database, as zarr v2 chunks or
// zarr3 shards of two inner chunks along the first dimension (edge shards partly absent), no
// _METADATA (the tree comes from the names). Small inline limit and nodes: out-of-line values and
// interior B+tree nodes.
void write_orbax_style_item(const fs::path& dir, const std::map<std::string, HostArray>& values, bool zarr3,
                            const Compression& compression, std::mt19937& rng) {
  OcdbtWriter w(dir, {.max_inline_value_bytes = 48, .max_node_entries = 3, .durable = false});
  for (const auto& [path, h] : values) {
    std::string name = path;
    std::replace(name.begin(), name.end(), '/', '.');
    std::vector<int64_t> chunk(h.shape().rank()), shard(h.shape().rank());
    for (size_t d = 0; d < chunk.size(); ++d) {
      chunk[d] = std::uniform_int_distribution<int64_t>(1, std::max<int64_t>(h.shape()[d], 1))(rng);
      shard[d] = chunk[d] * (d == 0 ? 2 : 1);
    }
    const ZarrArray z = zarr3 ? ZarrArray::sharded_v3(h.shape(), Shape(shard), Shape(chunk), h.dtype(), compression)
                              : ZarrArray(h.shape(), Shape(chunk), h.dtype(), compression);
    w.put(name + "/" + z.metadata_key(), z.to_json());
    const size_t item = item_size(h.dtype());
    std::map<std::string, std::map<int64_t, std::vector<std::byte>>> shards;  // key -> position -> bytes
    for (const auto& index : z.chunks_in(Box::full(h.shape()))) {
      const Box box = z.chunk_box(index);
      std::vector<std::byte> raw(static_cast<size_t>(z.chunk_bytes()));
      copy_region(h.bytes().data(), Box::full(h.shape()), raw.data(), box, box.intersect(Box::full(h.shape())), item);
      shards[z.chunk_key(index)][z.position_in_shard(index)] = compress(compression, raw);
    }
    for (auto& [key, chunks] : shards) {
      std::vector<std::byte> value;
      std::vector<uint64_t> table(static_cast<size_t>(2 * z.chunks_per_shard()), UINT64_MAX);
      for (const auto& [pos, bytes] : chunks) {
        table[static_cast<size_t>(2 * pos)] = value.size();
        table[static_cast<size_t>(2 * pos + 1)] = bytes.size();
        value.insert(value.end(), bytes.begin(), bytes.end());
      }
      if (zarr3) {
        std::vector<std::byte> index(table.size() * 8 + 4);
        std::memcpy(index.data(), table.data(), table.size() * 8);
        const uint32_t crc = detail::crc32c(std::span<const std::byte>(index).first(table.size() * 8));
        std::memcpy(index.data() + table.size() * 8, &crc, 4);
        value.insert(value.end(), index.begin(), index.end());
      }
      w.put(name + "/" + key, std::span<const std::byte>(value));
    }
  }
  w.commit();
}

// zarr3 metadata tessel cannot honour is refused by name, not misread.
TEST(Zarr3, UnsupportedMetadataIsNamed) {
  const std::string grid = R"("chunk_grid":{"configuration":{"chunk_shape":[8]},"name":"regular"},"data_type":"int32",)"
                           R"("fill_value":0,"node_type":"array","shape":[8],"zarr_format":3)";
  const std::string bytes = R"({"configuration":{"endian":"little"},"name":"bytes"})";
  auto parse = [&](const std::string& codecs) { return ZarrArray::parse("{" + grid + ",\"codecs\":" + codecs + "}", "w/zarr.json"); };
  EXPECT_EQ(parse("[" + bytes + "]").chunk_key(std::vector<int64_t>{0}), "c/0");
  const std::pair<std::string, std::string> bad[] = {
      {R"([{"name":"transpose","configuration":{"order":[0]}},)" + bytes + "]", "no transpose"},
      {R"([{"configuration":{"endian":"big"},"name":"bytes"}])", "endian \"big\""},
      {"[" + bytes + R"(,{"name":"gzip","configuration":{"level":1}}])", "codec 'gzip'"},
      {"[" + bytes + R"(,{"name":"crc32c"},{"name":"zstd"}])", "codec 'crc32c' here"},
      {R"([{"name":"sharding_indexed","configuration":{"chunk_shape":[3],"codecs":[)" + bytes +
           R"(],"index_codecs":[)" + bytes + "]}}]",
       "does not divide"},
      {R"([{"name":"sharding_indexed","configuration":{"chunk_shape":[4],"codecs":[)" + bytes +
           R"(],"index_codecs":[)" + bytes + R"(],"index_location":"middle"}}])",
       "index_location"},
      {"[]", "non-empty list"},
  };
  for (const auto& [codecs, message] : bad) {
    const auto parse_codecs = [&parse, &codecs = codecs] { parse(codecs); };
    EXPECT_THAT(parse_codecs, ::testing::ThrowsMessage<ValueError>(HasSubstr(message))) << codecs;
  }
  EXPECT_THAT([&] { ZarrArray::parse(R"({"zarr_format":3,"shape":[8]})", "w/zarr.json"); },
              ::testing::ThrowsMessage<ValueError>(HasSubstr("w/zarr.json: missing 'data_type'")));
}

TEST(OcdbtRoundTrip, RandomArraysRestoreOntoRandomMeshes) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(8);
  for (int iter = 0; iter < 24; ++iter) {
    testing::TempDir tmp;
    const bool zarr3 = iter % 2 == 1;
    const Compression compression = iter % 3 == 0 ? Compression::none() : Compression::zstd(iter % 4 + 1);
    std::map<std::string, HostArray> values;
    State target;
    const Mesh mesh = testing::random_mesh(rng);
    for (int i = 0; i < 3; ++i) {
      const Shape shape = testing::random_shape(rng);
      const auto dtypes = all_dtypes();
      const DType dtype = dtypes[rng() % dtypes.size()];
      HostArray h(shape, dtype);
      for (auto& b : h.mutable_bytes()) b = static_cast<std::byte>(dtype == DType::kBool ? rng() & 1 : rng());
      const std::string path = "layer" + std::to_string(i) + (i % 2 ? "/w" : "/sub/b");
      target.insert(path, Variable::abstract(kParam, shape, dtype, NamedSharding(mesh, testing::random_spec(rng, mesh, shape.rank()))));
      values.emplace(path, std::move(h));
    }
    write_orbax_style_item(tmp.path() / "item", values, zarr3, compression, rng);
    SCOPED_TRACE("iteration " + std::to_string(iter) + (zarr3 ? " zarr3 " : " zarr v2 ") + compression.to_string());
    const ItemMetadata meta = read_item_metadata(tmp.path() / "item");
    EXPECT_TRUE(meta.use_ocdbt);
    EXPECT_EQ(meta.use_zarr3, zarr3);
    const State got = restore(rt, tmp.path() / "item", target);
    for (const auto& [path, var] : got) {
      EXPECT_EQ(var.array().sharding(), *target.at(path).sharding()) << path;
      EXPECT_EQ(to_host(var.array()), values.at(path)) << path;
    }
    const VerifyReport report = verify(CheckpointItem::open(tmp.path() / "item"));
    EXPECT_TRUE(report.faults.empty()) << report.faults.front();
  }
}

}  // namespace
}  // namespace tessel
