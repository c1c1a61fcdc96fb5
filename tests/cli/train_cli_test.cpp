// tessel train end to end: the plan and progress, metrics, --steps 0, resuming on another mesh
// with the same losses, and bad input.
#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/cli_test_util.h"

namespace tessel {
namespace {

constexpr const char* kModel = "model: transformer\nvocab: 256\nembed: 32\nlayers: 2\nheads: 4\nmlp: 64\n";

std::vector<nlohmann::json> read_metrics(const std::filesystem::path& p) {
  std::istringstream in(testing::read_file(p));
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(TrainCli, PrintsThePlanAndProgressAndWritesMetrics) {
  testing::TempDir dir;
  const auto model = dir.write("m.yml", kModel);
  const auto metrics = dir.path() / "m.jsonl";
  const Result r = run("train --model " + model.string() + " --steps 6 --batch 8 --seq 16 --log-every 3 --metrics " +
                       metrics.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("on Mesh(data=2, fsdp=2, tensor=2)"));
  EXPECT_THAT(r.out, HasSubstr("per device (max over 8 devices): params"));
  EXPECT_THAT(r.out, HasSubstr("step 3/6 loss"));
  EXPECT_THAT(r.out, HasSubstr("tokens/s"));
  EXPECT_THAT(r.out, HasSubstr("ETA"));
  const auto lines = read_metrics(metrics);
  ASSERT_EQ(lines.size(), 6u);
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["step"], i + 1);
    for (const char* key : {"loss", "tokens_per_s", "grad_norm", "lr"}) EXPECT_TRUE(lines[i][key].is_number()) << key;
  }
}

TEST(TrainCli, ResumingOnAnotherMeshContinuesTheSameRun) {
  testing::TempDir dir;
  const auto model = dir.write("m.yml", kModel);
  const std::string common = "train --model " + model.string() + " --batch 8 --seq 16 --steps 8 --warmup 2 ";
  const auto straight = dir.path() / "straight.jsonl", resumed = dir.path() / "resumed.jsonl";
  ASSERT_EQ(run(common + "--metrics " + straight.string()).rc, 0);
  const auto ckpt = dir.path() / "ckpt";
  // Stopped after step 4 (the schedule still spans 8 steps), resumed on fsdp=4,tensor=2.
  Result r = run(common + "--stop-at 4 --checkpoint-dir " + ckpt.string() + " --metrics " + resumed.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(ckpt / "4"));
  r = run(common + "--checkpoint-dir " + ckpt.string() + " --resume --mesh fsdp=4,tensor=2 --metrics " +
          resumed.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("resumed step 4"));
  EXPECT_THAT(r.out, HasSubstr("onto Mesh(data=1, fsdp=4, tensor=2)"));
  const auto a = read_metrics(straight), b = read_metrics(resumed);
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(b[i]["step"], i + 1);
    const double x = a[i]["loss"], y = b[i]["loss"];
    EXPECT_NEAR(y, x, 1e-4 * std::abs(x)) << "step " << i + 1;
  }
}

TEST(TrainCli, StepsZeroSavesTheInitialState) {
  testing::TempDir dir;
  const auto model = dir.write("m.yml", kModel);
  const auto ckpt = dir.path() / "ckpt";
  const Result r = run("train --model " + model.string() + " --steps 0 --checkpoint-dir " + ckpt.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("saved step 0"));
  EXPECT_TRUE(std::filesystem::exists(ckpt / "0" / "default" / "_METADATA"));
  EXPECT_TRUE(std::filesystem::exists(ckpt / "0" / "data" / "metadata"));
  const Result info = run("ckpt info " + ckpt.string());
  ASSERT_EQ(info.rc, 0) << info.err;
  EXPECT_THAT(info.out, HasSubstr("opt_state/mu/token_embedder/embedding"));
}

TEST(TrainCli, BadInputIsOneLine) {
  testing::TempDir dir;
  const auto model = dir.write("m.yml", kModel);
  const std::string m = "train --model " + model.string() + " --batch 8 --seq 16 ";
  expect_one_line_error(run(m + "--resume"), 1, "--resume needs --checkpoint-dir");
  expect_one_line_error(run(m + "--steps 0"), 1, "give --checkpoint-dir");
  expect_one_line_error(run(m + "--mesh data=16"), 1, "");
  expect_one_line_error(run(m + "--data " + (dir.path() / "none.txt").string()), 1, "cannot read the training text");
  expect_one_line_error(run(m + "--lr -1"), 1, "--lr must be a positive number");
  expect_one_line_error(run(m + "--optimizer lion"), 1, "--optimizer must be adamw or sgd");
  expect_one_line_error(run("train --model " + model.string() + " --seq 100000"), 1, "needs at least 100001");
  expect_one_line_error(run(m + "--devices-per-process 0"), 1, "--devices-per-process must be at least 1, got 0");
  expect_one_line_error(run(m + "--devices-per-process 8 --meeting-timeout 0"), 1,
                        "--meeting-timeout must be at least 1 second, got 0");
  // Started without mpirun: the job has one process.
  expect_one_line_error(run(m + "--devices 6 --devices-per-process 4"), 1,
                        "--devices 6 does not match 1 processes x --devices-per-process 4");
  const auto ckpt = dir.path() / "ckpt";
  ASSERT_EQ(run(m + "--steps 0 --checkpoint-dir " + ckpt.string()).rc, 0);
  expect_one_line_error(run(m + "--steps 2 --checkpoint-dir " + ckpt.string()), 1, "pass --resume");
  // Resuming a checkpoint of another model names the mismatch.
  const auto other = dir.write("o.yml", "model: transformer\nvocab: 256\nembed: 16\nlayers: 1\nheads: 2\nmlp: 32\n");
  expect_one_line_error(run("train --model " + other.string() + " --batch 8 --seq 16 --steps 2 --resume --checkpoint-dir " +
                            ckpt.string()),
                        1, "");
}

}  // namespace
}  // namespace tessel

namespace tessel {
namespace {

TEST(TrainCli, MaxTextDenseModelsTrainAndSaveMaxTextsLayout) {
  const std::string base = testing::testdata("maxtext/base.yml").string();
  const std::string model = testing::testdata("maxtext/models/llama3.1-8b.yml").string();
  const std::string tiny = " --set base_emb_dim=32 --set base_num_query_heads=4 --set base_num_kv_heads=2"
                           " --set head_dim=8 --set base_mlp_dim=64 --set base_num_decoder_layers=2"
                           " --set vocab_size=256 --batch 8 --seq 16";
  testing::TempDir dir;
  const std::string ckpt = (dir.path() / "ckpt").string();
  Result r = run("train --model " + model + " --base " + base + tiny +
                 " --mesh fsdp=4,tensor=2 --steps 3 --layout maxtext --checkpoint-dir " + ckpt);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("tessel train: maxtext:llama2"));
  // MaxText's numbering: directory N holds the state after N + 1 updates.
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "ckpt" / "2" / "items" / "_METADATA"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "ckpt" / "3"));
  const std::string meta = testing::read_file(dir.path() / "ckpt" / "2" / "items" / "_METADATA");
  EXPECT_THAT(meta, HasSubstr("('params', 'params', 'decoder', 'layers', 'mlp', 'wi_0', 'kernel')"));
  EXPECT_THAT(meta, HasSubstr("('opt_state', '0', 'mu', 'params', 'token_embedder', 'embedding')"));
  EXPECT_THAT(meta, HasSubstr("('opt_state', '2', 'count')"));
  EXPECT_THAT(meta, HasSubstr("('step',)"));
  expect_one_line_error(run("train --model " + model + " --base " + base + tiny + " --optimizer sgd --layout maxtext"
                            " --checkpoint-dir " + ckpt + "2"),
                        1, "use --optimizer adamw");
  expect_one_line_error(run("train --base " + base), 1, "--base needs --model");
  expect_one_line_error(run("train --model " + model + " --base " + base + " --set vocab_size=100 --steps 1"), 1,
                        "needs at least 256");
}

}  // namespace
}  // namespace tessel
