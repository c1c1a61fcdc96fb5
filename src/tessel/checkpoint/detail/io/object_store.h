// Internal (not installed): what the checkpoint layer asks of an object store, whichever it is
// (S3 in s3.h, Google Cloud Storage in gcs.h): objects read by byte ranges, listed by prefix,
// written whole or in parts, deleted. Every call is a blocking request, retried by the client on
// the failures its store calls transient; what is left is thrown as IoError naming the object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace tessel {
class Location;
}

namespace tessel::detail {

struct ObjectListing {
  std::vector<std::pair<std::string, int64_t>> objects;  // names (with the prefix) and sizes
  std::vector<std::string> prefixes;                     // common prefixes, ending with the delimiter
};

// What a store's configuration is made of: the values of `variables` and the size and
// modification time of each of `files` ("" skipped). The clients rebuild their configuration
// (reading credentials files) only when this changes, not on every object opened.
std::string configuration_fingerprint(std::initializer_list<const char*> variables,
                                      std::initializer_list<std::string> files);

// The shared client make() built, while `fingerprint` (configuration_fingerprint) stays the same;
// a new one from make() when it changes. One cache per call site (per Make type).
template <class Client, class Make>
std::shared_ptr<const Client> cached_client(const std::string& fingerprint, Make make) {
  static std::mutex mu;
  static std::shared_ptr<const Client> client;
  static std::string made_from;
  {
    std::lock_guard lock(mu);
    if (client && fingerprint == made_from) return client;
  }
  auto fresh = std::make_shared<const Client>(make());  // outside the lock: it reads files
  std::lock_guard lock(mu);
  made_from = fingerprint;
  client = std::move(fresh);
  return client;
}

// Appends a listing page to `out`, each name checked to be under the asked `prefix` (IoError
// naming `where` for one that is not: a server's answer is not trusted to stay in the checkpoint).
void append_page(ObjectListing& out, ObjectListing page, const std::string& prefix, const std::string& where);

// An object written in parts numbered from 0, all of one size but the last. The store's rules on
// order differ (S3 takes parts in any order, a GCS resumable upload only in order), so a part
// given ahead of its turn may be held until then.
class PartUpload {
 public:
  virtual ~PartUpload() = default;  // not completed: the parts are discarded (best effort)
  // Part `index`; several threads may give parts at once.
  virtual void put_part(int64_t index, std::vector<std::byte> bytes) = 0;
  // Parts [0, count) were all given: the object appears, whole.
  virtual void complete(int64_t count) = 0;
};

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;
  // The client for a bucket location's store, as the environment configures it (shared).
  static std::shared_ptr<const ObjectStore> for_location(const Location& loc);

  // "s3" or "gs", for URLs in messages.
  virtual const char* scheme() const = 0;
  // The object's size; nullopt when there is none.
  virtual std::optional<int64_t> head(const std::string& bucket, const std::string& key) const = 0;
  // Exactly out.size() bytes at `offset`; a shorter object is an IoError ("truncated").
  virtual void read(const std::string& bucket, const std::string& key, int64_t offset,
                    std::span<std::byte> out) const = 0;
  // The whole object, refused above `max_bytes`, checked against the store's checksum when it
  // gives one (read again on a mismatch); nullopt when there is none.
  virtual std::optional<std::string> read_all(const std::string& bucket, const std::string& key,
                                              int64_t max_bytes) const = 0;
  // The objects below `prefix`; with a delimiter, names are cut at its first occurrence after the
  // prefix into common prefixes (every page; only the first page of `max_keys` when > 0).
  virtual ObjectListing list(const std::string& bucket, const std::string& prefix, const std::string& delimiter,
                             int max_keys = 0) const = 0;
  virtual void put(const std::string& bucket, const std::string& key, std::span<const std::byte> bytes) const = 0;
  // Deleting an object that is not there is no error.
  virtual void remove(const std::string& bucket, const std::string& key) const = 0;
  // Every object below `prefix` (a '/'-terminated "directory").
  void remove_all(const std::string& bucket, const std::string& prefix) const;
  // A new upload in parts of `part_bytes` (S3 wants at least 5 MiB, GCS a multiple of 256 KiB).
  virtual std::unique_ptr<PartUpload> start_upload(const std::string& bucket, const std::string& key,
                                                   int64_t part_bytes) const = 0;
  // The most parts one object may have.
  virtual int64_t max_parts() const = 0;
};

}  // namespace tessel::detail
