// One writer interface for every checkpoint format: a writer lays out every leaf of an abstract
// state (paths, shapes, dtypes, shardings), takes the arrays as they come, in any order, and
// commits atomically: until commit() returns nothing is visible under its directory, and a writer
// destroyed uncommitted leaves nothing. Across the processes of a ProcessGroup, every process
// constructs the writer and writes its own blocks (replica 0 of the blocks it holds), and process
// 0 commits once all have; a failure on one is thrown on all. The formats: CheckpointWriter
// (Orbax, checkpointer.h) and SafetensorsWriter (safetensors.h).
//
// The directory may be a bucket prefix (s3://bucket/run/7). A bucket has no rename: the files go
// straight to their place and commit() writes `commit_success.txt` last, the marker Orbax writes
// on object stores; readers ignore steps without it, and a new save first removes what an
// unfinished one left there.
//
//   std::unique_ptr<tessel::StateWriter> w = std::make_unique<tessel::SafetensorsWriter>("out", abstract);
//   for (const auto& [path, v] : state) w->write(path, v.array());
//   w->commit();
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/box.h"
#include "tessel/core/location.h"
#include "tessel/runtime/array.h"
#include "tessel/runtime/process_group.h"
#include "tessel/state/state.h"

namespace tessel {
namespace detail {
class OutputDir;
}

// One block of a leaf in host memory: the row-major bytes of `box`.
struct HostBlock {
  Box box;
  std::span<const std::byte> bytes;
};

class StateWriter {
 public:
  virtual ~StateWriter();
  StateWriter(const StateWriter&) = delete;
  StateWriter& operator=(const StateWriter&) = delete;

  // This process's blocks of `array` (replica 0 of each block it holds), for the leaf laid out at
  // `path`. Throws ValueError for a path not laid out, another shape or dtype (or, where the
  // format stores the layout's sharding, another sharding), or a block written before.
  void write(const std::string& path, const Array& array);
  // The same from host memory: each block one of the leaf's sharding's distinct blocks (any box
  // of the leaf's shape when it was laid out without a sharding; a box of the format's block
  // grid where it has one), with its box's byte count. A leaf may come in several calls, each
  // with other blocks: a slab at a time.
  void write(const std::string& path, std::span<const HostBlock> blocks);
  // Checks that every leaf was written (in one process: every element of it), then makes the
  // result visible under dir(), durably.
  void commit();

  const Location& dir() const { return dir_; }
  const State& layout() const { return layout_; }

 protected:
  // `tmp_suffix` names the temporary directory (`<dir><suffix>`) the files go to until commit.
  // `fixed_shardings`: the format stores the layout's shardings, so arrays must come in them.
  // `group` nullptr: this process alone.
  StateWriter(Location dir, std::string_view tmp_suffix, const State& abstract, ProcessGroup* group, bool durable,
              bool fixed_shardings);
  // The derived constructor calls this last: the leader creates the temporary directory and runs
  // begin_leader(), then every process begin_process(), each step a meeting of all processes.
  void start();

  // Where the files go until commit: `<dir><suffix>` for a local directory, dir() itself in a bucket.
  const Location& tmp() const { return tmp_; }
  // tmp() to write into (from begin_process on, on every process).
  detail::OutputDir& out() const { return *out_; }
  ProcessGroup& group() const { return *group_; }
  bool durable() const { return durable_; }
  // The leaves in layout order (State order); write_blocks gets an index into it.
  const std::vector<std::string>& paths() const { return paths_; }

  // What a leaf is called in this format's messages ("leaves", "tensors").
  virtual std::string_view leaf_noun() const { return "leaves"; }
  // The blocks a leaf is written in when the format fixes them otherwise than by its sharding:
  // the boxes of a grid of this shape (edge boxes cut at the leaf's shape).
  virtual std::optional<Shape> block_grid(size_t /*leaf*/) const { return std::nullopt; }
  virtual void begin_leader() {}
  virtual void begin_process() {}
  // Writes blocks of leaf `leaf` (checked against its layout); may run on one thread at a time.
  virtual void write_blocks(size_t leaf, std::span<const HostBlock> blocks) = 0;
  // Every process: its part is written and durable. Returns what the leader needs of it.
  virtual std::string finish_process() { return {}; }
  // The leader, once every process finished: the files that complete tmp(), before the rename.
  virtual void finish(const std::vector<std::string>& parts) = 0;

 private:
  Location dir_, tmp_;
  std::shared_ptr<detail::OutputDir> out_;
  std::string tmp_suffix_;
  State layout_;
  std::vector<std::string> paths_;
  std::map<std::string, size_t> index_;
  std::vector<bool> written_;
  std::vector<std::set<std::vector<int64_t>>> blocks_seen_;  // per leaf, the starts of its blocks
  std::vector<int64_t> elements_written_;
  std::unique_ptr<ProcessGroup> own_group_;
  ProcessGroup* group_ = nullptr;
  bool durable_ = true;
  bool fixed_shardings_ = false;
  bool started_ = false;
  bool committed_ = false;
};

}  // namespace tessel
