// Internal (not installed): OAuth access tokens for Google Cloud Storage, found the way Google's
// client libraries find Application Default Credentials:
//   1. GOOGLE_AUTH_TOKEN_FOR_TESTING: a fixed token (as TensorStore takes it);
//   2. GOOGLE_APPLICATION_CREDENTIALS: a service account key file (a JWT signed with its RS256
//      key, exchanged at its token_uri), an authorized_user file (its refresh token exchanged) or
//      an external_account file (workload identity federation: a subject token read from a file
//      or a URL, exchanged at Google's STS, then, where the file says so, for a service account's
//      token by impersonation);
//   3. gcloud's application_default_credentials.json in $CLOUDSDK_CONFIG or ~/.config/gcloud;
//   4. the metadata server, on a Google Cloud machine (its DMI product name says so, unless
//      NO_GCE_CHECK is true) or where GCE_METADATA_HOST / GCE_METADATA_ROOT name one;
//   5. else none: requests go unauthenticated (public buckets, emulators), and an answer of 401 or
//      403 names where credentials were looked for.
// A token is kept until five minutes before it expires, or until the store refuses it (401).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace tessel::detail {

// An external_account credentials file's settings (workload identity federation).
struct GcsExternalAccount {
  std::string audience, subject_token_type;
  std::string file;  // the subject token's file, or
  std::string url;   // its URL, asked with `headers`
  std::vector<std::pair<std::string, std::string>> headers;
  std::string format = "text", field;  // "json": the token is the answer's `field`
  std::string impersonation_url;       // "" without impersonation
};

class GcsAuth {
 public:
  enum class Source { kNone, kFixedToken, kServiceAccount, kAuthorizedUser, kExternalAccount, kMetadataServer };

  // From the environment as described above. Throws ValueError for a credentials file that is
  // missing, unreadable or not one of the two kinds.
  static GcsAuth from_environment();
  // Unauthenticated (an emulator named by STORAGE_EMULATOR_HOST).
  static GcsAuth none(std::string hint) {
    GcsAuth a;
    a.hint_ = std::move(hint);
    return a;
  }

  GcsAuth(const GcsAuth& other);
  GcsAuth& operator=(const GcsAuth& other);

  Source source() const { return source_; }
  // Where the credentials came from, or where they were looked for.
  const std::string& hint() const { return hint_; }
  // The Authorization header's value ("Bearer ..."), "" without credentials. Fetches a token when
  // none is held or it is due for renewal (gcs_auth.cpp); throws IoError naming the token server when
  // that fails. Thread-safe.
  std::string authorization() const;
  // After a 401 to a request that carried `authorization`: whether a new token is worth asking
  // for (the source can mint one), and if so the held token is dropped unless another request
  // already replaced it, so the next authorization() fetches a fresh one. Google's libraries
  // do the same for a token revoked or rotated before its expiry.
  bool renew_after_refusal(const std::string& authorization) const;

 private:
  GcsAuth() = default;
  void fetch_token() const;  // under mu_
  // An external account's token and its life in seconds (under mu_).
  std::pair<std::string, int64_t> external_token() const;

  Source source_ = Source::kNone;
  std::string hint_;
  std::string token_uri_;     // service account / authorized user / metadata URL
  std::string client_email_;  // service account
  std::string private_key_;   // service account, PEM
  std::string client_id_, client_secret_, refresh_token_;  // authorized user
  GcsExternalAccount external_;                                     // external account
  mutable std::mutex mu_;
  mutable std::string token_;
  mutable std::chrono::steady_clock::time_point refresh_at_{};  // when the token is renewed
};

// A JWT assertion for the OAuth 2.0 JWT bearer grant: {"alg":"RS256","typ":"JWT"} over the claims
// iss = client_email, scope, aud = token_uri, iat = now, exp = now + 3600, signed with the PEM
// private key. Throws ValueError for a key OpenSSL cannot read.
std::string service_account_assertion(const std::string& client_email, const std::string& private_key_pem,
                                      const std::string& scope, const std::string& token_uri, int64_t now);

// gcloud's application default credentials file ($CLOUDSDK_CONFIG or ~/.config/gcloud), "" when
// neither is set; whether it exists is the caller's question.
std::string gcloud_adc_file();

// URL-safe base64 without padding (RFC 4648 section 5), as JWTs use it.
std::string base64url(std::string_view bytes);

}  // namespace tessel::detail
