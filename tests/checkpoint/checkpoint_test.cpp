// Save/restore round trips, the on-disk layout, structure and dtype handling, and bounded reads.
#include <sys/resource.h>

#include <fstream>
#include <map>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../runtime/runtime_test_util.h"
#include "test_util.h"
#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/metadata.h"
#include "tessel/checkpoint/detail/store/ocdbt.h"
#include "tessel/checkpoint/detail/store/zarr.h"
#include "tessel/core/error.h"
#include "tessel/runtime/cast.h"
#include "tessel/sharding/rules_io.h"
#include "tessel/state/init.h"
#include "tessel/models/model_config.h"

namespace tessel {
namespace {
using detail::OcdbtDatabase;
using detail::OcdbtEntry;
using detail::ZarrArray;
using detail::choose_chunk_shape;
namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::TempDir;

using testing::random_host;

DType random_dtype(std::mt19937& rng) {
  auto all = all_dtypes();
  return all[std::uniform_int_distribution<size_t>(0, all.size() - 1)(rng)];
}

State one_leaf(const std::string& path, const Array& a) {
  State s;
  s.insert(path, Variable(kParam, a));
  return s;
}

TEST(CheckpointRoundTrip, RandomMeshesAndShardingsAreBitIdentical) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(20261122);
  for (int iter = 0; iter < 40; ++iter) {
    TempDir tmp;
    const Mesh a = testing::random_mesh(rng);
    const Mesh b = testing::random_mesh(rng);
    State state, target;
    std::map<std::string, HostArray> values;
    const int leaves = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int i = 0; i < leaves; ++i) {
      const Shape shape = testing::random_shape(rng);
      const DType dtype = random_dtype(rng);
      const std::string path = "layer" + std::to_string(i) + (i % 2 ? "/w" : "/sub/b");
      HostArray h = random_host(rng, shape, dtype);
      NamedSharding src(a, testing::random_spec(rng, a, shape.rank()));
      state.insert(path, Variable(kParam, device_put(rt, h, src)));
      target.insert(path, Variable::abstract(kParam, shape, dtype,
                                             NamedSharding(b, testing::random_spec(rng, b, shape.rank()))));
      values.emplace(path, std::move(h));
    }
    SaveOptions options;
    if (iter % 3 == 1) options.compression = Compression::zstd(iter % 5 + 1);
    if (iter % 2 == 0) options.max_chunk_bytes = std::uniform_int_distribution<int64_t>(1, 64)(rng);
    // Every layout Orbax writes: OCDBT or plain files, each with zarr v2 or zarr3.
    options.use_ocdbt = (iter / 2) % 2 == 0;
    options.use_zarr3 = iter % 2 == 1;
    save(tmp.path() / "ckpt", state, options);
    RestoreOptions ro;
    ro.staging_bytes = iter % 4 == 0 ? 64 : int64_t{256} << 20;
    State again = restore(rt, tmp.path() / "ckpt", target, ro);
    ASSERT_EQ(again.size(), state.size());
    for (const auto& [path, var] : again) {
      SCOPED_TRACE("iteration " + std::to_string(iter) + " " + path + " " + var.to_string());
      EXPECT_EQ(var.array().sharding(), *target.at(path).sharding());
      EXPECT_EQ(to_host(var.array()), values.at(path));
    }
    EXPECT_TRUE(verify(CheckpointItem::open(tmp.path() / "ckpt")).faults.empty());
  }
}

const char* kRules = R"(
mesh_axes: [data, fsdp, tensor]
logical_axis_rules: [[batch, data], [vocab, tensor], [embed, fsdp], [mlp, tensor], [heads, tensor], [kv, []], [layers, []], [norm, []]]
)";

TEST(CheckpointRoundTrip, TransformerFromFsdpToDataTensor) {
  Runtime rt = Runtime::host(8);
  TempDir tmp;
  const LogicalRules rules = parse_rules_yaml(kRules);
  const ModelConfig cfg = load_model_config(fs::path(TESSEL_EXAMPLES_DIR) / "models" / "transformer.yml");
  const Module model = cfg.build();
  const Mesh fsdp = Mesh::parse("fsdp=8", rules.mesh_axes());
  const Mesh other = Mesh::parse("data=2,tensor=4", rules.mesh_axes());
  State params = init(rt, model, 7, fsdp, rules);
  SaveOptions options;
  options.rules = rules;
  save(tmp.path() / "params", params, options);
  State target = eval_shape(model, other, rules);
  RestoreStats stats;
  State again = restore(rt, tmp.path() / "params", target, {}, &stats);
  for (const auto& [path, var] : params) {
    SCOPED_TRACE(path);
    EXPECT_EQ(again.at(path).sharding(), target.at(path).sharding());
    EXPECT_EQ(again.at(path).partitioning(), var.partitioning());
    EXPECT_EQ(to_host(again.at(path).array()), to_host(var.array()));
  }
  // Uncompressed: every stored byte the devices need is read exactly once.
  EXPECT_EQ(stats.bytes_read, params.nbytes());
  // The saved logical axes and rules come back with the metadata.
  const ItemMetadata meta = read_item_metadata(tmp.path() / "params");
  ASSERT_TRUE(meta.rules.has_value());
  EXPECT_EQ(meta.rules->rules().size(), rules.rules().size());
  EXPECT_EQ(*meta.mesh, fsdp);
}

TEST(CheckpointFormat, OrbaxLayout) {
  Runtime rt = Runtime::host(8);
  TempDir tmp;
  const Mesh mesh = Mesh::parse("data=2,fsdp=4");
  HostArray h = testing::iota({8, 6}, DType::kF32);
  State s;
  s.insert("dense/kernel", Variable(kParam, device_put(rt, h, NamedSharding(mesh, {{"fsdp"}, {}})),
                                    Partitioning::by_logical({"embed", "mlp"})));
  const fs::path dir = tmp.path() / "item";
  save(dir, s, {.use_ocdbt = false});
  EXPECT_TRUE(fs::exists(dir / "commit_success.txt"));
  EXPECT_FALSE(fs::exists(tmp.path() / "item.orbax-checkpoint-tmp"));
  EXPECT_EQ(testing::read_file(dir / "dense.kernel" / ".zarray"),
            R"({"chunks":[2,6],"compressor":null,"dimension_separator":".","dtype":"<f4","fill_value":null,)"
            R"("filters":null,"order":"C","shape":[8,6],"zarr_format":2})");
  for (int i = 0; i < 4; ++i) {
    const fs::path chunk = dir / "dense.kernel" / (std::to_string(i) + ".0");
    ASSERT_TRUE(fs::exists(chunk)) << chunk;
    EXPECT_EQ(fs::file_size(chunk), 2u * 6 * 4);
  }
  auto meta = nlohmann::json::parse(testing::read_file(dir / "_METADATA"));
  const auto& leaf = meta["tree_metadata"]["('dense', 'kernel')"];
  EXPECT_EQ(leaf["key_metadata"][1]["key"], "kernel");
  EXPECT_EQ(leaf["key_metadata"][1]["key_type"], 2);
  EXPECT_EQ(leaf["value_metadata"]["value_type"], "jax.Array");
  EXPECT_EQ(leaf["value_metadata"]["write_shape"], nlohmann::json({2, 6}));
  EXPECT_EQ(meta["use_ocdbt"], false);
  EXPECT_EQ(meta["use_zarr3"], false);
  EXPECT_EQ(meta["store_array_data_equal_to_fill_value"], true);
  const auto& extra = meta["custom_metadata"]["tessel"]["params"]["dense.kernel"];
  EXPECT_EQ(extra["logical_axes"], nlohmann::json({"embed", "mlp"}));
  EXPECT_EQ(extra["crc32c"].size(), 4u);
  auto sharding = nlohmann::json::parse(testing::read_file(dir / "_sharding"));
  const std::string key = base64_url_encode("dense.kernel");
  ASSERT_TRUE(sharding.contains(key));
  auto inner = nlohmann::json::parse(sharding[key].get<std::string>());
  EXPECT_EQ(inner["sharding_type"], "NamedSharding");
  EXPECT_EQ(inner["shape"], nlohmann::json({2, 4}));
  EXPECT_EQ(inner["axis_names"], nlohmann::json({"data", "fsdp"}));
  EXPECT_EQ(inner["partition_spec"], nlohmann::json::parse(R"(["fsdp", null])"));
  auto am = nlohmann::json::parse(testing::read_file(dir / "array_metadatas" / "process_0"));
  EXPECT_EQ(am["array_metadatas"][0]["array_metadata"]["param_name"], "dense.kernel");
  EXPECT_EQ(am["array_metadatas"][0]["array_metadata"]["chunk_shape"], nlohmann::json({2, 6}));
  auto cm = nlohmann::json::parse(testing::read_file(dir / "_CHECKPOINT_METADATA"));
  EXPECT_TRUE(cm.contains("init_timestamp_nsecs"));
  EXPECT_TRUE(cm.contains("commit_timestamp_nsecs"));
  // The saved sharding comes back as saved.
  const ItemMetadata item = read_item_metadata(dir);
  ASSERT_EQ(item.params.size(), 1u);
  EXPECT_EQ(item.params[0].sharding->spec, (PartitionSpec{{"fsdp"}, {}}));
  EXPECT_EQ(item.params[0].sharding->mesh, mesh);
}

// Orbax's default layout: the arrays in the item's root OCDBT database, which refers to the
// per-process database `ocdbt.process_0/` for values out of line.
TEST(CheckpointFormat, OrbaxOcdbtLayout) {
  Runtime rt = Runtime::host(4);
  TempDir tmp;
  const Mesh mesh = Mesh::parse("fsdp=4");
  State s;
  s.insert("dense/kernel", Variable(kParam, device_put(rt, testing::iota({8, 64}, DType::kF32), NamedSharding(mesh, {{"fsdp"}, {}}))));
  s.insert("dense/bias", Variable(kParam, device_put(rt, testing::iota({64}, DType::kF32), NamedSharding(mesh, {}))));
  const fs::path dir = tmp.path() / "item";
  save(dir, s);
  EXPECT_TRUE(fs::exists(dir / "manifest.ocdbt"));
  EXPECT_TRUE(fs::exists(dir / "ocdbt.process_0" / "manifest.ocdbt"));
  EXPECT_FALSE(fs::exists(dir / "dense.kernel"));
  auto meta = nlohmann::json::parse(testing::read_file(dir / "_METADATA"));
  EXPECT_EQ(meta["use_ocdbt"], true);
  EXPECT_EQ(meta["use_zarr3"], false);
  const OcdbtDatabase db = OcdbtDatabase::open(dir);
  std::vector<std::string> keys;
  for (const auto& e : db.entries()) keys.push_back(e.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"dense.bias/.zarray", "dense.bias/0", "dense.kernel/.zarray", "dense.kernel/0.0",
                                            "dense.kernel/1.0", "dense.kernel/2.0", "dense.kernel/3.0"}));
  EXPECT_EQ(db.find("dense.kernel/.zarray")->value,
            R"({"chunks":[2,64],"compressor":null,"dimension_separator":".","dtype":"<f4","fill_value":null,)"
            R"("filters":null,"order":"C","shape":[8,64],"zarr_format":2})");
  // 256-byte bias inline; 512-byte kernel chunks too (Orbax's limit is 1024 bytes).
  EXPECT_TRUE(db.find("dense.bias/0")->is_inline);
  EXPECT_EQ(db.find("dense.kernel/1.0")->value.size(), 512u);
  // Larger chunks stay in the per-process database, referred to from the root.
  State big;
  big.insert("w", Variable(kParam, device_put(rt, testing::iota({4, 1024}, DType::kF32), NamedSharding(mesh, {{"fsdp"}, {}}))));
  save(tmp.path() / "big", big);
  const OcdbtDatabase root = OcdbtDatabase::open(tmp.path() / "big");
  const OcdbtEntry* chunk = root.find("w/2.0");
  ASSERT_NE(chunk, nullptr);
  EXPECT_FALSE(chunk->is_inline);
  EXPECT_EQ(chunk->length, 4096u);
  EXPECT_EQ(chunk->file.rfind("ocdbt.process_0/d/", 0), 0u) << chunk->file;
  EXPECT_EQ(OcdbtDatabase::open(tmp.path() / "big" / "ocdbt.process_0").entries().size(), root.entries().size());
}

// zarr3, as Orbax's v1 API writes it: one `sharding_indexed` shard per chunk, holding one inner
// chunk, its index and the index's CRC-32C.
TEST(CheckpointFormat, OrbaxZarr3Layout) {
  Runtime rt = Runtime::host(2);
  TempDir tmp;
  const Mesh mesh = Mesh::parse("x=2");
  State s;
  s.insert("w", Variable(kParam, device_put(rt, testing::iota({4, 3}, DType::kI32), NamedSharding(mesh, {{"x"}}))));
  save(tmp.path() / "files", s, {.use_ocdbt = false, .use_zarr3 = true});
  const fs::path w = tmp.path() / "files" / "w";
  const std::string json = testing::read_file(w / "zarr.json");
  const ZarrArray z = ZarrArray::parse(json, "zarr.json");
  EXPECT_TRUE(z.sharded());
  EXPECT_EQ(z.shard_shape(), (Shape{2, 3}));
  EXPECT_EQ(z.chunks(), (Shape{2, 3}));
  EXPECT_THAT(json, HasSubstr(R"("name":"sharding_indexed")"));
  EXPECT_THAT(json, HasSubstr(R"("index_codecs":[{"configuration":{"endian":"little"},"name":"bytes"},{"name":"crc32c"}])"));
  const std::string shard = testing::read_file(w / "c" / "1" / "0");
  ASSERT_EQ(shard.size(), 24u + 20u);
  int32_t first = 0;
  std::memcpy(&first, shard.data(), 4);
  EXPECT_EQ(first, 7);  // element (2, 0): iota counts from 1
  uint64_t offset = 1, length = 0;
  std::memcpy(&offset, shard.data() + 24, 8);
  std::memcpy(&length, shard.data() + 32, 8);
  EXPECT_EQ(offset, 0u);
  EXPECT_EQ(length, 24u);
  auto meta = nlohmann::json::parse(testing::read_file(tmp.path() / "files" / "_METADATA"));
  EXPECT_EQ(meta["use_ocdbt"], false);
  EXPECT_EQ(meta["use_zarr3"], true);
  save(tmp.path() / "ocdbt", s, {.use_zarr3 = true});
  const OcdbtDatabase db = OcdbtDatabase::open(tmp.path() / "ocdbt");
  ASSERT_NE(db.find("w/zarr.json"), nullptr);
  EXPECT_EQ(db.find("w/zarr.json")->value, json);
  ASSERT_NE(db.find("w/c/1/0"), nullptr);
  EXPECT_EQ(db.find("w/c/1/0")->value, shard);
}

// More chunks than one B+tree node holds (4096): the root gets interior nodes, and a restore
// onto another mesh reads every chunk back through them.
TEST(CheckpointRoundTrip, OcdbtTreesWithInteriorNodes) {
  Runtime rt = Runtime::host(4);
  TempDir tmp;
  HostArray h = testing::iota({80, 64}, DType::kF32);
  SaveOptions options;
  options.max_chunk_bytes = 4;  // one element per chunk: 5120 keys
  save(tmp.path() / "c", one_leaf("w", device_put(rt, h, NamedSharding(Mesh::parse("x=4"), {{"x"}}))), options);
  const OcdbtDatabase db = OcdbtDatabase::open(tmp.path() / "c");
  EXPECT_EQ(db.entries().size(), 80u * 64 + 1);
  EXPECT_GE(db.version().root_height, 1);
  State target;
  target.insert("w", Variable::abstract(kParam, {80, 64}, DType::kF32, NamedSharding(Mesh::parse("a=2,b=2"), {{"b"}, {"a"}})));
  EXPECT_EQ(to_host(restore(rt, tmp.path() / "c", target).at("w").array()), h);
  EXPECT_TRUE(verify(CheckpointItem::open(tmp.path() / "c")).faults.empty());
}

TEST(CheckpointFormat, Base64UrlMatchesPython) {
  EXPECT_EQ(base64_url_encode("a"), "YQ==");
  EXPECT_EQ(base64_url_encode("b.c"), "Yi5j");
  EXPECT_EQ(base64_url_encode("ab"), "YWI=");
  EXPECT_EQ(base64_url_encode("\xfb\xff"), "-_8=");
  for (std::string s : {"", "a", "ab", "abc", "layers.0.mlp.wi_0.kernel"}) EXPECT_EQ(base64_url_decode(base64_url_encode(s)), s);
  EXPECT_THROW(base64_url_decode("YQ="), ValueError);
  EXPECT_THROW(base64_url_decode("Y+Q="), ValueError);
  EXPECT_THROW(base64_url_decode("=YQ="), ValueError);
}

TEST(CheckpointFormat, LargeShardsAreSplitIntoDivisorChunks) {
  Runtime rt = Runtime::host(8);
  TempDir tmp;
  const Mesh mesh = Mesh::parse("fsdp=2");
  HostArray h = testing::iota({64, 30}, DType::kF32);
  SaveOptions options;
  options.max_chunk_bytes = 1000;
  options.use_ocdbt = false;
  save(tmp.path() / "c", one_leaf("w", device_put(rt, h, NamedSharding(mesh, {{"fsdp"}}))), options);
  const ZarrArray z = ZarrArray::parse(testing::read_file(tmp.path() / "c" / "w" / ".zarray"), "w");
  EXPECT_LE(z.chunk_bytes(), 1000);
  EXPECT_EQ(32 % z.chunks()[0], 0);
  EXPECT_EQ(30 % z.chunks()[1], 0);
  // Chunks tile the shards exactly, and restoring any way gives the values back.
  State again = restore(rt, tmp.path() / "c", TargetSpec{.mesh = Mesh::parse("r=3"), .placement = Placement::kReplicated});
  EXPECT_EQ(to_host(again.at("w").array()), h);
  EXPECT_EQ(choose_chunk_shape(Shape{32, 30}, 4, 1000, std::vector<size_t>{0}), (Shape{8, 30}));
  EXPECT_EQ(choose_chunk_shape(Shape{0, 3}, 4, 1000, {}), (Shape{1, 3}));
}

TEST(CheckpointRestore, StructuralDifferencesAreListedOnBothSides) {
  Runtime rt = Runtime::host(2);
  TempDir tmp;
  const Mesh mesh = Mesh::parse("x=2");
  State s;
  s.insert("a/w", Variable(kParam, device_put(rt, testing::iota({4}), NamedSharding(mesh, {}))));
  s.insert("b/w", Variable(kParam, device_put(rt, testing::iota({4}), NamedSharding(mesh, {}))));
  save(tmp.path() / "c", s);
  State target;
  target.insert("a/w", Variable::abstract(kParam, {4}, DType::kI32, NamedSharding(mesh, {{"x"}})));
  target.insert("c/w", Variable::abstract(kParam, {4}, DType::kI32, NamedSharding(mesh, {{"x"}})));
  try {
    restore(rt, tmp.path() / "c", target);
    FAIL() << "expected a structural error";
  } catch (const ValueError& e) {
    EXPECT_THAT(e.what(), HasSubstr("in the target but not in the checkpoint (1):\n  c/w"));
    EXPECT_THAT(e.what(), HasSubstr("in the checkpoint but not in the target (1):\n  b/w"));
  }
  // partial: the checkpoint may hold more, but every target leaf must be there.
  EXPECT_THROW(restore(rt, tmp.path() / "c", target, {.partial = true}), ValueError);
  State only_a = target.filter(Filter::path_contains("a/"));
  State got = restore(rt, tmp.path() / "c", only_a, {.partial = true});
  EXPECT_EQ(got.paths(), std::vector<std::string>{"a/w"});
  EXPECT_EQ(to_host(got.at("a/w").array()), testing::iota({4}));
}

TEST(CheckpointRestore, ShapeMismatchNamesThePath) {
  Runtime rt = Runtime::host(2);
  TempDir tmp;
  save(tmp.path() / "c", one_leaf("enc/w", device_put(rt, testing::iota({4, 2}), NamedSharding(Mesh::parse("x=2"), {}))));
  State target;
  target.insert("enc/w", Variable::abstract(kParam, {2, 4}, DType::kI32, NamedSharding(Mesh::parse("x=2"), {})));
  try {
    restore(rt, tmp.path() / "c", target);
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'enc/w': the checkpoint holds i32[4,2], the target wants i32[2,4]"));
  }
}

TEST(CheckpointRestore, CastsBetweenFloatTypes) {
  Runtime rt = Runtime::host(4);
  TempDir tmp;
  std::mt19937 rng(3);
  HostArray h({16, 8}, DType::kF32);
  for (float& v : h.mutable_values<float>()) v = std::normal_distribution<float>()(rng);
  const Mesh mesh = Mesh::parse("x=4");
  Array x = device_put(rt, h, NamedSharding(mesh, {{"x"}}));
  save(tmp.path() / "f32", one_leaf("w", x), {.compression = Compression::zstd()});
  State to_bf16;
  to_bf16.insert("w", Variable::abstract(kParam, {16, 8}, DType::kBF16, NamedSharding(mesh, {{}, {"x"}})));
  State b = restore(rt, tmp.path() / "f32", to_bf16);
  EXPECT_EQ(to_host(b.at("w").array()), to_host(cast(x, DType::kBF16)));
  save(tmp.path() / "bf16", b);
  State to_f32;
  to_f32.insert("w", Variable::abstract(kParam, {16, 8}, DType::kF32, NamedSharding(mesh, {{"x"}})));
  State f = restore(rt, tmp.path() / "bf16", to_f32);
  EXPECT_EQ(to_host(f.at("w").array()), to_host(cast(cast(x, DType::kBF16), DType::kF32)));
}

TEST(CheckpointRestore, WithoutATargetShardingThePlacementIsExplicit) {
  Runtime rt = Runtime::host(8);
  TempDir tmp;
  const Mesh mesh = Mesh::parse("a=2,b=4");
  HostArray h = testing::iota({8, 4});
  save(tmp.path() / "c", one_leaf("w", device_put(rt, h, NamedSharding(mesh, {{"b"}, {"a"}}))));
  State unsharded;
  unsharded.insert("w", Variable::abstract(kParam, {8, 4}, DType::kI32));
  try {
    restore(rt, tmp.path() / "c", unsharded);
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_THAT(e.what(), HasSubstr("the target leaf 'w' has no sharding"));
  }
  EXPECT_THROW(restore(rt, tmp.path() / "c", TargetSpec{}), ValueError);
  State as_saved = restore(rt, tmp.path() / "c", TargetSpec{.placement = Placement::kAsSaved});
  EXPECT_EQ(as_saved.at("w").array().sharding(), NamedSharding(mesh, {{"b"}, {"a"}}));
  EXPECT_EQ(to_host(as_saved.at("w").array()), h);
  State replicated = restore(rt, tmp.path() / "c", TargetSpec{.placement = Placement::kReplicated});
  EXPECT_TRUE(replicated.at("w").array().sharding().is_fully_replicated());
  EXPECT_EQ(replicated.at("w").array().mesh().device_count(), 8);
  // A saved mesh larger than the runtime does not fit.
  Runtime small = Runtime::host(4);
  EXPECT_THAT([&] { restore(small, tmp.path() / "c", TargetSpec{.placement = Placement::kAsSaved}); },
              ::testing::ThrowsMessage<ValueError>(HasSubstr("more than the runtime's 4")));
}

TEST(CheckpointRestore, CompressedChunksAreDecodedOnceForAllDevices) {
  Runtime rt = Runtime::host(8);
  TempDir tmp;
  HostArray h = testing::iota({64, 64}, DType::kF32);
  save(tmp.path() / "c", one_leaf("w", device_put(rt, h, NamedSharding(Mesh::parse("x=8"), {{"x"}}))),
       {.compression = Compression::zstd()});
  State target;
  // Every device needs a column block, so every device needs every row chunk.
  target.insert("w", Variable::abstract(kParam, {64, 64}, DType::kF32, NamedSharding(Mesh::parse("y=8"), {{}, {"y"}})));
  RestoreStats stats;
  State got = restore(rt, tmp.path() / "c", target, {.staging_bytes = 3 * 2048 + 100}, &stats);
  EXPECT_EQ(to_host(got.at("w").array()), h);
  EXPECT_EQ(stats.chunks_read, 8);
  EXPECT_LE(stats.staging_peak, 3 * 2048 + 3 * 2200);  // decoded chunks plus their compressed bytes
  EXPECT_EQ(stats.target_bytes, 64 * 64 * 4);
}

TEST(CheckpointRestore, ChunksThatAreOneBlockDecodeStraightIntoItAndItsReplicas) {
  Runtime rt = Runtime::host(8);
  TempDir tmp;
  HostArray h = testing::iota({256, 64}, DType::kF32);
  save(tmp.path() / "c", one_leaf("w", device_put(rt, h, NamedSharding(Mesh::parse("x=4"), {{"x"}}))),
       {.compression = Compression::zstd()});
  State target;  // the saved blocks, each held by two devices
  target.insert("w", Variable::abstract(kParam, {256, 64}, DType::kF32, NamedSharding(Mesh::parse("data=2,x=4"), {{"x"}})));
  RestoreStats stats;
  State got = restore(rt, tmp.path() / "c", target, {.readers = 1}, &stats);
  EXPECT_EQ(to_host(got.at("w").array()), h);
  for (const Shard& s : got.at("w").array().shards()) {  // replicas too, not only replica 0
    SCOPED_TRACE(s.device);
    const auto values = s.buffer.as<float>();
    const auto expect = h.values<float>().subspan(static_cast<size_t>(s.box.start(0) * 64), values.size());
    EXPECT_TRUE(std::equal(values.begin(), values.end(), expect.begin()));
  }
  EXPECT_EQ(stats.chunks_read, 4);
  // A block's two holders share one buffer, each device charged for it.
  std::map<int64_t, const std::byte*> by_row;
  for (const Shard& s : got.at("w").array().shards()) {
    auto [it, fresh] = by_row.emplace(s.box.start(0), s.buffer.data());
    EXPECT_EQ(it->second, s.buffer.data()) << "device " << s.device;
  }
  EXPECT_EQ(stats.target_bytes, 2 * 256 * 64 * 4);
  // Only compressed bytes were staged: no chunk was decoded into a buffer of its own.
  EXPECT_LT(stats.staging_peak, 64 * 64 * 4);
}

TEST(CheckpointRestore, UncompressedReadsOnlyTheBytesEachDeviceNeeds) {
  Runtime rt = Runtime::host(8);
  TempDir tmp;
  HostArray h = testing::iota({64, 64}, DType::kF32);
  save(tmp.path() / "c", one_leaf("w", device_put(rt, h, NamedSharding(Mesh::parse("x=8"), {{"x"}}))));
  State target;
  target.insert("w", Variable::abstract(kParam, {64, 64}, DType::kF32, NamedSharding(Mesh::parse("y=2"), {{}, {"y"}})));
  RestoreStats stats;
  State got = restore(rt, tmp.path() / "c", target, {.partial = true}, &stats);
  EXPECT_EQ(to_host(got.at("w").array()), h);
  EXPECT_EQ(stats.bytes_read, 64 * 64 * 4);  // each byte once, no whole-chunk reads
  EXPECT_EQ(stats.staging_peak, 0);
}

// The largest chunk file of a plain-files checkpoint (the test's one large leaf has 1 MiB chunks).
fs::path a_large_chunk(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.file_size() == (int64_t{1} << 20)) return e.path();
  throw std::runtime_error("no 1 MiB chunk file in " + dir.string());
}

TEST(CheckpointRestore, BlocksThatAreOneUncompressedChunkMapItsBytes) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(20261128);
  for (bool ocdbt : {false, true}) {
    SCOPED_TRACE(ocdbt ? "ocdbt" : "files");
    TempDir tmp;
    const Mesh x2 = Mesh::parse("x=2");
    // An odd-sized value first: the large one's chunks must not happen to start at aligned offsets.
    const HostArray odd = random_host(rng, Shape{301}, DType::kF32);
    const HostArray big = random_host(rng, Shape{1024, 512}, DType::kF32);  // 1 MiB per block on x=2
    State state;
    state.insert("a", Variable(kParam, device_put(rt, odd, NamedSharding(x2, {}))));
    state.insert("w", Variable(kParam, device_put(rt, big, NamedSharding(x2, {{"x"}}))));
    save(tmp.path() / "c", state, {.use_ocdbt = ocdbt});
    State target;  // the saved blocks, each held by 4 devices
    const NamedSharding replicas(Mesh::parse("data=4,x=2"), {{"x"}});
    target.insert("a", Variable::abstract(kParam, {301}, DType::kF32, NamedSharding(x2, {})));
    target.insert("w", Variable::abstract(kParam, {1024, 512}, DType::kF32, replicas));
    RestoreStats stats;
    State got = restore(rt, tmp.path() / "c", target, {}, &stats);
    EXPECT_EQ(stats.bytes_mapped, int64_t{2} << 20);
    EXPECT_EQ(stats.bytes_read, (int64_t{2} << 20) + 301 * 4);
    EXPECT_EQ(stats.target_bytes, (int64_t{8} << 20) + 2 * 301 * 4);  // every device charged
    EXPECT_EQ(to_host(got.at("w").array()), big);
    EXPECT_EQ(to_host(got.at("a").array()), odd);
    // A block's replicas share its one mapping; the two blocks are distinct.
    std::map<int64_t, const std::byte*> by_row;
    for (const Shard& s : got.at("w").array().shards()) {
      auto [it, fresh] = by_row.emplace(s.box.start(0), s.buffer.data());
      EXPECT_EQ(it->second, s.buffer.data()) << "device " << s.device;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(s.buffer.data()) % 64, 0u);
    }
    EXPECT_EQ(by_row.size(), 2u);
    // Copying instead gives the same values.
    RestoreStats copied;
    EXPECT_EQ(to_host(restore(rt, tmp.path() / "c", target, {.map_chunks = false}, &copied).at("w").array()), big);
    EXPECT_EQ(copied.bytes_mapped, 0);
    // Blocks that are not one chunk (columns), another dtype or compressed chunks are copied.
    State columns;
    columns.insert("w", Variable::abstract(kParam, {1024, 512}, DType::kF32, NamedSharding(x2, {{}, {"x"}})));
    EXPECT_EQ(to_host(restore(rt, tmp.path() / "c", columns, {.partial = true}, &copied).at("w").array()), big);
    EXPECT_EQ(copied.bytes_mapped, 0);
    State bf16;
    bf16.insert("w", Variable::abstract(kParam, {1024, 512}, DType::kBF16, replicas));
    EXPECT_EQ(to_host(restore(rt, tmp.path() / "c", bf16, {.partial = true}, &copied).at("w").array()),
              to_host(cast(device_put(rt, big, replicas), DType::kBF16)));
    EXPECT_EQ(copied.bytes_mapped, 0);
    save(tmp.path() / "z", state, {.compression = Compression::zstd(), .use_ocdbt = ocdbt});
    EXPECT_EQ(to_host(restore(rt, tmp.path() / "z", target, {}, &copied).at("w").array()), big);
    EXPECT_EQ(copied.bytes_mapped, 0);
    // The mapped arrays outlive the checkpoint's files.
    fs::remove_all(tmp.path() / "c");
    EXPECT_EQ(to_host(got.at("w").array()), big);
  }
}

TEST(CheckpointRestore, MappedChunksAreCheckedLikeReadOnes) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(7);
  TempDir tmp;
  const HostArray big = random_host(rng, Shape{1024, 512}, DType::kF32);
  const NamedSharding rows(Mesh::parse("x=2"), {{"x"}});
  save(tmp.path() / "c", one_leaf("w", device_put(rt, big, rows)), {.use_ocdbt = false});
  State target;
  target.insert("w", Variable::abstract(kParam, {1024, 512}, DType::kF32, rows));
  const fs::path chunk = a_large_chunk(tmp.path() / "c");
  {
    std::fstream f(chunk, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12345);
    f.put('\x5a');
  }
  EXPECT_THAT([&] { restore(rt, tmp.path() / "c", target); },
              ::testing::ThrowsMessage<ValueError>(HasSubstr("CRC-32C mismatch")));
  // Unchecked, the mapping holds the file's bytes as they are.
  RestoreStats stats;
  const Array got = restore(rt, tmp.path() / "c", target, {.verify_checksums = false}, &stats).at("w").array();
  EXPECT_EQ(stats.bytes_mapped, int64_t{2} << 20);
  EXPECT_NE(to_host(got), big);
  // A chunk file cut short is never mapped: the read reports it.
  fs::resize_file(chunk, (int64_t{1} << 20) - 4096);
  EXPECT_THAT([&] { restore(rt, tmp.path() / "c", target); },
              ::testing::ThrowsMessage<ValueError>(HasSubstr("an uncompressed chunk of")));
}

// A shard above max_chunk_bytes is saved as several chunks; when they are runs of the block's
// rows (whole pages each), the restore maps them side by side into one buffer.
TEST(CheckpointRestore, BlocksOfSeveralChunksMapThemSideBySide) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(20261129);
  const Mesh x2 = Mesh::parse("x=2");
  const HostArray rows = random_host(rng, Shape{2048, 1024}, DType::kF32);       // 4 chunks of 256 rows a block
  const HostArray planes = random_host(rng, Shape{2, 1024, 512}, DType::kF32);   // [1, 512, 512] chunks
  const HostArray columns = random_host(rng, Shape{1024, 2048}, DType::kF32);    // [1024, 256]: not runs
  const HostArray ragged = random_host(rng, Shape{1200, 1001}, DType::kF32);     // [300, 1001]: not whole pages
  for (bool ocdbt : {false, true}) {
    SCOPED_TRACE(ocdbt ? "ocdbt" : "files");
    TempDir tmp;
    State state;
    state.insert("rows", Variable(kParam, device_put(rt, rows, NamedSharding(x2, {{"x"}}))));
    state.insert("planes", Variable(kParam, device_put(rt, planes, NamedSharding(x2, {{"x"}}))));
    state.insert("columns", Variable(kParam, device_put(rt, columns, NamedSharding(x2, {{}, {"x"}}))));
    state.insert("ragged", Variable(kParam, device_put(rt, ragged, NamedSharding(x2, {{"x"}}))));
    save(tmp.path() / "c", state, {.use_ocdbt = ocdbt, .max_chunk_bytes = int64_t{3} << 19});
    State target;  // the saved shardings, each block held by 4 devices
    const Mesh mesh = Mesh::parse("data=4,x=2");
    target.insert("rows", Variable::abstract(kParam, {2048, 1024}, DType::kF32, NamedSharding(mesh, {{"x"}})));
    target.insert("planes", Variable::abstract(kParam, {2, 1024, 512}, DType::kF32, NamedSharding(mesh, {{"x"}})));
    target.insert("columns", Variable::abstract(kParam, {1024, 2048}, DType::kF32, NamedSharding(mesh, {{}, {"x"}})));
    target.insert("ragged", Variable::abstract(kParam, {1200, 1001}, DType::kF32, NamedSharding(mesh, {{"x"}})));
    RestoreStats stats;
    const State got = restore(rt, tmp.path() / "c", target, {}, &stats);
    EXPECT_EQ(stats.bytes_mapped, int64_t{12} << 20) << "rows and planes; columns and ragged are read";
    EXPECT_EQ(to_host(got.at("rows").array()), rows);
    EXPECT_EQ(to_host(got.at("planes").array()), planes);
    EXPECT_EQ(to_host(got.at("columns").array()), columns);
    EXPECT_EQ(to_host(got.at("ragged").array()), ragged);
    for (const Shard& s : got.at("rows").array().shards())
      EXPECT_EQ(reinterpret_cast<uintptr_t>(s.buffer.data()) % 4096, 0u);
    // Each chunk of a mapped block is checked: one flipped byte in the third chunk of a block.
    if (!ocdbt) {
      const fs::path chunk = tmp.path() / "c" / "rows" / "2.0";
      ASSERT_TRUE(fs::exists(chunk));
      {
        std::fstream f(chunk, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(777);
        f.put(static_cast<char>(~f.peek()));
      }
      EXPECT_THAT([&] { restore(rt, tmp.path() / "c", target); },
                  ::testing::ThrowsMessage<ValueError>(HasSubstr("CRC-32C mismatch")));
      // A chunk cut short keeps its block unmapped, and the read reports it.
      fs::resize_file(chunk, (int64_t{1} << 20) - 4096);
      EXPECT_THAT([&] { restore(rt, tmp.path() / "c", target); },
                  ::testing::ThrowsMessage<ValueError>(HasSubstr("an uncompressed chunk of")));
    }
  }
}

// Mapped chunks do not keep their files open: a plain-files checkpoint may have more chunk files
// than the process may hold open at once.
TEST(CheckpointRestore, MappingChunksHoldsNoFileOpen) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(5);
  TempDir tmp;
  const HostArray h = random_host(rng, Shape{64 * 1024, 256}, DType::kF32);  // 64 chunks of 1 MiB
  const NamedSharding rows(Mesh::parse("x=2"), {{"x"}});
  save(tmp.path() / "c", one_leaf("w", device_put(rt, h, rows)), {.use_ocdbt = false, .max_chunk_bytes = int64_t{1} << 20});
  State target;
  target.insert("w", Variable::abstract(kParam, h.shape(), DType::kF32, rows));
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = 48;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  RestoreStats stats;
  std::optional<State> got;
  std::string error;
  try {
    got = restore(rt, tmp.path() / "c", target, {}, &stats);
  } catch (const std::exception& e) {
    error = e.what();
  }
  ::setrlimit(RLIMIT_NOFILE, &saved);
  ASSERT_TRUE(got) << error;
  EXPECT_EQ(stats.bytes_mapped, int64_t{64} << 20);
  EXPECT_EQ(to_host(got->at("w").array()), h);
}

TEST(CheckpointRestore, ColumnBlocksOfRowChunksAreReadOnceInSlabs) {
  Runtime rt = Runtime::host(8);
  TempDir tmp;
  HostArray h = testing::iota({512, 64}, DType::kF32);
  save(tmp.path() / "c", one_leaf("w", device_put(rt, h, NamedSharding(Mesh::parse("x=8"), {{"x"}}))));
  State target;
  target.insert("w", Variable::abstract(kParam, {512, 64}, DType::kF32, NamedSharding(Mesh::parse("y=8"), {{}, {"y"}})));
  RestoreStats stats;
  State got = restore(rt, tmp.path() / "c", target, {}, &stats);
  EXPECT_EQ(to_host(got.at("w").array()), h);
  EXPECT_EQ(stats.bytes_read, 512 * 64 * 4);  // each chunk once, not once per 32-byte piece
  EXPECT_GT(stats.staging_peak, 0);
  EXPECT_LE(stats.staging_peak, 2 * 64 * 64 * 4);
}

TEST(OrbaxCompat, LegacyZarrArraysRestore) {
  Runtime rt = Runtime::host(2);
  const fs::path dir = testing::testdata("orbax/legacy/aggregate_some.checkpoint");
  const Mesh mesh = Mesh::parse("x=2");
  State target;
  target.insert("a", Variable::abstract(kParam, {8}, DType::kI64, NamedSharding(mesh, {{"x"}})));
  target.insert("b", Variable::abstract(kParam, {16}, DType::kI64, NamedSharding(mesh, {})));
  State got = restore(rt, dir, target, {.partial = true});
  std::vector<int64_t> a(8), b(16);
  for (int i = 0; i < 8; ++i) a[i] = i;
  for (int i = 0; i < 16; ++i) b[i] = 2 * i;
  EXPECT_EQ(to_host(got.at("a").array()), HostArray::from<int64_t>({8}, a));
  EXPECT_EQ(to_host(got.at("b").array()), HostArray::from<int64_t>({16}, b));
  // Strict: the msgpack-aggregated leaves are listed, and asking for one says why it cannot come.
  EXPECT_THAT([&] { restore(rt, dir, target); }, ::testing::ThrowsMessage<ValueError>(HasSubstr("c/a")));
  State c;
  c.insert("c/a", Variable::abstract(kParam, {2, 4}, DType::kI64, NamedSharding(mesh, {})));
  EXPECT_THAT([&] { restore(rt, dir, c, {.partial = true}); },
              ::testing::ThrowsMessage<ValueError>(HasSubstr("aggregate msgpack")));
  // Without _sharding, as_saved has nothing to go by.
  EXPECT_THAT([&] { restore(rt, dir, TargetSpec{.placement = Placement::kAsSaved, .paths = {"a"}}); },
              ::testing::ThrowsMessage<ValueError>(HasSubstr("no saved NamedSharding")));
}

}  // namespace
}  // namespace tessel
