#include "tessel/checkpoint/detail/store/safetensors_file.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "tessel/checkpoint/detail/io/file_io.h"
#include "tessel/checkpoint/detail/io/storage.h"
#include "tessel/core/error.h"
#include "tessel/detail/json_util.h"

namespace tessel::detail {
namespace fs = std::filesystem;
using json_util::Json;

namespace {

struct DTypeName {
  std::string_view text;
  DType dtype;
};
constexpr std::array kDTypes = {
    DTypeName{"F64", DType::kF64},  DTypeName{"F32", DType::kF32},  DTypeName{"F16", DType::kF16},
    DTypeName{"BF16", DType::kBF16}, DTypeName{"I64", DType::kI64},  DTypeName{"I32", DType::kI32},
    DTypeName{"I16", DType::kI16},  DTypeName{"I8", DType::kI8},    DTypeName{"U64", DType::kU64},
    DTypeName{"U32", DType::kU32},  DTypeName{"U16", DType::kU16},  DTypeName{"U8", DType::kU8},
    DTypeName{"BOOL", DType::kBool},   DTypeName{"F8_E4M3", DType::kF8E4M3FN}, DTypeName{"F8_E5M2", DType::kF8E5M2},
};
// Defined by the format, not held by tessel yet.
constexpr std::array<std::string_view, 5> kUnsupported = {"F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64"};

int64_t checked_int(const Json& j, std::string_view what) {
  if (!j.is_number_integer() && !j.is_number_unsigned())
    throw ValueError(fmt::format("{}: expected a non-negative integer, got {}", what, json_util::kind(j)));
  if (j.is_number_unsigned()) {
    const auto v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw ValueError(fmt::format("{}: {} is too large", what, v));
    return static_cast<int64_t>(v);
  }
  const auto v = j.get<int64_t>();
  if (v < 0) throw ValueError(fmt::format("{}: {} is negative", what, v));
  return v;
}

SafetensorsTensor parse_tensor(const std::string& name, const Json& j, std::string_view source) {
  const std::string what = fmt::format("{}: tensor '{}'", source, name);
  if (!j.is_object()) throw ValueError(fmt::format("{}: expected an object, got {}", what, json_util::kind(j)));
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!j.contains(field)) throw ValueError(fmt::format("{}: no \"{}\"", what, field));
  if (!j["dtype"].is_string()) throw ValueError(what + ": \"dtype\" is not a string");
  SafetensorsTensor t{name, parse_safetensors_dtype(j["dtype"].get<std::string>(), what), Shape(), 0, 0, 0};
  const Json& shape = j["shape"];
  if (!shape.is_array()) throw ValueError(what + ": \"shape\" is not an array");
  std::vector<int64_t> dims;
  int64_t elements = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dims.push_back(checked_int(shape[i], fmt::format("{} shape[{}]", what, i)));
    if (__builtin_mul_overflow(elements, dims.back(), &elements))
      throw ValueError(what + ": its shape holds more than 2^63 elements");
  }
  t.shape = Shape(std::move(dims));
  const Json& offsets = j["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) throw ValueError(what + ": \"data_offsets\" is not [begin, end]");
  t.begin = checked_int(offsets[0], what + " data_offsets[0]");
  t.end = checked_int(offsets[1], what + " data_offsets[1]");
  if (t.end < t.begin) throw ValueError(fmt::format("{}: data_offsets [{}, {}] end before they begin", what, t.begin, t.end));
  int64_t bytes = 0;
  if (__builtin_mul_overflow(elements, static_cast<int64_t>(item_size(t.dtype)), &bytes))
    throw ValueError(what + ": its shape holds more than 2^63 bytes");
  if (bytes != t.end - t.begin)
    throw ValueError(fmt::format("{}: {}{} takes {} bytes, but data_offsets [{}, {}] hold {}", what,
                                 safetensors_dtype(t.dtype), t.shape.to_string(), bytes, t.begin, t.end,
                                 t.end - t.begin));
  return t;
}

// A tensor name as tessel path levels: '.'-separated, none empty, no '/'.
void check_name(const std::string& name, std::string_view source) {
  const bool bad = name.empty() || name.front() == '.' || name.back() == '.' ||
                   name.find("..") != std::string::npos || name.find('/') != std::string::npos ||
                   name.find('\0') != std::string::npos;
  if (bad)
    throw ValueError(fmt::format("{}: tensor name '{}' is not a path of '.'-separated names (an empty level or a '/')",
                                 source, name));
}

bool ends_with(const Location& p, std::string_view suffix) {
  const std::string s = p.filename();
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string_view safetensors_dtype(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.text;
  throw ValueError(fmt::format("safetensors has no dtype for {}", name(dtype)));
}

DType parse_safetensors_dtype(std::string_view text, std::string_view what) {
  for (const auto& d : kDTypes)
    if (d.text == text) return d.dtype;
  if (std::find(kUnsupported.begin(), kUnsupported.end(), text) != kUnsupported.end())
    throw ValueError(fmt::format("{}: dtype {} is not supported by tessel yet", what, text));
  throw ValueError(fmt::format("{}: unknown safetensors dtype \"{}\"", what, text));
}

SafetensorsHeader parse_safetensors_header(std::string_view json, int64_t data_bytes, std::string_view source) {
  const size_t first = json.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos || json[first] != '{')
    throw ParseError(std::string(source), 1, 1, "a safetensors header is a JSON object");
  const Json j = json_util::parse(json, source);
  SafetensorsHeader h;
  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      // null is no metadata, as the reference reader's Option takes it (such files are published).
      if (value.is_null()) continue;
      if (!value.is_object()) throw ValueError(fmt::format("{}: __metadata__ is not an object or null", source));
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) throw ValueError(fmt::format("{}: __metadata__ '{}' is not a string", source, k));
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_tensor(key, value, source));
  }
  // The format's rule: sorted by offset, the tensors tile the data section exactly.
  std::sort(h.tensors.begin(), h.tensors.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  int64_t at = 0;
  for (const SafetensorsTensor& t : h.tensors) {
    if (t.begin != at)
      throw ValueError(fmt::format("{}: tensor '{}' begins at byte {} of the data, but the previous tensor ends at {} "
                                   "(a gap or an overlap)", source, t.name, t.begin, at));
    at = t.end;
  }
  if (at != data_bytes)
    throw ValueError(fmt::format("{}: the tensors end at byte {} of the data, but the file holds {} data bytes", source,
                                 at, data_bytes));
  return h;
}

namespace {

// The header's length from the file's first 8 bytes, checked against the format's limit and the file.
int64_t header_length(std::span<const std::byte> prefix, int64_t file_size, std::string_view source) {
  if (file_size < 8 || prefix.size() < 8)
    throw ValueError(fmt::format("{}: {} bytes, too short for a safetensors header length", source, file_size));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<uint64_t>(prefix[static_cast<size_t>(i)]);
  if (n > static_cast<uint64_t>(kMaxSafetensorsHeaderBytes))
    throw ValueError(fmt::format("{}: a header of {} bytes, more than safetensors' limit of {}", source, n,
                                 kMaxSafetensorsHeaderBytes));
  if (n > static_cast<uint64_t>(file_size - 8))
    throw ValueError(fmt::format("{}: a header of {} bytes in a file of {}", source, n, file_size));
  return static_cast<int64_t>(n);
}

}  // namespace

SafetensorsHeader parse_safetensors_head(std::span<const std::byte> head, int64_t file_size, std::string_view source) {
  const int64_t n = header_length(head, file_size, source);
  if (static_cast<int64_t>(head.size()) < 8 + n)
    throw ValueError(fmt::format("{}: {} bytes given of a header of {}", source, head.size(), n));
  const std::string_view text(reinterpret_cast<const char*>(head.data()) + 8, static_cast<size_t>(n));
  SafetensorsHeader h = parse_safetensors_header(text, file_size - 8 - n, source);
  h.data_start = 8 + n;
  return h;
}

SafetensorsHeader read_safetensors_header(const Location& path) {
  const auto file = detail::open_source(path);
  const int64_t size = file->size();
  std::vector<std::byte> head(8);
  if (size >= 8) file->read_exact(0, head);
  const int64_t n = header_length(head, size, path.string());
  head.resize(static_cast<size_t>(8 + n));
  file->read_exact(8, std::span<std::byte>(head).subspan(8));
  return parse_safetensors_head(head, size, path.string());
}

bool is_safetensors(const Location& path) {
  if (detail::is_file(path)) return ends_with(path, ".safetensors") || ends_with(path, ".safetensors.index.json");
  if (detail::is_file(path / "_METADATA")) return false;
  return detail::is_file(path / "model.safetensors") || detail::is_file(path / "model.safetensors.index.json");
}

SafetensorsSet open_safetensors(const Location& path) {
  SafetensorsSet set;
  set.source = path;
  std::optional<Location> index;
  if (!detail::is_file(path)) {
    if (detail::is_file(path / "model.safetensors.index.json")) {
      index = path / "model.safetensors.index.json";
    } else if (detail::is_file(path / "model.safetensors")) {
      set.files.push_back(path / "model.safetensors");
    } else {
      throw ValueError("'" + path.string() + "' holds neither model.safetensors nor model.safetensors.index.json");
    }
  } else if (ends_with(path, ".index.json")) {
    index = path;
  } else {
    set.files.push_back(path);
  }

  std::map<std::string, std::string> weight_map;
  if (index) {
    const std::optional<std::string> text = detail::read_small(*index, kMaxSafetensorsHeaderBytes);
    if (!text) throw IoError("'" + index->string() + "' does not exist");
    const Json j = json_util::parse(*text, index->string());
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw ValueError(index->string() + ": no \"weight_map\" object");
    std::map<std::string, size_t> file_ids;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) throw ValueError(fmt::format("{}: weight_map '{}' is not a file name", index->string(), name));
      const std::string f = file.get<std::string>();
      if (f.empty() || f == "." || f == ".." || f.find_first_of(std::string("/\0", 2)) != std::string::npos)
        throw ValueError(fmt::format("{}: weight_map file '{}' must name one file beside the index", index->string(), f));
      const Location p = index->parent() / f;
      if (file_ids.emplace(f, set.files.size()).second) set.files.push_back(p);
      weight_map[name] = f;
    }
    if (j.contains("metadata") && j["metadata"].is_object())
      for (const auto& [k, v] : j["metadata"].items()) set.metadata[k] = v.is_string() ? v.get<std::string>() : v.dump();
    if (set.files.empty()) throw ValueError(index->string() + ": the weight_map names no files");
  }

  std::map<std::string, size_t> seen;  // name -> file
  for (size_t f = 0; f < set.files.size(); ++f) {
    SafetensorsHeader h = read_safetensors_header(set.files[f]);
    set.data_starts.push_back(h.data_start);
    if (f == 0 && !h.metadata.empty()) set.metadata = h.metadata;
    for (SafetensorsTensor& t : h.tensors) {
      check_name(t.name, set.files[f].string());
      if (auto [it, fresh] = seen.emplace(t.name, f); !fresh)
        throw ValueError(fmt::format("tensor '{}' is in both {} and {}", t.name, set.files[it->second].string(),
                                     set.files[f].string()));
      t.file = f;
      set.tensors.push_back(std::move(t));
    }
  }
  for (const auto& [name, file] : weight_map) {
    auto it = seen.find(name);
    if (it == seen.end() || set.files[it->second].filename() != file)
      throw ValueError(fmt::format("{}: weight_map puts '{}' in {}, which does not hold it", index->string(), name, file));
  }
  std::sort(set.tensors.begin(), set.tensors.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) { return a.name < b.name; });
  return set;
}

}  // namespace tessel::detail
