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

// Writes every array of `staged` as a tensor named by its path with '.' between levels, into the
// new directory `dir` (a Hugging Face model directory). Each process writes its own blocks into
// the shared files; the leader commits by renaming `<dir>.tmp`, so a crash leaves no partial
// directory. Throws IoError if `dir` exists, ValueError for a path level holding a '.' (it would
// read back as another tree).
void save_safetensors(const std::filesystem::path& dir, const StagedState& staged,
                      const SafetensorsSaveOptions& options = {});
void save_safetensors(const std::filesystem::path& dir, const State& state, const SafetensorsSaveOptions& options = {});

// The same one tensor at a time, in one process, so a conversion holds one tensor (or a few) at
// once: the layout comes from `abstract` (paths, shapes, dtypes) and the files are created at
// once in `<dir>.tmp`; write() puts each array's blocks in place, in any order; commit() checks
// that every tensor was written and renames. A writer destroyed uncommitted removes `<dir>.tmp`.
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::filesystem::path dir, const State& abstract, SafetensorsSaveOptions options = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  // Throws ValueError for a path not laid out, a shape or dtype other than laid out, or a second write.
  void write(const std::string& path, const Array& array);
  void commit();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessel
