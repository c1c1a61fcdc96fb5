#include "tessel/models/model_config.h"

#include <functional>
#include <map>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "tessel/core/error.h"
#include "tessel/detail/file_util.h"
#include "tessel/detail/text_util.h"
#include "tessel/detail/yaml_util.h"
#include "tessel/models/maxtext.h"

namespace tessel {
namespace {

using yaml_util::fail;

std::string scalar(const std::string& source, const std::string& key, const YAML::Node& n) {
  if (!n.IsScalar()) fail(source, n, fmt::format("'{}' must be a single value", key));
  return n.Scalar();
}

int64_t integer(const std::string& source, const std::string& key, const YAML::Node& n) {
  std::string text = scalar(source, key, n);
  std::string digits;
  for (char c : text)
    if (c != '_') digits += c;  // MaxText writes 10_000
  const auto v = text_util::parse_number<int64_t>(digits);
  if (!v) fail(source, n, fmt::format("'{}' must be an integer, got '{}'", key, text));
  return *v;
}

bool boolean(const std::string& source, const std::string& key, const YAML::Node& n) {
  std::string text = scalar(source, key, n);
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  fail(source, n, fmt::format("'{}' must be true or false, got '{}'", key, text));
}

template <typename Config>
using Setter = std::function<void(Config&, const std::string& source, const std::string& key, const YAML::Node&)>;

template <typename Config>
Setter<Config> int_field(int64_t Config::*field) {
  return [field](Config& c, const std::string& s, const std::string& k, const YAML::Node& n) { c.*field = integer(s, k, n); };
}
template <typename Config>
Setter<Config> bool_field(bool Config::*field) {
  return [field](Config& c, const std::string& s, const std::string& k, const YAML::Node& n) { c.*field = boolean(s, k, n); };
}
template <typename Config>
Setter<Config> dtype_field(DType Config::*field) {
  return [field](Config& c, const std::string& s, const std::string& k, const YAML::Node& n) {
    try {
      c.*field = parse_dtype(scalar(s, k, n));
    } catch (const ValueError& e) {
      fail(s, n, fmt::format("'{}': {}", k, e.what()));
    }
  };
}
template <typename Config>
Setter<Config> init_field(Initializer Config::*field) {
  return [field](Config& c, const std::string& s, const std::string& k, const YAML::Node& n) {
    try {
      c.*field = Initializer::parse(scalar(s, k, n));
    } catch (const ValueError& e) {
      fail(s, n, fmt::format("'{}': {}", k, e.what()));
    }
  };
}

template <typename Config>
Config read_fields(const std::string& source, const YAML::Node& root, const std::string& family,
                   const std::map<std::string, Setter<Config>>& setters) {
  Config config;
  std::map<std::string, int64_t> seen;  // key -> line, to reject a repeated key
  for (const auto& item : root) {
    const YAML::Node& key_node = item.first;
    if (!key_node.IsScalar()) fail(source, key_node, "keys must be names");
    const std::string key = key_node.Scalar();
    auto [at, fresh] = seen.emplace(key, key_node.Mark().line + 1);
    if (!fresh) fail(source, key_node, fmt::format("key '{}' is given twice (first on line {})", key, at->second));
    if (key == "model") continue;
    auto it = setters.find(key);
    if (it == setters.end()) {
      std::string known;
      for (const auto& [k, s] : setters) known += (known.empty() ? "" : ", ") + k;
      fail(source, key_node, fmt::format("unknown key '{}' for model '{}' (known: model, {})", key, family, known));
    }
    it->second(config, source, key, item.second);
  }
  return config;
}

ModelConfig from_yaml(const YAML::Node& root, const std::string& source) {
  if (!root.IsMap()) fail(source, root, "a model config must be a map with a 'model' key");
  const YAML::Node model = root["model"];
  if (!model) fail(source, root, "missing 'model' key (transformer or dot_relu_dot)");
  const std::string family = scalar(source, "model", model);

  ModelConfig out{.config = DotReluDotConfig{}, .source = source};
  if (family == "dot_relu_dot") {
    using C = DotReluDotConfig;
    out.config = read_fields<C>(source, root, family, {
        {"depth", int_field<C>(&C::depth)}, {"hidden", int_field<C>(&C::hidden)},
        {"dtype", dtype_field<C>(&C::dtype)}, {"kernel_init", init_field<C>(&C::kernel_init)}});
  } else if (family == "transformer") {
    using C = TransformerConfig;
    out.config = read_fields<C>(source, root, family, {
        {"vocab", int_field<C>(&C::vocab)}, {"embed", int_field<C>(&C::embed)},
        {"layers", int_field<C>(&C::layers)}, {"heads", int_field<C>(&C::heads)},
        {"kv_heads", int_field<C>(&C::kv_heads)}, {"head_dim", int_field<C>(&C::head_dim)},
        {"mlp", int_field<C>(&C::mlp)}, {"scan_layers", bool_field<C>(&C::scan_layers)},
        {"scan_axis", int_field<C>(&C::scan_axis)}, {"tied_embedding", bool_field<C>(&C::tied_embedding)},
        {"gated_mlp", bool_field<C>(&C::gated_mlp)}, {"qk_norm", bool_field<C>(&C::qk_norm)},
        {"dtype", dtype_field<C>(&C::dtype)}, {"kernel_init", init_field<C>(&C::kernel_init)},
        {"embedding_init", init_field<C>(&C::embedding_init)}, {"norm_init", init_field<C>(&C::norm_init)}});
  } else {
    fail(source, model, fmt::format("unknown model '{}' (known: transformer, dot_relu_dot)", family));
  }
  // Sizes and their relations, reported against the file.
  try {
    if (const auto* d = std::get_if<DotReluDotConfig>(&out.config)) validate(*d);
    if (const auto* t = std::get_if<TransformerConfig>(&out.config)) validate(*t);
  } catch (const ValueError& e) {
    throw ParseError(source, 0, 0, e.what());
  }
  return out;
}

}  // namespace

std::string ModelConfig::family() const {
  if (std::holds_alternative<DotReluDotConfig>(config)) return "dot_relu_dot";
  if (std::holds_alternative<TransformerConfig>(config)) return "transformer";
  return "maxtext:" + std::get<MaxTextConfig>(config).decoder_block;
}

int64_t ModelConfig::vocab() const {
  if (const auto* t = std::get_if<TransformerConfig>(&config)) return t->vocab;
  if (const auto* m = std::get_if<MaxTextConfig>(&config)) return m->vocab_size;
  return 0;
}

Module ModelConfig::build() const {
  if (const auto* c = std::get_if<DotReluDotConfig>(&config)) return dot_relu_dot(*c);
  if (const auto* m = std::get_if<MaxTextConfig>(&config)) return maxtext_model(*m);
  return transformer_lm(std::get<TransformerConfig>(config));
}

ModelConfig load_maxtext_model(const MaxTextSources& sources) {
  MaxTextConfig c = load_maxtext_config(sources);
  std::string source = c.source;
  return ModelConfig{.config = std::move(c), .source = std::move(source)};
}

ModelConfig parse_model_config(std::string_view yaml, std::string source) {
  YAML::Node root = yaml_util::load(yaml, source);
  try {
    return from_yaml(root, source);
  } catch (const YAML::Exception& e) {
    throw ParseError(source, e.mark.is_null() ? 0 : e.mark.line + 1, 0, "invalid model config: " + e.msg);
  }
}

ModelConfig load_model_config(const std::filesystem::path& file) {
  return parse_model_config(file_util::read_text(file), file.string());
}

}  // namespace tessel
