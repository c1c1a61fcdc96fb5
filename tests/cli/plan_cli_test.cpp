// tessel plan end to end: tables, JSON, MaxText's base.yml on an abstract mesh, and bad inputs.
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli_test_util.h"

namespace tessel {
namespace {

const std::string kModels = std::string(TESSEL_EXAMPLES_DIR) + "/models/";
const std::string kBase = testing::testdata("maxtext/base.yml").string();

TEST(PlanCli, PrintsBytesPerDeviceReplicatedParametersAndTheShardingCheck) {
  Result r = run("plan --model " + kModels + "transformer.yml --mesh data=2,fsdp=2,tensor=2 --rules " + kModels +
                 "rules.yml --optimizer adamw --params");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("memory plan on Mesh(data=2, fsdp=2, tensor=2) (8 devices): 3,016,960 parameters in 11 arrays"));
  EXPECT_THAT(r.out, HasSubstr("opt (adamw)"));
  EXPECT_THAT(r.out, HasSubstr("decoder/decoder_norm/scale"));
  EXPECT_THAT(r.out, HasSubstr("sufficiently sharded: yes"));
  EXPECT_THAT(r.out, HasSubstr("PartitionSpec('fsdp', None, 'tensor')"));  // --params: mlp/wi/kernel
}

TEST(PlanCli, InitOnVirtualDevicesMatchesThePlanPerDevice) {
  Result r = run("plan --model " + kModels + "transformer.yml --mesh data=2,fsdp=2,tensor=2 --rules " + kModels +
                 "rules.yml --init 3 --devices 8");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("init (seed 3): 11 parameters, 11.51 MiB on 8 devices"));
  EXPECT_THAT(r.out, HasSubstr("every device's peak equals its planned bytes"));
  expect_one_line_error(run("plan --model " + kModels + "transformer.yml --mesh fsdp=4 --rules " + kModels +
                            "rules.yml --init 0 --devices 2"),
                        1, "uses device 2, but the runtime has devices 0 to 1");
  expect_one_line_error(run("plan --model " + kModels + "transformer.yml --mesh fsdp=4 --rules " + kModels +
                            "rules.yml --init 0 --devices 4 --device-memory 1MiB"),
                        1, "out of memory");
}

TEST(PlanCli, Plans405BOnAn8192DeviceMeshWithBaseYml) {
  Result r = run("plan --model " + kModels + "llama3.1-405b.yml --mesh data=16,fsdp=64,tensor=8 --rules " + kBase +
                 " --remove-size-one-axes --optimizer adamw --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["device_count"], 8192);
  EXPECT_EQ(j["param_count"], 405853388800);
  EXPECT_EQ(j["sufficiently_sharded"]["ok"], true);
  // AdamW: params + gradients + two moments, bf16, split 512 ways (fsdp x tensor) up to rounding.
  double per_device = j["per_device"]["total"]["max"].get<double>();
  EXPECT_NEAR(per_device, 4 * 2 * 405853388800.0 / 512, 0.01 * per_device);
}

TEST(PlanCli, CheckFailsWhenParametersAreNotSufficientlySharded) {
  testing::TempDir dir;
  std::string rules = (dir.path() / "rules.yml").string();
  std::ofstream(rules) << "logical_axis_rules: [['embed', 'fsdp']]\n";  // mlp stays replicated on tensor
  Result r = run("plan --model " + kModels + "dot_relu_dot.yml --mesh fsdp=2,tensor=2 --rules " + rules + " --check");
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.out, HasSubstr("sufficiently sharded: NO"));
  EXPECT_THAT(r.err, HasSubstr("not sufficiently sharded: 100.00% of parameter bytes"));
}

TEST(PlanCli, BadInputsGiveOneClearLine) {
  testing::TempDir dir;
  std::string bad = (dir.path() / "bad.yml").string();
  std::ofstream(bad) << "model: transformer\nembed: 64\nheads: 5\n";
  expect_one_line_error(run("plan --model " + bad + " --mesh fsdp=2 --rules " + kModels + "rules.yml"), 1,
                        "heads (5) must divide embed (64)");
  std::string typo = (dir.path() / "typo.yml").string();
  std::ofstream(typo) << "model: transformer\nlayer: 4\n";
  expect_one_line_error(run("plan --model " + typo + " --mesh fsdp=2 --rules " + kModels + "rules.yml"), 1,
                        "typo.yml:2:1: unknown key 'layer'");
  std::string partial = (dir.path() / "partial.yml").string();
  std::ofstream(partial) << "logical_axis_rules: [['embed', 'fsdp']]\n";
  expect_one_line_error(run("plan --model " + kModels + "transformer.yml --mesh fsdp=2 --rules " + partial +
                            " --strict"),
                        1, "token_embedder/embedding: dimension 0 ('vocab'): no rule maps logical axis 'vocab'");
  expect_one_line_error(run("plan --model " + kModels + "transformer.yml --mesh model=2 --rules " + kModels +
                            "rules.yml"),
                        1, "axis 'model' is not among the declared mesh_axes");
  Result r = run("plan --model " + kModels + "transformer.yml --mesh fsdp=2 --rules " + kModels +
                 "rules.yml --optimizer lion");
  EXPECT_EQ(r.rc, 2);
}

}  // namespace
}  // namespace tessel

namespace tessel {
namespace {

const std::string kMaxTextModels = testing::testdata("maxtext/models/").string();

TEST(PlanCli, MaxTextModelsFromTheirFilesWithDumpsCountsAndOverrides) {
  testing::TempDir dir;
  Result r = run("plan --model " + kMaxTextModels + "qwen3-0.6b.yml --base " + kBase +
                 " --devices 16 --optimizer adamw --check --dump-shardings " + (dir.path() / "dump").string());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("(16 devices): 596,049,920 parameters in 13 arrays"));
  EXPECT_THAT(r.out, HasSubstr("fsdp=16"));
  for (const char* f : {"logical_shardings.json", "named_shardings.json"}) {
    const auto golden = nlohmann::ordered_json::parse(
        testing::read_file(testing::testdata(std::string("maxtext/qwen3-0.6b_tpu7x-16_default/") + f)));
    EXPECT_EQ(nlohmann::ordered_json::parse(testing::read_file(dir.path() / "dump" / f)), golden) << f;
  }
  r = run("plan --model " + kMaxTextModels + "llama3.1-70b.yml --base " + kBase +
          " --mesh fsdp=8,tensor=8 --set scan_layers=false --set ici_tensor_parallelism=8");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("70,553,706,496 parameters in 723 arrays"));
  // The same through `tessel shardings`, key for key.
  r = run("shardings --model " + kMaxTextModels + "qwen3-0.6b.yml --base " + kBase + " --devices 16");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::ordered_json::parse(r.out),
            nlohmann::ordered_json::parse(testing::read_file(
                testing::testdata("maxtext/qwen3-0.6b_tpu7x-16_default/named_shardings.json"))));
}

TEST(PlanCli, MaxTextBadInputIsOneLine) {
  const std::string qwen = kMaxTextModels + "qwen3-0.6b.yml";
  expect_one_line_error(run("plan --model " + qwen + " --base " + kBase), 1, "--devices N");
  expect_one_line_error(run("plan --model " + qwen + " --base " + kBase + " --devices 16 --set fused_mlp=true"), 1,
                        "fused_mlp");
  expect_one_line_error(run("plan --model " + qwen + " --base " + kBase + " --devices 16 --set vocab=5"), 1,
                        "unknown key 'vocab'");
  expect_one_line_error(run("plan --model " + qwen + " --set scan_layers=false --mesh fsdp=2 --rules " + kBase), 1,
                        "give --base");
  expect_one_line_error(run("plan --model " + qwen + " --base " + kBase + " --mesh tensor=16"), 1,
                        "num_kv_heads (8) must be divisible by 16");
  expect_one_line_error(run("plan --model " + kModels + "transformer.yml --mesh fsdp=2 --dump-shardings /tmp/x --rules " +
                            kModels + "rules.yml"),
                        1, "give a MaxText model");
  expect_one_line_error(run("shardings --base " + kBase + " --devices 4"), 1, "--base needs --model");
}

}  // namespace
}  // namespace tessel
