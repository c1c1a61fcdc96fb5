// Internal (not installed): Orbax's names for what commits a checkpoint, and the temporary
// directory a save writes into before the rename that makes it appear.
#pragma once

#include <cstdint>
#include <filesystem>

namespace tessel::detail {

inline constexpr const char* kTmpSuffix = ".orbax-checkpoint-tmp";
inline constexpr const char* kCommitFile = "commit_success.txt";
inline constexpr const char* kCheckpointMetadata = "_CHECKPOINT_METADATA";
inline constexpr const char* kPyTreeHandler =
    "orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler";
inline constexpr const char* kJsonHandler =
    "orbax.checkpoint._src.handlers.json_checkpoint_handler.JsonCheckpointHandler";

// `<final><suffix>`, emptied and created (a stale one is removed first).
std::filesystem::path begin_tmp_dir(const std::filesystem::path& final_dir, const char* suffix = kTmpSuffix);
// Renames `tmp` to `final_dir` (which must not exist) and fsyncs the parent; with `commit_file`,
// writes Orbax's commit_success.txt into `tmp` first, and fsyncs `tmp` when durable.
void commit_tmp_dir(const std::filesystem::path& tmp, const std::filesystem::path& final_dir, bool durable,
                    bool commit_file = true);

int64_t now_ns();

}  // namespace tessel::detail
