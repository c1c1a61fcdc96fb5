#include "tessel/models/maxtext.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "tessel/core/error.h"
#include "tessel/detail/file_util.h"
#include "tessel/detail/json_util.h"
#include "tessel/detail/text_util.h"
#include "tessel/models/detail/maxtext_layers.h"
#include "tessel/nn/optimizer.h"
#include "tessel/runtime/array.h"
#include "tessel/ops/ops.h"
#include "tessel/sharding/detail/spec_json.h"

namespace tessel {
namespace {

using maxtext::Weights;

// One decoder layer of the family, or of its MoE kind (deepseek).
Module layer_of(const MaxTextConfig& c, const std::string& name, bool moe) {
  if (c.decoder_block == "llama2") return maxtext::llama2_layer(name, c);
  if (c.decoder_block == "qwen3") return maxtext::qwen3_layer(name, c);
  if (c.decoder_block == "deepseek")
    return moe ? maxtext::deepseek_moe_layer(name, c) : maxtext::deepseek_dense_layer(name, c);
  if (c.decoder_block == "gpt_oss") return maxtext::gpt_oss_layer(name, c);
  if (c.decoder_block == "mixtral") return maxtext::mixtral_layer(name, c);
  if (c.decoder_block == "qwen3_moe") return maxtext::qwen3_moe_layer(name, c);
  throw ValueError("decoder_block '" + c.decoder_block + "' is not one tessel builds");
}

// The decoder's layer stacks as (name, count, moe): scanned, each is one Module of stacked
// parameters; unscanned, `name`_0, `name`_1, ...
struct Stack {
  std::string name;
  int64_t count;
  bool moe;
};

std::vector<Stack> stacks(const MaxTextConfig& c) {
  if (c.decoder_block == "deepseek")
    return {{"dense_layers", c.first_num_dense_layers, false},
            {"moe_layers", c.num_decoder_layers - c.first_num_dense_layers, true}};
  return {{"layers", c.num_decoder_layers, false}};
}

}  // namespace

Module maxtext_model(const MaxTextConfig& c) {
  Module embedder("token_embedder");
  // default_embed_init: variance_scaling(1, fan_in, normal, out_axis=0) over [vocab, embed].
  embedder.param({.name = "embedding", .shape = {c.vocab_size, c.emb_dim}, .dtype = c.weight_dtype,
                  .init = Initializer::variance_scaling(1.0, FanMode::kFanIn, Distribution::kNormal),
                  .partitioning = Partitioning::by_logical({"vocab", "embed_vocab"}), .fans = {{1}, {0}, {}}});
  Module decoder("decoder");
  for (const Stack& s : stacks(c)) {
    if (c.scan_layers) {
      const bool blocks = c.decoder_block == "gpt_oss";
      const Module unit = blocks ? maxtext::gpt_oss_block(s.name, c) : layer_of(c, s.name, s.moe);
      const int64_t n = blocks ? s.count / c.inhomogeneous_layer_cycle_interval : s.count;
      decoder.add(maxtext::stacked(s.name, unit, n, c.param_scan_axis));
    } else {
      for (int64_t i = 0; i < s.count; ++i) decoder.add(layer_of(c, s.name + "_" + std::to_string(i), s.moe));
    }
  }
  decoder.add(maxtext::rms_norm("decoder_norm", c.emb_dim, c.weight_dtype));
  if (!c.logits_via_embedding)
    decoder.add(maxtext::dense("logits_dense", {c.emb_dim}, {c.vocab_size}, {"embed_vocab", "vocab"},
                               Initializer::lecun_normal(), c.weight_dtype));
  Module model("model");
  model.add(std::move(decoder));
  model.add(std::move(embedder));
  return model;
}

bool maxtext_has_forward(const MaxTextConfig& c) {
  return c.decoder_block == "llama2" || c.decoder_block == "qwen3" || c.decoder_block == "mixtral" ||
         c.decoder_block == "qwen3_moe" || c.decoder_block == "deepseek" || c.decoder_block == "gpt_oss";
}

Tensor maxtext_logits(const MaxTextConfig& c, const nn::Params& p, const Tensor& tokens) {
  return maxtext_forward(c, p, tokens).logits;
}

MaxTextOutputs maxtext_forward(const MaxTextConfig& c, const nn::Params& p, const Tensor& tokens) {
  if (!maxtext_has_forward(c))
    throw ValueError(fmt::format("decoder_block '{}': tessel builds its parameters but has no forward pass for it yet "
                                 "(llama2, qwen3, mixtral, qwen3_moe, deepseek and gpt_oss have one)", c.decoder_block));
  if (tokens.rank() != 2) throw ValueError("maxtext: tokens must be [batch, seq], got " + tokens.to_string());
  const Tensor& embedding = nn::param(p, "token_embedder/embedding");
  Tensor x = ops::take(embedding, tokens);
  std::vector<Tensor> aux;
  for (const Stack& stack : stacks(c)) {
    for (int64_t i = 0; i < stack.count; ++i) {
      const Weights w = [&c, &p, &stack, i](const std::string& path) {
        if (!c.scan_layers) return nn::param(p, "decoder/" + stack.name + "_" + std::to_string(i) + "/" + path);
        // gpt-oss scans blocks of inhomogeneous_layer_cycle_interval layers (layers_0, layers_1, ...).
        const int64_t cycle = c.decoder_block == "gpt_oss" ? c.inhomogeneous_layer_cycle_interval : 1;
        const std::string inner = cycle > 1 ? "layers_" + std::to_string(i % cycle) + "/" : "";
        const Tensor& stacked = nn::param(p, "decoder/" + stack.name + "/" + inner + path);
        const size_t dim = std::min(static_cast<size_t>(c.param_scan_axis), stacked.rank() - 1);
        return ops::index(stacked, dim, i / cycle);
      };
      if (c.decoder_block == "qwen3") x = maxtext::qwen3_layer_forward(c, w, x);
      else if (c.decoder_block == "mixtral") x = maxtext::mixtral_layer_forward(c, w, x, aux);
      else if (c.decoder_block == "qwen3_moe") x = maxtext::qwen3_moe_layer_forward(c, w, x, aux);
      else if (c.decoder_block == "deepseek") x = maxtext::deepseek_layer_forward(c, w, x, stack.moe, aux);
      else if (c.decoder_block == "gpt_oss") x = maxtext::gpt_oss_layer_forward(c, w, x, i, aux);
      else x = maxtext::llama2_layer_forward(c, w, x);
    }
  }
  x = ops::rms_norm(x, nn::param(p, "decoder/decoder_norm/scale"), c.normalization_layer_epsilon);
  MaxTextOutputs out;
  if (!aux.empty()) {
    // MaxText's train step adds the mean of the layers' sown moe_lb_loss values.
    Tensor total = aux[0];
    for (size_t i = 1; i < aux.size(); ++i) total = ops::add(total, aux[i]);
    out.aux_loss = ops::scale(total, 1.0 / static_cast<double>(aux.size()));
  }
  if (!c.logits_via_embedding) {
    out.logits = ops::dot(x, nn::param(p, "decoder/logits_dense/kernel"));
    return out;
  }
  out.logits = ops::dot_nt(x, embedding);
  if (c.normalize_embedding_logits) out.logits = ops::scale(out.logits, 1.0 / std::sqrt(static_cast<double>(c.emb_dim)));
  return out;
}

}  // namespace tessel
