// Internal (not installed): an S3 client over HTTP (http.h): objects read by byte ranges, listed by
// prefix, written whole; requests signed with AWS Signature Version 4 and retried with backoff on
// 5xx, throttling and dropped connections.
//
// Configuration as the AWS CLI and SDKs take it: credentials from AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), else the profile AWS_PROFILE names ("default")
// in the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, ~/.aws/credentials) or the config
// file (AWS_CONFIG_FILE, ~/.aws/config), else the temporary credentials of a web identity, a
// container or an EC2 instance (aws_credentials.h); the region from AWS_REGION, AWS_DEFAULT_REGION or the
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

#include "tessel/checkpoint/detail/io/aws_credentials.h"
#include "tessel/checkpoint/detail/io/http.h"
#include "tessel/checkpoint/detail/io/object_store.h"

namespace tessel::detail {

struct S3Config {
  std::string endpoint;  // "https://s3.us-east-1.amazonaws.com" or an override, no trailing '/'
  bool path_style = false;
  std::string region = "us-east-1";
  std::shared_ptr<const AwsCredentialSource> credentials;  // null when none was found
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

// Now as SigV4 dates it: YYYYMMDD'T'HHMMSS'Z' in UTC.
std::string amz_date_now();

// Hex SHA-256, hex MD5 and base64 MD5 (Content-MD5) of bytes.
std::string sha256_hex(std::span<const std::byte> bytes);
std::string md5_hex(std::span<const std::byte> bytes);
std::string md5_base64(std::span<const std::byte> bytes);

// One ListObjectsV2 page (bytes a server sent, so anything: the fuzzers' entry point): its objects
// and common prefixes, `next` set to the continuation token ("" on the last page). Throws IoError
// naming `where` for an answer that is no listing.
ObjectListing parse_list_page(std::string_view body, const std::string& where, std::string* next);

class S3Client final : public ObjectStore {
 public:
  explicit S3Client(S3Config config) : config_(std::move(config)) {}
  // The client for the current environment, shared until the environment or the AWS files change.
  static std::shared_ptr<const S3Client> current();

  const S3Config& config() const { return config_; }
  const char* scheme() const override { return "s3"; }
  std::optional<int64_t> head(const std::string& bucket, const std::string& key) const override;
  void read(const std::string& bucket, const std::string& key, int64_t offset, std::span<std::byte> out) const override;
  // When the object's ETag is its MD5 (stored in one PUT), the bytes are checked against it.
  std::optional<std::string> read_all(const std::string& bucket, const std::string& key,
                                      int64_t max_bytes) const override;
  // ListObjectsV2.
  ObjectListing list(const std::string& bucket, const std::string& prefix, const std::string& delimiter,
                     int max_keys = 0) const override;
  // With Content-MD5.
  void put(const std::string& bucket, const std::string& key, std::span<const std::byte> bytes) const override;
  void remove(const std::string& bucket, const std::string& key) const override;
  // A multipart upload: each part uploaded when given, from the giving thread.
  std::unique_ptr<PartUpload> start_upload(const std::string& bucket, const std::string& key,
                                           int64_t part_bytes) const override;
  int64_t max_parts() const override { return 10000; }

  // The multipart upload's requests: parts numbered from 1, each but the last at least 5 MiB;
  // the object appears at complete_multipart(), and abort_multipart() discards the parts.
  std::string create_multipart(const std::string& bucket, const std::string& key) const;
  // The part's ETag, for complete_multipart().
  std::string upload_part(const std::string& bucket, const std::string& key, const std::string& upload_id,
                          int part_number, std::span<const std::byte> bytes) const;
  void complete_multipart(const std::string& bucket, const std::string& key, const std::string& upload_id,
                          const std::vector<std::string>& etags) const;
  void abort_multipart(const std::string& bucket, const std::string& key, const std::string& upload_id) const;

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
