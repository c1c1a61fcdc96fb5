// The tessel executable end to end: outputs, exit codes, and one-line errors.
#include <sys/wait.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli_test_util.h"
#include "test_util.h"

namespace tessel {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

std::string maxtext(const std::string& file) { return testing::testdata("maxtext/" + file).string(); }

TEST(ShardingsCli, ReproducesMaxTextGoldenDumpByteForByte) {
  Result r = run("shardings --rules " + maxtext("base.yml") + " --logical " +
                 maxtext("qwen3-0.6b_tpu7x-16_default/logical_shardings.json") + " --mesh fsdp=16");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");
  std::string golden = testing::read_file(maxtext("qwen3-0.6b_tpu7x-16_default/named_shardings.json"));
  EXPECT_EQ(r.out, golden + "\n");
}

TEST(ShardingsCli, FullMeshSpellingGivesTheSameOutput) {
  std::string mesh = "diloco=1,data=1,stage=1,fsdp=16,fsdp_transpose=1,context=1,context_usp_ulysses=1,"
                     "context_autoregressive=1,tensor=1,tensor_sequence=1,expert=1,autoregressive=1";
  testing::TempDir dir;
  std::string out = (dir.path() / "named.json").string();
  Result r = run("shardings --rules " + maxtext("base.yml") + " --logical " +
                 maxtext("qwen3-0.6b_tpu7x-16_default/logical_shardings.json") + " --mesh " + mesh + " --out " + out);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(testing::read_file(out), testing::read_file(maxtext("qwen3-0.6b_tpu7x-16_default/named_shardings.json")) + "\n");
}

TEST(ShardingsCli, ExplainShowsEachRuleTried) {
  Result r = run("shardings --rules " + maxtext("base.yml") + " --logical " +
                 maxtext("qwen3-0.6b_tpu7x-16_default/logical_shardings.json") +
                 " --mesh fsdp=4,tensor=4 --remove-size-one-axes --explain");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("['mlp']/['wi_0']/['kernel']  shape [1024, 28, 3072]  logical (embed, layers, mlp)"));
  EXPECT_THAT(r.out, HasSubstr("skipped, mesh axis 'fsdp_transpose' is already used by dim 2 'mlp'"));
  EXPECT_THAT(r.out, HasSubstr("removed size-1 mesh axes: context, context_usp_ulysses, expert"));
  EXPECT_THAT(r.out, HasSubstr("spec: PartitionSpec('fsdp', None, 'tensor')"));
}

TEST(ShardingsCli, ShowDrawsOneSharding) {
  Result r = run("shardings --mesh fsdp=2,tensor=2 --spec '[\"fsdp\", \"tensor\"]' --shape 4,4 --show");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("4 distinct shards, 1 copy each"));
  EXPECT_THAT(r.out, HasSubstr("0:2 │  0  │  1  │"));
  Result boxes = run("shardings --mesh fsdp=4 --spec '[\"fsdp\"]' --shape 10");
  ASSERT_EQ(boxes.rc, 0) << boxes.err;
  EXPECT_THAT(boxes.out, HasSubstr("device    3  [9:10]  replica 0"));
}

TEST(ShardingsCli, BundledExampleResolvesStrictly) {
  std::string ex = std::string(TESSEL_EXAMPLES_DIR) + "/shardings/";
  Result r = run("shardings --rules " + ex + "rules.yml --logical " + ex + "tiny_lm_logical.json" +
                 " --mesh data=2,fsdp=2,tensor=2 --strict");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["params/token_embedder/embedding"]["partition_spec"], nlohmann::json::parse(R"(["tensor", "fsdp"])"));
  EXPECT_EQ(j["params/decoder/final_norm/scale"]["partition_spec"], nlohmann::json::parse(R"([["fsdp", "tensor"]])"));
  EXPECT_EQ(j["params/decoder/layers/mlp/wo/kernel"]["partition_spec"], nlohmann::json::parse(R"(["tensor", null, "fsdp"])"));
}

TEST(ShardingsCli, HelpDocumentsTheOptions) {
  Result r = run("shardings --help");
  EXPECT_EQ(r.rc, 0);
  for (const char* flag : {"--rules", "--logical", "--mesh", "--remove-size-one-axes", "--drop-indivisible",
                           "--strict", "--explain", "--out", "--spec", "--shape", "--show"})
    EXPECT_THAT(r.out, HasSubstr(flag));
}

TEST(ShardingsCli, BadInputsGiveOneClearLine) {
  testing::TempDir dir;
  auto logical = maxtext("qwen3-0.6b_tpu7x-16_default/logical_shardings.json");
  auto broken_yaml = dir.write("broken.yml", "logical_axis_rules: [\n  [embed, fsdp],\n  [mlp, [tensor\n");
  auto rules = dir.write("r.yml", "logical_axis_rules: [[embed, [fsdp, stage]], [mlp, fsdp], [mlp, stage]]\n");
  auto one = dir.write("one.json", R"({"w": {"partition_spec": ["embed", "mlp"], "shape": [8, 8]}})");
  auto dup = dir.write("dup.json", R"({"w": {"partition_spec": ["embed", "embed"], "shape": [8, 8]}})");
  auto bad_json = dir.write("bad.json", "{\"w\": {\"partition_spec\": [\"embed\"],\n \"shape\": [8,]}}");

  expect_one_line_error(run("shardings --rules " + broken_yaml.string() + " --logical " + logical + " --mesh fsdp=4"),
                        1, "broken.yml:");
  expect_one_line_error(run("shardings --rules " + rules.string() + " --logical " + one.string() + " --mesh fsdp=0"),
                        1, "'fsdp' has size 0");
  expect_one_line_error(run("shardings --rules " + rules.string() + " --logical " + one.string() + " --mesh fsdp=x"),
                        1, "size 'x', not an integer");
  expect_one_line_error(run("shardings --rules " + rules.string() + " --logical " + dup.string() + " --mesh fsdp=4"),
                        1, "logical axis 'embed' names both dimension 0 and dimension 1");
  expect_one_line_error(run("shardings --rules " + rules.string() + " --logical " + bad_json.string() + " --mesh fsdp=4"),
                        1, "bad.json:2:");
  expect_one_line_error(
      run("shardings --rules " + rules.string() + " --logical " + one.string() + " --mesh fsdp=4,stage=2 --strict"),
      1, "w: dimension 1 ('mlp') ends unsharded because every rule for 'mlp' is blocked");
  expect_one_line_error(run("shardings --rules " + rules.string() + " --logical " + one.string() + " --mesh tensor=4"),
                        1, "has no such axis");
  expect_one_line_error(run("shardings --mesh fsdp=4 --spec '[\"tensor\"]' --shape 8"), 1, "mesh axis 'tensor'");
  expect_one_line_error(run("shardings --mesh fsdp=4 --spec '[\"fsdp\", null]' --shape 8"), 1,
                        "2 entries but the array shape [8] has rank 1");
  expect_one_line_error(run("shardings --mesh fsdp=4 --spec '[\"fsdp\", \"fsdp\"]' --shape 8,8"), 1, "'fsdp' twice");
  expect_one_line_error(run("shardings --mesh fsdp=4 --spec '[\"fsdp\"' --shape 8"), 1, "--spec:1:");
  expect_one_line_error(run("shardings --mesh fsdp=4 --spec '[\"fsdp\"]' --shape 8,-1"), 1, "negative size");
  expect_one_line_error(run("shardings --mesh fsdp=4"), 1, "nothing to do");
  expect_one_line_error(run("shardings --mesh fsdp=4 --rules " + rules.string()), 1, "--rules needs --logical");
  expect_one_line_error(run("shardings --mesh fsdp=4 --rules " + rules.string() + " --logical " + one.string() +
                            " --spec '[]' --shape 1"), 1, "not both");
  expect_one_line_error(run("shardings --rules /no/such.yml --logical " + logical + " --mesh fsdp=4"), 2,
                        "/no/such.yml");
  expect_one_line_error(run("shardings --spec '[]' --shape 2"), 1, "give --mesh");
  expect_one_line_error(run("shardings --mesh a=1 --bogus"), 2, "--bogus");
  expect_one_line_error(run(""), 2, "subcommand");
  expect_one_line_error(run("shardings --rules " + rules.string() + " --logical " + one.string() +
                            " --mesh fsdp=4,stage=2 --out /no/such/dir/out.json"), 1, "cannot open '/no/such/dir/out.json'");
}

}  // namespace
}  // namespace tessel
