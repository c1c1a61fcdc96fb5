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
#include "tessel/runtime/runtime.h"
#include "tessel/state/module.h"
#include "tessel/state/state.h"

namespace tessel {

Module maxtext_model(const MaxTextConfig& config);

// Whether tessel has this family's forward pass (llama2, qwen3, mixtral, qwen3_moe today).
bool maxtext_has_forward(const MaxTextConfig& config);

struct MaxTextOutputs {
  Tensor logits;    // [batch, seq, vocab]
  Tensor aux_loss;  // the mean over MoE layers of their load-balance losses; undefined without
};
// tokens: i32 [batch, seq] -> logits and the auxiliary loss MaxText's train step adds to the
// cross-entropy. Throws ValueError for a family without a forward pass (MLA: not yet).
MaxTextOutputs maxtext_forward(const MaxTextConfig& config, const nn::Params& params, const Tensor& tokens);
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
// `mu_dtype` (default: the parameter's), nu in the parameter's dtype, the counters int32 scalars
// replicated on the mesh.
std::vector<MaxTextStateEntry> maxtext_train_state(const State& state, std::optional<DType> mu_dtype = std::nullopt);
// The same with the config's mu_dtype; throws ValueError for an opt_type other than adamw.
std::vector<MaxTextStateEntry> maxtext_train_state(const MaxTextConfig& config, const State& state);

// Checkpoints in MaxText's layout: Orbax's CheckpointManager item "items" holding the TrainState
// (params/params/..., opt_state/0/{count, mu, nu}, opt_state/1 empty, opt_state/2/count, step),
// so MaxText's load_full_state_path restores a tessel checkpoint and tessel resumes MaxText's.
inline constexpr const char* kMaxTextItem = "items";
// For SaveOptions: opt_state is a tuple (sequence_nodes), opt_state/1 optax's EmptyState (empty_nodes).
inline constexpr const char* kMaxTextSequenceNode = "opt_state";
inline constexpr const char* kMaxTextEmptyNode = "opt_state/1";
// A tessel train state (params and AdamW's opt_state/mu, opt_state/nu) at `step` as the TrainState
// tree, the counters as int32 scalars on the params' mesh. Throws ValueError for a state without
// AdamW's moments.
State to_maxtext_layout(const Runtime& rt, const State& train_state, int64_t step);
// The restore target for such a checkpoint: `abstract_train_state`'s shardings under MaxText's paths.
State maxtext_layout_target(const State& abstract_train_state);
// Back to tessel's paths; `step` receives the saved step. Throws ValueError for a tree that is not
// an AdamW TrainState of these parameters.
State from_maxtext_layout(const State& restored, const State& abstract_train_state, int64_t* step);

// logical_shardings.json and named_shardings.json in sharding_dump.py's format, from an abstract
// (or concrete) state placed on a mesh. Throws IoError naming a file that cannot be written.
void write_maxtext_shardings(const std::vector<MaxTextStateEntry>& entries, const std::filesystem::path& dir);

}  // namespace tessel
