// Internal (not installed): MaxText's decoder families in one table: each family's decoder_block
// name, whether it is a mixture of experts, its layer stacks, the layer it builds and that layer's
// forward pass. The config reader, the model builder and the forward pass all look a family up
// here instead of comparing decoder_block strings.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/models/detail/maxtext_layers.h"
#include "tessel/models/maxtext_config.h"
#include "tessel/state/module.h"

namespace tessel::maxtext {

// A stack of decoder layers as (name, count, moe): scanned, one Module of stacked parameters;
// unscanned, `name`_0, `name`_1, ...
struct Stack {
  std::string name;
  int64_t count;
  bool moe;
};

struct Family {
  MaxTextFamily family;
  std::string_view decoder_block;
  bool moe;  // routed experts: num_experts must be > 1
  std::vector<Stack> (*stacks)(const MaxTextConfig& c);
  // One decoder layer of a stack (`moe`: the stack's kind, for a family with dense and MoE stacks).
  Module (*layer)(std::string name, const MaxTextConfig& c, bool moe);
  // Scanned, the unit repeated along a stack and how many layers it holds (gpt-oss: a block of
  // inhomogeneous_layer_cycle_interval layers, layers_0, layers_1, ...).
  Module (*scan_unit)(std::string name, const MaxTextConfig& c, bool moe);
  int64_t (*layers_per_unit)(const MaxTextConfig& c);
  // Layer `index` (counted in its stack) on its weights; MoE layers append their load-balance
  // losses to `aux`.
  Tensor (*forward)(const MaxTextConfig& c, const Weights& w, const Tensor& x, int64_t index, bool moe,
                    std::vector<Tensor>& aux);
  // The modules of one scan unit that hold an nnx.Rngs in MaxText 0.2.5 (its checkpoints keep
  // their state under nnx_aux): paths inside the unit, "" the unit itself. Read off MaxText's own
  // checkpoints (tests/python/test_maxtext_peer.py compares them).
  std::vector<std::string> (*rng_holders)(bool moe);
};

const std::vector<Family>& families();
const Family& family_of(const MaxTextConfig& c);
const Family* find_family(std::string_view decoder_block);  // nullptr if tessel does not build it
// "llama2, qwen3, ...", for messages.
std::string family_names();

}  // namespace tessel::maxtext
