// MaxText's model configuration, read as MaxText reads it: base.yml's defaults, a model file
// (configs/models/<name>.yml) over them, then key=value overrides; logical_axis_rules merged the
// way pyconfig merges them (a later list replaces the earlier rules of the same names and goes
// last), or replaced with a custom mesh-and-rule file (mesh_axes + logical_axis_rules). The
// derived sizes follow MaxText: global_parameter_scale, moe_mlp_dim, mu_dtype, the mesh from the
// ici_*/dcn_* parallelism keys.
//
//   tessel::MaxTextConfig c = tessel::load_maxtext_config(
//       {.model = "models/qwen3-0.6b.yml", .base = "base.yml", .overrides = {"scan_layers=false"}});
//   c.emb_dim == 1024 && c.decoder_block == "qwen3"
//   tessel::Mesh mesh = c.mesh(16);        // ici_fsdp_parallelism: -1 takes what is left
//
// Errors name the file and line (ParseError) or the key (ValueError): a key base.yml does not
// have, a value of the wrong type, a decoder block tessel does not build, and a parameter-shaping
// option tessel does not implement set away from its default (refused_keys()).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/dtype.h"
#include "tessel/sharding/logical_rules.h"
#include "tessel/sharding/mesh.h"

namespace tessel {

struct MaxTextSources {
  std::filesystem::path model;               // empty: base.yml alone
  std::filesystem::path base;                // MaxText's base.yml
  std::vector<std::string> overrides;        // "key=value", the value in YAML ("[\"silu\", \"linear\"]")
  std::optional<std::filesystem::path> rules;  // custom mesh_axes + logical_axis_rules
};

// The decoder families tessel builds, by MaxText's decoder_block.
enum class MaxTextFamily { kLlama2, kQwen3, kMixtral, kQwen3Moe, kDeepseek, kGptOss };

struct MaxTextConfig {
  std::string model_name;     // the model file's stem ("qwen3-0.6b"), or base.yml's model_name
  std::string decoder_block;  // llama2, qwen3, mixtral, qwen3_moe, deepseek, gpt_oss
  MaxTextFamily family = MaxTextFamily::kLlama2;  // decoder_block's
  // Sizes after global_parameter_scale.
  int64_t emb_dim = 0, num_query_heads = 0, num_kv_heads = 0, head_dim = 0, mlp_dim = 0;
  int64_t moe_mlp_dim = 0, num_decoder_layers = 0, vocab_size = 0;
  std::vector<std::string> mlp_activations;  // wi (one) or wi_0, wi_1, ... (several)
  double mlp_activations_limit = -1;
  bool logits_via_embedding = false, normalize_embedding_logits = false;
  bool use_qk_norm = false;
  bool scan_layers = true;
  int64_t param_scan_axis = 1;
  DType weight_dtype = DType::kF32, dtype = DType::kBF16, mu_dtype = DType::kF32;
  double normalization_layer_epsilon = 1e-5;
  double rope_max_timescale = 10000;
  // MaxText's rope: "default" (halves paired; "llama3.1" model names get LLaMARotaryEmbedding,
  // neighbours paired, Llama 3.1's scaling with rope_use_scale), "llama3.1" or "yarn".
  std::string rope_type = "default";
  bool rope_use_scale = true;
  double rope_min_timescale = 1, rope_linear_scaling_factor = 1;
  // YaRN (rope_type: yarn) and MLA's softmax scale.
  int64_t max_position_embeddings = 163840, original_max_position_embeddings = 4096;
  double rope_factor = 40, beta_fast = 32, beta_slow = 1, mscale = 1;
  bool rope_interleave = true, rope_truncate = true, rope_attention_scaling = false;
  double dense_init_scale = 1.0;
  bool attention_bias = false, attention_sink = false;
  int64_t sliding_window_size = 0;
  int64_t inhomogeneous_layer_cycle_interval = 1;
  // Mixture of experts.
  int64_t num_experts = 1, num_experts_per_tok = 1, shared_experts = 0, first_num_dense_layers = 0;
  bool routed_bias = false, mlp_bias = false;
  std::string routed_score_func;
  double routed_scaling_factor = 1.0;
  bool norm_topk_prob = false;
  double capacity_factor = -1;  // <= 0: dropless
  double load_balance_loss_weight = 0;
  int64_t n_routing_groups = -1, topk_routing_group = -1;
  // Attention kind; MLA's low-rank sizes.
  std::string attention_type = "global";
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  // Optimizer (for the TrainState and the plan).
  std::string opt_type = "adamw";
  std::string context_parallel_strategy = "all_gather", context_sharding = "context";
  // Rules and mesh.
  LogicalRules rules;
  std::vector<std::string> mesh_axes;
  std::map<std::string, int64_t> ici_parallelism, dcn_parallelism;  // per mesh axis
  int64_t num_slices = 1;
  std::string source;  // "base.yml + models/qwen3-0.6b.yml + 2 overrides", for messages

  bool is_moe() const { return num_experts > 1; }
  bool is_mla() const { return attention_type == "mla"; }
  // DeepSeek V3's routing (moe.py, deepseek_routing): experts chosen by the biased scores and
  // weighted by the unbiased ones, for model names deepseek3* and deepseek4*.
  bool deepseek_routing() const { return model_name.starts_with("deepseek3") || model_name.starts_with("deepseek4"); }
  // MaxText 0.2.5 keeps these models' gate bias as a MoEBiasVar (updated from the routing, not
  // trained), not a parameter: under nnx_aux in its checkpoints.
  bool moe_bias_is_aux() const {
    return model_name.starts_with("deepseek3") || model_name.starts_with("deepseek4") || model_name.starts_with("kimi-k2");
  }
  // The mesh MaxText builds for `devices` devices (num_slices slices): per mesh axis
  // ici * dcn, one -1 per kind filled with what is left. Throws ValueError when the sizes do not
  // multiply to the device count.
  Mesh mesh(int64_t devices) const;
  // MaxText's checks of the config against a mesh (Attention._validate_kv_head_sharding): the
  // mesh axes that shard kv_heads (by the rules, and the context axis under Ulysses) must divide
  // num_kv_heads, as attention heads are atomic. Throws ShardingError naming the axes.
  void check_mesh(const Mesh& mesh) const;
};

MaxTextConfig load_maxtext_config(const MaxTextSources& sources);
// The same from the files' texts (an empty `model_file` name: no model file); the names label
// messages, and `rules_file` is read from disk.
MaxTextConfig parse_maxtext_config(std::string_view base_text, std::string_view model_text,
                                   const std::vector<std::string>& overrides, const std::string& base_name = "base.yml",
                                   const std::string& model_file = "model.yml",
                                   const std::optional<std::filesystem::path>& rules_file = std::nullopt);

// The parameter-shaping keys tessel refuses when set away from base.yml's value, each with the
// reason; every other key base.yml has (compute, data, mesh, training) is accepted.
const std::map<std::string, std::string>& maxtext_refused_keys();

}  // namespace tessel
