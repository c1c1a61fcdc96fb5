// Saving and restoring a State as an Orbax PyTree checkpoint item: by default as Orbax writes it
// by default (zarr v2 arrays in an OCDBT database), or any of Orbax's other layouts (SaveOptions).
//
// save() writes each distinct block of every array once (replica 0), as whole chunks, from a
// pool of writers, into `<dir>.orbax-checkpoint-tmp`, fsyncs, writes commit_success.txt and
// renames: a crash leaves either the finished directory or none. restore() reads any layout. restore() places each leaf
// straight into its target sharding: each device's block is read from the chunks that intersect
// it (uncompressed chunks by byte ranges, compressed ones decoded once for every block that needs
// them), with host staging bounded by RestoreOptions::staging_bytes.
//
//   tessel::save("ckpt/params", params, {.compression = tessel::Compression::zstd()});
//   auto target = tessel::eval_shape(model, tessel::Mesh::parse("data=2,tensor=4"), rules);
//   tessel::State again = tessel::restore(rt, "ckpt/params", target);
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "tessel/checkpoint/codec.h"
#include "tessel/checkpoint/item.h"
#include "tessel/checkpoint/metadata.h"
#include "tessel/checkpoint/target.h"
#include "tessel/checkpoint/writer.h"
#include "tessel/core/host_array.h"
#include "tessel/runtime/process_group.h"
#include "tessel/runtime/runtime.h"
#include "tessel/sharding/logical_rules.h"
#include "tessel/state/state.h"

namespace tessel {

struct SaveOptions {
  Compression compression;                  // none: fastest on local disks
  bool use_ocdbt = true;                    // arrays in an OCDBT database (Orbax's default), else plain files
  bool use_zarr3 = false;                   // zarr3 shards (Orbax's v1 API), else zarr v2 (its v0 default)
  int64_t max_chunk_bytes = int64_t{64} << 20;  // larger shards are split into divisor chunks
  int writers = 0;                          // parallel chunk writers; 0: max(4, cores), at most 16
  // fsync files and directories before the commit. Blocks of 1 MiB and more then go to the disk
  // directly (O_DIRECT, where the file system reports it): faster, and the saved bytes do not
  // fill the page cache (a restore right after reads them from the disk).
  bool durable = true;
  std::optional<LogicalRules> rules;        // recorded, so a restore can re-resolve the axes
  // The tree's nodes that are lists or tuples ('/'-joined paths; "" is the root): their children's
  // keys are recorded as sequence indices, so Orbax rebuilds lists. Every other node is a dict.
  std::set<std::string> sequence_nodes;
  // Nodes without leaves ('/'-joined paths), recorded as Orbax records empty nodes (optax's
  // EmptyState in an optimizer chain), so Orbax restores the tree's full structure.
  std::set<std::string> empty_nodes;
  // Write `_CHECKPOINT_METADATA` into the item, as a standalone checkpoint has it (Orbax's
  // StandardCheckpointer); the items of a CheckpointManager's step leave it to the step.
  bool checkpoint_metadata = true;
  // Leaves written a block of this shape at a time ('/'-joined path -> block shape) instead of
  // their sharding's blocks: a stacked tensor written a layer's slab at a time. Their chunks
  // divide the block shape; the sharding is still what `_sharding` records.
  std::map<std::string, Shape> block_shapes;
};

struct HostLeaf;
struct HostProcesses;
namespace detail {
struct StagedLeaves;
}  // namespace detail

// What a save writes (each array's replica-0 blocks held by this process): host copies, taken so
// the arrays may change or go away while the files are written in the background, or the arrays
// or host bytes themselves.
class StagedState {
 public:
  StagedState();
  ~StagedState();
  StagedState(StagedState&&) noexcept;
  StagedState& operator=(StagedState&&) noexcept;
  int64_t bytes() const;  // host bytes held
  // The abstract state of what is staged: each leaf's path, kind, shape, dtype and sharding.
  State abstract() const;
  // The processes that write it together: its arrays' runtime's (one process for host leaves).
  ProcessGroup& processes() const;
  // Writes every leaf's blocks through `writer` (laid out as abstract()).
  void write_to(StateWriter& writer) const;

  const detail::StagedLeaves& leaves() const { return *leaves_; }

 private:
  friend StagedState stage(const State& state);
  friend StagedState stage_in_place(const State& state);
  friend StagedState stage_host(std::vector<HostLeaf> leaves, const HostProcesses& processes);
  std::unique_ptr<detail::StagedLeaves> leaves_;
};

// Copies the blocks to host memory. Throws ValueError for an abstract variable (naming it).
StagedState stage(const State& state);
// The arrays as they are, without copies: valid while they live (a synchronous save).
StagedState stage_in_place(const State& state);

// A leaf held in host memory by a caller whose arrays are not tessel Arrays (NumPy, JAX): the
// sharding it is saved with and each of that sharding's distinct blocks once (replica 0, any
// order) as the row-major bytes of its box.
struct HostLeaf {
  std::string path;
  Shape shape;
  DType dtype = DType::kF32;
  NamedSharding sharding;
  std::vector<std::pair<Box, std::span<const std::byte>>> blocks;
  std::string kind = kParam;
  Partitioning partitioning;
};

// A save of host leaves in one process, without copies: the bytes must outlive the save. Throws
// ValueError naming the leaf when its blocks are not exactly the sharding's distinct blocks, or a
// block's byte count is not its box's.
StagedState stage_host(std::vector<HostLeaf> leaves);

// The processes of a save whose arrays live in another framework's multi-process job (JAX): this
// process's group (the job's meeting points) and the ids of the devices this process holds, in
// the leaves' meshes' id space. Both must outlive the save.
struct HostProcesses {
  ProcessGroup* group = nullptr;
  std::set<int64_t> local_devices;
};
// The same in one of several processes: each gives exactly the distinct blocks whose replica 0
// is on one of its devices (as JAX's replica_id), so that every block is written once. Throws
// ValueError as above, naming a missing or foreign block.
StagedState stage_host(std::vector<HostLeaf> leaves, const HostProcesses& processes);

// An Orbax PyTree item written through the writer interface (writer.h): the layout comes from
// `abstract` (every leaf placed: a sharding), each process writes the chunks of its blocks as each
// array arrives, in any order (into its own OCDBT database, `ocdbt.process_N`, or chunk files),
// and commit() has process 0 merge the databases, write the metadata with every process's
// CRC-32Cs and rename `<dir>.orbax-checkpoint-tmp` to `dir`, after writing `commit_success.txt`.
// Throws IoError if `dir` exists, ValueError for two paths that would share a stored name
// ("a.b/c" and "a/b.c"), before anything is written.
class CheckpointWriter final : public StateWriter {
 public:
  CheckpointWriter(Location dir, const State& abstract, SaveOptions options = {},
                   ProcessGroup* group = nullptr);
  ~CheckpointWriter() override;

 protected:
  void begin_process() override;
  std::optional<Shape> block_grid(size_t leaf) const override;
  void write_blocks(size_t leaf, std::span<const HostBlock> blocks) override;
  std::string finish_process() override;
  void finish(const std::vector<std::string>& parts) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Saves concrete `state` into the new directory `dir` (its parent must exist), atomically, with a
// CheckpointWriter over the state's processes.
void save(const Location& dir, const State& state, const SaveOptions& options = {});
void save(const Location& dir, const StagedState& staged, const SaveOptions& options = {});

struct RestoreOptions {
  bool partial = false;  // restore exactly the target's leaves; the checkpoint may hold more
  int64_t staging_bytes = int64_t{256} << 20;       // host bytes for chunk decoding at once
  int readers = 0;                                  // 0: max(2, cores), at most 16; and
                                                    // max(8, cores) to read mapped chunks in
  bool verify_checksums = true;                     // of every chunk read whole
  // A device block that is exactly one uncompressed chunk of its dtype (the same mesh, chunks of
  // at least 1 MiB) maps the chunk's file bytes copy-on-write instead of copying them into fresh
  // memory: the restored buffer then is the page cache's pages. The checkpoint's files must not be
  // cut short in place while the restored arrays live (deleting or replacing them is safe, as
  // every checkpointer does); false copies every chunk.
  bool map_chunks = true;
};

struct RestoreStats {
  int64_t bytes_read = 0;     // from files
  int64_t chunks_read = 0;
  int64_t bytes_mapped = 0;   // of bytes_read, those mapped (RestoreOptions::map_chunks)
  int64_t target_bytes = 0;   // bytes of every restored device buffer
  int64_t staging_peak = 0;   // host staging bytes held at once
  double seconds = 0;
};

// The box `box` of the saved array `path`, read into host memory (no mesh, no devices) from the
// chunks that intersect it, cast to `dtype` (default: the saved one): what a streaming conversion
// reads, a slab at a time. Throws ValueError for a path the item lacks, a box outside the shape,
// and what a restore throws for its chunks.
HostArray read_box(const CheckpointItem& item, const std::string& path, const Box& box,
                   std::optional<DType> dtype = std::nullopt, const RestoreOptions& options = {});
// The same into `out` (exactly the box's bytes), a buffer the caller keeps and reuses.
void read_box_into(const CheckpointItem& item, const std::string& path, const Box& box, std::span<std::byte> out,
                   std::optional<DType> dtype = std::nullopt, const RestoreOptions& options = {});

// Restores into the structure, shapes, dtypes (cast when they differ from the saved ones) and
// shardings of `target` (e.g. eval_shape on any mesh; every leaf needs a sharding). Throws
// ValueError listing the leaves missing on either side (unless partial), naming a leaf whose shape
// differs, or a chunk that is missing, truncated, corrupt or fails its checksum.
State restore(const Runtime& rt, const CheckpointItem& item, const State& target, const RestoreOptions& options = {},
              RestoreStats* stats = nullptr);
// The leaves `spec` chooses, placed by it (make_target), under its renamed paths.
State restore(const Runtime& rt, const CheckpointItem& item, const TargetSpec& spec, const RestoreOptions& options = {},
              RestoreStats* stats = nullptr);
// The same for CheckpointItem::open(item_dir).
State restore(const Runtime& rt, const Location& item_dir, const State& target, const RestoreOptions& options = {},
              RestoreStats* stats = nullptr);
State restore(const Runtime& rt, const Location& item_dir, const TargetSpec& spec, const RestoreOptions& options = {},
              RestoreStats* stats = nullptr);

// Reads every chunk of every array, checks sizes, decoding and CRC-32C. One line per fault,
// naming the parameter and the chunk; empty when the item is sound. `checksums` counts the chunks
// whose CRC-32C was compared: an item written without them (Orbax's own) is read and decoded, but
// a flipped byte in it can go unnoticed.
struct VerifyReport {
  std::vector<std::string> faults;
  int64_t arrays = 0;
  int64_t chunks = 0;
  int64_t bytes = 0;
  int64_t checksums = 0;  // chunks whose CRC-32C was compared
  int64_t unchecked = 0;  // chunks read and decoded with no checksum to compare (Orbax's own)
};
VerifyReport verify(const CheckpointItem& item);

}  // namespace tessel
