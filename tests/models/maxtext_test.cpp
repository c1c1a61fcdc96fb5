// MaxText's model families from MaxText's own YAML: the golden sharding dump, the published
// parameter counts, the tree's structure per option, the config errors, and training.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "../runtime/runtime_test_util.h"
#include "tessel/checkpoint/key_map.h"
#include "tessel/checkpoint/safetensors.h"
#include "tessel/runtime/detail/kernels.h"
#include "tessel/core/error.h"
#include "tessel/models/maxtext.h"
#include "tessel/models/maxtext_checkpoint.h"
#include "tessel/models/train.h"
#include "tessel/state/init.h"
#include "tessel/state/plan.h"

namespace tessel {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

std::string model_file(const std::string& name) { return testing::testdata("maxtext/models/" + name + ".yml").string(); }

MaxTextConfig config(const std::string& name, std::vector<std::string> sets = {}) {
  return load_maxtext_config(
      {.model = model_file(name), .base = testing::testdata("maxtext/base.yml"), .overrides = std::move(sets)});
}

std::map<std::string, ParamDecl> declared(const Module& m) {
  std::map<std::string, ParamDecl> out;
  m.visit([&](const std::string& path, const ParamDecl& d) { out.emplace(path, d); });
  return out;
}

int64_t count(const Module& m) {
  int64_t n = 0;
  m.visit([&](const std::string&, const ParamDecl& d) { n += d.shape.num_elements(); });
  return n;
}

LogicalAxes names(std::initializer_list<std::optional<std::string>> n) { return LogicalAxes(n); }

TEST(MaxText, Qwen3DumpEqualsMaxTextsGoldenForEveryKey) {
  const MaxTextConfig c = config("qwen3-0.6b");
  const State params = eval_shape(maxtext_model(c), c.mesh(16), c.rules);
  testing::TempDir dir;
  write_maxtext_shardings(maxtext_train_state(c, params), dir.path());
  for (const char* file : {"logical_shardings.json", "named_shardings.json"}) {
    SCOPED_TRACE(file);
    const auto golden = nlohmann::ordered_json::parse(
        testing::read_file(testing::testdata(std::string("maxtext/qwen3-0.6b_tpu7x-16_default/") + file)));
    const auto ours = nlohmann::ordered_json::parse(testing::read_file(dir.path() / file));
    ASSERT_EQ(ours.size(), golden.size());
    for (const auto& [key, value] : golden.items()) {
      SCOPED_TRACE(key);
      ASSERT_TRUE(ours.contains(key));
      EXPECT_EQ(ours[key], value);
    }
    EXPECT_EQ(ours.dump(), golden.dump());  // the same order too (JAX's flattening order)
  }
}

TEST(MaxText, ParameterCountsAreThePublishedOnes) {
  // The models' published sizes (their model cards and papers).
  const std::map<std::string, int64_t> published = {
      {"llama2-7b", 6'738'415'616},       {"llama3-8b", 8'030'261'248},        {"llama3.1-8b", 8'030'261'248},
      {"llama3.1-70b", 70'553'706'496},   {"llama3.1-405b", 405'853'388'800},  {"qwen3-0.6b", 596'049'920},
      {"qwen3-8b", 8'190'735'360},        {"qwen3-32b", 32'762'123'264},       {"deepseek2-16b", 15'706'484'224},
      {"deepseek3-671b", 671'026'419'200}, {"gpt-oss-20b", 20'914'757'184},    {"gpt-oss-120b", 116'829'156'672}};
  for (const auto& [name, n] : published) {
    SCOPED_TRACE(name);
    EXPECT_EQ(count(maxtext_model(config(name))), n);
  }
}

TEST(MaxText, PlanOfTheLargestModelsOn8192DevicesIsCheap) {
  for (const char* name : {"deepseek3-671b", "llama3.1-405b"}) {
    const MaxTextConfig c = config(name);
    const MemoryPlan p = plan(eval_shape(maxtext_model(c), c.mesh(8192), c.rules), {.optimizer = Optimizer::kAdamW});
    EXPECT_EQ(p.device_count, 8192);
    EXPECT_GT(p.total.max, 0);
    EXPECT_LT(p.total.max, p.param_bytes / 1000);  // fsdp=8192 shards nearly everything
  }
}

TEST(MaxText, Llama2TreeUnscannedAndScanned) {
  auto scanned = declared(maxtext_model(config("llama2-7b")));
  EXPECT_EQ(scanned.size(), 12u);
  const ParamDecl& q = scanned.at("decoder/layers/self_attention/query/kernel");
  EXPECT_EQ(q.shape, (Shape{4096, 32, 32, 128}));
  EXPECT_EQ(q.partitioning.logical, names({"embed", "layers", "q_heads", "kv"}));
  EXPECT_EQ(scanned.at("decoder/layers/self_attention/key/kernel").partitioning.logical,
            names({"embed", "layers", "kv_heads", "kv_head_dim"}));
  EXPECT_EQ(scanned.at("decoder/logits_dense/kernel").partitioning.logical, names({"embed_vocab", "vocab"}));
  EXPECT_EQ(scanned.at("token_embedder/embedding").partitioning.logical, names({"vocab", "embed_vocab"}));
  EXPECT_EQ(scanned.at("decoder/layers/mlp/wi_0/kernel").shape, (Shape{4096, 32, 11008}));

  auto unscanned = declared(maxtext_model(config("llama2-7b", {"scan_layers=false", "param_scan_axis=0"})));
  EXPECT_EQ(unscanned.size(), 3u + 32u * 9u);
  EXPECT_EQ(unscanned.at("decoder/layers_31/self_attention/out/kernel").shape, (Shape{32, 128, 4096}));
  EXPECT_FALSE(unscanned.contains("decoder/layers/self_attention/out/kernel"));

  // param_scan_axis moves the stacked dimension.
  auto axis0 = declared(maxtext_model(config("llama2-7b", {"param_scan_axis=0"})));
  EXPECT_EQ(axis0.at("decoder/layers/mlp/wo/kernel").shape, (Shape{32, 11008, 4096}));
  EXPECT_EQ(axis0.at("decoder/layers/mlp/wo/kernel").partitioning.logical, names({"layers", "mlp", "embed"}));
}

TEST(MaxText, Llama2sOwnRuleForNormReplacesBaseYmlsAndGoesLast) {
  const MaxTextConfig c = config("llama2-7b");
  const LogicalRule& last = c.rules.rules().back();
  EXPECT_EQ(last.logical, "norm");
  EXPECT_EQ(last.mesh_axes, std::vector<std::string>{"fsdp"});
  int norms = 0;
  for (const LogicalRule& r : c.rules.rules()) norms += r.logical == "norm";
  EXPECT_EQ(norms, 1);
}

TEST(MaxText, DerivedSizesFollowGlobalParameterScaleAndActivations) {
  const MaxTextConfig base = config("llama2-7b");
  const MaxTextConfig scaled = config("llama2-7b", {"global_parameter_scale=8"});  // log2 3: every scale 1
  EXPECT_EQ(scaled.emb_dim, 2 * base.emb_dim);
  EXPECT_EQ(scaled.num_query_heads, 2 * base.num_query_heads);
  EXPECT_EQ(scaled.mlp_dim, 2 * base.mlp_dim);
  EXPECT_EQ(scaled.num_decoder_layers, 2 * base.num_decoder_layers);
  const MaxTextConfig four = config("llama2-7b", {"global_parameter_scale=4"});  // log2 2: heads, mlp, emb
  EXPECT_EQ(four.emb_dim, 2 * base.emb_dim);
  EXPECT_EQ(four.num_decoder_layers, base.num_decoder_layers);
  auto gelu = declared(maxtext_model(config("llama2-7b", {"mlp_activations=[gelu]"})));
  EXPECT_TRUE(gelu.contains("decoder/layers/mlp/wi/kernel"));
  EXPECT_FALSE(gelu.contains("decoder/layers/mlp/wi_0/kernel"));
  EXPECT_EQ(base.mu_dtype, DType::kF32);
  EXPECT_EQ(config("llama2-7b", {"weight_dtype=bfloat16"}).mu_dtype, DType::kBF16);
  EXPECT_EQ(config("llama2-7b", {"weight_dtype=bfloat16", "mu_dtype=float32"}).mu_dtype, DType::kF32);
}

TEST(MaxText, Qwen3TiesEmbeddingsAndNormsQueriesAndKeys) {
  auto p = declared(maxtext_model(config("qwen3-0.6b")));
  EXPECT_FALSE(p.contains("decoder/logits_dense/kernel"));
  EXPECT_EQ(p.at("decoder/layers/self_attention/query_norm/scale").shape, (Shape{128, 28}));
  auto untied = declared(maxtext_model(config("qwen3-0.6b", {"logits_via_embedding=false", "use_qk_norm=false"})));
  EXPECT_TRUE(untied.contains("decoder/logits_dense/kernel"));
  EXPECT_FALSE(untied.contains("decoder/layers/self_attention/query_norm/scale"));
}

TEST(MaxText, DeepSeekHasDenseThenMoeStacksWithMlaAndSharedExperts) {
  const MaxTextConfig c = config("deepseek3-671b");
  auto p = declared(maxtext_model(c));
  const ParamDecl& wq_a = p.at("decoder/dense_layers/self_attention/wq_a/kernel");
  EXPECT_EQ(wq_a.shape, (Shape{7168, 3, 1536}));
  EXPECT_EQ(wq_a.partitioning.logical, names({"embed", "dense_layers", "q_lora_up_proj"}));
  EXPECT_EQ(p.at("decoder/moe_layers/self_attention/wkv_a/kernel").shape, (Shape{7168, 58, 512 + 64}));
  EXPECT_EQ(p.at("decoder/moe_layers/self_attention/wkv_b/kernel").shape, (Shape{512, 58, 128, 128 + 128}));
  EXPECT_EQ(p.at("decoder/moe_layers/self_attention/out/kernel").shape, (Shape{128, 58, 128, 7168}));
  const std::string moe = "decoder/moe_layers/DeepSeekMoeBlock_0/";
  const ParamDecl& wi = p.at(moe + "MoeBlock_0/wi_0");
  EXPECT_EQ(wi.shape, (Shape{256, 58, 7168, 2048}));
  EXPECT_EQ(wi.partitioning.logical, names({"exp", "moe_layers", "embed_moe", "mlp_moe"}));
  EXPECT_EQ(p.at(moe + "MoeBlock_0/gate/kernel").partitioning.logical, names({"embed_moe", "moe_layers", std::nullopt}));
  EXPECT_EQ(p.at(moe + "MoeBlock_0/gate/bias").shape, (Shape{256, 58}));  // routed_bias
  EXPECT_EQ(p.at(moe + "shared_experts/wi_0/kernel").shape, (Shape{7168, 58, 2048}));
  EXPECT_EQ(p.at("decoder/dense_layers/mlp/wi_0/kernel").shape, (Shape{7168, 3, 18432}));

  auto no_q_lora = declared(maxtext_model(config("deepseek2-16b", {"scan_layers=false"})));
  EXPECT_TRUE(no_q_lora.contains("decoder/dense_layers_0/self_attention/query/kernel"));
  EXPECT_TRUE(no_q_lora.contains("decoder/moe_layers_25/DeepSeekMoeBlock_0/MoeBlock_0/wo"));
  EXPECT_FALSE(no_q_lora.contains("decoder/moe_layers_26/DeepSeekMoeBlock_0/MoeBlock_0/wo"));
  EXPECT_FALSE(no_q_lora.contains("decoder/moe_layers_0/DeepSeekMoeBlock_0/MoeBlock_0/gate/bias"));
}

TEST(MaxText, GptOssScansBlocksOfTwoWithSinksBiasesAndFloat32Norms) {
  auto p = declared(maxtext_model(config("gpt-oss-20b", {"weight_dtype=bfloat16"})));
  const std::string l0 = "decoder/layers/layers_0/", l1 = "decoder/layers/layers_1/";
  EXPECT_EQ(p.at(l0 + "GptOssAttention/query/kernel").shape, (Shape{2880, 12, 64, 64}));
  EXPECT_EQ(p.at(l1 + "GptOssAttention/query/bias").shape, (Shape{64, 12, 64}));
  EXPECT_EQ(p.at(l0 + "GptOssAttention/out/bias").partitioning.logical, names({"embed", "layers"}));
  EXPECT_EQ(p.at(l0 + "GptOssAttention/sinks").partitioning.logical, names({std::nullopt, "layers"}));
  EXPECT_EQ(p.at(l0 + "GptOssMlp/wi_0_bias").partitioning.logical, names({"exp", "layers", "activation_mlp"}));
  EXPECT_EQ(p.at(l0 + "GptOssMlp/gate/kernel").partitioning.logical, names({"embed", "layers", std::nullopt}));
  EXPECT_EQ(p.at(l0 + "pre_self_attention_layer_norm/scale").dtype, DType::kF32);
  EXPECT_EQ(p.at(l0 + "GptOssMlp/wo").dtype, DType::kBF16);
  EXPECT_EQ(p.at("decoder/decoder_norm/scale").dtype, DType::kBF16);
  EXPECT_THAT([] { config("gpt-oss-20b", {"base_num_decoder_layers=5"}); },
              ThrowsMessage<ValueError>(HasSubstr("inhomogeneous_layer_cycle_interval = 2, which must divide the 5")));
  auto unscanned = declared(maxtext_model(config("gpt-oss-20b", {"scan_layers=false"})));
  EXPECT_TRUE(unscanned.contains("decoder/layers_23/GptOssMlp/wi_1"));
}

TEST(MaxText, ConfigErrorsNameTheKeyAndWhere) {
  EXPECT_THAT([] { config("llama2-7b", {"base_emb_dimm=8"}); },
              ThrowsMessage<ParseError>(HasSubstr("unknown key 'base_emb_dimm'")));
  EXPECT_THAT([] { config("llama2-7b", {"fused_qkv=true"}); },
              ThrowsMessage<ParseError>(AllOf(HasSubstr("--set fused_qkv=true"), HasSubstr("does not build"))));
  EXPECT_THAT([] { config("llama2-7b", {"base_emb_dim=wide"}); },
              ThrowsMessage<ParseError>(HasSubstr("'base_emb_dim' must be an integer")));
  EXPECT_THAT([] { config("llama2-7b", {"decoder_block=gemma3"}); },
              ThrowsMessage<ParseError>(HasSubstr("decoder_block 'gemma3' is not one tessel builds")));
  EXPECT_THAT([] { config("llama2-7b", {"global_parameter_scale=3"}); },
              ThrowsMessage<ValueError>(HasSubstr("power of two")));
  EXPECT_THAT([] { config("llama2-7b", {"num_experts=8", "base_moe_mlp_dim=64"}); },
              ThrowsMessage<ValueError>(HasSubstr("needs a mixture-of-experts decoder_block")));
  EXPECT_THAT([] { config("llama2-7b", {"base_num_kv_heads=5"}); },
              ThrowsMessage<ValueError>(HasSubstr("must divide base_num_query_heads")));
  EXPECT_THAT([] { config("llama2-7b", {"scan_layers"}); }, ThrowsMessage<ValueError>(HasSubstr("key=value")));
  EXPECT_THAT([] { config("deepseek3-671b", {"attention_type=global"}); },
              ThrowsMessage<ValueError>(HasSubstr("attention_type must be 'mla'")));
  testing::TempDir dir;
  const auto bad = dir.write("bad.yml", "base_emb_dim: 8\nnot_a_key: 1\n");
  EXPECT_THAT([&] { load_maxtext_config({.model = bad, .base = testing::testdata("maxtext/base.yml")}); },
              ThrowsMessage<ParseError>(AllOf(HasSubstr("bad.yml:2"), HasSubstr("unknown key 'not_a_key'"))));
}

TEST(MaxText, MeshFromTheIciParallelism) {
  const MaxTextConfig c = config("llama2-7b", {"ici_tensor_parallelism=2"});
  const Mesh m = c.mesh(16);
  EXPECT_EQ(m.device_count(), 16);
  EXPECT_EQ(m.axis_size("fsdp"), 8);
  EXPECT_EQ(m.axis_size("tensor"), 2);
  EXPECT_EQ(m.axes().size(), c.mesh_axes.size());
  EXPECT_THAT([&] { c.mesh(3); }, ThrowsMessage<ValueError>(HasSubstr("3 is not a multiple of 2")));
  EXPECT_THAT([] { config("llama2-7b", {"ici_data_parallelism=-1"}).mesh(8); },
              ThrowsMessage<ValueError>(HasSubstr("more than one ici parallelism is -1")));
  EXPECT_THAT([] { config("llama2-7b", {"ici_fsdp_parallelism=4"}).mesh(8); },
              ThrowsMessage<ValueError>(HasSubstr("multiplies to 4, not the 8 devices per slice")));
}

TEST(MaxText, KvHeadsMustSplitEvenlyOverTheAxesThatShardThem) {
  const MaxTextConfig c = config("llama3.1-8b");  // 8 kv heads; kv_heads -> tensor, tensor_sequence, autoregressive
  c.check_mesh(Mesh::parse("fsdp=4,tensor=8", c.rules.mesh_axes()));
  EXPECT_THAT([&] { c.check_mesh(Mesh::parse("tensor=16", c.rules.mesh_axes())); },
              ThrowsMessage<ShardingError>(HasSubstr("num_kv_heads (8) must be divisible by 16")));
  EXPECT_THAT([&] { c.check_mesh(Mesh::parse("tensor=4,tensor_sequence=4", c.rules.mesh_axes())); },
              ThrowsMessage<ShardingError>(HasSubstr("divisible by 16")));
  const MaxTextConfig ulysses = config("llama3.1-8b", {"context_parallel_strategy=ulysses"});
  EXPECT_THAT([&] { ulysses.check_mesh(Mesh::parse("context=4,tensor=4", c.rules.mesh_axes())); },
              ThrowsMessage<ShardingError>(HasSubstr("divisible by 16")));
  config("deepseek3-tiny").check_mesh(Mesh::parse("tensor=8"));  // MLA: no kv kernel to check
}

// Losses of a few steps of a tiny model from MaxText's files (`sets` shrink it) on each mesh.
std::vector<std::vector<double>> tiny_losses(const std::string& model, std::vector<std::string> sets,
                                            const std::vector<const char*>& meshes) {
  Runtime rt = Runtime::host(8);
  auto data = nn::ByteDataset::open(nn::ByteDataset::default_path());
  std::vector<std::vector<double>> losses;
  for (const char* mesh : meshes) {
    SCOPED_TRACE(model + " on " + mesh);
    const MaxTextConfig c = config(model, sets);
    nn::OptimizerConfig opt;
    opt.schedule.peak = 3e-3;
    models::Trainer t(rt, ModelConfig{.config = c, .source = c.source}, Mesh::parse(mesh, c.rules.mesh_axes()),
                      c.rules, opt);
    State state = t.init(0);
    std::vector<double>& l = losses.emplace_back();
    for (int64_t step = 0; step < 6; ++step)
      l.push_back(t.step(state, t.batch(&data, {.seed = 0, .step = step}, 8, 16), step).loss);
    EXPECT_LT(l.back(), l.front());
  }
  return losses;
}

void expect_same_losses(const std::vector<std::vector<double>>& losses, double rel) {
  double worst = 0;
  for (size_t m = 1; m < losses.size(); ++m)
    for (size_t i = 0; i < losses[0].size(); ++i) {
      EXPECT_NEAR(losses[m][i], losses[0][i], rel * losses[0][i]) << "mesh " << m << " step " << i;
      worst = std::max(worst, std::abs(losses[m][i] / losses[0][i] - 1));
    }
  std::printf("losses %.6f -> %.6f on %zu meshes, largest relative difference %.2g\n", losses[0].front(),
              losses[0].back(), losses.size(), worst);
}

TEST(MaxText, TinyQwen3TrainsWithTheSameLossesOnAnyMesh) {
  const std::vector<std::string> tiny = {"base_emb_dim=32", "base_num_query_heads=4", "base_num_kv_heads=2",
                                         "head_dim=8",      "base_mlp_dim=64",        "base_num_decoder_layers=2",
                                         "vocab_size=256"};
  expect_same_losses(tiny_losses("qwen3-0.6b", tiny, {"data=1", "fsdp=8", "data=2,fsdp=2,tensor=2"}), 1e-6);
}

TEST(MaxText, TinyMoeTrainsWithTheSameLossesUnderExpertParallelism) {
  const std::vector<std::string> tiny = {"base_emb_dim=32", "base_num_query_heads=4", "base_num_kv_heads=4",
                                         "head_dim=8", "base_mlp_dim=48", "base_moe_mlp_dim=48",
                                         "base_num_decoder_layers=2", "vocab_size=256", "num_experts=8",
                                         "num_experts_per_tok=2"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.end(), tiny.begin(), tiny.end());
    return more;
  };
  const std::vector<const char*> meshes = {"data=1", "fsdp=4,expert=2", "data=2,expert=4", "expert=8",
                                           "fsdp=2,tensor=2,expert=2"};
  // Mixtral: llama2's attention, dropless routed experts, with the load-balance loss.
  expect_same_losses(tiny_losses("llama2-7b", with({"decoder_block=mixtral", "load_balance_loss_weight=0.01"}), meshes), 1e-5);
  // Qwen3-MoE: qk-norm attention, normalized top-k weights, a capacity that drops tokens.
  expect_same_losses(tiny_losses("qwen3-0.6b", with({"decoder_block=qwen3_moe", "norm_topk_prob=true", "capacity_factor=1.0"}),
                                {"data=1", "data=2,expert=4", "fsdp=2,tensor=2,expert=2"}),
                     1e-5);
}

// DeepSeek V3 from MaxText's deepseek3-tiny file, shrunk: MLA with low-rank queries and YaRN rope,
// a dense layer, then routed experts (sigmoid scores, the gate bias choosing, scaled weights) with a
// shared expert; the same losses with expert parallelism.
TEST(MaxText, TinyDeepSeekTrainsWithTheSameLossesUnderExpertParallelism) {
  const std::vector<std::string> tiny = {
      "base_emb_dim=32",     "base_num_query_heads=4", "base_num_kv_heads=4", "base_mlp_dim=64",
      "base_moe_mlp_dim=32", "base_num_decoder_layers=3", "first_num_dense_layers=1", "vocab_size=256",
      "q_lora_rank=16",      "kv_lora_rank=8",         "qk_nope_head_dim=8",  "qk_rope_head_dim=4",
      "v_head_dim=8",        "num_experts=8",          "num_experts_per_tok=2"};
  expect_same_losses(tiny_losses("deepseek3-tiny", tiny, {"data=1", "data=2,expert=4", "fsdp=2,tensor=2,expert=2"}),
                     1e-5);
  // Group-limited routing: 8 experts in 4 groups, the best 2 groups.
  std::vector<std::string> grouped = tiny;
  grouped.insert(grouped.end(), {"n_routing_groups=4", "topk_routing_group=2"});
  expect_same_losses(tiny_losses("deepseek3-tiny", grouped, {"data=1", "expert=8"}), 1e-5);
}

// gpt-oss from MaxText's gpt-oss-20b file, shrunk: attention with biases and sinks, sliding and
// global layers alternating in scanned blocks of two, YaRN rope, routed experts with biases and the
// clipped GLU; the same losses with expert parallelism, scanned or not.
TEST(MaxText, TinyGptOssTrainsWithTheSameLossesUnderExpertParallelism) {
  const std::vector<std::string> tiny = {
      "base_emb_dim=32",        "base_num_query_heads=4", "base_num_kv_heads=2", "head_dim=8",
      "base_mlp_dim=32",        "base_moe_mlp_dim=32",    "base_num_decoder_layers=4", "vocab_size=256",
      "num_experts=8",          "num_experts_per_tok=2",  "sliding_window_size=5", "mlp_activations_limit=1.0"};
  expect_same_losses(tiny_losses("gpt-oss-20b", tiny, {"data=1", "data=2,expert=4", "fsdp=2,tensor=2,expert=2"}), 1e-5);
  // Unscanned, the layers are layers_0, layers_1, ... (initialized differently from the scanned tree).
  std::vector<std::string> unscanned = tiny;
  unscanned.push_back("scan_layers=false");
  expect_same_losses(tiny_losses("gpt-oss-20b", unscanned, {"data=1", "expert=8"}), 1e-5);
}

// A Hugging Face checkpoint through a key map straight to MaxText's parameter-only checkpoint, as
// MaxText's to_maxtext writes it: step 0's item "items", the map's targets under params/params/,
// the step, bfloat16 unless asked otherwise; a map that would go the other way is refused, and
// nothing is left behind.
TEST(MaxText, ParamsOnlyCheckpointThroughAKeyMap) {
  constexpr const char* kMap = R"(rules:
  - from: model.layers.{i}.w
    to: decoder.layers.mlp.kernel
    transpose: [1, 0]
    stack: 1
  - from: model.norm
    to: decoder.norm.scale
)";
  Runtime rt = Runtime::host(1);
  const Mesh mesh({{"x", 1}});
  std::mt19937 rng(53);
  testing::TempDir tmp;
  State hf;
  std::map<std::string, HostArray> values;
  for (const std::string& p : {"model/layers/0/w", "model/layers/1/w"})
    values.emplace(p, testing::random_host(rng, {3, 5}, DType::kF32));
  values.emplace("model/norm", testing::random_host(rng, {5}, DType::kF32));
  for (const auto& [p, h] : values) hf.insert(p, Variable(kParam, device_put(rt, h, NamedSharding(mesh, {}))));
  save_safetensors(tmp.path() / "hf", hf);
  const CheckpointItem src = CheckpointItem::find(tmp.path() / "hf");
  ConvertOptions options;
  options.map = parse_key_map(kMap, "map.yml");
  const ConvertReport r = convert(rt, src, tmp.path() / "out", maxtext_params_conversion(src, options));
  EXPECT_EQ(r.tensors, 2);
  const CheckpointItem out = CheckpointItem::find(tmp.path() / "out" / "0" / "items");
  const State saved = out.abstract_state();
  ASSERT_TRUE(saved.contains("params/params/decoder/layers/mlp/kernel"));
  ASSERT_TRUE(saved.contains("params/params/decoder/norm/scale"));
  ASSERT_TRUE(saved.contains("step"));
  const std::string kernel = "params/params/decoder/layers/mlp/kernel";
  EXPECT_EQ(saved.at(kernel).shape(), Shape({5, 2, 3}));
  EXPECT_EQ(saved.at(kernel).dtype(), DType::kBF16);
  // Layer 1's kernel is its transpose, rounded to bfloat16 once.
  const HostArray layer1 = read_box(out, kernel, Box({0, 1, 0}, {5, 2, 3}));
  const HostArray& w1 = values.at("model/layers/1/w");
  HostArray want({5, 1, 3}, DType::kBF16);
  HostArray w1_t({5, 3}, DType::kF32);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j) w1_t.mutable_values<float>()[j * 3 + i] = w1.values<float>()[i * 5 + j];
  detail::convert_run(DType::kF32, w1_t.bytes().data(), DType::kBF16, want.mutable_bytes().data(), 15);
  EXPECT_EQ(layer1, want);

  // Asked in float32, the values are the source's.
  ConvertOptions wide = options;
  wide.dtype = DType::kF32;
  convert(rt, src, tmp.path() / "wide", maxtext_params_conversion(src, wide));
  const CheckpointItem wide_item = CheckpointItem::find(tmp.path() / "wide" / "0" / "items");
  EXPECT_EQ(read_box(wide_item, "params/params/decoder/norm/scale", Box({0}, {5})), values.at("model/norm"));

  // From MaxText's names the map goes backward: refused before anything is written.
  convert(rt, src, tmp.path() / "plain", options);
  const CheckpointItem mapped = CheckpointItem::find(tmp.path() / "plain");
  ConvertOptions back;
  back.map = parse_key_map(kMap, "map.yml");
  EXPECT_THAT([&] { maxtext_params_conversion(mapped, back); },
              ThrowsMessage<ValueError>(HasSubstr("matches the key map's target side")));
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "back"));
}

}  // namespace
}  // namespace tessel
