#include "tessel/checkpoint/detail/store/zarr.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "tessel/checkpoint/detail/io/crc32c.h"
#include "tessel/core/error.h"
#include "tessel/detail/json_util.h"

namespace tessel::detail {
using json_util::Json;

namespace {

// The largest chunk tessel will allocate when decoding: far above any real chunk (Orbax keeps
// them under 2 GiB), low enough that a corrupt `.zarray` cannot ask for absurd memory.
constexpr int64_t kMaxChunkBytes = int64_t{16} << 30;

int64_t checked_volume(const Shape& s, size_t item, std::string_view what) {
  int64_t v = static_cast<int64_t>(item);
  for (int64_t d : s) {
    if (d != 0 && v > std::numeric_limits<int64_t>::max() / d) {
      throw ValueError(std::string(what) + ": " + s.to_string() + " elements overflow a 64-bit byte count");
    }
    v *= d;
  }
  return v;
}

Shape parse_dims(const Json& j, std::string_view source, const char* field) {
  if (!j.is_array()) throw ValueError(std::string(source) + ": '" + field + "' must be a list of integers");
  std::vector<int64_t> dims;
  for (const Json& d : j) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      throw ValueError(std::string(source) + ": '" + field + "' must hold non-negative integers, not " + d.dump());
    }
    dims.push_back(d.get<int64_t>());
  }
  if (dims.size() > 32) throw ValueError(std::string(source) + ": '" + field + "' has more than 32 dimensions");
  return Shape(std::move(dims));
}

Compression parse_compressor(const Json& j, std::string_view source) {
  if (j.is_null()) return Compression::none();
  if (!j.is_object() || !j.contains("id") || !j["id"].is_string()) {
    throw ValueError(std::string(source) + ": 'compressor' must be null or an object with an 'id'");
  }
  const std::string id = j["id"].get<std::string>();
  if (id == "zstd") {
    int level = 1;
    if (j.contains("level") && j["level"].is_number_integer()) level = j["level"].get<int>();
    return Compression::zstd(level);
  }
  if (id == "blosc") return {Compression::Kind::kBlosc, 0};
  throw ValueError(std::string(source) + ": compressor '" + id + "' is not supported (tessel reads none, zstd and blosc)");
}

std::optional<double> parse_fill(const Json& j, std::string_view source) {
  if (j.is_null()) return std::nullopt;
  if (j.is_boolean()) return j.get<bool>() ? 1.0 : 0.0;
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const auto s = j.get<std::string>();
    if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
  }
  throw ValueError(std::string(source) + ": unsupported fill_value " + j.dump());
}

// A v3 codec: {"name": ..., "configuration": {...}}.
struct Codec {
  std::string name;
  Json config;
};

std::vector<Codec> parse_codecs(const Json& j, std::string_view source, const char* field) {
  if (!j.is_array() || j.empty()) throw ValueError(std::string(source) + ": '" + field + "' must be a non-empty list");
  std::vector<Codec> out;
  for (const Json& c : j) {
    if (!c.is_object() || !c.contains("name") || !c["name"].is_string()) {
      throw ValueError(std::string(source) + ": each of '" + field + "' must be an object with a 'name', not " + c.dump());
    }
    Json config = c.value("configuration", Json::object());
    if (!config.is_object()) throw ValueError(std::string(source) + ": a codec's configuration must be an object");
    out.push_back({c["name"].get<std::string>(), std::move(config)});
  }
  return out;
}

void check_bytes_codec(const Codec& c, DType dtype, std::string_view source) {
  if (c.name != "bytes") {
    throw ValueError(std::string(source) + ": codec '" + c.name + "' where 'bytes' must come (tessel reads bytes, "
                     "zstd, crc32c and sharding_indexed; no transpose)");
  }
  const Json endian = c.config.value("endian", Json("little"));
  if (endian != "little" && !(item_size(dtype) == 1 && endian.is_null())) {
    throw ValueError(std::string(source) + ": endian " + endian.dump() + " is not supported (only little)");
  }
}

}  // namespace

struct ZarrV3Parser {
  static ZarrArray parse(const Json& j, std::string_view source);
};

ZarrArray ZarrV3Parser::parse(const Json& j, std::string_view source) {
  auto fail = [&](const std::string& why) -> ValueError { return ValueError(std::string(source) + ": " + why); };
  for (const char* key : {"shape", "data_type", "chunk_grid", "codecs"}) {
    if (!j.contains(key)) throw fail(std::string("missing '") + key + "'");
  }
  if (j.value("node_type", Json("array")) != "array") throw fail("node_type must be \"array\"");
  if (!j["data_type"].is_string()) throw fail("data_type must be a string, not " + j["data_type"].dump());
  DType dtype;
  try {
    dtype = parse_dtype(j["data_type"].get<std::string>());
  } catch (const ValueError& e) {
    throw fail(e.what());
  }
  Shape shape = parse_dims(j["shape"], source, "shape");
  const Json& grid = j["chunk_grid"];
  if (!grid.is_object() || grid.value("name", Json()) != "regular" || !grid.contains("configuration") ||
      !grid["configuration"].is_object() || !grid["configuration"].contains("chunk_shape")) {
    throw fail("chunk_grid must be {\"name\": \"regular\", \"configuration\": {\"chunk_shape\": [...]}}");
  }
  Shape grid_shape = parse_dims(grid["configuration"]["chunk_shape"], source, "chunk_shape");
  bool default_keys = true;
  char separator = '/';
  if (j.contains("chunk_key_encoding")) {
    const Json& k = j["chunk_key_encoding"];
    if (!k.is_object() || !k.contains("name")) throw fail("chunk_key_encoding must be an object with a 'name'");
    if (k["name"] == "v2") {
      default_keys = false;
      separator = '.';
    } else if (k["name"] != "default") {
      throw fail("chunk_key_encoding " + k["name"].dump() + " (known: default, v2)");
    }
    const Json sep = k.contains("configuration") && k["configuration"].is_object()
                         ? k["configuration"].value("separator", Json(std::string(1, separator)))
                         : Json(std::string(1, separator));
    if (sep != "/" && sep != ".") throw fail("chunk key separator must be \"/\" or \".\", not " + sep.dump());
    separator = sep.get<std::string>()[0];
  }
  std::vector<Codec> codecs = parse_codecs(j["codecs"], source, "codecs");
  bool sharded = false, index_at_end = true, index_crc = false;
  Shape chunks = grid_shape;
  if (codecs.front().name == "sharding_indexed") {
    if (codecs.size() != 1) throw fail("codecs after sharding_indexed are not supported");
    const Json& cfg = codecs.front().config;
    for (const char* key : {"chunk_shape", "codecs", "index_codecs"}) {
      if (!cfg.contains(key)) throw fail(std::string("sharding_indexed has no '") + key + "'");
    }
    sharded = true;
    chunks = parse_dims(cfg["chunk_shape"], source, "sharding_indexed chunk_shape");
    if (chunks.rank() != grid_shape.rank()) throw fail("inner chunk_shape and chunk_grid differ in rank");
    for (size_t d = 0; d < chunks.rank(); ++d) {
      if (chunks[d] < 1 || grid_shape[d] % chunks[d] != 0) {
        throw fail("inner chunk_shape " + chunks.to_string() + " does not divide the shard shape " + grid_shape.to_string());
      }
    }
    const Json location = cfg.value("index_location", Json("end"));
    if (location != "end" && location != "start") throw fail("index_location " + location.dump() + " (end or start)");
    index_at_end = location == "end";
    std::vector<Codec> index = parse_codecs(cfg["index_codecs"], source, "index_codecs");
    check_bytes_codec(index.front(), DType::kI64, source);
    if (index.size() > 2 || (index.size() == 2 && index[1].name != "crc32c")) {
      throw fail("index_codecs must be bytes, optionally followed by crc32c");
    }
    index_crc = index.size() == 2;
    codecs = parse_codecs(cfg["codecs"], source, "sharding_indexed codecs");
  }
  check_bytes_codec(codecs.front(), dtype, source);
  Compression compression = Compression::none();
  bool chunk_crc = false;
  for (size_t i = 1; i < codecs.size(); ++i) {
    const Codec& c = codecs[i];
    if (c.name == "zstd" && compression.kind == Compression::Kind::kNone && !chunk_crc) {
      const Json level = c.config.value("level", Json(0));
      if (!level.is_number_integer()) throw fail("zstd level must be an integer");
      if (c.config.value("checksum", Json(false)) != false) throw fail("zstd with checksum is not supported");
      compression = Compression::zstd(level.get<int>() == 0 ? 3 : level.get<int>());
    } else if (c.name == "crc32c" && i + 1 == codecs.size()) {
      chunk_crc = true;
    } else {
      throw fail("codec '" + c.name + "' here is not supported (tessel reads bytes, zstd, crc32c, sharding_indexed)");
    }
  }
  std::optional<double> fill = parse_fill(j.value("fill_value", Json()), source);
  try {
    ZarrArray z(std::move(shape), std::move(chunks), dtype, compression);
    z.format_ = 3;
    z.v3_default_keys_ = default_keys;
    z.separator_ = separator;
    z.sharded_ = sharded;
    z.shard_shape_ = grid_shape;
    z.index_at_end_ = index_at_end;
    z.index_crc_ = index_crc;
    z.chunk_crc_ = chunk_crc;
    z.fill_value_ = fill;
    return z;
  } catch (const ValueError& e) {
    throw fail(e.what());
  }
}

ZarrArray ZarrArray::sharded_v3(Shape shape, Shape shard_shape, Shape chunks, DType dtype, Compression compression) {
  if (shard_shape.rank() != chunks.rank()) throw ValueError("zarr3: shard and chunk shapes differ in rank");
  for (size_t d = 0; d < chunks.rank(); ++d) {
    if (chunks[d] < 1 || shard_shape[d] % chunks[d] != 0) {
      throw ValueError("zarr3: chunk shape " + chunks.to_string() + " does not divide the shard shape " +
                       shard_shape.to_string());
    }
  }
  ZarrArray z(std::move(shape), std::move(chunks), dtype, compression);
  z.format_ = 3;
  z.separator_ = '/';
  z.sharded_ = true;
  z.shard_shape_ = std::move(shard_shape);
  z.index_crc_ = true;
  z.fill_value_ = 0.0;
  return z;
}

int64_t ZarrArray::chunks_per_shard() const {
  if (!sharded_) return 1;
  int64_t n = 1;
  for (size_t d = 0; d < chunks_.rank(); ++d) n *= shard_shape_[d] / chunks_[d];
  return n;
}

std::optional<ZarrArray::Range> ZarrArray::inner_chunk_range(std::span<const std::byte> index, int64_t position,
                                                             int64_t shard_size, std::string_view what) const {
  const int64_t index_bytes = shard_index_bytes();
  if (static_cast<int64_t>(index.size()) != index_bytes || position < 0 || position >= chunks_per_shard()) {
    throw ValueError(std::string(what) + ": a shard index of " + std::to_string(index.size()) + " bytes, expected " +
                     std::to_string(index_bytes));
  }
  if (shard_size < index_bytes) {
    throw ValueError(std::string(what) + ": a shard of " + std::to_string(shard_size) + " bytes cannot hold its index of " +
                     std::to_string(index_bytes));
  }
  if (index_crc_) {
    uint32_t crc = 0;
    std::memcpy(&crc, index.data() + index_bytes - 4, 4);
    if (detail::crc32c(index.first(static_cast<size_t>(index_bytes - 4))) != crc) {
      throw ValueError(std::string(what) + ": the shard index fails its CRC-32C (corrupt)");
    }
  }
  uint64_t offset = 0, length = 0;
  std::memcpy(&offset, index.data() + position * 16, 8);
  std::memcpy(&length, index.data() + position * 16 + 8, 8);
  if (offset == UINT64_MAX && length == UINT64_MAX) return std::nullopt;
  const uint64_t begin = index_at_end_ ? 0 : static_cast<uint64_t>(index_bytes);
  const uint64_t end = static_cast<uint64_t>(index_at_end_ ? shard_size - index_bytes : shard_size);
  if (offset < begin || offset > end || length > end - offset) {
    throw ValueError(std::string(what) + ": the shard index puts inner chunk " + std::to_string(position) + " at [" +
                     std::to_string(offset) + ", +" + std::to_string(length) + "), outside the shard's data");
  }
  return Range{static_cast<int64_t>(offset), static_cast<int64_t>(length)};
}

int64_t ZarrArray::position_in_shard(std::span<const int64_t> index) const {
  if (!sharded_) return 0;
  int64_t pos = 0;
  for (size_t d = 0; d < index.size(); ++d) {
    const int64_t per = shard_shape_[d] / chunks_[d];
    pos = pos * per + index[d] % per;
  }
  return pos;
}

ZarrArray::ZarrArray(Shape shape, Shape chunks, DType dtype, Compression compression)
    : shape_(std::move(shape)), chunks_(std::move(chunks)), dtype_(dtype), compression_(compression) {
  if (chunks_.rank() != shape_.rank()) {
    throw ValueError("zarr array: chunks " + chunks_.to_string() + " do not match the rank of shape " + shape_.to_string());
  }
  for (int64_t c : chunks_) {
    if (c < 1) throw ValueError("zarr array: chunk sizes must be positive, got " + chunks_.to_string());
  }
  checked_volume(shape_, item_size(dtype_), "zarr array shape");
  chunk_bytes_ = checked_volume(chunks_, item_size(dtype_), "zarr chunk shape");
  if (chunk_bytes_ > kMaxChunkBytes) {
    throw ValueError("zarr array: one chunk of " + chunks_.to_string() + " holds " + std::to_string(chunk_bytes_) +
                     " bytes, more than the 16 GiB tessel accepts");
  }
}

ZarrArray ZarrArray::parse(std::string_view text, std::string_view source) {
  const Json j = json_util::parse(text, source);
  auto fail = [&](const std::string& why) -> ValueError { return ValueError(std::string(source) + ": " + why); };
  if (!j.is_object()) throw fail("a .zarray must be a JSON object, not " + json_util::kind(j));
  if (!j.contains("zarr_format")) throw fail("missing 'zarr_format'");
  if (j["zarr_format"] == 3) return ZarrV3Parser::parse(j, source);
  for (const char* key : {"shape", "chunks", "dtype"}) {
    if (!j.contains(key)) throw fail(std::string("missing '") + key + "'");
  }
  if (!j["zarr_format"].is_number_integer() || j["zarr_format"].get<int64_t>() != 2) {
    throw fail("zarr_format must be 2 or 3, not " + j["zarr_format"].dump());
  }
  if (j.contains("order") && j["order"] != "C") throw fail("order " + j["order"].dump() + " is not supported (only \"C\")");
  if (j.contains("filters") && !j["filters"].is_null() && !(j["filters"].is_array() && j["filters"].empty())) {
    throw fail("filters " + j["filters"].dump() + " are not supported");
  }
  if (!j["dtype"].is_string()) throw fail("dtype must be a string, not " + j["dtype"].dump());
  DType dtype;
  try {
    dtype = parse_dtype(j["dtype"].get<std::string>());
  } catch (const ValueError& e) {
    throw fail(e.what());
  }
  Shape shape = parse_dims(j["shape"], source, "shape");
  Shape chunks = parse_dims(j["chunks"], source, "chunks");
  Compression compression = parse_compressor(j.value("compressor", Json()), source);
  char separator = '.';
  if (j.contains("dimension_separator") && !j["dimension_separator"].is_null()) {
    if (j["dimension_separator"] == "/") {
      separator = '/';
    } else if (j["dimension_separator"] != ".") {
      throw fail("dimension_separator must be \".\" or \"/\", not " + j["dimension_separator"].dump());
    }
  }
  std::optional<double> fill = parse_fill(j.value("fill_value", Json()), source);
  try {
    ZarrArray z(std::move(shape), std::move(chunks), dtype, compression);
    z.separator_ = separator;
    z.fill_value_ = fill;
    return z;
  } catch (const ValueError& e) {
    throw fail(e.what());
  }
}

std::string ZarrArray::to_json() const {
  nlohmann::json j;  // sorted keys, as TensorStore writes them
  if (format_ == 3) {
    auto bytes_codec = [&](size_t item) {
      return item == 1 ? nlohmann::json{{"name", "bytes"}}
                       : nlohmann::json{{"configuration", {{"endian", "little"}}}, {"name", "bytes"}};
    };
    nlohmann::json inner = nlohmann::json::array({bytes_codec(item_size(dtype_))});
    if (compression_.kind == Compression::Kind::kZstd) {
      inner.push_back({{"configuration", {{"checksum", false}, {"level", compression_.level}}}, {"name", "zstd"}});
    }
    if (chunk_crc_) inner.push_back({{"name", "crc32c"}});
    nlohmann::json codecs = inner;
    if (sharded_) {
      nlohmann::json index = nlohmann::json::array({bytes_codec(8)});
      if (index_crc_) index.push_back({{"name", "crc32c"}});
      nlohmann::json config{{"chunk_shape", chunks_.dims()}, {"codecs", inner}, {"index_codecs", index}};
      if (!index_at_end_) config["index_location"] = "start";
      codecs = nlohmann::json::array({{{"configuration", config}, {"name", "sharding_indexed"}}});
    }
    j["chunk_grid"] = {{"configuration", {{"chunk_shape", (sharded_ ? shard_shape_ : chunks_).dims()}}}, {"name", "regular"}};
    j["chunk_key_encoding"] = v3_default_keys_ && separator_ == '/'
                                  ? nlohmann::json{{"name", "default"}}
                                  : nlohmann::json{{"configuration", {{"separator", std::string(1, separator_)}}},
                                                   {"name", v3_default_keys_ ? "default" : "v2"}};
    j["codecs"] = codecs;
    j["data_type"] = std::string(name(dtype_));
    if (dtype_ == DType::kBool) {
      j["fill_value"] = fill_value_.value_or(0) != 0;
    } else if (is_floating(dtype_)) {
      j["fill_value"] = fill_value_.value_or(0);
    } else {
      j["fill_value"] = static_cast<int64_t>(fill_value_.value_or(0));
    }
    j["node_type"] = "array";
    j["shape"] = shape_.dims();
    j["zarr_format"] = 3;
    return j.dump();
  }
  j["chunks"] = chunks_.dims();
  if (compression_.kind == Compression::Kind::kZstd) {
    j["compressor"] = {{"id", "zstd"}, {"level", compression_.level}};
  } else {
    j["compressor"] = nullptr;
  }
  j["dimension_separator"] = std::string(1, separator_);
  j["dtype"] = std::string(numpy_typestr(dtype_));
  j["fill_value"] = nullptr;
  j["filters"] = nullptr;
  j["order"] = "C";
  j["shape"] = shape_.dims();
  j["zarr_format"] = 2;
  return j.dump();
}

std::vector<int64_t> ZarrArray::grid() const {
  std::vector<int64_t> g(shape_.rank());
  for (size_t d = 0; d < g.size(); ++d) g[d] = (shape_[d] + chunks_[d] - 1) / chunks_[d];
  return g;
}

int64_t ZarrArray::num_chunks() const {
  int64_t n = 1;
  for (int64_t g : grid()) n *= g;  // bounded by the element count, which fits
  return n;
}

Box ZarrArray::chunk_box(std::span<const int64_t> index) const {
  std::vector<int64_t> start(index.size()), stop(index.size());
  for (size_t d = 0; d < index.size(); ++d) {
    start[d] = index[d] * chunks_[d];
    stop[d] = start[d] + chunks_[d];
  }
  return Box(std::move(start), std::move(stop));
}

std::string ZarrArray::chunk_key(std::span<const int64_t> index) const {
  const bool v3_keys = format_ == 3 && v3_default_keys_;
  if (index.empty()) return v3_keys ? "c" : "0";
  std::string key = v3_keys ? std::string("c") + separator_ : std::string();
  for (size_t d = 0; d < index.size(); ++d) {
    if (d > 0) key += separator_;
    key += std::to_string(sharded_ ? index[d] * chunks_[d] / shard_shape_[d] : index[d]);
  }
  return key;
}

std::vector<std::vector<int64_t>> ZarrArray::chunks_in(const Box& region) const {
  const size_t rank = shape_.rank();
  if (region.empty()) return {};
  if (rank == 0) return {std::vector<int64_t>{}};
  std::vector<int64_t> lo(rank), hi(rank);
  for (size_t d = 0; d < rank; ++d) {
    lo[d] = region.start(d) / chunks_[d];
    hi[d] = (region.stop(d) - 1) / chunks_[d] + 1;
  }
  std::vector<std::vector<int64_t>> out;
  std::vector<int64_t> idx = lo;
  for (;;) {
    out.push_back(idx);
    size_t d = rank;
    while (d-- > 0) {
      if (++idx[d] < hi[d]) break;
      idx[d] = lo[d];
    }
    if (d == static_cast<size_t>(-1)) return out;
  }
}

Shape choose_chunk_shape(const Shape& write_shape, size_t item_size, int64_t max_bytes,
                         std::span<const size_t> prefer) {
  std::vector<int64_t> chunk(write_shape.dims());
  for (int64_t& c : chunk) c = std::max<int64_t>(c, 1);
  auto bytes = [&] {
    double b = static_cast<double>(item_size);
    for (int64_t c : chunk) b *= static_cast<double>(c);
    return b;
  };
  auto smallest_divisor = [](int64_t n) {
    for (int64_t f = 2; f * f <= n; ++f) {
      if (n % f == 0) return f;
    }
    return n;
  };
  // Shrink the largest preferred dimension, then the largest of all, by its smallest prime factor.
  auto shrink_one = [&](bool preferred_only) {
    size_t best = chunk.size();
    for (size_t d = 0; d < chunk.size(); ++d) {
      if (chunk[d] <= 1) continue;
      if (preferred_only && std::find(prefer.begin(), prefer.end(), d) == prefer.end()) continue;
      if (best == chunk.size() || chunk[d] > chunk[best]) best = d;
    }
    if (best == chunk.size()) return false;
    chunk[best] /= smallest_divisor(chunk[best]);
    return true;
  };
  while (bytes() > static_cast<double>(max_bytes) && shrink_one(true)) {
  }
  while (bytes() > static_cast<double>(max_bytes) && shrink_one(false)) {
  }
  return Shape(std::move(chunk));
}

ZarrArray ZarrArray::one_chunk(const Shape& shape, DType dtype) {
  std::vector<int64_t> chunks;
  for (int64_t d : shape.dims()) chunks.push_back(std::max<int64_t>(d, 1));
  return ZarrArray(shape, Shape(std::move(chunks)), dtype, Compression::none());
}

}  // namespace tessel::detail
