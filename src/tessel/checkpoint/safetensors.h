// Hugging Face safetensors: an 8-byte little-endian header length, a JSON header
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}} and the
// tensors' bytes (C order, little endian) packed one after another. A sharded set is several such
// files and `model.safetensors.index.json` ({"metadata": ..., "weight_map": {name: file}}).
//
// tessel reads them as one more storage format behind the same restore plan as Orbax's: each
// tensor is an array of one uncompressed chunk, so every device reads only the byte ranges of its
// own block. A tensor's tessel path is its name with '.' as the level separator
// ("model.layers.0.mlp.up_proj.weight" -> "model/layers/0/mlp/up_proj/weight").
//
//   State params = tessel::restore(rt, "llama", target);          // restore reads them as any item
//   tessel::save_safetensors("out", params, {.max_file_bytes = int64_t{5} << 30});
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/writer.h"
#include "tessel/core/dtype.h"
#include "tessel/core/shape.h"

namespace tessel {

struct SafetensorsSaveOptions {
  // 0: one file, model.safetensors. Else files of at most this many tensor bytes (a larger tensor
  // alone in its file) named as Hugging Face names them, model-00001-of-0000N.safetensors, with
  // model.safetensors.index.json; when everything fits in one file, model.safetensors alone.
  int64_t max_file_bytes = 0;
  std::map<std::string, std::string> metadata;  // `__metadata__` of every file (HF's {"format": "pt"})
  bool durable = true;                          // fsync files and directories before the rename
};

// Safetensors through the writer interface (writer.h): every array a tensor named by its path with
// '.' between levels, in the new directory `dir` (a Hugging Face model directory). The leader lays
// out every file at once in `<dir>.tmp` (headers and sizes; tensors ordered by item size, largest
// first, then by name, as the format's own writer does); each process writes its blocks at their
// offsets, in any order; commit() writes the index of a sharded set and renames. Throws IoError if
// `dir` exists, ValueError for a path level holding a '.' (it would read back as another tree).
class SafetensorsWriter final : public StateWriter {
 public:
  SafetensorsWriter(Location dir, const State& abstract, SafetensorsSaveOptions options = {},
                    ProcessGroup* group = nullptr);
  ~SafetensorsWriter() override;

 protected:
  std::string_view leaf_noun() const override { return "tensors"; }
  void begin_leader() override;
  void begin_process() override;
  void write_blocks(size_t leaf, std::span<const HostBlock> blocks) override;
  std::string finish_process() override;
  void finish(const std::vector<std::string>& parts) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Every leaf of `staged` (or `state`) through a SafetensorsWriter over its processes.
void save_safetensors(const Location& dir, const StagedState& staged,
                      const SafetensorsSaveOptions& options = {});
void save_safetensors(const Location& dir, const State& state, const SafetensorsSaveOptions& options = {});

}  // namespace tessel
