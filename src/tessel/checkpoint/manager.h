// A directory of checkpoints, one per training step, in Orbax's CheckpointManager layout:
// `<root>/<step>/_CHECKPOINT_METADATA`, the state as the PyTree item `<root>/<step>/default/`,
// and named JSON items beside it (a data iterator's position, say) in `<item>/metadata`.
//
// One manager writes to a root at a time (a lock file, `<root>/.tessel-lock`); opening it removes
// what a crashed save left (`*.orbax-checkpoint-tmp`). The root may be a bucket prefix
// (s3://bucket/run): steps are written in place and committed by `commit_success.txt`, written
// last; opening removes steps without it, and no lock is taken (one writer is the caller's rule). Across processes (MPI), every process opens
// the manager with the runtime; each writes its own blocks and process 0 commits. Steps appear only when complete. After each
// save the oldest steps go beyond max_to_keep, except multiples of keep_period.
//
//   tessel::CheckpointManager ckpt("ckpt/", {.max_to_keep = 3});
//   ckpt.save_async(step, state, {{"data", R"({"position": 4096})"}});   // returns once staged
//   ...
//   tessel::State again = ckpt.restore(rt, *ckpt.latest_step(), eval_shape(model, mesh, rules));
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/items.h"
#include "tessel/runtime/process_group.h"

namespace tessel {

struct CheckpointManagerOptions {
  std::optional<int64_t> max_to_keep;  // keep the newest N steps; none: keep every step
  std::optional<int64_t> keep_period;  // and keep every step divisible by this
  SaveOptions save;
  bool read_only = false;  // no lock, no cleanup; save() is refused
  // The state's PyTree item: Orbax's single-item "default", or a name such as MaxText's "items".
  std::string item_name = "default";
};

// Makes `step_dir` an Orbax CheckpointManager step holding the PyTree items written in it (by
// CheckpointWriter or save): writes its `_CHECKPOINT_METADATA` naming them, durably (in a bucket,
// then the step's commit marker, as Orbax commits a step there). Throws IoError naming the file.
void write_step_metadata(const Location& step_dir, const std::vector<std::string>& pytree_items);

class CheckpointManager {
 public:
  // Creates `root` unless read_only. Throws IoError when another manager holds the lock.
  explicit CheckpointManager(Location root, CheckpointManagerOptions options = {});
  // For a runtime of several processes (MPI): every process constructs its manager at the same
  // point of its program. Process 0 locks and cleans the root and commits each step after every
  // process has written its blocks; an error on one is thrown on all.
  CheckpointManager(const Runtime& rt, Location root, CheckpointManagerOptions options = {});
  ~CheckpointManager();  // waits for a save in flight; its error, if any, goes to stderr
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Saves `state` as step `step`, plus JSON items by name. Throws ValueError if the step exists,
  // an item name is "default" or not a plain name, or an item is not valid JSON.
  void save(int64_t step, const State& state, const std::map<std::string, std::string>& json_items = {});
  // Copies the shards to host staging, returns, and writes in the background. A failure is
  // rethrown by the next call to this manager.
  void save_async(int64_t step, const State& state, const std::map<std::string, std::string>& json_items = {});
  void wait();

  State restore(const Runtime& rt, int64_t step, const State& target, const RestoreOptions& options = {},
                RestoreStats* stats = nullptr);
  std::string restore_json(int64_t step, const std::string& item);

  std::vector<int64_t> all_steps();
  std::optional<int64_t> latest_step();
  Location step_dir(int64_t step) const;
  Location item_dir(int64_t step, const std::string& item = "default") const;
  const Location& root() const { return root_; }

 private:
  void open();            // checks the options; locks and cleans the root (process 0)
  void lock_and_clean();
  void write_step(int64_t step, const StagedState& staged, const std::map<std::string, std::string>& json_items);
  void apply_retention(int64_t just_saved);
  void check_request(int64_t step, const std::map<std::string, std::string>& json_items);
  void surface_error();  // rethrows a finished background failure

  Location root_;
  CheckpointManagerOptions options_;
  std::unique_ptr<ProcessGroup> group_;  // this manager's own: saves may run in the background
  int lock_fd_ = -1;
  std::thread background_;
  std::exception_ptr background_error_;
  std::atomic<bool> background_done_{true};
};

}  // namespace tessel
