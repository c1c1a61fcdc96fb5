// Targets for checkpoints from elsewhere: saved on a mesh whose axes the target lacks, restored
// through an axis map, specs by path (MaxText's named dump, or {path: spec}) or logical axes and
// rules; subtrees selected by glob and moved by prefix.
#include <fstream>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../runtime/runtime_test_util.h"
#include "../test_util.h"
#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/target.h"
#include "tessel/core/error.h"
#include "tessel/sharding/spec_io.h"

namespace tessel {
namespace {
// The ladder on `mesh` for the item in `dir`.
State restore_target(const std::filesystem::path& dir, const Mesh& mesh, TargetSpec spec = {}) {
  spec.mesh = mesh;
  return make_target(CheckpointItem::open(dir), spec);
}

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using testing::TempDir;

struct Saved {
  TempDir tmp;
  std::map<std::string, HostArray> values;
  fs::path item() const { return tmp.path() / "item"; }
};

// A MaxText-like TrainState saved on x=2,y=4 (axes no target mesh here has).
std::unique_ptr<Saved> save_foreign(const Runtime& rt) {
  auto s = std::make_unique<Saved>();
  const Mesh mesh = Mesh::parse("x=2,y=4");
  State state;
  auto put = [&](const std::string& path, const Shape& shape, PartitionSpec spec) {
    HostArray h = testing::iota(shape, DType::kF32);
    state.insert(path, Variable(kParam, device_put(rt, h, NamedSharding(mesh, std::move(spec)))));
    s->values.emplace(path, std::move(h));
  };
  put("params/params/decoder/mlp/wi/kernel", {8, 16}, {{"x"}, {"y"}});
  put("params/params/decoder/mlp/wo/kernel", {16, 8}, {{"y"}, {"x"}});
  put("params/params/token_embedder/embedding", {32, 8}, {{"x", "y"}});
  put("opt_state/0/mu/params/decoder/mlp/wi/kernel", {8, 16}, {{"x"}, {"y"}});
  put("step", {}, {});
  save(s->item(), state);
  return s;
}

void expect_values(const State& got, const Saved& s, const Mesh& mesh) {
  for (const auto& [path, v] : got) {
    EXPECT_EQ(to_host(v.array()), s.values.at(path)) << path;
    EXPECT_EQ(v.array().mesh(), mesh) << path;
  }
}

TEST(ForeignTarget, MissingAxesNameTheLeavesAndTheThreeWaysOut) {
  Runtime rt = Runtime::host(8);
  auto s = save_foreign(rt);
  const Mesh mesh = Mesh::parse("data=2,model=4");
  try {
    restore_target(s->item(), mesh);
    FAIL() << "accepted";
  } catch (const ValueError& e) {
    const std::string m = e.what();
    EXPECT_THAT(m, HasSubstr("4 of the arrays"));
    EXPECT_THAT(m, HasSubstr("params/params/decoder/mlp/wi/kernel f32[8,16]"));
    EXPECT_THAT(m, HasSubstr("lacks x, y"));
    for (const char* way : {"--logical-axes", "--shardings", "--axis-map"}) EXPECT_THAT(m, HasSubstr(way));
  }
}

TEST(ForeignTarget, AxisMapRenamesAndDropsSavedAxes) {
  Runtime rt = Runtime::host(8);
  auto s = save_foreign(rt);
  const Mesh mesh = Mesh::parse("data=2,model=4");
  TargetSpec o;
  o.axis_map = parse_axis_map("x=data, y=model");
  State target = restore_target(s->item(), mesh, o);
  EXPECT_EQ(target.at("params/params/token_embedder/embedding").sharding()->spec(), (PartitionSpec{{"data", "model"}}));
  expect_values(restore(rt, s->item(), target), *s, mesh);
  o.axis_map = parse_axis_map("x=,y=model");
  target = restore_target(s->item(), mesh, o);
  EXPECT_EQ(target.at("params/params/decoder/mlp/wi/kernel").sharding()->spec(), (PartitionSpec{{}, {"model"}}));
  expect_values(restore(rt, s->item(), target), *s, mesh);
  o.axis_map = parse_axis_map("y=model,*=");  // every other axis the mesh lacks: dropped
  target = restore_target(s->item(), mesh, o);
  EXPECT_EQ(target.at("params/params/token_embedder/embedding").sharding()->spec(), (PartitionSpec{{"model"}}));
  expect_values(restore(rt, s->item(), target), *s, mesh);
  EXPECT_THROW(parse_axis_map("x"), ValueError);
}

TEST(ForeignTarget, SpecsFromMaxTextsNamedDumpOrAPlainMap) {
  Runtime rt = Runtime::host(8);
  auto s = save_foreign(rt);
  const Mesh mesh = Mesh::parse("fsdp=8");
  // MaxText's named_shardings.json keys; a dump covering more than the item is fine.
  std::vector<NamedEntry> entries = {
      {".params/['params']/['decoder']/['mlp']/['wi']/['kernel']", PartitionSpec{{"fsdp"}}, Shape({8, 16})},
      {".params/['params']/['decoder']/['mlp']/['wo']/['kernel']", PartitionSpec{{}, {"fsdp"}}, Shape({16, 8})},
      {".params/['params']/['token_embedder']/['embedding']", PartitionSpec{{"fsdp"}}, Shape({32, 8})},
      {".opt_state/[0]/.mu/['params']/['decoder']/['mlp']/['wi']/['kernel']", PartitionSpec{{"fsdp"}}, Shape({8, 16})},
      {".opt_state/[0]/.nu/['params']/['other']", PartitionSpec{{"fsdp"}}, Shape({8})},
      {".step", PartitionSpec{}, Shape()},
  };
  std::ofstream(s->tmp.path() / "named.json") << named_dump_json(entries, mesh);
  TargetSpec o;
  o.specs = load_target_specs(s->tmp.path() / "named.json");
  EXPECT_TRUE(o.specs.contains("opt_state/0/mu/params/decoder/mlp/wi/kernel"));
  State target = restore_target(s->item(), mesh, o);
  EXPECT_EQ(target.at("params/params/decoder/mlp/wo/kernel").sharding()->spec(), (PartitionSpec{{}, {"fsdp"}}));
  expect_values(restore(rt, s->item(), target), *s, mesh);
  // {path: spec} as JAX writes specs; the leaves it leaves out keep their own way (here: an axis map).
  std::ofstream(s->tmp.path() / "plain.json") << R"({"params/params/decoder/mlp/wi/kernel": [null, "fsdp"],
      "params.params.token_embedder.embedding": [["fsdp"]]})";
  o.specs = load_target_specs(s->tmp.path() / "plain.json");
  o.axis_map = {{"x", "fsdp"}, {"y", ""}};
  target = restore_target(s->item(), mesh, o);
  EXPECT_EQ(target.at("params/params/decoder/mlp/wi/kernel").sharding()->spec(), (PartitionSpec{{}, {"fsdp"}}));
  EXPECT_EQ(target.at("opt_state/0/mu/params/decoder/mlp/wi/kernel").sharding()->spec(), (PartitionSpec{{"fsdp"}, {}}));
  expect_values(restore(rt, s->item(), target), *s, mesh);
  // Specs for another tree altogether: an error showing both sides.
  std::ofstream(s->tmp.path() / "other.json") << R"({"decoder/mlp/wi/kernel": [null, "fsdp"]})";
  o.specs = load_target_specs(s->tmp.path() / "other.json");
  EXPECT_THAT([&] { restore_target(s->item(), mesh, o); },
              ThrowsMessage<ValueError>(HasSubstr("name none of the arrays")));
}

TEST(ForeignTarget, OneDeviceTakesAnySavedSpecAndGivenSpecsNeedTheirAxes) {
  Runtime rt = Runtime::host(8);
  auto s = save_foreign(rt);
  // On one device nothing is split: the saved specs' axes x, y need not exist there.
  const Mesh one = Mesh::parse("host=1");
  const State target = restore_target(s->item(), one);
  for (const auto& [path, v] : target) EXPECT_TRUE(v.sharding()->is_fully_replicated()) << path;
  expect_values(restore(rt, s->item(), target), *s, one);
  // A given spec naming an axis the target mesh lacks says how to give the mesh its axes.
  TargetSpec o;
  o.specs = {{"params/params/decoder/mlp/wi/kernel", PartitionSpec{{"data"}, {"fsdp"}}}};
  EXPECT_THAT([&] { restore_target(s->item(), Mesh::parse("fsdp=8"), o); },
              ThrowsMessage<ValueError>(AllOf(HasSubstr("params/params/decoder/mlp/wi/kernel"), HasSubstr("data"),
                                              HasSubstr("--rules"))));
}

TEST(ForeignTarget, LogicalAxesFromMaxTextsLogicalDumpWithRules) {
  Runtime rt = Runtime::host(8);
  auto s = save_foreign(rt);
  const Mesh mesh = Mesh::parse("fsdp=4,tensor=2");
  std::ofstream(s->tmp.path() / "logical.json") << R"({
    ".params/['params']/['decoder']/['mlp']/['wi']/['kernel']": {"partition_spec": ["embed", "mlp"], "shape": [8, 16]},
    ".params/['params']/['decoder']/['mlp']/['wo']/['kernel']": {"partition_spec": ["mlp", "embed"], "shape": [16, 8]},
    ".params/['params']/['token_embedder']/['embedding']": {"partition_spec": ["vocab", "embed"], "shape": [32, 8]},
    ".opt_state/[0]/.mu/['params']/['decoder']/['mlp']/['wi']/['kernel']": {"partition_spec": ["embed", "mlp"], "shape": [8, 16]},
    ".step": {"partition_spec": [], "shape": []}})";
  TargetSpec o;
  o.logical_axes = load_target_logical_axes(s->tmp.path() / "logical.json");
  EXPECT_THAT([&] { restore_target(s->item(), mesh, o); }, ThrowsMessage<ValueError>(HasSubstr("need rules")));
  o.rules = LogicalRules({{"embed", {"fsdp"}}, {"mlp", {"tensor"}}, {"vocab", {"tensor"}}});
  State target = restore_target(s->item(), mesh, o);
  EXPECT_EQ(target.at("params/params/decoder/mlp/wo/kernel").sharding()->spec(), (PartitionSpec{{"tensor"}, {"fsdp"}}));
  EXPECT_EQ(target.at("params/params/token_embedder/embedding").sharding()->spec(), (PartitionSpec{{"tensor"}, {"fsdp"}}));
  expect_values(restore(rt, s->item(), target), *s, mesh);
}

TEST(ForeignTarget, DumpKeysBecomePaths) {
  EXPECT_EQ(path_from_dump_key(".params/['params']/['decoder']/['layers']/['mlp']"), "params/params/decoder/layers/mlp");
  EXPECT_EQ(path_from_dump_key(".opt_state/[0]/.mu/['params']/['x']"), "opt_state/0/mu/params/x");
  EXPECT_EQ(path_from_dump_key(".step"), "step");
  EXPECT_EQ(path_from_dump_key("decoder/x"), "decoder/x");
  EXPECT_THROW(path_from_dump_key(".a//['b']"), ValueError);
}

TEST(ForeignTarget, SelectAndRenameSubtrees) {
  Runtime rt = Runtime::host(8);
  auto s = save_foreign(rt);
  const State saved = CheckpointItem::open(s->item()).abstract_state();
  EXPECT_EQ(select_paths(saved, {"params.params.decoder.*"}),
            (std::vector<std::string>{"params/params/decoder/mlp/wi/kernel", "params/params/decoder/mlp/wo/kernel"}));
  EXPECT_EQ(select_paths(saved, {"opt_state/0/mu/*", "step"}).size(), 2u);
  EXPECT_THAT([&] { select_paths(saved, {"nothing.*"}); }, ThrowsMessage<ValueError>(HasSubstr("matches none")));
  const State moved = rename_prefixes(saved, parse_renames("params.params=,opt_state/0/mu=mu"));
  EXPECT_EQ(moved.paths(), (std::vector<std::string>{"decoder/mlp/wi/kernel", "decoder/mlp/wo/kernel", "mu/params/decoder/mlp/wi/kernel",
                                                      "step", "token_embedder/embedding"}));
  EXPECT_THAT([&] { rename_prefixes(saved, parse_renames("params.params.decoder.mlp.wi=q,params.params.decoder.mlp.wo=q")); },
              ThrowsMessage<ValueError>(HasSubstr("both")));
  EXPECT_THAT([&] { rename_prefixes(saved, parse_renames("step=")); }, ThrowsMessage<ValueError>(HasSubstr("leaves no path")));
  // "params.param" is not a level prefix of "params/params/...".
  EXPECT_EQ(rename_prefixes(saved, parse_renames("params.param=z")).paths(), saved.paths());
}

}  // namespace
}  // namespace tessel
