#include "tessel/checkpoint/items.h"

#include <algorithm>
#include <charconv>
#include <map>

#include "tessel/checkpoint/detail/io/storage.h"
#include "tessel/checkpoint/detail/orbax_layout.h"
#include "tessel/checkpoint/detail/store/safetensors_file.h"
#include "tessel/core/error.h"
#include "tessel/detail/json_util.h"

namespace tessel {
namespace {

constexpr int64_t kMaxCheckpointMetadataBytes = int64_t{16} << 20;

std::optional<int64_t> parse_step(const std::string& name) {
  if (name.empty() || name.size() > 18) return std::nullopt;
  int64_t step = 0;
  auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), step);
  if (ec != std::errc() || end != name.data() + name.size() || step < 0) return std::nullopt;
  if (std::to_string(step) != name) return std::nullopt;  // "007" is not a step
  return step;
}

std::map<std::string, std::string> item_handlers(const Location& step_dir) {
  const Location file = step_dir / detail::kCheckpointMetadata;
  const std::optional<std::string> text = detail::read_small(file, kMaxCheckpointMetadataBytes);
  if (!text) return {};
  return parse_item_handlers(*text, file.string());
}

std::string names_of(const std::vector<ItemInfo>& items, bool arrays_only) {
  std::string s;
  for (const auto& i : items) {
    if (arrays_only && !i.holds_arrays) continue;
    s += (s.empty() ? "'" : ", '") + i.name + "'";
  }
  return s.empty() ? "none" : s;
}

// The PyTree item of a step directory: `item` when given, else the only one. A step saved as a
// bare item (StandardCheckpointer.save("ckpt/7")) is its own item.
Location choose_item(const Location& step_dir, const std::optional<std::string>& item) {
  if (is_item_dir(step_dir)) {
    if (item) throw ValueError("--item: step '" + step_dir.string() + "' is a single item, not a directory of items");
    return step_dir;
  }
  const std::vector<ItemInfo> items = list_items(step_dir);
  if (item) {
    for (const auto& i : items) {
      if (i.name != *item) continue;
      if (!i.holds_arrays) {
        throw ValueError("item '" + *item + "' in '" + step_dir.string() + "' holds no arrays (handler " +
                         (i.handler.empty() ? std::string("unknown") : i.handler) + "); its PyTree items: " +
                         names_of(items, true));
      }
      return step_dir / i.name;
    }
    throw ValueError("'" + step_dir.string() + "' has no item '" + *item + "' (its items: " + names_of(items, false) + ")");
  }
  std::vector<const ItemInfo*> arrays;
  for (const auto& i : items) {
    if (i.holds_arrays) arrays.push_back(&i);
  }
  if (arrays.size() == 1) return step_dir / arrays.front()->name;
  if (arrays.empty()) {
    throw ValueError("'" + step_dir.string() + "' holds no PyTree item (its items: " + names_of(items, false) + ")");
  }
  throw ValueError("'" + step_dir.string() + "' holds several PyTree items (" + names_of(items, true) +
                   "): choose one with --item");
}

}  // namespace

std::map<std::string, std::string> parse_item_handlers(std::string_view text, std::string_view source) {
  const std::string where(source);
  const json_util::Json j = json_util::parse(text, source);
  if (!j.is_object()) throw ParseError(where, 0, 0, "expected a JSON object");
  std::map<std::string, std::string> out;
  if (!j.contains("item_handlers") || j["item_handlers"].is_null()) return out;
  const json_util::Json& h = j["item_handlers"];
  if (h.is_string()) return out;  // a single unnamed item: the handler says nothing about names
  if (!h.is_object()) throw ParseError(where, 0, 0, "'item_handlers' must be an object of item names");
  for (const auto& [name, handler] : h.items()) out[name] = handler.is_string() ? handler.get<std::string>() : "";
  return out;
}

std::vector<int64_t> list_steps(const Location& root) {
  std::vector<int64_t> steps;
  for (const auto& entry : detail::list_directory(root)) {
    if (!entry.is_directory) continue;
    const std::optional<int64_t> step = parse_step(entry.name);
    // A bucket has no rename: a step is there once its commit marker is (Orbax's rule for object
    // stores); the objects of an unfinished save are not a step.
    if (step && (root.is_local() || detail::is_file(root / entry.name / detail::kCommitFile))) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

bool is_item_dir(const Location& dir) {
  const std::vector<detail::StorageEntry> entries = detail::list_directory(dir);
  for (const auto& e : entries) {
    if (!e.is_directory && (e.name == "_METADATA" || e.name == "_sharding" || e.name == "manifest.ocdbt")) return true;
  }
  // An item that lost its _METADATA: its arrays are still zarr directories.
  for (const auto& e : entries) {
    if (!e.is_directory) continue;
    for (const char* f : {".zarray", "zarr.json"}) {
      if (detail::is_file(dir / e.name / f)) return true;
    }
  }
  return false;
}

std::vector<ItemInfo> list_items(const Location& step_dir) {
  const std::map<std::string, std::string> handlers = item_handlers(step_dir);
  std::vector<ItemInfo> items;
  for (const auto& e : detail::list_directory(step_dir)) {
    if (!e.is_directory) continue;
    const std::string& name = e.name;
    if (name.ends_with(detail::kTmpSuffix)) continue;  // an unfinished save
    auto h = handlers.find(name);
    const bool arrays = is_item_dir(step_dir / name);
    if (h == handlers.end() && !arrays && !detail::is_file(step_dir / name / "metadata")) continue;
    items.push_back({name, h == handlers.end() ? "" : h->second, arrays});
  }
  std::sort(items.begin(), items.end(), [](const ItemInfo& a, const ItemInfo& b) { return a.name < b.name; });
  return items;
}

Location find_item_dir(const Location& path, std::optional<int64_t> step, const std::optional<std::string>& item) {
  if (detail::is_safetensors(path)) {
    if (step || item) throw ValueError("--step and --item are for Orbax checkpoints; '" + path.string() + "' is safetensors");
    return path;
  }
  if (!detail::is_directory(path)) {
    if (!detail::is_file(path)) throw IoError("'" + path.string() + "' does not exist");
    throw IoError("'" + path.string() + "' is neither a checkpoint directory nor a .safetensors file or index");
  }
  if (is_item_dir(path)) {
    if (step) throw ValueError("--step is for a directory of steps; '" + path.string() + "' is a single checkpoint item");
    // The item itself, named as its step names it (run/checkpoints/4/items with --item items).
    if (item && path.filename() != *item) {
      throw ValueError("--item is for a step directory; '" + path.string() + "' is a single checkpoint item");
    }
    return path;
  }
  const std::vector<int64_t> steps = list_steps(path);
  if (steps.empty()) {
    if (detail::is_file(path / detail::kCheckpointMetadata) || !list_items(path).empty()) {
      if (step) throw ValueError("--step is for a directory of steps; '" + path.string() + "' is a single step");
      return choose_item(path, item);
    }
    throw ValueError("'" + path.string() + "' holds no checkpoint: no _METADATA, no items and no step directories");
  }
  const int64_t chosen = step ? *step : steps.back();
  if (!std::binary_search(steps.begin(), steps.end(), chosen)) {
    throw ValueError("'" + path.string() + "' has no step " + std::to_string(chosen) + " (it has " +
                     std::to_string(steps.size()) + " steps, latest " + std::to_string(steps.back()) + ")");
  }
  return choose_item(path / std::to_string(chosen), item);
}

}  // namespace tessel
