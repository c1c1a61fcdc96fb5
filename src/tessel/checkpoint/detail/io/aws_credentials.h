// Internal (not installed): AWS credentials that expire and are fetched again, from the sources the
// AWS SDKs' default chain tries after the environment's and the profile's keys (s3.h):
//   0. a role a profile assumes with another profile's keys (role_arn, source_profile; STS's
//      AssumeRole, signed with those keys);
//   0'. a profile's credential_process (a command printing credentials as JSON);
//   1. web identity: AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN (or the profile's
//      web_identity_token_file and role_arn), the token exchanged at STS (AssumeRoleWithWebIdentity;
//      EKS's service-account roles);
//   2. a container's credentials endpoint: AWS_CONTAINER_CREDENTIALS_RELATIVE_URI (on
//      169.254.170.2) or AWS_CONTAINER_CREDENTIALS_FULL_URI, with AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE
//      or AWS_CONTAINER_AUTHORIZATION_TOKEN (ECS task roles, EKS Pod Identity);
//   3. the EC2 instance metadata service (IMDSv2: a session token, then the instance role's
//      credentials), on an EC2 machine (its DMI says so) or at AWS_EC2_METADATA_SERVICE_ENDPOINT,
//      unless AWS_EC2_METADATA_DISABLED is true.
// Credentials are kept until five minutes before they expire (halfway through a shorter life).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessel::detail {

struct S3Credentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // "" unless temporary credentials
};

// Credentials as a source answered them, with their expiry (seconds since the epoch) when given.
struct ExpiringCredentials {
  S3Credentials credentials;
  std::optional<int64_t> expires_at;
};

class AwsCredentialSource {
 public:
  enum class Kind { kFixed, kAssumedRole, kWebIdentity, kProcess, kContainer, kInstanceMetadata };

  // Keys that never expire (the environment's or a profile's).
  static std::shared_ptr<const AwsCredentialSource> fixed(S3Credentials credentials, std::string where);
  // `role_arn` assumed at STS with `source`'s keys (the request signed for `region`); `external_id`
  // sent when not empty.
  static std::shared_ptr<const AwsCredentialSource> assume_role(S3Credentials source, std::string role_arn,
                                                                std::string session_name, std::string external_id,
                                                                std::string sts_endpoint, std::string region);
  // `sts_endpoint` without a trailing '/'; the token file is read again at each exchange (it is
  // rotated by the platform).
  static std::shared_ptr<const AwsCredentialSource> web_identity(std::string token_file, std::string role_arn,
                                                                 std::string session_name, std::string sts_endpoint);
  // `url` the full credentials URL; the token file, when given, is read at each fetch, else `token`
  // is sent (when not empty) as the Authorization header. Throws ValueError for a plain-http URL
  // to a host other than the loopback and the container hosts AWS uses (169.254.170.2,
  // 169.254.170.23, fd00:ec2::23), as the SDKs refuse it.
  static std::shared_ptr<const AwsCredentialSource> container(std::string url, std::string token,
                                                              std::string token_file);
  // A profile's credential_process: `command` run by /bin/sh at each fetch, its standard output
  // the credentials (parse_process_credentials).
  static std::shared_ptr<const AwsCredentialSource> process(std::string command, std::string profile);
  // `endpoint` like "http://169.254.169.254", no trailing '/'.
  static std::shared_ptr<const AwsCredentialSource> instance_metadata(std::string endpoint);

  Kind kind() const { return kind_; }
  // Where the credentials come from, for messages.
  const std::string& where() const { return where_; }
  // The credentials now: fetched when none are held or they are due for renewal. Throws IoError
  // naming the source when that fails. Thread-safe.
  S3Credentials get() const;
  // After a store refused `access_key` as expired (S3's ExpiredToken): whether new credentials are
  // worth asking for (the source is temporary); if so the held ones are dropped unless another
  // request already replaced them, so the next get() fetches. The SDKs do the same for
  // credentials revoked or rotated before their stated expiry.
  bool renew_after_refusal(const std::string& access_key) const;

 private:
  AwsCredentialSource() = default;
  ExpiringCredentials fetch() const;
  ExpiringCredentials fetch_web_identity() const;
  ExpiringCredentials fetch_assumed_role() const;
  ExpiringCredentials fetch_process() const;
  ExpiringCredentials ask_sts(const std::string& action, std::vector<std::pair<std::string, std::string>> fields,
                              bool signed_request) const;
  ExpiringCredentials fetch_container() const;
  ExpiringCredentials fetch_instance_metadata() const;

  Kind kind_ = Kind::kFixed;
  std::string where_;
  std::string url_;         // STS endpoint, container URL, metadata endpoint
  std::string token_;       // container authorization
  std::string token_file_;  // web identity token, container authorization token
  std::string role_arn_, session_name_, external_id_, region_;
  S3Credentials source_;  // an assumed role's
  mutable std::mutex mu_;
  mutable std::optional<S3Credentials> held_;
  mutable std::chrono::system_clock::time_point renew_at_{};
};

// An STS AssumeRole or AssumeRoleWithWebIdentity answer (bytes a server sent: fuzzed). Throws IoError naming
// `where` for one without credentials, with STS's error code and message when it sent an error.
ExpiringCredentials parse_sts_credentials(std::string_view xml, const std::string& where);
// A container endpoint's or the instance metadata service's JSON answer: AccessKeyId,
// SecretAccessKey, Token, Expiration (bytes a server sent: fuzzed). Throws IoError naming `where`.
ExpiringCredentials parse_json_credentials(std::string_view json, const std::string& where);

// A credential_process's output: {"Version": 1, "AccessKeyId", "SecretAccessKey", "SessionToken",
// "Expiration"} (the last two optional). Throws IoError naming `where`.
ExpiringCredentials parse_process_credentials(std::string_view json, const std::string& where);

// Whether this machine is an EC2 instance, by its DMI (no request made).
bool on_ec2();

}  // namespace tessel::detail
