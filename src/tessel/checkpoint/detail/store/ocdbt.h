// Internal (not installed): OCDBT, TensorStore's key-value database inside a directory, where Orbax keeps a checkpoint's
// arrays by default: `manifest.ocdbt` names the newest versions of a B+tree whose nodes and large
// values live in data files (`d/<hex>`, and `ocdbt.process_N/d/<hex>` in a merged root). Small
// values sit inline in the leaves. Every manifest and node is checked (magic, length, CRC-32C,
// exact decoding, increasing keys, heights) before it is trusted, and every data-file path read
// from it is resolved inside the database directory.
//
//   auto db = tessel::detail::OcdbtDatabase::open("ckpt/7/state");        // the latest version
//   for (const auto& e : db.entries()) std::cout << e.key << " " << e.length << "\n";
//   if (const auto* e = db.find("params.w/.zarray")) std::string text = db.read_all(*e);
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/location.h"

namespace tessel::detail {

struct OcdbtConfig {
  std::array<uint8_t, 16> uuid{};
  int manifest_kind = 0;  // 0: one manifest.ocdbt; 1: numbered manifest.<016x> files
  uint64_t max_inline_value_bytes = 1024;
  uint64_t max_decoded_node_bytes = 100000000;
  int version_tree_arity_log2 = 4;
  bool zstd = true;  // how nodes and manifests are compressed
  int zstd_level = 0;
};

// One version of the tree: where its root node is and what lies below it.
struct OcdbtVersion {
  uint64_t generation = 0;
  int root_height = 0;
  std::string root_file;  // relative to the database directory; empty for an empty tree
  std::string root_base;  // the file's base path, carried down to the nodes below
  uint64_t root_offset = 0;
  uint64_t root_length = 0;
  uint64_t num_keys = 0;
  uint64_t num_tree_bytes = 0;
  uint64_t num_indirect_value_bytes = 0;
  uint64_t commit_time_ns = 0;
  bool empty() const { return root_file.empty() && root_offset == UINT64_MAX; }
};

// A key and where its value is: inline bytes, or `length` bytes at `offset` in `file`.
struct OcdbtEntry {
  std::string key;
  bool is_inline = true;
  std::string value;  // inline bytes
  std::string file;   // out of line: the data file, relative to the database directory
  uint64_t offset = 0;
  uint64_t length = 0;  // the value's size either way
};

class OcdbtDatabase {
 public:
  // Reads the manifest and walks the tree of the latest version (or of `generation`), keeping
  // every key and its value's location; values out of line are read on demand. Throws IoError
  // for a missing or unreadable file and ValueError naming the file and what is wrong with it.
  static OcdbtDatabase open(const Location& dir, std::optional<uint64_t> generation = std::nullopt);

  const Location& dir() const { return dir_; }
  const OcdbtConfig& config() const { return config_; }
  const OcdbtVersion& version() const { return version_; }
  // Every generation the manifest lists inline, oldest first (older ones sit in version nodes).
  const std::vector<OcdbtVersion>& inline_versions() const { return inline_versions_; }
  const std::vector<OcdbtEntry>& entries() const { return entries_; }  // sorted by key

  const OcdbtEntry* find(std::string_view key) const;  // nullptr if absent
  // The data file's path, checked to stay inside dir() (no "..", no symlinked directories).
  Location data_file(const OcdbtEntry& entry) const;
  // The whole value; throws IoError for a data file too short for it.
  std::string read_all(const OcdbtEntry& entry) const;

 private:
  Location dir_;
  OcdbtConfig config_;
  OcdbtVersion version_;
  std::vector<OcdbtVersion> inline_versions_;
  std::vector<OcdbtEntry> entries_;
};

// Writes a new single-writer database (one generation) into a directory: values longer than
// max_inline_value_bytes go to data files (`d/<hex>`) as they are put, the rest stay inline;
// commit() builds the B+tree (leaves of at most max_node_entries keys, interior nodes above),
// writes the nodes, fsyncs, and writes `manifest.ocdbt` last, atomically. Until then no manifest
// exists, so a crash leaves no database, not a damaged one. put() may be called from several
// threads at once (large values are written outside the writer's lock); commit() after all.
//
//   tessel::detail::OcdbtWriter w("ckpt/tmp/state/ocdbt.process_0");
//   w.put("params.w/.zarray", zarray_json);
//   w.put("params.w/0.0", chunk_bytes);
//   w.commit();
struct OcdbtWriteOptions {
  uint64_t max_inline_value_bytes = 1024;  // Orbax's setting
  size_t max_node_entries = 4096;
  uint64_t target_data_file_bytes = uint64_t{2} << 30;  // Orbax's ocdbt_target_data_file_size
  bool zstd = true;  // compress nodes and the manifest (zstd level 0, as TensorStore)
  bool durable = true;
};

class OcdbtWriter {
 public:
  // A database in `dir`, local (created if missing) or in a bucket.
  explicit OcdbtWriter(const Location& dir, OcdbtWriteOptions options = {});
  ~OcdbtWriter();
  OcdbtWriter(const OcdbtWriter&) = delete;
  OcdbtWriter& operator=(const OcdbtWriter&) = delete;
  // Throws ValueError for a key given twice (at commit) or longer than 65535 bytes.
  void put(std::string key, std::span<const std::byte> value);
  void put(std::string key, std::string_view value);
  // Every key of `db`, a database in the directory `subdir` beside this one's `d/`: inline values
  // are copied, values out of line stay where they are and are referenced with the base path
  // `subdir/` (how Orbax merges the per-process databases `ocdbt.process_N` into the item's root).
  void copy_from(const OcdbtDatabase& db, const std::string& subdir);
  void commit();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The root database of `root` over the committed databases in root/<subdir> for each of
// `subdirs` (e.g. "ocdbt.process_0"): Orbax's finalize step. Throws ValueError for a key that
// two of them hold.
void merge_ocdbt(const Location& root, const std::vector<std::string>& subdirs, OcdbtWriteOptions options = {});

// The decoders, over bytes that may be anything (the fuzzers' entry points). `what` names the
// source in errors. A manifest of kind 1 (numbered) decodes to its config only.
struct OcdbtManifest {
  OcdbtConfig config;
  std::vector<OcdbtVersion> versions;  // inline, oldest first
  struct VersionNode {                 // a subtree of older versions
    uint64_t latest_generation = 0;
    uint64_t num_generations = 0;
    int height = 0;
    std::string file, base;
    uint64_t offset = 0, length = 0;
  };
  std::vector<VersionNode> version_nodes;
};
OcdbtManifest decode_ocdbt_manifest(std::span<const std::byte> blob, std::string_view what);

struct OcdbtNode {
  int height = 0;
  // Leaf: keys relative to the node's prefix, with their values (file paths resolved).
  std::vector<OcdbtEntry> entries;
  // Interior: children, each with its key (the child's first key, relative to this node), the
  // number of leading key bytes all keys below share, and where the child node is.
  struct Child {
    std::string key;
    size_t common_prefix = 0;
    std::string file, base;
    uint64_t offset = 0, length = 0;
    uint64_t num_keys = 0;
  };
  std::vector<Child> children;
};
// `base` is the base path of the file the node came from: the node's own file ids extend it.
OcdbtNode decode_ocdbt_node(std::span<const std::byte> blob, std::string_view base, uint64_t max_decoded_bytes,
                            std::string_view what);

}  // namespace tessel::detail
