// Byte-level language modeling on a text file, with no download: any file the user names, by
// default the GPL-3 text every Debian system ships (/usr/share/common-licenses/GPL-3).
//
// Batches are a pure function of (seed, step): row r of step t starts at an offset drawn from
// (seed, t, r), so the stream resumes exactly from the step saved with a checkpoint, on any mesh.
// make_batch builds the global [batch, seq] arrays with make_array_from_callback: each device
// fills only its own rows.
//
//   nn::ByteDataset data = nn::ByteDataset::open(nn::ByteDataset::default_path());
//   nn::Batch b = nn::make_batch(rt, data, {.seed = 0, .step = 7}, 16, 128, batch_sharding);
//   // b.inputs: i32[16,128] (bytes), b.targets: the next byte of each
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "tessel/runtime/array.h"

namespace tessel::nn {

class ByteDataset {
 public:
  // Reads the whole file. Throws IoError if it cannot be read, ValueError if it is empty.
  static ByteDataset open(const std::filesystem::path& path);
  static std::filesystem::path default_path();

  const std::filesystem::path& path() const { return path_; }
  int64_t size() const { return static_cast<int64_t>(bytes_->size()); }
  const std::string& bytes() const { return *bytes_; }

 private:
  std::filesystem::path path_;
  std::shared_ptr<const std::string> bytes_;
};

// Where the stream stands: the next batch is `step`. Saved with checkpoints as JSON.
struct DataPosition {
  uint64_t seed = 0;
  int64_t step = 0;
  // {"seed", "step"} plus the text's "path" and "size" when there is one (null: synthetic data).
  std::string to_json(const ByteDataset* data) const;
  // Throws ValueError on malformed JSON, or when the recorded text size differs from `data`'s
  // (another text would silently change the stream).
  static DataPosition from_json(const std::string& json, const ByteDataset* data);
};

struct Batch {
  Array inputs;   // LM: i32 tokens [batch, seq]; regression: f32 [batch, depth]
  Array targets;  // LM: the next byte of each token; regression: sin(inputs)
};

// Throws ValueError when the text is not longer than seq (each row needs seq + 1 bytes).
Batch make_batch(const Runtime& rt, const ByteDataset& data, const DataPosition& at, int64_t batch, int64_t seq,
                 const NamedSharding& sharding);

// DotReluDot's synthetic regression task: inputs ~ N(0, 1) drawn from (seed, step, element),
// targets = sin(inputs), both f32 [batch, depth] on `sharding`.
Batch make_regression_batch(const Runtime& rt, const DataPosition& at, int64_t batch, int64_t depth,
                            const NamedSharding& sharding);

}  // namespace tessel::nn
