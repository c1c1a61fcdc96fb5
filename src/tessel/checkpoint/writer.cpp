// The cycle every checkpoint writer shares: lay out, create the temporary directory, write blocks
// as they come, let every process finish its part, let the leader complete and rename.
#include "tessel/checkpoint/writer.h"

#include <chrono>
#include <map>
#include <set>

#include "tessel/checkpoint/detail/io/file_io.h"
#include "tessel/checkpoint/detail/io/output.h"
#include "tessel/checkpoint/detail/io/storage.h"
#include "tessel/checkpoint/detail/orbax_layout.h"
#include "tessel/checkpoint/detail/staged.h"
#include "tessel/core/error.h"
#include "tessel/core/path.h"

namespace tessel {
namespace fs = std::filesystem;

namespace detail {

fs::path begin_tmp_dir(const fs::path& final_dir, const char* suffix) {
  fs::path tmp = final_dir;
  tmp += suffix;
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (ec) throw IoError("cannot remove the stale '" + tmp.string() + "': " + ec.message());
  if (!fs::create_directory(tmp, ec) || ec) {
    throw IoError("cannot create '" + tmp.string() + "': " + (ec ? ec.message() : "it exists"));
  }
  return tmp;
}

void commit_tmp_dir(const fs::path& tmp, const fs::path& final_dir, bool durable, bool commit_file) {
  if (commit_file) write_file(tmp / kCommitFile, "Checkpoint commit was successful to " + final_dir.string(), durable);
  if (durable) sync_directory(tmp);
  std::error_code ec;
  if (fs::exists(final_dir, ec)) throw IoError("cannot commit '" + final_dir.string() + "': it already exists");
  fs::rename(tmp, final_dir, ec);
  if (ec) throw IoError("cannot rename '" + tmp.string() + "' to '" + final_dir.string() + "': " + ec.message());
  if (durable) sync_directory(final_dir.parent_path().empty() ? fs::path(".") : final_dir.parent_path());
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace detail

StateWriter::StateWriter(Location dir, std::string_view tmp_suffix, const State& abstract, ProcessGroup* group,
                         bool durable, bool fixed_shardings)
    : dir_(dir.is_local() ? Location(local_path(dir.local().string(), "checkpoint directory")) : std::move(dir)),
      layout_(abstract),
      durable_(durable),
      fixed_shardings_(fixed_shardings) {
  tmp_suffix_ = tmp_suffix;
  tmp_ = dir_.is_local() ? Location(fs::path(dir_.local()) += tmp_suffix_) : dir_;
  if (!group) own_group_ = std::make_unique<SingleProcessGroup>();
  group_ = group ? group : own_group_.get();
  for (const auto& [path, v] : layout_) {
    if (fixed_shardings_ && !v.sharding())
      throw ValueError("'" + path + "' has no sharding: a checkpoint records each leaf's sharding");
    index_.emplace(path, paths_.size());
    paths_.push_back(path);
  }
  written_.assign(paths_.size(), false);
  blocks_seen_.resize(paths_.size());
  elements_written_.assign(paths_.size(), 0);
}

namespace {

// What a save finds at its destination: nothing, a committed checkpoint, or (in a bucket) the
// objects of a save that never committed, removed as a stale temporary directory is.
void clear_destination(const Location& dir, const std::string& tmp_suffix) {
  if (dir.is_local()) {
    std::error_code ec;
    if (fs::exists(dir.local(), ec)) throw IoError("cannot save to '" + dir.string() + "': it already exists");
    detail::begin_tmp_dir(dir.local(), tmp_suffix.c_str());
    return;
  }
  detail::refuse_bucket_root(dir);
  if (detail::is_file(dir / detail::kCommitFile) || detail::is_file(dir))
    throw IoError("cannot save to '" + dir.string() + "': it already exists");
  if (detail::is_directory(dir)) detail::remove_all(dir);
}

}  // namespace

StateWriter::~StateWriter() {
  out_.reset();
  if (started_ && !committed_ && group_->is_leader()) {
    // Best effort: a crash instead leaves it for the next cleanup (or, in a bucket, uncommitted).
    try {
      detail::remove_all(tmp_);
    } catch (const Error&) {
    }
  }
}

void StateWriter::start() {
  const std::string where = "saving '" + dir_.string() + "'";
  run_together(*group_, where, [&] {
    if (!group_->is_leader()) return;
    clear_destination(dir_, tmp_suffix_);
    started_ = true;
    out_ = detail::OutputDir::at(tmp_, durable_);
    begin_leader();
  });
  started_ = true;
  run_together(*group_, where, [&] {
    if (!out_) out_ = detail::OutputDir::at(tmp_, durable_);
    begin_process();
  });
}

void StateWriter::write(const std::string& path, const Array& array) {
  auto it = index_.find(path);
  if (it == index_.end())
    throw ValueError("'" + path + "' is not one of the " + std::string(leaf_noun()) + " this writer laid out");
  const Variable& v = layout_.at(path);
  if (array.shape() != v.shape() || array.dtype() != v.dtype() ||
      (fixed_shardings_ && !(array.sharding() == *v.sharding()))) {
    throw ValueError("'" + path + "' is " + type_string(array.dtype(), array.shape()) + " " + array.sharding().to_string() +
                     ", laid out as " + type_string(v.dtype(), v.shape()) +
                     (v.sharding() ? " " + v.sharding()->to_string() : std::string()));
  }
  std::vector<HostBlock> blocks;
  for (const detail::BlockBytes& b : detail::blocks_to_write(array)) blocks.push_back({b.box, b.bytes});
  write(path, blocks);
}

void StateWriter::write(const std::string& path, std::span<const HostBlock> blocks) {
  auto it = index_.find(path);
  if (it == index_.end())
    throw ValueError("'" + path + "' is not one of the " + std::string(leaf_noun()) + " this writer laid out");
  const size_t leaf = it->second;
  const Variable& v = layout_.at(path);
  const std::optional<Shape> grid = block_grid(leaf);
  std::map<std::vector<int64_t>, Box> distinct;  // the sharding's non-empty blocks by start
  if (v.sharding() && !grid) {
    for (const ShardPlacement& p : v.sharding()->distinct_shards(v.shape()))
      if (!p.box.empty()) distinct.emplace(std::vector<int64_t>(p.box.starts().begin(), p.box.starts().end()), p.box);
  }
  auto on_grid = [&](const Box& box) {
    for (size_t d = 0; d < box.rank(); ++d) {
      const int64_t step = (*grid)[d];
      if (step < 1 || box.start(d) % step != 0 || box.stop(d) != std::min(box.start(d) + step, v.shape()[d])) return false;
    }
    return true;
  };
  std::set<std::vector<int64_t>>& seen = blocks_seen_[leaf];
  std::vector<HostBlock> kept;  // empty blocks hold nothing to write
  const Box full = Box::full(v.shape());
  for (const HostBlock& b : blocks) {
    if (b.box.rank() == v.shape().rank() && b.box.empty() && b.bytes.empty()) continue;
    const std::vector<int64_t> start(b.box.starts().begin(), b.box.starts().end());
    const bool fits = b.box.rank() == v.shape().rank() && full.intersect(b.box) == b.box &&
                      (grid ? on_grid(b.box) : !v.sharding() || (distinct.contains(start) && distinct.at(start) == b.box));
    if (!fits) {
      throw ValueError("'" + path + "': block " + b.box.to_string() + " is not one of the blocks of " +
                       (grid ? "the grid " + grid->to_string()
                             : v.sharding() ? v.sharding()->to_string() : std::string("the tensor")) +
                       " for shape " + v.shape().to_string());
    }
    if (seen.contains(start)) throw ValueError("'" + path + "': block " + b.box.to_string() + " is given twice");
    const int64_t expect = b.box.volume() * static_cast<int64_t>(item_size(v.dtype()));
    if (static_cast<int64_t>(b.bytes.size()) != expect) {
      throw ValueError("'" + path + "': block " + b.box.to_string() + " has " + std::to_string(b.bytes.size()) +
                       " bytes, not the " + std::to_string(expect) + " of " + std::string(name(v.dtype())));
    }
    kept.push_back(b);
  }
  write_blocks(leaf, kept);
  for (const HostBlock& b : kept) {
    seen.emplace(b.box.starts().begin(), b.box.starts().end());
    elements_written_[leaf] += b.box.volume();
  }
  written_[leaf] = true;
}

void StateWriter::commit() {
  if (committed_) throw ValueError("'" + dir_.string() + "' is committed already");
  const std::string where = "saving '" + dir_.string() + "'";
  std::vector<std::string> parts = gather_together(*group_, where, [&] {
    for (size_t i = 0; i < written_.size(); ++i) {
      if (!written_[i]) throw ValueError("'" + paths_[i] + "' was never written");
      // Blocks do not overlap (the sharding's, or a grid's); boxes given freely could, but a
      // shortfall is a leaf left partly unwritten either way.
      const int64_t want = layout_.at(paths_[i]).shape().num_elements();
      if (group_->count() == 1 && elements_written_[i] < want)
        throw ValueError("'" + paths_[i] + "': " + std::to_string(elements_written_[i]) + " of its " +
                         std::to_string(want) + " elements were written");
    }
    return finish_process();
  });
  run_together(*group_, where, [&] {
    if (!group_->is_leader()) return;
    finish(parts);
    if (dir_.is_local()) {
      detail::commit_tmp_dir(tmp_.local(), dir_.local(), durable_, /*commit_file=*/false);
    } else {
      out_->write(detail::kCommitFile, "Checkpoint commit was successful to " + dir_.string());
    }
  });
  committed_ = true;
}

}  // namespace tessel
