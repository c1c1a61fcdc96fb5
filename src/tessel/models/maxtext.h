// MaxText's model families built from MaxText's own config (maxtext_config.h): the parameter tree
// MaxText's Transformer has (every path, shape, dtype, logical axis and initializer), the forward
// pass of the dense families, and the TrainState around the parameters as MaxText's
// sharding_dump.py and checkpointer name it.
//
//   tessel::MaxTextConfig c = tessel::load_maxtext_config({.model = "qwen3-0.6b.yml", .base = "base.yml"});
//   tessel::Module m = tessel::maxtext_model(c);
//   // token_embedder/embedding (vocab, embed_vocab), decoder/layers/self_attention/query/kernel
//   // (embed, layers, q_heads, kv), ..., decoder/decoder_norm/scale (norm)
//   tessel::State params = tessel::eval_shape(m, c.mesh(16), c.rules);
//   tessel::write_maxtext_shardings(params, c, "dump/");   // logical_ and named_shardings.json
//
// Families (decoder_block): llama2 (llama2, llama3, llama3.1), qwen3, deepseek (MLA attention;
// dense_layers then moe_layers with routed and shared experts), gpt_oss (attention sinks and
// biases, routed experts with biases, float32 norms).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "tessel/models/maxtext_config.h"
#include "tessel/nn/params.h"
#include "tessel/state/module.h"
#include "tessel/state/state.h"

namespace tessel {

Module maxtext_model(const MaxTextConfig& config);

// Whether tessel has this family's forward pass (llama2 and qwen3 today).
bool maxtext_has_forward(const MaxTextConfig& config);
// tokens: i32 [batch, seq] -> logits [batch, seq, vocab]. Throws ValueError for a family without a
// forward pass (MoE and MLA: not yet).
Tensor maxtext_logits(const MaxTextConfig& config, const nn::Params& params, const Tensor& tokens);

// One leaf of MaxText's TrainState (step, params, opt_state of optax.adamw) for a tessel state.
struct MaxTextStateEntry {
  std::string key;           // sharding_dump's key: ".params/['params']/['decoder']/..."
  std::string orbax_path;    // the checkpoint's path: "params/params/decoder/...", "opt_state/0/mu/..."
  std::string tessel_path;   // the tessel state's path ("decoder/...", "opt_state/mu/decoder/..."), "" for
                             // the step counters
  Shape shape;
  DType dtype;
  LogicalAxes logical;       // empty for scalars
  std::optional<NamedSharding> sharding;
};

// The TrainState's leaves in JAX's flattening order (step, params sorted by key, opt_state's
// [0] count, mu, nu, then [2] count), from the parameters (kind "param") of `state`; mu in
// mu_dtype, nu in the parameter's dtype, the counters int32 scalars replicated on the mesh.
// Throws ValueError for an opt_type other than adamw.
std::vector<MaxTextStateEntry> maxtext_train_state(const MaxTextConfig& config, const State& state);

// logical_shardings.json and named_shardings.json in sharding_dump.py's format, from an abstract
// (or concrete) state placed on a mesh. Throws IoError naming a file that cannot be written.
void write_maxtext_shardings(const std::vector<MaxTextStateEntry>& entries, const std::filesystem::path& dir);

}  // namespace tessel
