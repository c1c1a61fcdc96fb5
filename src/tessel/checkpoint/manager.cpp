#include "tessel/checkpoint/manager.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <iostream>

#include "tessel/checkpoint/detail/io/file_io.h"
#include "tessel/checkpoint/detail/io/output.h"
#include "tessel/checkpoint/detail/io/storage.h"
#include "tessel/checkpoint/detail/orbax_layout.h"
#include "tessel/checkpoint/detail/metadata_writer.h"
#include "tessel/core/error.h"
#include "tessel/core/path.h"
#include "tessel/detail/json_util.h"

namespace tessel {
namespace fs = std::filesystem;

namespace {

constexpr const char* kJsonFile = "metadata";  // Orbax's JsonCheckpointHandler file name

Location checked_root(const Location& root) {
  return root.is_local() ? Location(local_path(root.local().string(), "checkpoint directory")) : root;
}

}  // namespace

CheckpointManager::CheckpointManager(Location root, CheckpointManagerOptions options)
    : root_(checked_root(root)), options_(std::move(options)), group_(std::make_unique<SingleProcessGroup>()) {
  open();
}

CheckpointManager::CheckpointManager(const Runtime& rt, Location root, CheckpointManagerOptions options)
    : root_(checked_root(root)), options_(std::move(options)), group_(rt.new_process_group()) {
  open();
}

void write_step_metadata(const Location& step_dir, const std::vector<std::string>& pytree_items) {
  std::map<std::string, std::string> handlers;
  for (const std::string& item : pytree_items) {
    (void)detail::nested_location(step_dir, item, "item name");
    handlers[item] = detail::kPyTreeHandler;
  }
  const int64_t now = detail::now_ns();
  const std::string metadata = detail::checkpoint_metadata_json(handlers, now, now);
  if (step_dir.is_local()) {
    detail::write_file(step_dir.local() / detail::kCheckpointMetadata, metadata, true);
    detail::sync_directory(step_dir.local());
    return;
  }
  const std::shared_ptr<detail::OutputDir> out = detail::OutputDir::at(step_dir, true);
  out->write(detail::kCheckpointMetadata, metadata);
  out->write(detail::kCommitFile, "Checkpoint commit was successful to " + step_dir.string());  // last: the step is there
}

void CheckpointManager::open() {
  if (options_.max_to_keep && *options_.max_to_keep < 1) throw ValueError("max_to_keep must be at least 1");
  if (options_.keep_period && *options_.keep_period < 1) throw ValueError("keep_period must be at least 1");
  detail::child_path("root", options_.item_name, "item name");
  if (options_.read_only) {
    if (!detail::is_directory(root_)) throw IoError("'" + root_.string() + "' is not a checkpoint directory");
    return;
  }
  run_together(*group_, "opening the checkpoint directory '" + root_.string() + "'", [&] {
    if (group_->is_leader()) lock_and_clean();
  });
}

void CheckpointManager::lock_and_clean() {
  if (!root_.is_local()) {
    // What a crashed save left: steps without their commit marker.
    for (const auto& e : detail::list_directory(root_)) {
      const Location step = root_ / e.name;
      if (e.is_directory && !e.name.empty() && e.name.find_first_not_of("0123456789") == std::string::npos &&
          !detail::is_file(step / detail::kCommitFile))
        detail::remove_all(step);
    }
    return;
  }
  const fs::path& root = root_.local();
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw IoError("cannot create '" + root_.string() + "': " + ec.message());
  const fs::path lock = root / ".tessel-lock";
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) throw IoError("cannot open '" + lock.string() + "': " + std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw IoError("another CheckpointManager is writing to '" + root_.string() + "' (it holds " + lock.string() + ")");
  }
  // What a crashed save or deletion left behind; never visible as a step.
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > std::strlen(detail::kTmpSuffix) && name.ends_with(detail::kTmpSuffix)) {
      fs::remove_all(entry.path(), ec);
      if (ec) throw IoError("cannot remove the leftover '" + entry.path().string() + "': " + ec.message());
    }
  }
}

CheckpointManager::~CheckpointManager() {
  if (background_.joinable()) background_.join();
  if (background_error_) {
    try {
      std::rethrow_exception(background_error_);
    } catch (const std::exception& e) {
      std::cerr << "tessel: a background checkpoint save failed: " << e.what() << "\n";
    }
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

Location CheckpointManager::step_dir(int64_t step) const { return root_ / std::to_string(step); }

Location CheckpointManager::item_dir(int64_t step, const std::string& item) const {
  detail::child_path("step", item, "item name");
  return step_dir(step) / item;
}

void CheckpointManager::surface_error() {
  if (background_.joinable() && background_done_.load()) background_.join();
  if (background_error_) {
    auto e = background_error_;
    background_error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void CheckpointManager::wait() {
  if (background_.joinable()) background_.join();
  surface_error();
}

void CheckpointManager::check_request(int64_t step, const std::map<std::string, std::string>& json_items) {
  if (options_.read_only) throw ValueError("the CheckpointManager for '" + root_.string() + "' is read-only");
  if (step < 0) throw ValueError("a checkpoint step must be non-negative, not " + std::to_string(step));
  const bool there = root_.is_local() ? detail::exists(step_dir(step)) : detail::is_file(step_dir(step) / detail::kCommitFile);
  if (there) throw ValueError("step " + std::to_string(step) + " already exists in '" + root_.string() + "'");
  for (const auto& [name, text] : json_items) {
    if (name == options_.item_name) throw ValueError("the item name '" + name + "' is the state's own");
    detail::child_path("root", name, "item name");
    json_util::parse(text, "item '" + name + "'");
  }
}

void CheckpointManager::write_step(int64_t step, const StagedState& staged,
                                   const std::map<std::string, std::string>& json_items) {
  ProcessGroup& g = *group_;
  if (staged.processes().count() != g.count()) {
    throw ValueError("the state spans " + std::to_string(staged.processes().count()) +
                     " processes, but the CheckpointManager for '" + root_.string() + "' " +
                     std::to_string(g.count()) + ": construct it with the state's runtime");
  }
  const bool durable = options_.save.durable;
  const int64_t init = detail::now_ns();
  const Location final_dir = step_dir(step);
  // A local step is written in a temporary directory and renamed; a bucket's in place.
  const Location tmp = root_.is_local() ? Location(fs::path(final_dir.local()) += detail::kTmpSuffix) : final_dir;
  const std::string& item = options_.item_name;
  const std::string where = "saving step " + std::to_string(step) + " to '" + root_.string() + "'";
  run_together(g, where, [&] {
    if (!g.is_leader()) return;
    if (root_.is_local()) {
      detail::begin_tmp_dir(final_dir.local());
    } else if (detail::is_directory(final_dir)) {
      detail::remove_all(final_dir);  // an unfinished save of this step
    }
  });
  // The state's item: every process writes its blocks, process 0 commits it inside the step's
  // temporary directory once all are durable; a crash before the step's commit leaves no step.
  SaveOptions options = options_.save;
  options.checkpoint_metadata = false;  // the step has it
  CheckpointWriter writer(tmp / item, staged.abstract(), options, &g);
  staged.write_to(writer);
  writer.commit();
  run_together(g, where, [&] {
    if (!g.is_leader()) return;
    std::map<std::string, std::string> handlers{{item, detail::kPyTreeHandler}};
    const std::shared_ptr<detail::OutputDir> out = detail::OutputDir::at(tmp, durable);
    for (const auto& [name, text] : json_items) {
      if (root_.is_local()) {
        const fs::path item_tmp = detail::begin_tmp_dir(tmp.local() / name);
        detail::write_file(item_tmp / kJsonFile, text, durable);
        detail::commit_tmp_dir(item_tmp, tmp.local() / name, durable);
      } else {
        out->write(name + "/" + kJsonFile, text);
      }
      handlers[name] = detail::kJsonHandler;
    }
    out->write(detail::kCheckpointMetadata, detail::checkpoint_metadata_json(handlers, init, detail::now_ns()));
    if (root_.is_local()) {
      detail::commit_tmp_dir(tmp.local(), final_dir.local(), durable);
    } else {
      out->write(detail::kCommitFile, "Checkpoint commit was successful to " + final_dir.string());
    }
    apply_retention(step);
  });
}

void CheckpointManager::apply_retention(int64_t just_saved) {
  if (!options_.max_to_keep) return;
  std::vector<int64_t> steps = list_steps(root_);
  const auto keep = static_cast<size_t>(*options_.max_to_keep);
  if (steps.size() <= keep) return;
  for (size_t i = 0; i + keep < steps.size(); ++i) {
    const int64_t s = steps[i];
    if (s == just_saved || (options_.keep_period && s % *options_.keep_period == 0)) continue;
    if (!root_.is_local()) {
      // The marker first: the step is gone from the listing before its objects are.
      detail::remove_file(step_dir(s) / detail::kCommitFile);
      detail::remove_all(step_dir(s));
      continue;
    }
    // Renamed out of sight first: a crash mid-removal leaves a leftover, not a half step.
    fs::path doomed = step_dir(s).local();
    doomed += detail::kTmpSuffix;
    std::error_code ec;
    fs::rename(step_dir(s).local(), doomed, ec);
    if (ec) throw IoError("cannot remove step " + std::to_string(s) + " from '" + root_.string() + "': " + ec.message());
    fs::remove_all(doomed, ec);
  }
}

void CheckpointManager::save(int64_t step, const State& state, const std::map<std::string, std::string>& json_items) {
  wait();
  check_request(step, json_items);
  // Synchronous: the arrays stay alive for the call, so nothing is copied.
  write_step(step, stage_in_place(state), json_items);
}

void CheckpointManager::save_async(int64_t step, const State& state,
                                   const std::map<std::string, std::string>& json_items) {
  wait();
  check_request(step, json_items);
  auto staged = std::make_shared<StagedState>(stage(state));
  background_done_ = false;
  background_ = std::thread([this, step, staged, json_items] {
    try {
      write_step(step, *staged, json_items);
    } catch (...) {
      background_error_ = std::current_exception();
    }
    background_done_ = true;
  });
}

State CheckpointManager::restore(const Runtime& rt, int64_t step, const State& target, const RestoreOptions& options,
                                 RestoreStats* stats) {
  surface_error();
  const std::vector<int64_t> steps = list_steps(root_);
  if (!std::binary_search(steps.begin(), steps.end(), step)) {
    throw ValueError("no step " + std::to_string(step) + " in '" + root_.string() + "'");
  }
  return tessel::restore(rt, item_dir(step, options_.item_name), target, options, stats);
}

std::string CheckpointManager::restore_json(int64_t step, const std::string& item) {
  surface_error();
  const Location file = item_dir(step, item) / kJsonFile;
  std::optional<std::string> text = detail::read_small(file, int64_t{1} << 30);
  if (!text) {
    throw ValueError("step " + std::to_string(step) + " in '" + root_.string() + "' has no JSON item '" + item + "'");
  }
  json_util::parse(*text, file.string());
  return *text;
}

std::vector<int64_t> CheckpointManager::all_steps() {
  surface_error();
  return list_steps(root_);
}

std::optional<int64_t> CheckpointManager::latest_step() {
  auto steps = all_steps();
  if (steps.empty()) return std::nullopt;
  return steps.back();
}

}  // namespace tessel
