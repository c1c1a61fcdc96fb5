// Internal (not installed): the pieces save() and the CheckpointManager share.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "tessel/checkpoint/checkpointer.h"

namespace tessel::detail {

inline constexpr const char* kTmpSuffix = ".orbax-checkpoint-tmp";
inline constexpr const char* kCommitFile = "commit_success.txt";
inline constexpr const char* kCheckpointMetadata = "_CHECKPOINT_METADATA";
inline constexpr const char* kPyTreeHandler =
    "orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler";
inline constexpr const char* kJsonHandler =
    "orbax.checkpoint._src.handlers.json_checkpoint_handler.JsonCheckpointHandler";

// Writes the arrays and metadata of a PyTree item into `item_dir`, which must exist and be empty.
void write_item(const std::filesystem::path& item_dir, const StagedState& staged, const SaveOptions& options);

// The arrays of `state` as they are, without copies: valid while they live.
StagedState stage_in_place(const State& state);

// `<final>.orbax-checkpoint-tmp`, emptied and created (a stale one is removed first).
std::filesystem::path begin_tmp_dir(const std::filesystem::path& final_dir);
// Writes commit_success.txt into `tmp`, fsyncs it, renames it to `final_dir`, fsyncs the parent.
void commit_tmp_dir(const std::filesystem::path& tmp, const std::filesystem::path& final_dir, bool durable);

int64_t now_ns();

}  // namespace tessel::detail
