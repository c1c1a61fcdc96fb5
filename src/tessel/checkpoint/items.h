// Finding the PyTree item to read in what a user points at: an item directory, an Orbax step
// directory (MaxText's `items`, `model_params`, `default`, `state`, any name) or a directory of
// steps, local or in a bucket (s3://bucket/prefix). A step's items come from `_CHECKPOINT_METADATA` (Orbax's `item_handlers`) and from the
// subdirectories that hold arrays, whatever their names; JSON items sit beside them.
//
//   for (const auto& i : tessel::list_items("ckpt/7")) std::cout << i.name << " " << i.handler << "\n";
//   auto dir = tessel::find_item_dir("ckpt", std::nullopt, "model_params");  // ckpt/<latest>/model_params
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/location.h"

namespace tessel {

// The committed steps under `root`, ascending: directories named by a decimal step (in a bucket,
// those holding `commit_success.txt`).
std::vector<int64_t> list_steps(const Location& root);

struct ItemInfo {
  std::string name;
  std::string handler;        // Orbax's handler class from _CHECKPOINT_METADATA; "" if not recorded
  bool holds_arrays = false;  // a PyTree item (what restore reads), not a JSON item
};

// Orbax's `item_handlers` from the text of a `_CHECKPOINT_METADATA`: {item name: handler class}
// (empty when it records none, or one class for a single unnamed item). Throws ParseError naming
// `source` for malformed JSON or an `item_handlers` that is neither an object nor a string.
std::map<std::string, std::string> parse_item_handlers(std::string_view text, std::string_view source);

// True for a directory that is one PyTree item: it has `_METADATA`, `_sharding` or
// `manifest.ocdbt`, or subdirectories that are zarr arrays.
bool is_item_dir(const Location& dir);

// The items of a step directory, by name. Throws ParseError for a malformed
// `_CHECKPOINT_METADATA`, IoError when the directory cannot be listed.
std::vector<ItemInfo> list_items(const Location& step_dir);

// The PyTree item `path` names: an item directory itself; a step directory's item `item`, or its
// only PyTree item; a directory of steps: the same in step `step`, else in the latest one. Throws
// ValueError saying what was found instead: no steps, no such step or item, a JSON item, or
// several PyTree items (listed) and no `item` to choose one.
Location find_item_dir(const Location& path, std::optional<int64_t> step = std::nullopt,
                       const std::optional<std::string>& item = std::nullopt);

}  // namespace tessel
