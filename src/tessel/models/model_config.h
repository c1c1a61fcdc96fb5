// Model descriptions in YAML, for the CLI and for users who do not want to write C++:
//
//   model: transformer            # or dot_relu_dot
//   vocab: 32000
//   embed: 4096
//   layers: 32
//   heads: 32
//   kv_heads: 8                   # optional, default heads
//   head_dim: 128                 # optional, default embed / heads
//   mlp: 14336
//   scan_layers: true             # stacked "layers" dimension (default) or layers/0, layers/1, ...
//   gated_mlp: true               # wi_0 + wi_1
//   tied_embedding: false
//   dtype: bf16
//   kernel_init: lecun_normal     # any Initializer::parse text
//
//   tessel::ModelConfig config = tessel::load_model_config("llama.yml");
//   tessel::Module model = config.build();
//
// Unknown keys, wrong types and invalid sizes are ParseError with the file, line and column.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <variant>

#include "tessel/models/dot_relu_dot.h"
#include "tessel/models/maxtext_config.h"
#include "tessel/models/transformer.h"
#include "tessel/state/module.h"

namespace tessel {

// A model: tessel's own (YAML above) or one of MaxText's families (maxtext_config.h).
struct ModelConfig {
  std::variant<DotReluDotConfig, TransformerConfig, MaxTextConfig> config;
  std::string source;  // the file(s) it came from, for messages

  std::string family() const;  // "dot_relu_dot", "transformer" or "maxtext:<decoder_block>"
  bool is_lm() const { return !std::holds_alternative<DotReluDotConfig>(config); }
  int64_t vocab() const;       // the LM's vocabulary; 0 for DotReluDot
  Module build() const;
};

ModelConfig parse_model_config(std::string_view yaml, std::string source = "<yaml>");
ModelConfig load_model_config(const std::filesystem::path& file);
// One of MaxText's models from its YAML files (load_maxtext_config).
ModelConfig load_maxtext_model(const MaxTextSources& sources);

}  // namespace tessel
