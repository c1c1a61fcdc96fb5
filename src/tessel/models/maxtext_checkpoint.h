// MaxText's TrainState around a model's parameters and its checkpoints: the leaves as MaxText's
// sharding_dump.py and checkpointer name them, a tessel train state in MaxText's checkpoint layout
// and back, and MaxText's parameter-only checkpoint as a conversion.
//
//   auto entries = tessel::maxtext_train_state(config, tessel::eval_shape(model, mesh, config.rules));
//   tessel::write_maxtext_shardings(entries, "dump/");   // logical_ and named_shardings.json
//   tessel::ConvertOptions o = tessel::maxtext_params_conversion(tessel::CheckpointItem::find("run/checkpoints"), {});
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tessel/checkpoint/convert.h"
#include "tessel/checkpoint/item.h"
#include "tessel/models/maxtext_config.h"
#include "tessel/runtime/runtime.h"
#include "tessel/state/state.h"

namespace tessel {

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
// The same with the config's mu_dtype; throws ValueError for an opt_type other than adamw. With
// `nnx_aux`, as MaxText 0.2.5 (NNX) checkpoints it: also the state it keeps under nnx_aux, each
// nnx.Rngs' counts and unsafe_rbg keys (uint32, unsharded) and DeepSeek V3's routing bias (a
// MoEBiasVar there, stacked first: [layers, experts], no optimizer moments).
std::vector<MaxTextStateEntry> maxtext_train_state(const MaxTextConfig& config, const State& state,
                                                   bool nnx_aux = false);

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
// With `aux_routing_bias` (MaxText 0.2.5's DeepSeek V3 and later: maxtext_aux_routing_bias), the
// routing bias goes under nnx_aux as [layers, experts], without its optimizer moments.
State to_maxtext_layout(const Runtime& rt, const State& train_state, int64_t step, bool aux_routing_bias = false);
// The restore target for such a checkpoint: `abstract_train_state`'s shardings under MaxText's paths.
State maxtext_layout_target(const State& abstract_train_state, bool aux_routing_bias = false);
// Back to tessel's paths; `step` receives the saved step. Throws ValueError for a tree that is not
// an AdamW TrainState of these parameters.
// With `aux_routing_bias`, the routing bias comes from nnx_aux and its AdamW moments start at zero
// (MaxText does not train it).
State from_maxtext_layout(const State& restored, const State& abstract_train_state, int64_t* step,
                          bool aux_routing_bias = false);
// Whether MaxText 0.2.5 keeps this config's routing bias under nnx_aux (DeepSeek V3 and later,
// with routed_bias).
bool maxtext_aux_routing_bias(const MaxTextConfig& config);
// The nnx_aux path of a routing bias parameter ("decoder/moe_layers/.../gate/bias"), or "" for
// any other path.
std::string maxtext_aux_bias_path(const std::string& tessel_path);

// logical_shardings.json and named_shardings.json in sharding_dump.py's format, from an abstract
// (or concrete) state placed on a mesh. Throws IoError naming a file that cannot be written.
void write_maxtext_shardings(const std::vector<MaxTextStateEntry>& entries, const std::filesystem::path& dir);

// MaxText's parameter-only checkpoint, as generate_param_only_checkpoint writes it, as a
// conversion of `src`: step 0's item "items" holding TrainState(step=0, params, opt_state={}), the
// parameters under params/params/ in bfloat16 (unless `options.dtype`). `src` is a MaxText
// TrainState (its params/params/ subtree) or a tessel train state (its parameters: every leaf but
// the optimizer's, put under params/params/, after `options.target.rename`); with `options.map`,
// the map's targets of `src` (a Hugging Face checkpoint), as MaxText's to_maxtext writes them.
// Throws ValueError for a source without parameters, or one the map would convert backward.
ConvertOptions maxtext_params_conversion(const CheckpointItem& src, ConvertOptions options);

// `params` (a model's parameters, abstract or not) read from `item` and placed as they are placed
// there: the start of a fine-tuning run. The item holds them as tessel's tree at its top, as
// MaxText's TrainState under params/params/ (or params/), or as MaxText 0.2.5's parameter-only
// checkpoint (each parameter an NNX Variable's `<path>/value`). A DeepSeek V3 routing bias is read
// where MaxText 0.2.5 keeps it too: nnx_aux/model/<path>, or params/params/<path> without AdamW
// moments, both [layers, experts]; where none is (MaxText 0.2.5's parameter-only checkpoint holds
// nnx.Params alone), it starts at zero. `where` receives the layout found, e.g. " (under
// params/params)", and the biases started at zero.
// Throws ValueError naming the first parameter missing when no layout holds them all.
State params_from_checkpoint(const Runtime& rt, const CheckpointItem& item, const State& params, std::string* where);

}  // namespace tessel
