// Writing OCDBT: values put into data files or inline, a B+tree of them built at commit, the
// manifest written last; and the merge of per-process databases into an item's root.
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>

#include "tessel/checkpoint/detail/io/crc32c.h"
#include "tessel/checkpoint/detail/io/file_io.h"
#include "tessel/checkpoint/detail/io/output.h"
#include "tessel/checkpoint/detail/io/storage.h"
#include "tessel/checkpoint/detail/store/ocdbt.h"
#include "tessel/checkpoint/detail/store/ocdbt_format.h"
#include "tessel/core/error.h"

namespace tessel::detail {
namespace fs = std::filesystem;
using namespace ocdbt_format;

namespace {

class Writer {
 public:
  void byte(uint8_t b) { out_.push_back(static_cast<std::byte>(b)); }
  void varint(uint64_t v) {
    while (v >= 0x80) {
      byte(static_cast<uint8_t>(v | 0x80));
      v >>= 7;
    }
    byte(static_cast<uint8_t>(v));
  }
  void le(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) byte(static_cast<uint8_t>(v >> (8 * i)));
  }
  void bytes(std::string_view s) {
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out_.insert(out_.end(), p, p + s.size());
  }
  std::vector<std::byte>& out() { return out_; }

 private:
  std::vector<std::byte> out_;
};

std::vector<std::byte> seal_envelope(uint32_t magic, const std::vector<std::byte>& body, bool zstd) {
  Writer w;
  for (int shift = 24; shift >= 0; shift -= 8) w.byte(static_cast<uint8_t>(magic >> shift));
  w.le(0, 8);  // length, patched below
  w.varint(0);
  w.varint(zstd ? 1 : 0);
  std::vector<std::byte>& out = w.out();
  if (zstd) {
    std::vector<std::byte> packed(ZSTD_compressBound(body.size()));
    const size_t n = ZSTD_compress(packed.data(), packed.size(), body.data(), body.size(), 0);
    if (ZSTD_isError(n)) throw ValueError(std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
    out.insert(out.end(), packed.begin(), packed.begin() + static_cast<ptrdiff_t>(n));
  } else {
    out.insert(out.end(), body.begin(), body.end());
  }
  const uint64_t length = out.size() + 4;
  for (int i = 0; i < 8; ++i) out[4 + static_cast<size_t>(i)] = static_cast<std::byte>(length >> (8 * i));
  const uint32_t crc = detail::crc32c(out);
  w.le(crc, 4);
  return std::move(out);
}

size_t common_prefix(std::string_view a, std::string_view b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// A data file as a table lists it: base + relative is its path below the database directory.
struct FileRef {
  std::string base, relative;
  auto operator<=>(const FileRef&) const = default;
};

// The table (3.3) of `files`, which must be sorted and distinct, as TensorStore writes it: a
// path's shared prefix with the previous one reaches into the relative part only when both have
// the same base.
void write_table(Writer& w, const std::vector<FileRef>& files) {
  w.varint(files.size());
  std::vector<std::string> paths;
  for (const auto& f : files) paths.push_back(f.base + f.relative);
  std::vector<size_t> prefix(files.size(), 0);
  for (size_t i = 1; i < files.size(); ++i) {
    size_t n = common_prefix(paths[i - 1], paths[i]);
    if (files[i].base != files[i - 1].base) n = std::min({n, files[i].base.size(), files[i - 1].base.size()});
    prefix[i] = n;
    w.varint(n);
  }
  for (size_t i = 0; i < files.size(); ++i) w.varint(paths[i].size() - prefix[i]);
  for (size_t i = 0; i < files.size(); ++i) w.varint(files[i].base.size());
  for (size_t i = 0; i < files.size(); ++i) w.bytes(std::string_view(paths[i]).substr(prefix[i]));
}

std::string random_file_name() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[40];
  std::snprintf(buf, sizeof buf, "d/%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return buf;
}

// A node's key columns (3.6): prefix lengths against the previous key, suffix lengths, for an
// interior node each child's subtree common prefix, then the suffix bytes.
void write_keys(Writer& w, const std::vector<std::string_view>& keys, const std::vector<size_t>* subtree_prefix) {
  std::vector<size_t> shared(keys.size(), 0);
  for (size_t i = 1; i < keys.size(); ++i) {
    shared[i] = common_prefix(keys[i - 1], keys[i]);
    w.varint(shared[i]);
  }
  for (size_t i = 0; i < keys.size(); ++i) w.varint(keys[i].size() - shared[i]);
  if (subtree_prefix) {
    for (size_t p : *subtree_prefix) w.varint(p);
  }
  for (size_t i = 0; i < keys.size(); ++i) w.bytes(keys[i].substr(shared[i]));
}

}  // namespace

struct OcdbtWriter::Impl {
  std::shared_ptr<OutputDir> out;
  const Location& dir() const { return out->location(); }
  OcdbtWriteOptions options;
  struct Value {
    std::string key;
    int file = -1;  // index into `files`; -1: inline
    std::string bytes;
    uint64_t offset = 0, length = 0;
  };
  std::mutex mu;  // guards everything below while puts run in parallel
  std::vector<Value> values;
  std::vector<FileRef> files;  // every data file a value lies in
  std::map<FileRef, int> file_ids;
  // The data files this writer fills. A put takes an idle one for the time of its write: writes
  // to one file serialize on its inode lock, so parallel puts need files of their own.
  struct DataFile {
    std::shared_ptr<OutputFile> file;
    int id = 0;  // in `files`
    uint64_t filled = 0;
  };
  std::vector<DataFile> written;
  std::vector<size_t> idle;  // into `written`
  bool committed = false;

  int file_id(FileRef ref) {
    auto [it, fresh] = file_ids.emplace(ref, static_cast<int>(files.size()));
    if (fresh) files.push_back(std::move(ref));
    return it->second;
  }

  void check_open(std::string_view key) const {
    if (committed) throw ValueError("the OCDBT database in '" + dir().string() + "' is already committed");
    if (key.size() > 65535) throw ValueError("OCDBT key of " + std::to_string(key.size()) + " bytes (at most 65535)");
  }

  // A node written: what its parent records.
  struct Ref {
    std::string first, last;  // full keys
    size_t prefix = 0;        // bytes of `first` the node's own keys leave out
    uint64_t offset = 0, length = 0;
    uint64_t num_keys = 0, tree_bytes = 0, indirect_bytes = 0;
  };
  std::string node_file_name;
  std::vector<std::byte> node_data;

  Ref add_node(std::vector<std::byte> body, std::string first, std::string last, size_t prefix, uint64_t keys,
               uint64_t tree_bytes_below, uint64_t indirect) {
    const std::vector<std::byte> blob = seal_envelope(kBtreeNodeMagic, body, options.zstd);
    Ref r{std::move(first), std::move(last), prefix, node_data.size(), blob.size(), keys, 0, indirect};
    r.tree_bytes = tree_bytes_below + blob.size();
    node_data.insert(node_data.end(), blob.begin(), blob.end());
    return r;
  }

  Ref leaf(size_t begin, size_t end, bool root) {
    const std::string& first = values[begin].key;
    const std::string& last = values[end - 1].key;
    const size_t prefix = root ? 0 : common_prefix(first, last);
    // The node's own table: the files its values lie in, sorted, each once.
    std::vector<int> used;
    uint64_t indirect_bytes = 0;
    for (size_t i = begin; i < end; ++i) {
      if (values[i].file < 0) continue;
      used.push_back(values[i].file);
      indirect_bytes += values[i].length;
    }
    std::sort(used.begin(), used.end(), [&](int a, int b) { return files[static_cast<size_t>(a)] < files[static_cast<size_t>(b)]; });
    used.erase(std::unique(used.begin(), used.end()), used.end());
    std::vector<FileRef> table;
    std::map<int, uint64_t> local;
    for (int f : used) {
      local[f] = table.size();
      table.push_back(files[static_cast<size_t>(f)]);
    }
    Writer w;
    w.byte(0);
    write_table(w, table);
    w.varint(end - begin);
    std::vector<std::string_view> keys;
    for (size_t i = begin; i < end; ++i) keys.push_back(std::string_view(values[i].key).substr(prefix));
    write_keys(w, keys, nullptr);
    for (size_t i = begin; i < end; ++i) w.varint(values[i].length);
    for (size_t i = begin; i < end; ++i) w.byte(values[i].file < 0 ? 0 : 1);
    for (size_t i = begin; i < end; ++i) {
      if (values[i].file >= 0) w.varint(local[values[i].file]);
    }
    for (size_t i = begin; i < end; ++i) {
      if (values[i].file >= 0) w.varint(values[i].offset);
    }
    for (size_t i = begin; i < end; ++i) {
      if (values[i].file < 0) w.bytes(values[i].bytes);
    }
    return add_node(std::move(w.out()), first, last, prefix, end - begin, 0, indirect_bytes);
  }

  Ref interior(const std::vector<Ref>& children, size_t begin, size_t end, bool root, int height) {
    const std::string& first = children[begin].first;
    const std::string& last = children[end - 1].last;
    const size_t prefix = root ? 0 : common_prefix(first, last);
    Writer w;
    w.byte(static_cast<uint8_t>(height));
    write_table(w, {{"", node_file_name}});
    w.varint(end - begin);
    std::vector<std::string_view> child_keys;
    std::vector<size_t> subtree_prefix;
    for (size_t i = begin; i < end; ++i) {
      child_keys.push_back(std::string_view(children[i].first).substr(prefix));
      subtree_prefix.push_back(children[i].prefix - prefix);
    }
    write_keys(w, child_keys, &subtree_prefix);
    uint64_t keys = 0, tree = 0, indirect = 0;
    for (size_t i = begin; i < end; ++i) w.varint(0);
    for (size_t i = begin; i < end; ++i) w.varint(children[i].offset);
    for (size_t i = begin; i < end; ++i) w.varint(children[i].length);
    for (size_t i = begin; i < end; ++i) w.varint(children[i].num_keys);
    for (size_t i = begin; i < end; ++i) w.varint(children[i].tree_bytes);
    for (size_t i = begin; i < end; ++i) w.varint(children[i].indirect_bytes);
    for (size_t i = begin; i < end; ++i) {
      keys += children[i].num_keys;
      tree += children[i].tree_bytes;
      indirect += children[i].indirect_bytes;
    }
    return add_node(std::move(w.out()), first, last, prefix, keys, tree, indirect);
  }
};

OcdbtWriter::OcdbtWriter(const Location& dir, OcdbtWriteOptions options) : impl_(std::make_unique<Impl>()) {
  if (options.max_node_entries < 2) throw ValueError("OCDBT nodes need room for at least 2 entries");
  if (options.max_inline_value_bytes > kMaxInlineValue) throw ValueError("inline OCDBT values are limited to 1 MiB");
  if (options.target_data_file_bytes < 1) throw ValueError("OCDBT data files need a positive target size");
  impl_->options = options;
  if (dir.is_local()) {
    std::error_code ec;
    fs::create_directories(dir.local(), ec);
    if (ec) throw IoError("cannot create '" + dir.string() + "': " + ec.message());
  }
  impl_->out = OutputDir::at(dir, options.durable);
  if (impl_->out->exists("manifest.ocdbt")) throw IoError("'" + dir.string() + "' already holds an OCDBT database");
}

OcdbtWriter::~OcdbtWriter() = default;

void OcdbtWriter::put(std::string key, std::string_view value) {
  put(std::move(key), std::span<const std::byte>(reinterpret_cast<const std::byte*>(value.data()), value.size()));
}

void OcdbtWriter::put(std::string key, std::span<const std::byte> value) {
  Impl& m = *impl_;
  std::shared_ptr<OutputFile> file;
  uint64_t offset = 0, gap = 0;
  size_t slot = 0;
  {
    std::lock_guard lock(m.mu);
    m.check_open(key);
    if (value.size() <= m.options.max_inline_value_bytes) {
      m.values.push_back({std::move(key), -1, std::string(reinterpret_cast<const char*>(value.data()), value.size()), 0,
                          value.size()});
      return;
    }
    // Values of 1 MiB and more start on a 4 KiB boundary (the gap a hole in the file), so that a
    // restore can map them as device buffers (File::map); smaller ones are copied anyway.
    auto start_of = [&](uint64_t filled) {
      return value.size() < (uint64_t{1} << 20) ? filled : (filled + 4095) / 4096 * 4096;
    };
    // An idle data file with room (a value is never split), else a new one.
    auto fits = [&](size_t i) {
      const uint64_t filled = m.written[i].filled;
      return filled == 0 || start_of(filled) + value.size() <= m.options.target_data_file_bytes;
    };
    auto it = std::find_if(m.idle.begin(), m.idle.end(), fits);
    if (it != m.idle.end()) {
      slot = *it;
      m.idle.erase(it);
    } else {
      const std::string name = random_file_name();
      slot = m.written.size();
      std::shared_ptr<OutputFile> created = m.out->create(name);
      m.written.push_back({std::move(created), m.file_id({"", name}), 0});
    }
    Impl::DataFile& f = m.written[slot];
    file = f.file;
    offset = start_of(f.filled);
    gap = offset - f.filled;
    f.filled = offset + value.size();
    m.values.push_back({std::move(key), f.id, {}, offset, value.size()});
  }
  // Outside the lock: each writer fills its own file (a local one starts its writeback).
  if (gap > 0) file->skip(static_cast<int64_t>(offset - gap), static_cast<int64_t>(gap));
  file->write_at(static_cast<int64_t>(offset), value);
  std::lock_guard lock(m.mu);
  m.idle.push_back(slot);
}

void OcdbtWriter::copy_from(const OcdbtDatabase& db, const std::string& subdir) {
  Impl& m = *impl_;
  if (subdir.empty() || subdir.find('/') != std::string::npos || subdir == "." || subdir == "..") {
    throw ValueError("'" + subdir + "' is not a directory name beside the database's own files");
  }
  std::lock_guard lock(m.mu);
  for (const OcdbtEntry& e : db.entries()) {
    m.check_open(e.key);
    if (e.is_inline) {
      m.values.push_back({e.key, -1, e.value, 0, e.value.size()});
    } else {
      m.values.push_back({e.key, m.file_id({subdir + "/", e.file}), {}, e.offset, e.length});
    }
  }
}

void OcdbtWriter::commit() {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  if (m.committed) throw ValueError("the OCDBT database in '" + m.dir().string() + "' is already committed");
  std::stable_sort(m.values.begin(), m.values.end(), [](const auto& a, const auto& b) { return a.key < b.key; });
  for (size_t i = 1; i < m.values.size(); ++i) {
    if (m.values[i].key == m.values[i - 1].key) throw ValueError("OCDBT key '" + m.values[i].key + "' put twice");
  }
  for (const auto& f : m.written) f.file->finish();
  m.node_file_name = random_file_name();
  OcdbtVersion version;
  version.generation = 1;
  version.commit_time_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  const size_t fan = m.options.max_node_entries;
  if (!m.values.empty()) {
    std::vector<Impl::Ref> level;
    const size_t n = m.values.size();
    for (size_t b = 0; b < n; b += fan) level.push_back(m.leaf(b, std::min(n, b + fan), n <= fan));
    int height = 0;
    while (level.size() > 1) {
      ++height;
      std::vector<Impl::Ref> up;
      for (size_t b = 0; b < level.size(); b += fan) {
        up.push_back(m.interior(level, b, std::min(level.size(), b + fan), level.size() <= fan, height));
      }
      level = std::move(up);
    }
    const Impl::Ref& root = level.front();
    version.root_height = height;
    version.root_file = m.node_file_name;
    version.root_offset = root.offset;
    version.root_length = root.length;
    version.num_keys = root.num_keys;
    version.num_tree_bytes = root.tree_bytes;
    version.num_indirect_value_bytes = root.indirect_bytes;
    std::unique_ptr<OutputFile> f = m.out->create(m.node_file_name);
    f->write_at(0, m.node_data);
    f->finish();
  } else {
    version.root_offset = version.root_length = kMissing;  // an empty tree
  }
  // The manifest: Orbax's config, one file table, one inline version, no version nodes.
  Writer w;
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  for (int i = 0; i < 2; ++i) w.le(rng(), 8);  // uuid
  w.byte(0);
  w.varint(m.options.max_inline_value_bytes);
  w.varint(100000000);
  w.byte(4);
  w.varint(m.options.zstd ? 1 : 0);
  if (m.options.zstd) w.le(0, 4);
  write_table(w, {{"", version.root_file}});  // an empty tree refers to the empty path
  w.varint(1);
  w.varint(version.generation);
  w.byte(static_cast<uint8_t>(version.root_height));
  w.varint(0);
  w.varint(version.root_offset);
  w.varint(version.root_length);
  w.varint(version.num_keys);
  w.varint(version.num_tree_bytes);
  w.varint(version.num_indirect_value_bytes);
  w.le(version.commit_time_ns, 8);
  w.varint(0);
  const std::vector<std::byte> blob = seal_envelope(kManifestMagic, w.out(), m.options.zstd);
  const std::string_view manifest(reinterpret_cast<const char*>(blob.data()), blob.size());
  if (m.dir().is_local()) {
    m.out->sync();
    const fs::path tmp = m.dir().local() / "manifest.ocdbt.tmp";
    detail::write_file(tmp, manifest, m.options.durable);
    std::error_code ec;
    fs::rename(tmp, m.dir().local() / "manifest.ocdbt", ec);
    if (ec) throw IoError("cannot rename '" + tmp.string() + "' to manifest.ocdbt: " + ec.message());
    if (m.options.durable) detail::sync_directory(m.dir().local());
  } else {
    m.out->write("manifest.ocdbt", manifest);  // an object appears whole
  }
  m.committed = true;
}

void merge_ocdbt(const Location& root, const std::vector<std::string>& subdirs, OcdbtWriteOptions options) {
  OcdbtWriter w(root, options);
  for (const auto& sub : subdirs) w.copy_from(OcdbtDatabase::open(root / sub), sub);
  w.commit();
}

}  // namespace tessel::detail
