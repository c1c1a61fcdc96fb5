// Maps between two projects' trees of the same model (Hugging Face's names and layouts <->
// MaxText's), for conversions. A map is YAML, written in one direction (from -> to) and applied in
// either: a source whose names match the `from` patterns is mapped forward, one whose names match
// the `to` patterns backward (each step inverted).
//
//   vars: {head_dim: 64}                       # defaults; --map-var head_dim=128 overrides
//   rules:
//     - from: model.embed_tokens.weight
//       to: token_embedder.embedding
//     - from: model.layers.{i}.self_attn.q_proj.weight     # [heads*head_dim, embed]
//       to: decoder.layers.self_attention.query.kernel     # [embed, layers, heads, head_dim]
//       transpose: [1, 0]                # HF Linear is [out, in], Flax kernels [in, out]
//       split: [1, [-1, "{head_dim}"]]   # axis 1 into (heads, head_dim); -1 is inferred
//       stack: 1                         # the {i} tensors stacked along axis 1 of the result
//
//     - from: model.layers.{i}.self_attn.q_proj.weight     # MaxText's llama folds the attention's
//       to: decoder.layers.self_attention.query.kernel     # 1/sqrt(head_dim) into the query kernel
//       scale: "1/sqrt({head_dim})"      # a number, sqrt(N) or A/B of those; backward divides
//       interleave: 2                    # axis 2 (after split) from halves to neighbours: rope
//                                        # pairs (k, k + d/2) become (2k, 2k + 1), as MaxText's llama3.1
//
//     - from: model.layers.{i}.mlp.experts.gate_up_proj     # [experts, embed, 2*mlp], gate and
//       to: decoder.layers_{i}.GptOssMlp.wi_0               # up by alternating columns: each
//       take: [2, 0, 2]                  # rule takes every 2nd column from 0 (wi_1: from 1)
//
// Steps apply in the order transpose, split, interleave, take, stack (backward: unstack, the
// takes' parts put back together, de-interleave, merge, transpose back);
// `scale` multiplies floating-point values, in float32 for 16-bit types (rounded back to nearest
// even), as MaxText's conversion hooks do.
// Names use '.' or '/' between levels. `{i}` stands for a layer index 0..n-1; in `from` alone it
// needs `stack`, in both it keeps layers apart. `{e}` is an expert index likewise, with
// `stack_experts: AXIS` (MaxText's experts [experts, layers, in, out]: stack_experts: 0, stack: 1;
// the stacked axes are the result's, inserted in ascending order). `layers: [START, STOP]` (or
// `[START]`) restricts a rule to source layers START..STOP-1, numbered from 0 on the `to` side:
// DeepSeek's HF layers 0..k-1 go to MaxText's dense_layers, k.. to moe_layers. Every source tensor must be matched by a rule,
// and a rule (unless `optional: true`) must match something.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/box.h"
#include "tessel/core/host_array.h"
#include "tessel/state/state.h"

namespace tessel {

struct KeyMapRule {
  static constexpr std::string_view kLayer = "{i}", kExpert = "{e}";  // the placeholders
  std::string from, to;                          // '/'-joined patterns, each may hold "{i}"
  std::vector<int64_t> transpose;                // a permutation, or empty
  std::optional<int64_t> split_axis;             // split this axis (after the transpose) ...
  std::vector<int64_t> split_sizes;              // ... into these sizes (one may be -1)
  std::optional<int64_t> stack;                  // stack axis of the result, for {i} in `from` only
  std::optional<int64_t> stack_experts;          // the same for {e} in `from` only
  int64_t layer_start = 0;                       // `from`'s {i} in [layer_start, layer_stop) only,
  std::optional<int64_t> layer_stop;             // counted from layer_start in `to` and the stack
  std::optional<double> scale;                   // forward factor; backward divides by it
  std::optional<int64_t> interleave;             // axis (after the split) to interleave its halves along
  // Every `step`-th element from `start` along `axis` (after the interleave): one of `step` rules
  // with the same `from`, which together cover the axis (HF's fused gate_up_proj, gate and up by
  // alternating columns, into MaxText's wi_0 and wi_1); backward they fill it back together.
  struct Take {
    int64_t axis = 0, start = 0, step = 1;
  };
  std::optional<Take> take;
  bool optional = false;
};

struct KeyMap {
  std::vector<KeyMapRule> rules;
  std::string source;  // for messages
};

// Parses a map; `vars` (NAME=VALUE) override the map's own `vars`. Throws ParseError naming the
// file, line and key for unknown keys, bad patterns, a transpose that is no permutation, a split
// with more than one -1, `{i}` in `to` but not in `from`, or a `{name}` without a value.
KeyMap parse_key_map(std::string_view yaml, std::string source, const std::map<std::string, std::string>& vars = {});
KeyMap load_key_map(const std::filesystem::path& file, const std::map<std::string, std::string>& vars = {});

// One target tensor and how to make it: from one source tensor (`sources.size() == 1`, its slice
// at `index` along the `unstack` axes when set), from several stacked along the `stack` axes, or
// backward from the parts a `take` split it into (`takes`: sources ordered by their start, each
// sliced alike), whose rules differ in the take's start alone (`rule` is the first's).
struct MappedTensor {
  std::string path;  // target path
  Shape shape;
  DType dtype;
  std::vector<std::string> sources;    // source paths, row-major over the stack axes
  std::vector<int64_t> stack;          // forward: target axes (ascending) the sources stack along
  std::vector<int64_t> unstack;        // backward: source axes (ascending) to take the slice along
  std::vector<int64_t> index;          // ... at these positions
  const KeyMapRule* rule = nullptr;
  bool forward = true;
  bool takes = false;
};

struct MapPlan {
  bool forward = true;
  std::vector<MappedTensor> tensors;  // in source order of their first source
  State target;                       // abstract: every target path with its shape and dtype
};

// The targets of `source` (abstract: paths, shapes, dtypes) under the map, in the direction its
// names match. Throws ValueError listing source tensors no rule matches, rules that match nothing,
// layers that are not 0..n-1, shapes a step does not fit, and a map that matches both ways or none.
MapPlan plan_key_map(const KeyMap& map, const State& source);

// The target tensor from its source arrays (in `t.sources` order), on the host.
HostArray apply_mapped(const MappedTensor& t, const std::vector<const HostArray*>& sources);

// A part of a target made from parts of its sources, so that a stacked tensor is never whole in
// memory: forward, one piece per source (all of it) making its slab of the stacked target;
// backward, the source's slab (each take part's) making the whole (unstacked) target.
struct MapPiece {
  struct Read {
    size_t source = 0;  // index into MappedTensor::sources
    Box box;            // what is read of it
  };
  std::vector<Read> reads;
  Box target_box;  // what they make of the target
};
// The pieces of `t`; `source_shape` is the shape of its sources (all alike). A tensor only
// transposed or copied whose target holds more than `max_target_bytes` (> 0) comes in slabs of at
// most that many bytes (one row at least): of the target's first axis (each written in one run),
// or with `source_slabs` of the source's (each read in one run).
std::vector<MapPiece> map_pieces(const MappedTensor& t, const Shape& source_shape, int64_t max_target_bytes = 0,
                                 bool source_slabs = false);
// The permutation `t`'s steps come to when they are no more than a transpose (no split,
// interleave, take or scale): the target piece's dimension k is dimension perm[k] of the part a
// piece reads, the part's unstacked axes left out (the stacked or unstacked axes hold one position
// each and move no byte). nullopt when the steps do more.
std::optional<std::vector<int64_t>> map_permutation(const MappedTensor& t, const Shape& source_shape);

// The target's `piece.target_box` (a HostArray of that box's shape) from `parts`, what
// `piece.reads` read, in order (each of its box's shape).
HostArray apply_piece(const MappedTensor& t, const MapPiece& piece, std::vector<HostArray> parts);

// "NAME=VALUE,..." as map variables.
std::map<std::string, std::string> parse_map_vars(std::string_view text);

}  // namespace tessel
