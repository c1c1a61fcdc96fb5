#include "tessel/models/maxtext.h"

#include <cmath>

#include <fmt/format.h>

#include "tessel/core/error.h"
#include "tessel/models/detail/maxtext_families.h"
#include "tessel/ops/ops.h"

namespace tessel {
using maxtext::Weights;

Module maxtext_model(const MaxTextConfig& c) {
  Module embedder("token_embedder");
  // default_embed_init: variance_scaling(1, fan_in, normal, out_axis=0) over [vocab, embed].
  embedder.param({.name = "embedding", .shape = {c.vocab_size, c.emb_dim}, .dtype = c.weight_dtype,
                  .init = Initializer::variance_scaling(1.0, FanMode::kFanIn, Distribution::kNormal),
                  .partitioning = Partitioning::by_logical({"vocab", "embed_vocab"}), .fans = {{1}, {0}, {}}});
  const maxtext::Family& family = maxtext::family_of(c);
  Module decoder("decoder");
  for (const maxtext::Stack& s : family.stacks(c)) {
    if (c.scan_layers) {
      const Module unit = family.scan_unit(s.name, c, s.moe);
      decoder.add(maxtext::stacked(s.name, unit, s.count / family.layers_per_unit(c), c.param_scan_axis));
    } else {
      for (int64_t i = 0; i < s.count; ++i) decoder.add(family.layer(s.name + "_" + std::to_string(i), c, s.moe));
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

bool maxtext_has_forward(const MaxTextConfig& c) { return maxtext::find_family(c.decoder_block) != nullptr; }

Tensor maxtext_logits(const MaxTextConfig& c, const nn::Params& p, const Tensor& tokens) {
  return maxtext_forward(c, p, tokens).logits;
}

MaxTextOutputs maxtext_forward(const MaxTextConfig& c, const nn::Params& p, const Tensor& tokens) {
  const maxtext::Family& family = maxtext::family_of(c);
  if (tokens.rank() != 2) throw ValueError("maxtext: tokens must be [batch, seq], got " + tokens.to_string());
  const Tensor& embedding = nn::param(p, "token_embedder/embedding");
  Tensor x = ops::take(embedding, tokens);
  std::vector<Tensor> aux;
  for (const maxtext::Stack& stack : family.stacks(c)) {
    for (int64_t i = 0; i < stack.count; ++i) {
      const Weights w = [&c, &p, &stack, &family, i](const std::string& path) {
        if (!c.scan_layers) return nn::param(p, "decoder/" + stack.name + "_" + std::to_string(i) + "/" + path);
        // gpt-oss scans blocks of inhomogeneous_layer_cycle_interval layers (layers_0, layers_1, ...).
        const int64_t cycle = family.layers_per_unit(c);
        const std::string inner = cycle > 1 ? "layers_" + std::to_string(i % cycle) + "/" : "";
        const Tensor& stacked = nn::param(p, "decoder/" + stack.name + "/" + inner + path);
        const size_t dim = std::min(static_cast<size_t>(c.param_scan_axis), stacked.rank() - 1);
        return ops::index(stacked, dim, i / cycle);
      };
      x = family.forward(c, w, x, i, stack.moe, aux);
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
