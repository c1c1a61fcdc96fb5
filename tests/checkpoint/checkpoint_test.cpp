// Save/restore round trips, the on-disk layout, structure and dtype handling, and bounded reads.
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../runtime/runtime_test_util.h"
#include "test_util.h"
#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/metadata.h"
#include "tessel/checkpoint/zarr.h"
#include "tessel/core/error.h"
#include "tessel/runtime/cast.h"
#include "tessel/sharding/rules_io.h"
#include "tessel/state/init.h"
#include "tessel/state/model_config.h"

namespace tessel {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::TempDir;

HostArray random_host(std::mt19937& rng, const Shape& shape, DType dtype) {
  HostArray h(shape, dtype);
  for (auto& b : h.mutable_bytes()) b = static_cast<std::byte>(rng());
  if (dtype == DType::kBool) {
    for (auto& b : h.mutable_bytes()) b = static_cast<std::byte>(static_cast<unsigned>(b) & 1);
  }
  return h;
}

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
    EXPECT_TRUE(verify(tmp.path() / "ckpt").faults.empty());
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
  save(dir, s);
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
  save(tmp.path() / "c", one_leaf("w", device_put(rt, h, NamedSharding(mesh, {{"fsdp"}}))), options);
  const ZarrArray z = ZarrArray::parse(testing::read_file(tmp.path() / "c" / "w" / ".zarray"), "w");
  EXPECT_LE(z.chunk_bytes(), 1000);
  EXPECT_EQ(32 % z.chunks()[0], 0);
  EXPECT_EQ(30 % z.chunks()[1], 0);
  // Chunks tile the shards exactly, and restoring any way gives the values back.
  State again = restore(rt, tmp.path() / "c", RestoreOptions{.fallback = Placement::kReplicated, .mesh = Mesh::parse("r=3")});
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
  EXPECT_THROW(restore(rt, tmp.path() / "c", RestoreOptions{}), ValueError);
  State as_saved = restore(rt, tmp.path() / "c", unsharded, {.fallback = Placement::kAsSaved});
  EXPECT_EQ(as_saved.at("w").array().sharding(), NamedSharding(mesh, {{"b"}, {"a"}}));
  EXPECT_EQ(to_host(as_saved.at("w").array()), h);
  State replicated = restore(rt, tmp.path() / "c", RestoreOptions{.fallback = Placement::kReplicated});
  EXPECT_TRUE(replicated.at("w").array().sharding().is_fully_replicated());
  EXPECT_EQ(replicated.at("w").array().mesh().device_count(), 8);
  // A saved mesh larger than the runtime does not fit.
  Runtime small = Runtime::host(4);
  EXPECT_THAT([&] { restore(small, tmp.path() / "c", RestoreOptions{.fallback = Placement::kAsSaved}); },
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
  State unsharded;
  unsharded.insert("a", Variable::abstract(kParam, {8}, DType::kI64));
  EXPECT_THAT([&] { restore(rt, dir, unsharded, {.partial = true, .fallback = Placement::kAsSaved}); },
              ::testing::ThrowsMessage<ValueError>(HasSubstr("no saved NamedSharding")));
}

}  // namespace
}  // namespace tessel
