#include "tessel/checkpoint/metadata.h"

#include <algorithm>

#include "tessel/checkpoint/detail/metadata_writer.h"
#include "tessel/core/error.h"
#include "tessel/detail/json_util.h"
#include "tessel/detail/text_util.h"
#include "tessel/sharding/detail/spec_json.h"
#include "tessel/sharding/rules_io.h"
#include "tessel/state/state.h"

namespace tessel {
namespace fs = std::filesystem;
using json_util::Json;

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

// Python's str() of a tuple of strings: "('a',)", "('b', 'c')".
std::string python_tuple(const std::vector<std::string>& keys) {
  std::string s = "(";
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i > 0) s += ", ";
    std::string k = keys[i];
    const char quote = k.find('\'') != std::string::npos && k.find('"') == std::string::npos ? '"' : '\'';
    s += quote;
    for (char c : k) {
      if (c == '\\' || c == quote) s += '\\';
      s += c;
    }
    s += quote;
  }
  if (keys.size() == 1) s += ',';
  return s + ")";
}

Json logical_json(const LogicalAxes& axes) {
  Json j = Json::array();
  for (const auto& a : axes) j.push_back(a ? Json(*a) : Json());
  return j;
}

Json partitioning_json(const Partitioning& p) {
  Json j = Json::object();
  if (!p.logical.empty()) j["logical_axes"] = logical_json(p.logical);
  if (p.mesh_axes) j["mesh_axes"] = spec_json::to_json(*p.mesh_axes);
  return j;
}

Json mesh_json(const Mesh& mesh) {
  Json names = Json::array(), shape = Json::array();
  for (const auto& a : mesh.axes()) {
    names.push_back(a.name);
    shape.push_back(a.size);
  }
  return Json{{"axis_names", names}, {"shape", shape}};
}

Json rules_json(const LogicalRules& rules) {
  Json list = Json::array();
  for (const auto& r : rules.rules()) list.push_back(Json::array({r.logical, r.mesh_axes}));
  Json j{{"logical_axis_rules", list}};
  if (!rules.mesh_axes().empty()) j["mesh_axes"] = rules.mesh_axes();
  return j;
}

[[noreturn]] void bad(std::string_view source, const std::string& why) {
  throw ValueError(std::string(source) + ": " + why);
}

Mesh parse_mesh(const Json& j, std::string_view what) {
  if (!j.is_object() || !j.contains("axis_names") || !j.contains("shape") || !j["axis_names"].is_array() ||
      !j["shape"].is_array() || j["axis_names"].size() != j["shape"].size()) {
    bad(what, "a mesh needs 'axis_names' and 'shape' lists of the same length");
  }
  std::vector<MeshAxis> axes;
  for (size_t i = 0; i < j["shape"].size(); ++i) {
    const Json& n = j["axis_names"][i];
    const Json& s = j["shape"][i];
    if (!n.is_string() || !s.is_number_integer()) bad(what, "mesh axis " + std::to_string(i) + " needs a name and an integer size");
    axes.push_back({n.get<std::string>(), s.get<int64_t>()});
  }
  try {
    return Mesh(std::move(axes));
  } catch (const ValueError& e) {
    bad(what, e.what());
  }
}

LogicalAxes parse_logical(const Json& j, std::string_view what) {
  if (!j.is_array()) bad(what, "logical_axes must be a list");
  LogicalAxes axes;
  for (const Json& a : j) {
    if (a.is_null()) {
      axes.emplace_back();
    } else if (a.is_string()) {
      axes.emplace_back(a.get<std::string>());
    } else {
      bad(what, "a logical axis must be a name or null, not " + a.dump());
    }
  }
  return axes;
}

void parse_tessel_param(const Json& j, ParamMetadata& p, std::string_view source) {
  const std::string what = std::string(source) + " custom_metadata.tessel.params['" + p.name + "']";
  if (!j.is_object()) bad(what, "must be an object");
  if (j.contains("kind")) {
    if (!j["kind"].is_string() || j["kind"].get<std::string>().empty()) bad(what, "kind must be a non-empty string");
    p.kind = j["kind"].get<std::string>();
  }
  if (j.contains("logical_axes")) p.partitioning.logical = parse_logical(j["logical_axes"], what);
  if (j.contains("mesh_axes")) {
    try {
      p.partitioning.mesh_axes = spec_json::from_json(j["mesh_axes"], what);
    } catch (const ValueError& e) {
      bad(what, e.what());
    }
  }
  if (!p.partitioning.logical.empty() && p.partitioning.mesh_axes) bad(what, "has both logical_axes and mesh_axes");
  if (j.contains("crc32c")) {
    if (!j["crc32c"].is_object()) bad(what, "crc32c must map chunk keys to integers");
    for (const auto& [key, value] : j["crc32c"].items()) {
      if (!value.is_number_unsigned() || value.get<uint64_t>() > 0xFFFFFFFFu) {
        bad(what, "crc32c['" + key + "'] must be an unsigned 32-bit integer");
      }
      p.crc32c[key] = static_cast<uint32_t>(value.get<uint64_t>());
    }
  }
}

}  // namespace

std::string base64_url_encode(std::string_view bytes) {
  std::string out;
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8) | uint8_t(bytes[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kAlphabet[(v >> s) & 63];
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (rest == 2) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string base64_url_decode(std::string_view text) {
  auto value = [&](char c) -> int {
    const char* p = std::find(kAlphabet, kAlphabet + 64, c);
    return p == kAlphabet + 64 ? -1 : static_cast<int>(p - kAlphabet);
  };
  if (text.size() % 4 != 0) throw ValueError("'" + std::string(text) + "' is not padded URL-safe base64");
  std::string out;
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    int pad = 0;
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      int x = 0;
      if (c == '=' && last && k >= 2 && (k == 3 || text[i + 3] == '=')) {
        ++pad;
      } else if ((x = value(c)) < 0 || pad > 0) {
        throw ValueError("'" + std::string(text) + "' is not URL-safe base64 (character " + std::to_string(i + k) + ")");
      }
      v = (v << 6) | static_cast<uint32_t>(x);
    }
    out += static_cast<char>((v >> 16) & 0xFF);
    if (pad < 2) out += static_cast<char>((v >> 8) & 0xFF);
    if (pad < 1) out += static_cast<char>(v & 0xFF);
  }
  return out;
}

namespace {

struct ValueTypeName {
  ValueType type;
  std::string_view name;
};
constexpr ValueTypeName kValueTypes[] = {
    {ValueType::kJaxArray, "jax.Array"}, {ValueType::kNumpyArray, "np.ndarray"}, {ValueType::kScalar, "scalar"},
    {ValueType::kString, "string"},      {ValueType::kPlaceholder, "placeholder"}, {ValueType::kNone, "None"},
    {ValueType::kDict, "Dict"},          {ValueType::kList, "List"},             {ValueType::kTuple, "Tuple"},
    {ValueType::kNamedTuple, "NamedTuple"}, {ValueType::kUnknown, "Unknown"},
};

}  // namespace

ValueType parse_value_type(std::string_view text) {
  for (const auto& v : kValueTypes)
    if (v.name == text) return v.type;
  return ValueType::kOther;
}

std::string_view value_type_name(ValueType type) {
  for (const auto& v : kValueTypes)
    if (v.type == type) return v.name;
  return "other";
}

bool is_empty_node(ValueType type) {
  return type == ValueType::kNone || type == ValueType::kDict || type == ValueType::kList || type == ValueType::kTuple ||
         type == ValueType::kNamedTuple;
}

bool holds_array(ValueType type) {
  return type == ValueType::kJaxArray || type == ValueType::kNumpyArray || type == ValueType::kScalar ||
         type == ValueType::kUnknown;
}

const ParamMetadata* ItemMetadata::find(std::string_view path) const {
  for (const auto& p : params) {
    if (p.path == path) return &p;
  }
  return nullptr;
}

std::optional<SavedSharding> parse_saved_sharding(std::string_view text, std::string_view what) {
  const Json j = json_util::parse(text, what);
  if (!j.is_object() || !j.contains("sharding_type") || !j["sharding_type"].is_string()) {
    bad(what, "a saved sharding needs a 'sharding_type'");
  }
  const std::string type = j["sharding_type"].get<std::string>();
  if (type == "SingleDeviceSharding") return std::nullopt;
  if (type != "NamedSharding") bad(what, "sharding_type '" + type + "' is not supported (NamedSharding or SingleDeviceSharding)");
  Mesh mesh = parse_mesh(j, what);
  if (!j.contains("partition_spec")) bad(what, "a NamedSharding needs a 'partition_spec'");
  try {
    PartitionSpec spec = spec_json::from_json(j["partition_spec"], what);
    spec.validate(mesh, spec.size(), what);
    return SavedSharding{std::move(mesh), std::move(spec)};
  } catch (const ValueError& e) {
    bad(what, e.what());
  }
}

ItemMetadata parse_item_metadata(std::string_view metadata_json, std::string_view sharding_json,
                                 std::string_view source) {
  const Json j = json_util::parse(metadata_json, source);
  if (!j.is_object() || !j.contains("tree_metadata") || !j["tree_metadata"].is_object()) {
    bad(source, "expected an object with 'tree_metadata'");
  }
  ItemMetadata item;
  auto flag = [&](const char* key) {
    if (!j.contains(key) || j[key].is_null()) return false;
    if (!j[key].is_boolean()) bad(source, std::string("'") + key + "' must be true or false");
    return j[key].get<bool>();
  };
  item.use_ocdbt = flag("use_ocdbt");
  item.use_zarr3 = flag("use_zarr3");
  item.store_array_data_equal_to_fill_value = flag("store_array_data_equal_to_fill_value");

  std::map<std::string, ParamMetadata, PathLess> by_path;
  std::map<std::string, std::string> names;  // name -> path, to catch collisions
  for (const auto& [keypath, entry] : j["tree_metadata"].items()) {
    const std::string what = std::string(source) + " tree_metadata[\"" + keypath + "\"]";
    if (!entry.is_object() || !entry.contains("key_metadata") || !entry["key_metadata"].is_array() ||
        entry["key_metadata"].empty()) {
      bad(what, "needs a non-empty 'key_metadata' list");
    }
    ParamMetadata p;
    for (const Json& k : entry["key_metadata"]) {
      if (!k.is_object() || !k.contains("key")) bad(what, "each key_metadata entry needs a 'key'");
      const Json& key = k["key"];
      std::string s = key.is_string() ? key.get<std::string>() : key.is_number_integer() ? key.dump() : "";
      if (s.empty()) bad(what, "a key must be a non-empty string or an integer, not " + key.dump());
      if (s.find('/') != std::string::npos || s.find('\0') != std::string::npos) {
        bad(what, "key '" + s + "' contains '/' or NUL");
      }
      p.keys.push_back(std::move(s));
      int type = kDictKey;
      if (k.contains("key_type") && !k["key_type"].is_null()) {
        const Json& t = k["key_type"];
        if (!t.is_number_integer() || (t.get<int64_t>() != kSequenceKey && t.get<int64_t>() != kDictKey)) {
          bad(what, "key_type must be 1 (sequence) or 2 (dict), not " + t.dump());
        }
        type = t.get<int>();
      }
      p.key_types.push_back(type);
    }
    for (size_t i = 0; i < p.keys.size(); ++i) {
      p.path += (i ? "/" : "") + p.keys[i];
      p.name += (i ? "." : "") + p.keys[i];
    }
    const Json vm = entry.value("value_metadata", Json::object());
    if (!vm.is_object()) bad(what, "value_metadata must be an object");
    p.value_type = vm.contains("value_type") && vm["value_type"].is_string() ? parse_value_type(vm["value_type"].get<std::string>())
                                                                             : ValueType::kUnknown;
    if (vm.contains("skip_deserialize")) {
      if (!vm["skip_deserialize"].is_boolean()) bad(what, "skip_deserialize must be true or false");
      p.skip_deserialize = vm["skip_deserialize"].get<bool>();
    }
    if (vm.contains("write_shape") && !vm["write_shape"].is_null()) {
      const Json& ws = vm["write_shape"];
      if (!ws.is_array()) bad(what, "write_shape must be a list");
      std::vector<int64_t> dims;
      for (const Json& d : ws) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0) bad(what, "write_shape must hold non-negative integers");
        dims.push_back(d.get<int64_t>());
      }
      p.write_shape = Shape(std::move(dims));
    }
    if (auto [it, fresh] = names.emplace(p.name, p.path); !fresh) {
      bad(source, "leaves '" + it->second + "' and '" + p.path + "' share the stored name '" + p.name + "'");
    }
    if (!by_path.emplace(p.path, p).second) bad(source, "the leaf '" + p.path + "' appears twice");
  }

  // tessel's extras.
  if (j.contains("custom_metadata") && j["custom_metadata"].is_object() && j["custom_metadata"].contains("tessel")) {
    const Json& t = j["custom_metadata"]["tessel"];
    const std::string what = std::string(source) + " custom_metadata.tessel";
    if (!t.is_object()) bad(what, "must be an object");
    item.written_by_tessel = true;
    if (t.contains("mesh")) item.mesh = parse_mesh(t["mesh"], what + ".mesh");
    if (t.contains("rules") && !t["rules"].is_null()) {
      item.rules = parse_rules_json(t["rules"].dump(), what + ".rules");
    }
    if (t.contains("params")) {
      if (!t["params"].is_object()) bad(what, "params must be an object");
      for (auto& [path, p] : by_path) {
        if (t["params"].contains(p.name)) parse_tessel_param(t["params"][p.name], p, source);
      }
    }
  }

  if (!sharding_json.empty()) {
    const std::string what = std::string(source) + " _sharding";
    const Json s = json_util::parse(sharding_json, what);
    if (!s.is_object()) bad(what, "must be a JSON object");
    for (auto& [path, p] : by_path) {
      const std::string key = base64_url_encode(p.name);
      if (!s.contains(key)) continue;
      if (!s[key].is_string()) bad(what, "entry '" + key + "' (" + p.name + ") must be a JSON string");
      p.sharding = parse_saved_sharding(s[key].get<std::string>(), what + "['" + p.name + "']");
      if (p.sharding && p.write_shape && p.sharding->spec.size() > p.write_shape->rank()) {
        bad(what, "the spec of '" + p.name + "' has more entries than the array has dimensions");
      }
    }
  }
  for (auto& [path, p] : by_path) item.params.push_back(std::move(p));
  return item;
}

std::string metadata_from_array_keys(const std::vector<std::string>& stored_keys, bool use_ocdbt) {
  std::map<std::string, bool> names;  // name -> zarr3
  for (const std::string& key : stored_keys) {
    for (const auto& [suffix, v3] : {std::pair<std::string_view, bool>{"/.zarray", false}, {"/zarr.json", true}}) {
      if (key.size() > suffix.size() && key.ends_with(suffix)) {
        names.emplace(key.substr(0, key.size() - suffix.size()), v3);
      }
    }
  }
  if (names.empty()) return "";
  Json tree = Json::object();
  bool zarr3 = false;
  for (const auto& [name, v3] : names) {
    Json keys = Json::array();
    std::vector<std::string> parts;
    size_t start = 0;
    for (;;) {
      const size_t dot = name.find('.', start);
      parts.push_back(name.substr(start, dot == std::string::npos ? dot : dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    for (const auto& k : parts) keys.push_back({{"key", k}, {"key_type", 2}});
    tree[python_tuple(parts)] = {{"key_metadata", keys}, {"value_metadata", {{"value_type", "jax.Array"}, {"skip_deserialize", false}}}};
    zarr3 = zarr3 || v3;
  }
  return Json{{"tree_metadata", tree}, {"use_ocdbt", use_ocdbt}, {"use_zarr3", zarr3}}.dump();
}


namespace detail {

std::string tree_metadata_json(const std::vector<ParamRecord>& params, const std::vector<EmptyNode>& empty_nodes,
                               const Mesh& mesh, const std::optional<LogicalRules>& rules, bool use_ocdbt,
                               bool use_zarr3) {
  Json tree = Json::object();
  Json tessel_params = Json::object();
  for (const auto& p : params) {
    Json keys = Json::array();
    for (size_t i = 0; i < p.keys.size(); ++i) keys.push_back({{"key", p.keys[i]}, {"key_type", p.key_types.at(i)}});
    tree[python_tuple(p.keys)] = {
        {"key_metadata", keys},
        {"value_metadata", {{"value_type", "jax.Array"}, {"skip_deserialize", false}, {"write_shape", p.write_shape.dims()}}}};
    Json tp = partitioning_json(p.partitioning);
    tp["kind"] = p.kind;
    Json crc = Json::object();
    for (const auto& [key, value] : p.crc32c) crc[key] = value;
    tp["crc32c"] = std::move(crc);
    tessel_params[p.name] = std::move(tp);
  }
  for (const EmptyNode& e : empty_nodes) {
    Json keys = Json::array();
    for (size_t i = 0; i < e.keys.size(); ++i) keys.push_back({{"key", e.keys[i]}, {"key_type", e.key_types.at(i)}});
    tree[python_tuple(e.keys)] = {{"key_metadata", keys},
                                  {"value_metadata", {{"value_type", "None"}, {"skip_deserialize", true}}}};
  }
  Json tessel{{"version", 1}, {"mesh", mesh_json(mesh)}, {"rules", rules ? rules_json(*rules) : Json()},
              {"params", std::move(tessel_params)}};
  Json j{{"tree_metadata", std::move(tree)},
         {"use_ocdbt", use_ocdbt},
         {"use_zarr3", use_zarr3},
         {"store_array_data_equal_to_fill_value", true},
         {"custom_metadata", {{"tessel", std::move(tessel)}}}};
  return json_util::dump(j);
}

std::string sharding_json(const std::vector<ParamRecord>& params) {
  Json j = Json::object();
  for (const auto& p : params) {
    Json s = mesh_json(p.sharding.mesh());
    Json inner{{"sharding_type", "NamedSharding"},
               {"shape", s["shape"]},
               {"axis_names", s["axis_names"]},
               {"partition_spec", spec_json::to_json(p.sharding.spec())}};
    j[base64_url_encode(p.name)] = json_util::dump(inner);
  }
  return json_util::dump(j);
}

std::string array_metadatas_json(const std::vector<ParamRecord>& params) {
  Json list = Json::array();
  for (const auto& p : params) {
    list.push_back({{"array_metadata",
                     {{"param_name", p.name},
                      {"write_shape", p.write_shape.dims()},
                      {"chunk_shape", p.chunk_shape.dims()},
                      {"ext_metadata", nullptr}}}});
  }
  return json_util::dump(Json{{"array_metadatas", list}});
}

std::string checkpoint_metadata_json(const std::map<std::string, std::string>& item_handlers,
                                     int64_t init_ns, int64_t commit_ns) {
  Json handlers = Json::object();
  for (const auto& [item, handler] : item_handlers) handlers[item] = handler;
  Json j{{"item_handlers", handlers},
         {"metrics", Json::object()},
         {"performance_metrics", Json::object()},
         {"init_timestamp_nsecs", init_ns}};
  if (commit_ns > 0) j["commit_timestamp_nsecs"] = commit_ns;
  j["custom_metadata"] = Json::object();
  return json_util::dump(j);
}

}  // namespace detail
}  // namespace tessel
