// Internal (not installed): the pieces save() and the CheckpointManager share.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tessel/checkpoint/checkpointer.h"
#include "tessel/runtime/process_group.h"

namespace tessel::detail {

inline constexpr const char* kTmpSuffix = ".orbax-checkpoint-tmp";
inline constexpr const char* kCommitFile = "commit_success.txt";
inline constexpr const char* kCheckpointMetadata = "_CHECKPOINT_METADATA";
inline constexpr const char* kPyTreeHandler =
    "orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler";
inline constexpr const char* kJsonHandler =
    "orbax.checkpoint._src.handlers.json_checkpoint_handler.JsonCheckpointHandler";

// A PyTree item is written by every process of the state's runtime in two parts, into an
// `item_dir` the leader (process 0) created empty:
// 1. each process writes its blocks (replica 0 of the blocks its devices hold; the leader also each
//    array's zarr metadata) and returns the chunks' CRC-32Cs, as JSON;
std::string write_item_blocks(const std::filesystem::path& item_dir, const StagedState& staged,
                              const SaveOptions& options, int process);
// 2. once all have, the leader merges their OCDBT databases and writes the item's metadata, with
//    every process's checksums (by process index).
void finish_item(const std::filesystem::path& item_dir, const StagedState& staged, const SaveOptions& options,
                 const std::vector<std::string>& crcs);
// The processes that save `staged` together: its runtime's (one process for an empty state).
ProcessGroup& processes_of(const StagedState& staged);

// The arrays of `state` as they are, without copies: valid while they live.
StagedState stage_in_place(const State& state);

// `<final>.orbax-checkpoint-tmp`, emptied and created (a stale one is removed first).
std::filesystem::path begin_tmp_dir(const std::filesystem::path& final_dir);
// Writes commit_success.txt into `tmp`, fsyncs it, renames it to `final_dir`, fsyncs the parent.
void commit_tmp_dir(const std::filesystem::path& tmp, const std::filesystem::path& final_dir, bool durable);

int64_t now_ns();

}  // namespace tessel::detail
