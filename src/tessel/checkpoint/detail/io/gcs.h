// Internal (not installed): a Google Cloud Storage client over HTTP (http.h) and GCS's JSON API:
// objects read by byte ranges, listed by prefix, written by a media upload (one part) or a
// resumable upload (parts streamed in order), deleted; requests retried with backoff on 5xx, 408,
// 429 and dropped connections, and resumable uploads resumed from what the server says it holds.
//
// The endpoint: STORAGE_EMULATOR_HOST (host:port or a URL; requests then go unauthenticated, as
// Google's client libraries do for an emulator), else TENSORSTORE_GCS_HTTP_URL (TensorStore's
// override; credentials as usual), else https://storage.googleapis.com. Credentials: gcs_auth.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "tessel/checkpoint/detail/io/gcs_auth.h"
#include "tessel/checkpoint/detail/io/http.h"
#include "tessel/checkpoint/detail/io/object_store.h"

namespace tessel::detail {

struct GcsConfig {
  std::string endpoint = "https://storage.googleapis.com";  // no trailing '/'
  GcsAuth auth = GcsAuth::none("");
  int max_attempts = 8;

  // From the environment, as described above; TESSEL_GCS_MAX_ATTEMPTS sets max_attempts. Throws
  // ValueError for a bad endpoint or credentials file.
  static GcsConfig from_environment();
};

// One objects.list page (bytes a server sent, so anything: the fuzzers' entry point): its objects
// and prefixes, `next` set to nextPageToken ("" on the last page). Throws IoError naming `where`
// for an answer that is no listing.
ObjectListing parse_gcs_list_page(std::string_view body, const std::string& where, std::string* next);

// GCS's crc32c field and x-goog-hash value: base64 of the big-endian CRC-32C.
std::string gcs_crc32c_base64(uint32_t crc);

class GcsClient final : public ObjectStore {
 public:
  explicit GcsClient(GcsConfig config) : config_(std::move(config)) {}
  // The client for the current environment, shared (its token too) until the environment or the
  // credentials files change.
  static std::shared_ptr<const GcsClient> current();

  const GcsConfig& config() const { return config_; }
  const char* scheme() const override { return "gs"; }
  std::optional<int64_t> head(const std::string& bucket, const std::string& key) const override;
  void read(const std::string& bucket, const std::string& key, int64_t offset, std::span<std::byte> out) const override;
  // Checked against the CRC-32C in the answer's x-goog-hash.
  std::optional<std::string> read_all(const std::string& bucket, const std::string& key,
                                      int64_t max_bytes) const override;
  ObjectListing list(const std::string& bucket, const std::string& prefix, const std::string& delimiter,
                     int max_keys = 0) const override;
  // A media upload; the stored object's CRC-32C is checked against the bytes'.
  void put(const std::string& bucket, const std::string& key, std::span<const std::byte> bytes) const override;
  void remove(const std::string& bucket, const std::string& key) const override;
  // A resumable upload: parts stream in order, a part given early is held until its turn, and the
  // last part given is held until the next or the completion (which must send the total size).
  std::unique_ptr<PartUpload> start_upload(const std::string& bucket, const std::string& key,
                                           int64_t part_bytes) const override;
  int64_t max_parts() const override { return int64_t{1} << 40; }

  // One request with the Authorization header, retried on transport errors, 5xx, 408 and 429;
  // the final response (any status) is returned.
  HttpResponse send(const std::string& method, const std::string& url,
                    std::vector<std::pair<std::string, std::string>> headers, std::span<const std::byte> body,
                    std::span<std::byte> into = {}) const;
  // One attempt of `request` with the Authorization header. A 401 gets a new token and the same
  // request once more: a token revoked or rotated before its expiry (the refused request changed
  // nothing). Transport errors throw HttpTransportError.
  HttpResponse send_authorized(const HttpRequest& request, std::span<std::byte> into = {}) const;
  // IoError for a response that is no success: what was done, the URL, the status, GCS's message;
  // for 401 and 403, where credentials came from.
  [[noreturn]] void fail(const HttpResponse& r, const std::string& what, const std::string& url) const;
  // https://host/storage/v1/b/BUCKET/o[/KEY] and https://host/upload/storage/v1/b/BUCKET/o.
  std::string object_url(const std::string& bucket, const std::string& key) const;
  std::string upload_url(const std::string& bucket) const;

 private:
  GcsConfig config_;
};

}  // namespace tessel::detail
