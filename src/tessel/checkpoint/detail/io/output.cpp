#include "tessel/checkpoint/detail/io/output.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "tessel/checkpoint/detail/io/file_io.h"
#include "tessel/checkpoint/detail/io/object_store.h"
#include "tessel/checkpoint/detail/io/storage.h"
#include "tessel/core/error.h"

namespace tessel::detail {
namespace fs = std::filesystem;
namespace {

class LocalFile final : public OutputFile {
 public:
  LocalFile(File file, bool durable) : file_(std::move(file)), durable_(durable) {
    if (durable_) file_.enable_direct_writes();  // the bytes go to the disk now anyway (see File)
  }
  void write_at(int64_t offset, std::span<const std::byte> bytes) override {
    file_.write_at(offset, bytes);
    if (durable_) file_.start_writeback(offset, static_cast<int64_t>(bytes.size()));
  }
  void skip(int64_t, int64_t) override {}
  void finish() override {
    if (durable_) file_.sync();
    file_.close();
  }

 private:
  File file_;
  bool durable_;
};

class LocalDir final : public OutputDir {
 public:
  LocalDir(const Location& dir, bool durable) : OutputDir(dir, durable) {
    std::error_code ec;
    if (!fs::is_directory(fs::symlink_status(dir.local(), ec)))
      throw IoError("'" + dir.string() + "' is not a directory to write into");
  }
  std::unique_ptr<OutputFile> create(std::string_view relative) override {
    const fs::path path = nested_path(dir_.local(), relative, "stored name");
    const fs::path parent = path.parent_path();
    {
      std::lock_guard lock(mu_);
      if (parent != dir_.local() && !dirs_.contains(parent)) {
        std::error_code ec;
        fs::create_directories(parent, ec);
        if (ec) throw IoError("cannot create '" + parent.string() + "': " + ec.message());
        for (fs::path d = parent; d != dir_.local() && d.has_relative_path(); d = d.parent_path()) dirs_.insert(d);
      }
    }
    return std::make_unique<LocalFile>(File::create(path), durable_);
  }
  std::unique_ptr<OutputFile> open_existing(std::string_view relative) override {
    return std::make_unique<LocalFile>(File::open_write(nested_path(dir_.local(), relative, "stored name")), durable_);
  }
  bool exists(std::string_view relative) const override {
    std::error_code ec;
    return fs::exists(fs::symlink_status(dir_.local() / std::string(relative), ec));
  }
  void sync() override {
    if (!durable_) return;
    std::lock_guard lock(mu_);
    for (const fs::path& d : dirs_) sync_directory(d);
    sync_directory(dir_.local());
  }

 private:
  mutable std::mutex mu_;
  std::set<fs::path> dirs_;
};

// An object uploaded in parts as they fill: one PUT when it fits one part, else an upload in
// parts started at the first full part.
class BucketFile final : public OutputFile {
 public:
  BucketFile(std::shared_ptr<const ObjectStore> client, Location loc)
      : client_(std::move(client)), loc_(std::move(loc)) {}

  void write_at(int64_t offset, std::span<const std::byte> bytes) override {
    while (!bytes.empty()) {
      const int64_t index = offset / OutputDir::kPartBytes;
      const int64_t within = offset - index * OutputDir::kPartBytes;
      const size_t n = static_cast<size_t>(std::min<int64_t>(OutputDir::kPartBytes - within, static_cast<int64_t>(bytes.size())));
      std::byte* at = nullptr;
      {
        std::lock_guard lock(mu_);
        at = part(index).bytes.data() + within;
      }
      std::memcpy(at, bytes.data(), n);  // disjoint ranges: no lock needed for the copy
      add(index, offset + static_cast<int64_t>(n), static_cast<int64_t>(n));
      offset += static_cast<int64_t>(n);
      bytes = bytes.subspan(n);
    }
  }

  void skip(int64_t offset, int64_t size) override {
    while (size > 0) {
      const int64_t index = offset / OutputDir::kPartBytes;
      const int64_t n = std::min(OutputDir::kPartBytes - (offset - index * OutputDir::kPartBytes), size);
      {
        std::lock_guard lock(mu_);
        (void)part(index);
      }
      add(index, offset + n, n);
      offset += n;
      size -= n;
    }
  }

  void finish() override {
    std::lock_guard lock(mu_);
    if (finished_) return;
    if (!upload_ && end_ <= OutputDir::kPartBytes) {
      std::vector<std::byte> whole(static_cast<size_t>(end_));
      if (auto it = parts_.find(0); it != parts_.end()) std::memcpy(whole.data(), it->second.bytes.data(), whole.size());
      client_->put(loc_.bucket(), loc_.key(), whole);
      finished_ = true;
      return;
    }
    start_upload();
    const int64_t count = (end_ - 1) / OutputDir::kPartBytes + 1;
    if (count > client_->max_parts())
      throw IoError(fmt::format("{}: more than the store's {} parts", loc_.string(), client_->max_parts()));
    for (int64_t i = 0; i < count; ++i) {
      if (uploaded_.contains(i)) continue;
      const int64_t size = std::min(OutputDir::kPartBytes, end_ - i * OutputDir::kPartBytes);
      std::vector<std::byte> bytes = take(i);
      bytes.resize(static_cast<size_t>(size));  // a part never written is zeros
      uploaded_.insert(i);
      upload_->put_part(i, std::move(bytes));
    }
    upload_->complete(count);
    finished_ = true;
  }

 private:
  struct Part {
    std::vector<std::byte> bytes;
    int64_t filled = 0;
  };
  // Under mu_.
  Part& part(int64_t index) {
    if (finished_) throw IoError(loc_.string() + ": written after it was finished");
    if (uploaded_.contains(index))
      throw IoError(fmt::format("{}: part {} written again after it was uploaded", loc_.string(), index + 1));
    Part& p = parts_[index];
    if (p.bytes.empty()) p.bytes.assign(static_cast<size_t>(OutputDir::kPartBytes), std::byte{0});
    return p;
  }
  std::vector<std::byte> take(int64_t index) {
    auto it = parts_.find(index);
    if (it == parts_.end()) return std::vector<std::byte>(static_cast<size_t>(OutputDir::kPartBytes), std::byte{0});
    std::vector<std::byte> bytes = std::move(it->second.bytes);
    parts_.erase(it);
    return bytes;
  }
  void start_upload() {
    if (!upload_) upload_ = client_->start_upload(loc_.bucket(), loc_.key(), OutputDir::kPartBytes);
  }
  // Counts n bytes of part `index` as written; a full part goes to the upload from this thread.
  void add(int64_t index, int64_t end, int64_t n) {
    std::vector<std::byte> full;
    PartUpload* upload = nullptr;
    {
      std::lock_guard lock(mu_);
      end_ = std::max(end_, end);
      Part& p = parts_.at(index);
      p.filled += n;
      if (p.filled < OutputDir::kPartBytes) return;
      start_upload();
      upload = upload_.get();
      full = take(index);
      uploaded_.insert(index);
    }
    upload->put_part(index, std::move(full));
  }

  std::shared_ptr<const ObjectStore> client_;
  Location loc_;
  std::mutex mu_;
  std::map<int64_t, Part> parts_;  // those not given to the upload
  std::set<int64_t> uploaded_;     // those given
  int64_t end_ = 0;
  std::unique_ptr<PartUpload> upload_;  // destroyed unfinished: discarded
  bool finished_ = false;
};

class BucketDir final : public OutputDir {
 public:
  BucketDir(const Location& dir, bool durable) : OutputDir(dir, durable), client_(ObjectStore::for_location(dir)) {}
  std::unique_ptr<OutputFile> create(std::string_view relative) override {
    return std::make_unique<BucketFile>(client_, nested_location(dir_, relative, "stored name"));
  }
  std::unique_ptr<OutputFile> open_existing(std::string_view relative) override {
    throw IoError("'" + (dir_ / relative).string() + "': an object in a bucket is written by one process");
  }
  bool exists(std::string_view relative) const override {
    return is_file(nested_location(dir_, relative, "stored name"));
  }
  void sync() override {}

 private:
  std::shared_ptr<const ObjectStore> client_;
};

}  // namespace

std::shared_ptr<OutputDir> OutputDir::at(const Location& dir, bool durable) {
  if (dir.is_local()) return std::make_shared<LocalDir>(dir, durable);
  return std::make_shared<BucketDir>(dir, durable);
}

void OutputDir::write(std::string_view relative, std::string_view data) {
  std::unique_ptr<OutputFile> f = create(relative);
  f->write_at(0, std::as_bytes(std::span(data.data(), data.size())));
  f->finish();
}

}  // namespace tessel::detail
