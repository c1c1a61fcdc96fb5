// Internal (not installed): an S3 client over HTTP (http.h): objects read by byte ranges, listed by
// prefix, written whole; requests signed with AWS Signature Version 4 and retried with backoff on
// 5xx, throttling and dropped connections.
//
// Configuration as the AWS CLI and SDKs take it: credentials from AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), else the profile AWS_PROFILE names ("default")
// in the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, ~/.aws/credentials) or the config
// file (AWS_CONFIG_FILE, ~/.aws/config); the region from AWS_REGION, AWS_DEFAULT_REGION or the
// profile's `region` (else us-east-1); the endpoint from AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL or
// the profile's `endpoint_url`, for S3-compatible stores (addressed path-style), else AWS's own.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessel/checkpoint/detail/io/http.h"

namespace tessel::detail {

struct S3Credentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // "" unless temporary credentials
};

struct S3Config {
  std::string endpoint;  // "https://s3.us-east-1.amazonaws.com" or an override, no trailing '/'
  bool path_style = false;
  std::string region = "us-east-1";
  std::optional<S3Credentials> credentials;
  std::string credentials_hint;  // where credentials were looked for, for the error without them
  int max_attempts = 8;

  // From the environment and the AWS files, as described above. Throws ParseError for a
  // malformed AWS file, ValueError for a bad endpoint.
  static S3Config from_environment();
};

// What AWS Signature Version 4 signs: the request's canonical parts. `headers` are the ones sent
// and signed, names lowercase, host, x-amz-date and x-amz-content-sha256 among them.
struct SignedRequest {
  std::string method;
  std::string canonical_uri;    // the path, URI-encoded ('/' kept)
  std::string canonical_query;  // encoded name=value pairs sorted by name, '&'-joined
  std::map<std::string, std::string> headers;
  std::string payload_hash;  // hex SHA-256 of the body, or UNSIGNED-PAYLOAD
};

// The Authorization header's value for `request` at `amz_date` (YYYYMMDD'T'HHMMSS'Z').
std::string sigv4_authorization(const SignedRequest& request, const S3Credentials& credentials,
                                 const std::string& region, const std::string& service, const std::string& amz_date);

// Hex SHA-256, hex MD5 and base64 MD5 (Content-MD5) of bytes.
std::string sha256_hex(std::span<const std::byte> bytes);
std::string md5_hex(std::span<const std::byte> bytes);
std::string md5_base64(std::span<const std::byte> bytes);

struct S3Listing {
  std::vector<std::pair<std::string, int64_t>> objects;  // keys (with the prefix) and sizes
  std::vector<std::string> prefixes;                     // common prefixes, ending with the delimiter
};

// One ListObjectsV2 page (bytes a server sent, so anything: the fuzzers' entry point): its objects
// and common prefixes, `next` set to the continuation token ("" on the last page). Throws IoError
// naming `where` for an answer that is no listing.
S3Listing parse_list_page(std::string_view body, const std::string& where, std::string* next);

class S3Client {
 public:
  explicit S3Client(S3Config config) : config_(std::move(config)) {}
  // The client for the current environment: one per configuration, shared.
  static std::shared_ptr<const S3Client> current();

  const S3Config& config() const { return config_; }
  // The object's size; nullopt when there is none.
  std::optional<int64_t> head(const std::string& bucket, const std::string& key) const;
  // Exactly out.size() bytes at `offset` of the object; a shorter object is an IoError ("truncated").
  void read(const std::string& bucket, const std::string& key, int64_t offset, std::span<std::byte> out) const;
  // The whole object, refused above `max_bytes`; nullopt when there is none. When its ETag is
  // its MD5 (one PUT), the bytes are checked against it, and read again on a mismatch.
  std::optional<std::string> read_all(const std::string& bucket, const std::string& key, int64_t max_bytes) const;
  // The objects below `prefix`; with a delimiter, keys are cut at its first occurrence after the
  // prefix into common prefixes (ListObjectsV2, every page; only the first `max_keys` when > 0).
  S3Listing list(const std::string& bucket, const std::string& prefix, const std::string& delimiter,
                 int max_keys = 0) const;
  void put(const std::string& bucket, const std::string& key, std::span<const std::byte> bytes) const;
  void remove(const std::string& bucket, const std::string& key) const;
  // Every object below `prefix` (a '/'-terminated "directory"), deleted.
  void remove_all(const std::string& bucket, const std::string& prefix) const;

  // A multipart upload: parts numbered from 1, each but the last at least 5 MiB; the object
  // appears at complete(), and abort() discards the parts.
  std::string start_upload(const std::string& bucket, const std::string& key) const;
  // The part's ETag, for complete().
  std::string upload_part(const std::string& bucket, const std::string& key, const std::string& upload_id,
                          int part_number, std::span<const std::byte> bytes) const;
  void complete_upload(const std::string& bucket, const std::string& key, const std::string& upload_id,
                       const std::vector<std::string>& etags) const;
  void abort_upload(const std::string& bucket, const std::string& key, const std::string& upload_id) const;

 private:
  struct Result {
    HttpResponse response;
    std::string url;
  };
  // One signed request, retried on transport errors, 5xx, 429 and throttling answers; the final
  // response (any status) is returned.
  Result send(const std::string& method, const std::string& bucket, const std::string& key,
              const std::map<std::string, std::string>& query, std::map<std::string, std::string> headers,
              std::span<const std::byte> body, std::span<std::byte> into = {}) const;
  // IoError for a response that is no success: the URL, the status and S3's code and message.
  [[noreturn]] void fail(const Result& r, const std::string& what) const;

  S3Config config_;
};

}  // namespace tessel::detail
