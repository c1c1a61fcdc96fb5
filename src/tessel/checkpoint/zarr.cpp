#include "tessel/checkpoint/zarr.h"

#include <cmath>
#include <limits>

#include "tessel/core/error.h"
#include "tessel/detail/json_util.h"

namespace tessel {
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

}  // namespace

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
  for (const char* key : {"zarr_format", "shape", "chunks", "dtype"}) {
    if (!j.contains(key)) throw fail(std::string("missing '") + key + "'");
  }
  if (!j["zarr_format"].is_number_integer() || j["zarr_format"].get<int64_t>() != 2) {
    throw fail("zarr_format must be 2, not " + j["zarr_format"].dump());
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
  if (index.empty()) return "0";
  std::string key;
  for (size_t d = 0; d < index.size(); ++d) {
    if (d > 0) key += separator_;
    key += std::to_string(index[d]);
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

}  // namespace tessel
