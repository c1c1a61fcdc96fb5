#include "tessel/models/maxtext_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <set>
#include <variant>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "tessel/core/error.h"
#include "tessel/detail/file_util.h"
#include "tessel/detail/text_util.h"
#include "tessel/detail/yaml_util.h"
#include "tessel/models/detail/maxtext_families.h"
#include "tessel/sharding/rules_io.h"

namespace tessel {
namespace {

using yaml_util::fail;

// One key's final value and where it was set.
struct Setting {
  YAML::Node node;
  std::string source;  // the file (or "--set")
};

// The merged key -> value map: base.yml's keys, each replaced by the model file's and then the
// overrides' value.
class Settings {
 public:
  // Erase, then insert: assigning a YAML::Node would write into the node it refers to (base.yml's).
  void set(const std::string& key, YAML::Node node, std::string source) {
    values_.erase(key);
    values_.emplace(key, Setting{std::move(node), std::move(source)});
  }
  bool has(const std::string& key) const { return values_.contains(key); }
  const Setting& at(const std::string& key) const {
    auto it = values_.find(key);
    if (it == values_.end()) throw ValueError(fmt::format("MaxText config: base.yml has no '{}'", key));
    return it->second;
  }

  std::string str(const std::string& key) const {
    const Setting& s = at(key);
    if (s.node.IsNull()) return "";
    if (!s.node.IsScalar()) fail(s.source, s.node, fmt::format("'{}' must be a single value", key));
    return s.node.Scalar();
  }
  int64_t integer(const std::string& key) const {
    const auto v = text_util::parse_number<int64_t>(digits(key));
    if (!v) bad(key, "an integer");
    return *v;
  }
  double real(const std::string& key) const {
    const auto v = text_util::parse_number<double>(digits(key));
    if (!v) bad(key, "a number");
    return *v;
  }
  bool boolean(const std::string& key) const {
    const std::string t = str(key);
    if (t == "true" || t == "True" || t == "TRUE") return true;
    if (t == "false" || t == "False" || t == "FALSE") return false;
    bad(key, "true or false");
  }
  std::vector<std::string> strings(const std::string& key) const {
    const Setting& s = at(key);
    std::vector<std::string> out;
    if (!s.node.IsSequence()) bad(key, "a list");
    for (const YAML::Node& e : s.node) {
      if (!e.IsScalar()) bad(key, "a list of names");
      out.push_back(e.Scalar());
    }
    return out;
  }
  DType dtype(const std::string& key) const {
    const std::string t = str(key);
    try {
      return parse_dtype(t);
    } catch (const ValueError& e) {
      const Setting& s = at(key);
      fail(s.source, s.node, fmt::format("'{}': {}", key, e.what()));
    }
  }

 private:
  // MaxText writes 10_000 and 1.e-05; YAML 1.1 allows the underscores.
  std::string digits(const std::string& key) const {
    std::string out;
    for (char c : str(key))
      if (c != '_') out += c;
    return out;
  }
  [[noreturn]] void bad(const std::string& key, const std::string& want) const {
    const Setting& s = at(key);
    fail(s.source, s.node, fmt::format("'{}' must be {}, got '{}'", key, want, YAML::Dump(s.node)));
  }
  std::map<std::string, Setting> values_;
};

YAML::Node load_map(std::string_view text, const std::string& source) {
  YAML::Node root = yaml_util::load(text, source);
  if (root.IsNull()) return YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) fail(source, root, "a MaxText config must be a map of key: value");
  for (const auto& item : root)
    if (!item.first.IsScalar()) fail(source, item.first, "keys must be names");
  return root;
}

// base * 2^shift, refused when it leaves int64 (a size no machine holds anyway).
int64_t scaled(int64_t base, int64_t shift, const std::string& key) {
  if (base > (std::numeric_limits<int64_t>::max() >> shift) || base < -(int64_t{1} << 40))
    throw ValueError(fmt::format("MaxText config: {} = {} is out of range", key, base));
  return base * (int64_t{1} << shift);
}

// Rules merged as pyconfig's _merge_logical_axis_rules: the new list's names replace the old
// rules of the same names, and the new rules go last.
std::vector<LogicalRule> merge_rules(std::vector<LogicalRule> base, const std::vector<LogicalRule>& next) {
  std::set<std::string> names;
  for (const LogicalRule& r : next) names.insert(r.logical);
  std::erase_if(base, [&](const LogicalRule& r) { return names.contains(r.logical); });
  for (LogicalRule r : next) {
    r.line = 0;  // the line is in another file than the rules' source
    base.push_back(std::move(r));
  }
  return base;
}

// A rules list given as a YAML node (from a model file or an override), parsed by the rules reader.
std::vector<LogicalRule> rules_of(const YAML::Node& list, const std::string& source) {
  YAML::Node wrapper(YAML::NodeType::Map);
  wrapper["logical_axis_rules"] = list;
  return parse_rules_yaml(YAML::Dump(wrapper), source).rules();
}

// MaxText's get_individual_scales.
std::array<int64_t, 4> individual_scales(int64_t scale) {
  if (scale <= 0 || (scale & (scale - 1)) != 0)
    throw ValueError(fmt::format("MaxText config: global_parameter_scale must be a power of two, got {}", scale));
  int64_t log2 = 0;
  while ((int64_t{1} << (log2 + 1)) <= scale) ++log2;
  const int64_t base = log2 / 3, rem = log2 % 3;
  const int64_t heads = base + (rem > 0 ? 1 : 0);
  return {base + (rem > 1 ? 1 : 0), heads, heads, base};  // emb, heads, mlp, layers
}

std::string parallelism_key(const std::string& kind, const std::string& axis) {
  return fmt::format("{}_{}_parallelism", kind, axis == "stage" ? "pipeline" : axis == "model" ? "tensor" : axis);
}

void check(bool ok, const std::string& source, const std::string& message) {
  if (!ok) throw ValueError(source + ": " + message);
}

// The keys read as they are, each into the field of its name.
using Field = std::variant<int64_t MaxTextConfig::*, double MaxTextConfig::*, bool MaxTextConfig::*,
                           std::string MaxTextConfig::*, DType MaxTextConfig::*, std::vector<std::string> MaxTextConfig::*>;
struct Key {
  const char* name;
  Field field;
};
const Key kKeys[] = {
    {"head_dim", &MaxTextConfig::head_dim},
    {"vocab_size", &MaxTextConfig::vocab_size},
    {"mlp_activations", &MaxTextConfig::mlp_activations},
    {"mlp_activations_limit", &MaxTextConfig::mlp_activations_limit},
    {"logits_via_embedding", &MaxTextConfig::logits_via_embedding},
    {"normalize_embedding_logits", &MaxTextConfig::normalize_embedding_logits},
    {"use_qk_norm", &MaxTextConfig::use_qk_norm},
    {"scan_layers", &MaxTextConfig::scan_layers},
    {"param_scan_axis", &MaxTextConfig::param_scan_axis},
    {"weight_dtype", &MaxTextConfig::weight_dtype},
    {"dtype", &MaxTextConfig::dtype},
    {"normalization_layer_epsilon", &MaxTextConfig::normalization_layer_epsilon},
    {"rope_max_timescale", &MaxTextConfig::rope_max_timescale},
    {"rope_type", &MaxTextConfig::rope_type},
    {"rope_use_scale", &MaxTextConfig::rope_use_scale},
    {"rope_min_timescale", &MaxTextConfig::rope_min_timescale},
    {"rope_linear_scaling_factor", &MaxTextConfig::rope_linear_scaling_factor},
    {"max_position_embeddings", &MaxTextConfig::max_position_embeddings},
    {"original_max_position_embeddings", &MaxTextConfig::original_max_position_embeddings},
    {"rope_factor", &MaxTextConfig::rope_factor},
    {"beta_fast", &MaxTextConfig::beta_fast},
    {"beta_slow", &MaxTextConfig::beta_slow},
    {"mscale", &MaxTextConfig::mscale},
    {"rope_interleave", &MaxTextConfig::rope_interleave},
    {"rope_truncate", &MaxTextConfig::rope_truncate},
    {"rope_attention_scaling", &MaxTextConfig::rope_attention_scaling},
    {"dense_init_scale", &MaxTextConfig::dense_init_scale},
    {"attention_bias", &MaxTextConfig::attention_bias},
    {"attention_sink", &MaxTextConfig::attention_sink},
    {"sliding_window_size", &MaxTextConfig::sliding_window_size},
    {"inhomogeneous_layer_cycle_interval", &MaxTextConfig::inhomogeneous_layer_cycle_interval},
    {"num_experts", &MaxTextConfig::num_experts},
    {"num_experts_per_tok", &MaxTextConfig::num_experts_per_tok},
    {"shared_experts", &MaxTextConfig::shared_experts},
    {"first_num_dense_layers", &MaxTextConfig::first_num_dense_layers},
    {"routed_bias", &MaxTextConfig::routed_bias},
    {"mlp_bias", &MaxTextConfig::mlp_bias},
    {"routed_score_func", &MaxTextConfig::routed_score_func},
    {"routed_scaling_factor", &MaxTextConfig::routed_scaling_factor},
    {"norm_topk_prob", &MaxTextConfig::norm_topk_prob},
    {"capacity_factor", &MaxTextConfig::capacity_factor},
    {"load_balance_loss_weight", &MaxTextConfig::load_balance_loss_weight},
    {"n_routing_groups", &MaxTextConfig::n_routing_groups},
    {"topk_routing_group", &MaxTextConfig::topk_routing_group},
    {"attention_type", &MaxTextConfig::attention_type},
    {"q_lora_rank", &MaxTextConfig::q_lora_rank},
    {"kv_lora_rank", &MaxTextConfig::kv_lora_rank},
    {"qk_nope_head_dim", &MaxTextConfig::qk_nope_head_dim},
    {"qk_rope_head_dim", &MaxTextConfig::qk_rope_head_dim},
    {"v_head_dim", &MaxTextConfig::v_head_dim},
    {"opt_type", &MaxTextConfig::opt_type},
};

// The base_* sizes, each scaled by its share of global_parameter_scale (MaxText's
// get_individual_scales: embeddings, heads, mlp, layers).
enum Scale { kEmb, kHeads, kMlp, kLayers };
struct ScaledKey {
  const char* name;
  int64_t MaxTextConfig::*field;
  Scale scale;
};
const ScaledKey kScaledKeys[] = {
    {"base_emb_dim", &MaxTextConfig::emb_dim, kEmb},
    {"base_num_query_heads", &MaxTextConfig::num_query_heads, kHeads},
    {"base_num_kv_heads", &MaxTextConfig::num_kv_heads, kHeads},
    {"base_mlp_dim", &MaxTextConfig::mlp_dim, kMlp},
    {"base_moe_mlp_dim", &MaxTextConfig::moe_mlp_dim, kMlp},
    {"base_num_decoder_layers", &MaxTextConfig::num_decoder_layers, kLayers},
};

void read(const Settings& s, const char* key, int64_t& out) { out = s.integer(key); }
void read(const Settings& s, const char* key, double& out) { out = s.real(key); }
void read(const Settings& s, const char* key, bool& out) { out = s.boolean(key); }
void read(const Settings& s, const char* key, std::string& out) { out = s.str(key); }
void read(const Settings& s, const char* key, DType& out) { out = s.dtype(key); }
void read(const Settings& s, const char* key, std::vector<std::string>& out) { out = s.strings(key); }

}  // namespace

const std::map<std::string, std::string>& maxtext_refused_keys() {
  static const std::map<std::string, std::string> keys = {
      {"fused_qkv", "a fused qkv_proj kernel"},
      {"fused_mlp", "a fused wi kernel with a num_activations axis"},
      {"share_kv_projections", "one projection for keys and values"},
      {"trainable_position_size", "a trainable position_embedder"},
      {"shard_exp_on_fsdp", "expert kernels laid out for fsdp"},
      {"use_2d_fsdp_sharding", "expert kernels laid out for 2-D fsdp"},
      {"use_batch_split_schedule", "expert kernels laid out for the batch-split schedule"},
      {"moe_expert_input_dim", "a separate expert input width"},
      {"engram_layers", "engram layers"},
      {"mhc_expansion_rate", "manifold-constrained hyper-connections"},
      {"use_indexer", "the sparse-attention indexer"},
      {"interleave_moe_layer_step", "interleaved MoE layers (llama4)"},
      {"quantization", "quantized parameters"},
      {"attention_output_dim", "a different attention output width"},
      {"global_head_dim", "a separate global-attention head size"},
      {"qk_norm_with_scale", "query/key norms without a scale"},
      {"pipeline_parallel_layers", "pipeline-parallel layer stacks"},
      {"ici_pipeline_parallelism", "pipeline-parallel layer stacks"},
      {"dcn_pipeline_parallelism", "pipeline-parallel layer stacks"},
      {"ici_context_autoregressive_parallelism", "attention kernels without logical axes"},
      {"use_multimodal", "vision and audio encoders"},
      {"mtp_num_layers", "multi-token-prediction layers"},
      {"scan_layers_per_stage", "per-stage layer scans"},
      {"use_untrainable_positional_embedding", "sinusoidal position embeddings"},
  };
  return keys;
}

Mesh MaxTextConfig::mesh(int64_t devices) const {
  if (devices <= 0) throw ValueError(fmt::format("MaxText mesh: the device count must be positive, got {}", devices));
  if (devices % num_slices != 0)
    throw ValueError(fmt::format("MaxText mesh: {} devices do not split into {} slices", devices, num_slices));
  auto fill = [&](const std::map<std::string, int64_t>& given, int64_t target, const char* kind) {
    std::vector<int64_t> sizes;
    int64_t product = 1, unknown = -1;
    for (const std::string& axis : mesh_axes) {
      const int64_t v = given.at(axis);
      if (v == -1) {
        if (unknown >= 0)
          throw ValueError(fmt::format("MaxText mesh: more than one {} parallelism is -1 (at most one axis can be "
                                       "left to fill)", kind));
        unknown = static_cast<int64_t>(sizes.size());
      } else if (v <= 0) {
        throw ValueError(fmt::format("MaxText mesh: {} must be positive or -1, got {}", parallelism_key(kind, axis), v));
      } else {
        product *= v;
      }
      sizes.push_back(v);
    }
    if (unknown >= 0) {
      if (target % product != 0)
        throw ValueError(fmt::format("MaxText mesh: the {} parallelism left to fill cannot be found: {} is not a "
                                     "multiple of {}", kind, target, product));
      sizes[static_cast<size_t>(unknown)] = target / product;
      product = target;
    }
    if (product != target)
      throw ValueError(fmt::format("MaxText mesh: the {} parallelism multiplies to {}, not the {} {}", kind, product,
                                   target, std::string(kind) == "ici" ? "devices per slice" : "slices"));
    return sizes;
  };
  const std::vector<int64_t> ici = fill(ici_parallelism, devices / num_slices, "ici");
  const std::vector<int64_t> dcn = fill(dcn_parallelism, num_slices, "dcn");
  std::vector<MeshAxis> axes;
  for (size_t i = 0; i < mesh_axes.size(); ++i) axes.push_back({mesh_axes[i], ici[i] * dcn[i]});
  return Mesh(std::move(axes));
}

void MaxTextConfig::check_mesh(const Mesh& mesh) const {
  if (is_mla()) return;  // MLA's projections have no key/value kernel of their own
  const PartitionSpec spec = rules.logical_to_mesh_axes({"embed", "kv_heads", "kv_head_dim"}, "the key kernel");
  std::vector<std::string> axes(spec[1].begin(), spec[1].end());
  std::string lowered = context_parallel_strategy;
  for (char& ch : lowered) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (lowered == "ulysses" && std::find(axes.begin(), axes.end(), context_sharding) == axes.end())
    axes.push_back(context_sharding);
  int64_t ways = 1;
  std::string names;
  for (const std::string& a : axes) {
    ways *= mesh.has_axis(a) ? mesh.axis_size(a) : 1;
    names += (names.empty() ? "" : ", ") + a;
  }
  if (num_kv_heads % ways != 0)
    throw ShardingError(fmt::format(
        "num_kv_heads ({}) must be divisible by {}, the combined size of the mesh axes [{}] that shard KV heads on {}: "
        "attention heads are atomic under tensor parallelism (reduce those axes, raise base_num_kv_heads, or move the "
        "parallelism to fsdp)", num_kv_heads, ways, names, mesh.to_string()));
}

MaxTextConfig load_maxtext_config(const MaxTextSources& in) {
  const std::string base_text = file_util::read_text(in.base);
  const std::string model_text = in.model.empty() ? std::string() : file_util::read_text(in.model);
  return parse_maxtext_config(base_text, model_text, in.overrides, in.base.string(),
                              in.model.empty() ? std::string() : in.model.string(), in.rules);
}

MaxTextConfig parse_maxtext_config(std::string_view base_text, std::string_view model_text,
                                   const std::vector<std::string>& overrides, const std::string& base_name,
                                   const std::string& model_file, const std::optional<std::filesystem::path>& rules_file) {
  const YAML::Node base = load_map(base_text, base_name);
  Settings s;
  for (const auto& item : base) s.set(item.first.Scalar(), item.second, base_name);
  std::vector<LogicalRule> rules = parse_rules_yaml(base_text, base_name).rules();
  std::vector<std::string> mesh_axes = s.has("mesh_axes") ? s.strings("mesh_axes") : std::vector<std::string>{};

  std::string source = base_name;
  std::string model_name = s.has("model_name") ? s.str("model_name") : "default";
  auto apply = [&](const std::string& key, const YAML::Node& value, const std::string& from, const YAML::Node& at) {
    if (!s.has(key))
      fail(from, at, fmt::format("unknown key '{}': {} has no such key (a typo, or a newer MaxText?)", key, base_name));
    if (key == "logical_axis_rules") {
      rules = merge_rules(std::move(rules), rules_of(value, from));
      return;
    }
    s.set(key, value, from);
  };
  if (!model_file.empty()) {
    const YAML::Node model = load_map(model_text, model_file);
    for (const auto& item : model) apply(item.first.Scalar(), item.second, model_file, item.first);
    source += " + " + model_file;
    model_name = std::filesystem::path(model_file).stem().string();
  }
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    const std::string where = "--set " + o;
    if (eq == std::string::npos || eq == 0)
      throw ValueError(fmt::format("{}: expected key=value", where));
    const std::string key = o.substr(0, eq);
    const YAML::Node value = yaml_util::load(o.substr(eq + 1), where);
    apply(key, value, where, value);
  }
  if (!overrides.empty()) source += fmt::format(" + {} override{}", overrides.size(), overrides.size() == 1 ? "" : "s");
  if (rules_file) {
    // A custom mesh-and-rule file replaces both lists, as MaxText's custom_mesh_and_rule does.
    const LogicalRules custom = load_rules(*rules_file);
    rules = custom.rules();
    if (!custom.mesh_axes().empty()) mesh_axes = custom.mesh_axes();
    source += " + rules " + rules_file->string();
  }

  // What tessel does not build, refused by name rather than built differently.
  for (const auto& [key, what] : maxtext_refused_keys()) {
    if (!s.has(key) || !base[key]) continue;
    const Setting& now = s.at(key);
    if (YAML::Dump(now.node) != YAML::Dump(base[key]))
      fail(now.source, now.node, fmt::format("'{}: {}' asks for {}, which tessel does not build yet (leave it at "
                                             "{})", key, YAML::Dump(now.node), what, YAML::Dump(base[key])));
  }

  MaxTextConfig c;
  c.model_name = model_name;
  c.source = source;
  c.decoder_block = s.str("decoder_block");
  const maxtext::Family* family = maxtext::find_family(c.decoder_block);
  if (!family) {
    const Setting& at = s.at("decoder_block");
    fail(at.source, at.node, fmt::format("decoder_block '{}' is not one tessel builds (known: {})", c.decoder_block,
                                         maxtext::family_names()));
  }
  c.family = family->family;
  const std::array<int64_t, 4> scales = individual_scales(s.integer("global_parameter_scale"));
  for (const ScaledKey& k : kScaledKeys) c.*k.field = scaled(s.integer(k.name), scales[k.scale], k.name);
  for (const Key& k : kKeys) std::visit([&](auto field) { read(s, k.name, c.*field); }, k.field);
  c.mu_dtype = s.str("mu_dtype").empty() ? c.weight_dtype : s.dtype("mu_dtype");
  if (s.has("context_parallel_strategy")) c.context_parallel_strategy = s.str("context_parallel_strategy");
  if (s.has("context_sharding")) c.context_sharding = s.str("context_sharding");

  c.mesh_axes = mesh_axes;
  if (c.mesh_axes.empty()) throw ValueError(source + ": no mesh_axes");
  for (const std::string& axis : c.mesh_axes) {
    for (const char* kind : {"ici", "dcn"}) {
      const std::string key = parallelism_key(kind, axis);
      if (!s.has(key))
        throw ValueError(fmt::format("{}: mesh axis '{}' has no {} (MaxText sizes each mesh axis with it)", source,
                                     axis, key));
      (std::string(kind) == "ici" ? c.ici_parallelism : c.dcn_parallelism)[axis] = s.integer(key);
    }
  }
  const int64_t slices = s.has("num_slices") ? s.integer("num_slices") : -1;
  c.num_slices = slices > 0 ? slices : 1;
  c.rules = LogicalRules(std::move(rules), c.mesh_axes, base_name);

  // MaxText's own checks on these values, with its reasons.
  const std::string& src = c.source;
  for (auto [name, v] : {std::pair{"base_emb_dim", c.emb_dim}, {"base_num_query_heads", c.num_query_heads},
                         {"base_num_kv_heads", c.num_kv_heads}, {"head_dim", c.head_dim},
                         {"base_mlp_dim", c.mlp_dim}, {"base_num_decoder_layers", c.num_decoder_layers},
                         {"vocab_size", c.vocab_size}})
    check(v > 0, src, fmt::format("{} must be positive, got {}", name, v));
  // Every size below 2^31, so the products and sums the layers form stay far inside int64.
  constexpr int64_t kMaxSize = int64_t{1} << 31;
  for (auto [name, v] : {std::pair{"base_emb_dim", c.emb_dim}, {"base_num_query_heads", c.num_query_heads},
                         {"base_num_kv_heads", c.num_kv_heads}, {"head_dim", c.head_dim}, {"base_mlp_dim", c.mlp_dim},
                         {"base_moe_mlp_dim", c.moe_mlp_dim}, {"base_num_decoder_layers", c.num_decoder_layers},
                         {"vocab_size", c.vocab_size}, {"num_experts", c.num_experts},
                         {"num_experts_per_tok", c.num_experts_per_tok}, {"shared_experts", c.shared_experts},
                         {"first_num_dense_layers", c.first_num_dense_layers}, {"q_lora_rank", c.q_lora_rank},
                         {"kv_lora_rank", c.kv_lora_rank}, {"qk_nope_head_dim", c.qk_nope_head_dim},
                         {"qk_rope_head_dim", c.qk_rope_head_dim}, {"v_head_dim", c.v_head_dim},
                         {"inhomogeneous_layer_cycle_interval", c.inhomogeneous_layer_cycle_interval}})
    check(v < kMaxSize, src, fmt::format("{} = {} is out of range (at most 2^31 - 1)", name, v));
  check(c.num_query_heads % c.num_kv_heads == 0, src,
        fmt::format("base_num_kv_heads ({}) must divide base_num_query_heads ({})", c.num_kv_heads, c.num_query_heads));
  check(!c.mlp_activations.empty(), src, "mlp_activations must name at least one activation");
  check(c.param_scan_axis >= 0 && c.param_scan_axis <= 3, src,
        fmt::format("param_scan_axis must be in [0, 3], got {}", c.param_scan_axis));
  check(c.num_experts >= 1, src, fmt::format("num_experts must be positive, got {}", c.num_experts));
  if (c.is_moe()) {
    std::string moe_blocks;
    for (const maxtext::Family& f : maxtext::families())
      if (f.moe) moe_blocks += (moe_blocks.empty() ? "" : ", ") + std::string(f.decoder_block);
    check(family->moe, src, fmt::format("num_experts = {} needs a mixture-of-experts decoder_block ({}); '{}' has none",
                                        c.num_experts, moe_blocks, c.decoder_block));
    check(c.moe_mlp_dim > 0, src, "moe_mlp_dim must be positive for MoE models (num_experts > 1): set base_moe_mlp_dim");
    check(c.num_experts_per_tok >= 1 && c.num_experts_per_tok <= c.num_experts, src,
          fmt::format("num_experts_per_tok must be in [1, num_experts = {}], got {}", c.num_experts,
                      c.num_experts_per_tok));
    const bool fully_moe = c.first_num_dense_layers == 0 && c.inhomogeneous_layer_cycle_interval == 1;
    check(!fully_moe || s.integer("base_mlp_dim") == s.integer("base_moe_mlp_dim"), src,
          fmt::format("for a fully MoE model, base_mlp_dim must equal base_moe_mlp_dim (got {} and {})",
                      s.integer("base_mlp_dim"), s.integer("base_moe_mlp_dim")));
  } else {
    check(!family->moe, src, fmt::format("decoder_block '{}' is a mixture of experts: num_experts must be > 1",
                                       c.decoder_block));
  }
  if (c.family == MaxTextFamily::kDeepseek) {
    check(c.is_mla(), src, "decoder_block 'deepseek' uses MLA attention: attention_type must be 'mla'");
    check(c.first_num_dense_layers >= 0 && c.first_num_dense_layers <= c.num_decoder_layers, src,
          fmt::format("first_num_dense_layers must be in [0, {}], got {}", c.num_decoder_layers,
                      c.first_num_dense_layers));
    check(c.shared_experts >= 0, src, "shared_experts must not be negative");
  }
  if (c.is_mla()) {
    check(c.family == MaxTextFamily::kDeepseek, src, "attention_type 'mla' is built for decoder_block 'deepseek' only");
    check(c.num_query_heads == c.num_kv_heads, src, "MLA requires equal numbers of query and kv heads");
    for (auto [name, v] : {std::pair{"kv_lora_rank", c.kv_lora_rank}, {"qk_nope_head_dim", c.qk_nope_head_dim},
                           {"qk_rope_head_dim", c.qk_rope_head_dim}, {"v_head_dim", c.v_head_dim}})
      check(v > 0, src, fmt::format("MLA needs {} > 0, got {}", name, v));
    check(c.q_lora_rank >= 0, src, "q_lora_rank must not be negative");
  }
  check(c.load_balance_loss_weight >= 0, src,
        fmt::format("load_balance_loss_weight must not be negative, got {}", c.load_balance_loss_weight));
  check(std::isfinite(c.capacity_factor), src, "capacity_factor must be a number (<= 0: dropless)");
  check(c.inhomogeneous_layer_cycle_interval >= 1, src, "inhomogeneous_layer_cycle_interval must be positive");
  if (c.family == MaxTextFamily::kGptOss && c.scan_layers)
    check(c.num_decoder_layers % c.inhomogeneous_layer_cycle_interval == 0, src,
          fmt::format("scanned gpt_oss layers come in blocks of inhomogeneous_layer_cycle_interval = {}, which must "
                      "divide the {} layers", c.inhomogeneous_layer_cycle_interval, c.num_decoder_layers));
  if (!c.scan_layers)
    check(c.num_decoder_layers <= 10000, src, "at most 10000 unscanned layers (use scan_layers: true)");
  return c;
}

}  // namespace tessel
