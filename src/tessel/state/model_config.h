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

#include "tessel/state/models.h"
#include "tessel/state/module.h"

namespace tessel {

struct ModelConfig {
  std::variant<DotReluDotConfig, TransformerConfig> config;
  std::string source;  // the file it came from, for messages

  std::string family() const;  // "dot_relu_dot" or "transformer"
  Module build() const;
};

ModelConfig parse_model_config(std::string_view yaml, std::string source = "<yaml>");
ModelConfig load_model_config(const std::filesystem::path& file);

}  // namespace tessel
