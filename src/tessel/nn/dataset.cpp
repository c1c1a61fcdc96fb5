#include "tessel/nn/dataset.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tessel/core/error.h"

namespace tessel::nn {
namespace {

// SplitMix64: a well-mixed 64-bit hash, enough to spread row offsets over the text.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

int64_t row_offset(uint64_t seed, int64_t step, int64_t row, int64_t range) {
  const uint64_t h = mix(mix(mix(seed) ^ static_cast<uint64_t>(step)) ^ static_cast<uint64_t>(row));
  return static_cast<int64_t>(h % static_cast<uint64_t>(range));
}

}  // namespace

ByteDataset ByteDataset::open(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot read the training text " + path.string() + ": " + std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) throw IoError("error reading the training text " + path.string());
  ByteDataset d;
  d.path_ = path;
  d.bytes_ = std::make_shared<const std::string>(std::move(s).str());
  if (d.bytes_->empty()) throw ValueError("the training text " + path.string() + " is empty");
  return d;
}

std::filesystem::path ByteDataset::default_path() { return "/usr/share/common-licenses/GPL-3"; }

std::string DataPosition::to_json(const ByteDataset* data) const {
  nlohmann::json j{{"seed", seed}, {"step", step}};
  if (data) {
    j["path"] = data->path().string();
    j["size"] = data->size();
  }
  return j.dump();
}

DataPosition DataPosition::from_json(const std::string& text, const ByteDataset* data) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(std::string("data position: not JSON: ") + e.what());
  }
  auto field = [&](const char* name) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(name) || !j[name].is_number_integer()) {
      throw ValueError(std::string("data position: '") + name + "' is missing or not an integer in " + text);
    }
    return j[name];
  };
  DataPosition p;
  p.seed = field("seed").get<uint64_t>();
  p.step = field("step").get<int64_t>();
  if (p.step < 0) throw ValueError("data position: negative step in " + text);
  if (!data) return p;
  const int64_t size = field("size").get<int64_t>();
  if (size != data->size()) {
    throw ValueError("data position: the checkpoint's text had " + std::to_string(size) + " bytes, " +
                     data->path().string() + " has " + std::to_string(data->size()) +
                     " (resume with the same --data)");
  }
  return p;
}

Batch make_batch(const Runtime& rt, const ByteDataset& data, const DataPosition& at, int64_t batch, int64_t seq,
                 const NamedSharding& sharding) {
  if (batch <= 0 || seq <= 0) throw ValueError("batch and seq must be positive");
  if (data.size() <= seq) {
    throw ValueError("the training text " + data.path().string() + " has " + std::to_string(data.size()) +
                     " bytes; sequences of " + std::to_string(seq) + " need at least " + std::to_string(seq + 1));
  }
  const int64_t range = data.size() - seq;
  const std::string& text = data.bytes();
  auto fill = [&](int64_t shift) {
    return [&, shift](const Box& box, std::span<std::byte> out) {
      auto* o = reinterpret_cast<int32_t*>(out.data());
      for (int64_t r = box.start(0); r < box.stop(0); ++r) {
        const int64_t start = row_offset(at.seed, at.step, r, range) + shift;
        for (int64_t c = box.start(1); c < box.stop(1); ++c) {
          *o++ = static_cast<unsigned char>(text[static_cast<size_t>(start + c)]);
        }
      }
    };
  };
  const Shape shape{batch, seq};
  return {make_array_from_callback(rt, shape, DType::kI32, sharding, fill(0), "inputs"),
          make_array_from_callback(rt, shape, DType::kI32, sharding, fill(1), "targets")};
}

Batch make_regression_batch(const Runtime& rt, const DataPosition& at, int64_t batch, int64_t depth,
                            const NamedSharding& sharding) {
  if (batch <= 0 || depth <= 0) throw ValueError("batch and depth must be positive");
  auto fill = [&](bool target) {
    return [&, target](const Box& box, std::span<std::byte> out) {
      auto* o = reinterpret_cast<float*>(out.data());
      for (int64_t r = box.start(0); r < box.stop(0); ++r) {
        for (int64_t c = box.start(1); c < box.stop(1); ++c) {
          // Box-Muller from two hashed uniforms in (0, 1].
          const uint64_t h = mix(mix(mix(at.seed) ^ static_cast<uint64_t>(at.step)) ^ static_cast<uint64_t>(r * depth + c));
          const double u1 = (static_cast<double>(h >> 40) + 1) / 16777216.0;
          const double u2 = static_cast<double>(h & 0xffffff) / 16777216.0;
          const double x = std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
          *o++ = static_cast<float>(target ? std::sin(x) : x);
        }
      }
    };
  };
  const Shape shape{batch, depth};
  return {make_array_from_callback(rt, shape, DType::kF32, sharding, fill(false), "inputs"),
          make_array_from_callback(rt, shape, DType::kF32, sharding, fill(true), "targets")};
}

}  // namespace tessel::nn
