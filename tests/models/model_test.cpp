#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"
#include "tessel/core/error.h"
#include "tessel/models/model_config.h"
#include "tessel/models/transformer.h"

namespace tessel {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

std::map<std::string, ParamDecl> declared(const Module& m) {
  std::map<std::string, ParamDecl> out;
  m.visit([&](const std::string& path, const ParamDecl& d) { out.emplace(path, d); });
  return out;
}

LogicalAxes names(std::initializer_list<const char*> n) {
  LogicalAxes out;
  for (const char* s : n) out.emplace_back(s);
  return out;
}

TEST(Models, StackedTransformerHasMaxTextNamesShapesAndLogicalAxes) {
  TransformerConfig c{.vocab = 100, .embed = 64, .layers = 3, .heads = 8, .kv_heads = 2, .mlp = 96};
  auto p = declared(transformer_lm(c));
  ASSERT_EQ(p.size(), 11u);
  EXPECT_EQ(p.at("token_embedder/embedding").shape, (Shape{100, 64}));
  EXPECT_EQ(p.at("token_embedder/embedding").partitioning.logical, names({"vocab", "embed"}));
  const ParamDecl& q = p.at("decoder/layers/self_attention/query/kernel");
  EXPECT_EQ(q.shape, (Shape{64, 3, 8, 8}));  // layers at MaxText's param_scan_axis 1
  EXPECT_EQ(q.partitioning.logical, names({"embed", "layers", "q_heads", "kv"}));
  EXPECT_THAT(q.fans.in_axes, ElementsAre(0u));
  EXPECT_THAT(q.fans.out_axes, ElementsAre(2u, 3u));
  EXPECT_THAT(q.fans.batch_axes, ElementsAre(1u));
  EXPECT_EQ(p.at("decoder/layers/self_attention/key/kernel").shape, (Shape{64, 3, 2, 8}));
  EXPECT_EQ(p.at("decoder/layers/self_attention/key/kernel").partitioning.logical,
            names({"embed", "layers", "kv_heads", "kv"}));
  EXPECT_EQ(p.at("decoder/layers/self_attention/out/kernel").partitioning.logical,
            names({"heads", "layers", "kv", "embed"}));
  EXPECT_EQ(p.at("decoder/layers/mlp/wo/kernel").shape, (Shape{96, 3, 64}));
  EXPECT_EQ(p.at("decoder/layers/pre_self_attention_layer_norm/scale").partitioning.logical,
            names({"norm", "layers"}));
  EXPECT_EQ(p.at("decoder/decoder_norm/scale").init.kind(), Initializer::Kind::kOnes);
  EXPECT_EQ(p.at("decoder/logits_dense/kernel").partitioning.logical, names({"embed", "vocab"}));
}

TEST(Models, PerLayerTiedGatedAndQkNormVariants) {
  TransformerConfig c{.vocab = 50, .embed = 32, .layers = 12, .heads = 4, .mlp = 64, .scan_layers = false,
                      .tied_embedding = true, .gated_mlp = true, .qk_norm = true};
  auto p = declared(transformer_lm(c));
  EXPECT_EQ(p.size(), 1u + 12u * 11u + 1u);  // embedding, 11 per layer, final norm
  EXPECT_FALSE(p.contains("decoder/logits_dense/kernel"));
  EXPECT_EQ(p.at("decoder/layers/11/mlp/wi_1/kernel").shape, (Shape{32, 64}));
  EXPECT_EQ(p.at("decoder/layers/0/self_attention/query_norm/scale").shape, (Shape{8}));
  EXPECT_EQ(p.at("decoder/layers/3/self_attention/query/kernel").partitioning.logical,
            names({"embed", "q_heads", "kv"}));
}

TEST(Models, DotReluDotIsTheGuidesModel) {
  auto p = declared(dot_relu_dot({.depth = 16, .hidden = 32}));
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p.at("dot1/kernel").shape, (Shape{16, 32}));
  EXPECT_EQ(p.at("dot1/kernel").partitioning.logical, names({"embed", "mlp"}));
  EXPECT_EQ(p.at("w2").partitioning.logical, names({"mlp", "embed"}));
  EXPECT_EQ(p.at("w2").init.to_string(), "variance_scaling(scale=1, mode=fan_in, distribution=truncated_normal)");
}

TEST(Models, InvalidSizesNameTheField) {
  EXPECT_THAT([] { transformer_lm({.embed = 100, .heads = 3}); },
              ThrowsMessage<ValueError>(HasSubstr("heads (3) must divide embed (100)")));
  EXPECT_NO_THROW(transformer_lm({.embed = 100, .heads = 3, .head_dim = 32}));
  EXPECT_THAT([] { transformer_lm({.heads = 4, .kv_heads = 3}); },
              ThrowsMessage<ValueError>(HasSubstr("kv_heads (3) must divide heads (4)")));
  EXPECT_THAT([] { transformer_lm({.vocab = 0}); }, ThrowsMessage<ValueError>(HasSubstr("vocab must be positive")));
  EXPECT_THAT([] { transformer_lm({.layers = -2}); }, ThrowsMessage<ValueError>(HasSubstr("layers must be positive")));
  EXPECT_THAT([] { dot_relu_dot({.depth = 0}); }, ThrowsMessage<ValueError>(HasSubstr("depth must be positive")));
  EXPECT_THAT([] { transformer_lm({.vocab = int64_t{1} << 40, .embed = int64_t{1} << 40}); },
              ThrowsMessage<ValueError>(HasSubstr("more elements than int64")));
}

TEST(Module, RejectsClashesAndRankMismatches) {
  Module m("m");
  m.param({.name = "w", .shape = {2, 3}});
  EXPECT_THAT([&] { m.param({.name = "w", .shape = {2}}); }, ThrowsMessage<ValueError>(HasSubstr("already has")));
  EXPECT_THAT([&] { m.add(Module("w")); }, ThrowsMessage<ValueError>(HasSubstr("already has")));
  EXPECT_THAT([&] { m.param({.name = "v", .shape = {2, 3}, .partitioning = Partitioning::by_logical({"embed"})}); },
              ThrowsMessage<ValueError>(HasSubstr("m/v: 1 logical axis names for shape [2, 3]")));
  EXPECT_THAT([&] { m.param({.name = "u", .shape = {2}, .fans = {{3}, {}, {}}}); },
              ThrowsMessage<ValueError>(HasSubstr("out of range")));
  EXPECT_THROW(Module(""), ValueError);
  EXPECT_THROW(m.param({.name = "a//b", .shape = {1}}), ValueError);
}

TEST(ModelConfig, ReadsTheExamples) {
  ModelConfig t = load_model_config(std::string(TESSEL_EXAMPLES_DIR) + "/models/transformer.yml");
  EXPECT_EQ(t.family(), "transformer");
  const auto& c = std::get<TransformerConfig>(t.config);
  EXPECT_EQ(c.embed, 256);
  EXPECT_EQ(c.kv_heads, 4);
  EXPECT_TRUE(c.scan_layers);
  EXPECT_EQ(t.build().num_params(), 11u);
  ModelConfig llama = load_model_config(std::string(TESSEL_EXAMPLES_DIR) + "/models/llama3.1-405b.yml");
  EXPECT_EQ(std::get<TransformerConfig>(llama.config).dtype, DType::kBF16);
  EXPECT_EQ(load_model_config(std::string(TESSEL_EXAMPLES_DIR) + "/models/dot_relu_dot.yml").family(),
            "dot_relu_dot");
}

TEST(ModelConfig, ParsesInitializersAndUnderscoredNumbers) {
  ModelConfig m = parse_model_config(
      "model: transformer\nvocab: 32_000\nembedding_init: normal(stddev=0.02)\n"
      "kernel_init: variance_scaling(2.0, fan_avg, uniform)\nnorm_init: constant(0.5)\n");
  const auto& c = std::get<TransformerConfig>(m.config);
  EXPECT_EQ(c.vocab, 32000);
  EXPECT_EQ(c.embedding_init.to_string(), "normal(stddev=0.02)");
  EXPECT_EQ(c.kernel_init.to_string(), "variance_scaling(scale=2, mode=fan_avg, distribution=uniform)");
  EXPECT_EQ(c.norm_init.to_string(), "constant(0.5)");
}

void expect_parse_error(const std::string& yaml, int64_t line, const std::string& needle) {
  try {
    parse_model_config(yaml, "m.yml");
    ADD_FAILURE() << "no error for:\n" << yaml;
  } catch (const ParseError& e) {
    EXPECT_EQ(e.line(), line) << e.what();
    EXPECT_THAT(e.what(), AllOf(HasSubstr("m.yml"), HasSubstr(needle)));
  }
}

TEST(ModelConfig, BadConfigsGiveErrorsWithFileAndLine) {
  expect_parse_error("vocab: 3\n", 1, "missing 'model' key");
  expect_parse_error("model: gpt\n", 1, "unknown model 'gpt'");
  expect_parse_error("model: transformer\nembd: 64\n", 2, "unknown key 'embd'");
  expect_parse_error("model: transformer\nembed: sixty\n", 2, "'embed' must be an integer");
  expect_parse_error("model: transformer\nembed: 1.5\n", 2, "'embed' must be an integer");
  expect_parse_error("model: transformer\nembed: [1]\n", 2, "'embed' must be a single value");
  expect_parse_error("model: transformer\nscan_layers: maybe\n", 2, "true or false");
  expect_parse_error("model: transformer\ndtype: f8\n", 2, "'dtype'");
  expect_parse_error("model: transformer\nkernel_init: normal(x)\n", 2, "finite number");
  expect_parse_error("model: transformer\nkernel_init: fancy\n", 2, "unknown initializer 'fancy'");
  expect_parse_error("model: transformer\nembed: 64\nembed: 65\n", 3, "given twice (first on line 2)");
  expect_parse_error("model: transformer\nembed: 64\nheads: 5\n", 0, "heads (5) must divide embed (64)");
  expect_parse_error("model: transformer\nembed: -4\n", 0, "embed must be positive");
  expect_parse_error("model: transformer\nembed: 99999999999999999999\n", 2, "must be an integer");
  expect_parse_error("- model\n", 1, "must be a map");
  expect_parse_error("model: [transformer\n", 2, "invalid YAML");
  EXPECT_THROW(load_model_config("/nonexistent/model.yml"), IoError);
}

TEST(InitializerParse, AcceptsNamesCallsAndKeywords) {
  EXPECT_EQ(Initializer::parse("he_normal").to_string(), Initializer::he_normal().to_string());
  EXPECT_EQ(Initializer::parse(" truncated_normal(0.5, upper=1) ").to_string(),
            "truncated_normal(stddev=0.5, lower=-2, upper=1)");
  EXPECT_EQ(Initializer::parse("uniform()").to_string(), "uniform(scale=0.01)");
  EXPECT_EQ(Initializer::parse(Initializer::glorot_uniform().to_string()).to_string(),
            Initializer::glorot_uniform().to_string());  // to_string() text parses back
  for (std::string bad : {"normal(1, 2)", "normal(scale=1)", "normal(stddev=1, stddev=2)", "constant()",
                          "normal(1", "variance_scaling(1, fan_sideways)", "zeros(1)", "normal(-1)", "normal(nan)",
                          "variance_scaling(1, fan_in, cauchy)", "truncated_normal(1, 2, 1)", "normal(stddev=1, 2)"})
    EXPECT_THROW(Initializer::parse(bad), ValueError) << bad;
}

}  // namespace
}  // namespace tessel
