// Converting a checkpoint item into another format or layout, streaming: Orbax <-> safetensors,
// onto any mesh (each tensor restored straight into its blocks and written from them, a batch at a
// time), through a key map between two projects' trees (Hugging Face's <-> MaxText's), with
// dtype casts, subtrees selected and moved. The CLI's `tessel ckpt convert` and the Python
// package's tessel.checkpoint.convert both call this.
//
//   auto src = tessel::CheckpointItem::find("hf_model/");
//   tessel::ConvertOptions o{.to = tessel::CheckpointFormat::kOrbax};
//   o.map = tessel::load_key_map("examples/maps/llama_maxtext.yml", {{"head_dim", "128"}});
//   tessel::ConvertReport r = tessel::convert(tessel::Runtime::host(1), src, "ckpt/params", o);
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/item.h"
#include "tessel/checkpoint/key_map.h"
#include "tessel/checkpoint/safetensors.h"
#include "tessel/checkpoint/target.h"
#include "tessel/core/host_array.h"
#include "tessel/runtime/runtime.h"

namespace tessel {

enum class CheckpointFormat { kOrbax, kSafetensors };

// A leaf the conversion adds (MaxText's step counter): replicated, on the target's mesh.
struct ExtraLeaf {
  std::string path;
  std::string kind;
  HostArray value;
};

struct ConvertOptions {
  std::optional<CheckpointFormat> to;  // default: the other format than the source's
  // Which leaves, placed where, and their paths in the result (the target ladder). Without a mesh,
  // one device: one_device_mesh of the rules given, else of the saved ones.
  TargetSpec target;
  std::optional<DType> dtype;  // every tensor cast to it
  // A key map between two trees, applied forward or backward as the source's names match, on the
  // host. With `target`'s mesh and its shardings, specs or logical axes (keyed by the result's
  // paths, after the renames), an Orbax target records them (its chunks are the map's pieces).
  // Paths and an axis map must be left out.
  std::optional<KeyMap> map;
  SaveOptions orbax;                    // the Orbax layout (the target's rules are recorded)
  SafetensorsSaveOptions safetensors;  // files and metadata
  // Orbax only: write the item as item `item` of step `step` of a CheckpointManager directory
  // (`<dst>/<step>/<item>`, with the step's metadata), with these leaves added.
  struct Step {
    int64_t step = 0;
    std::string item;
  };
  std::optional<Step> as_step;
  std::vector<ExtraLeaf> extra;
  int64_t staging_bytes = int64_t{64} << 20;  // host staging per restore (RestoreOptions)
  int64_t batch_bytes = int64_t{128} << 20;   // tensors restored and written together
};

struct ConvertReport {
  CheckpointFormat written = CheckpointFormat::kOrbax;
  int64_t source_tensors = 0;
  int64_t tensors = 0;  // written
  int64_t bytes = 0;    // written
  double seconds = 0;
  std::optional<bool> map_forward;  // the direction a key map was applied in
};

// Writes `src`'s chosen leaves into the new directory `dst` (it must not exist; nothing is
// visible there until the end: a failure leaves no directory). Throws ValueError for options that
// do not go together (a map with a mesh, extra leaves for safetensors), and whatever the target
// ladder, the map, the restore or the writer throws, naming the tensor.
ConvertReport convert(const Runtime& rt, const CheckpointItem& src, const Location& dst,
                      const ConvertOptions& options);

// The format `options.to` names, or the other one than `src`'s.
CheckpointFormat convert_format(const CheckpointItem& src, const ConvertOptions& options);

}  // namespace tessel
