#include "tessel/checkpoint/detail/io/aws_credentials.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <memory>
#include <ctime>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include <sys/wait.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <pugixml.hpp>

#include "tessel/checkpoint/detail/io/http.h"
#include "tessel/checkpoint/detail/io/s3.h"
#include "tessel/core/error.h"
#include "tessel/detail/json_util.h"

namespace tessel::detail {
namespace {

constexpr int kAttempts = 4;
// Credential answers are small; more is no answer of theirs.
constexpr size_t kMaxAnswer = 1 << 20;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("cannot read the token file '{}'", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

// The request, tried again on a dropped connection, a 5xx or a 429; a 2xx answer, unless
// `any_status`. `what` names it in errors.
HttpResponse send_with_retries(const HttpRequest& request, const std::string& what, bool any_status = false) {
  HttpResponse r = http_send_retried(request, kAttempts, what);
  if (!any_status && (r.status < 200 || r.status >= 300))
    throw IoError(fmt::format("{}: HTTP {}: {}", what, r.status, trim(r.body.substr(0, 300))));
  if (r.body.size() > kMaxAnswer) throw IoError(fmt::format("{}: an answer of {} bytes", what, r.body.size()));
  return r;
}

// The host of an http(s) URL, without port or brackets.
std::string url_host(const std::string& url) {
  const size_t start = url.find("://");
  if (start == std::string::npos) return {};
  std::string rest = url.substr(start + 3);
  rest = rest.substr(0, rest.find_first_of("/?#"));
  if (const size_t at = rest.rfind('@'); at != std::string::npos) rest = rest.substr(at + 1);
  if (rest.starts_with('[')) return rest.substr(1, rest.find(']') - 1);
  return rest.substr(0, rest.find(':'));
}

bool read_sys_starts_with(const char* path, std::string_view prefix) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return false;
  std::transform(line.begin(), line.end(), line.begin(), [](unsigned char c) { return std::tolower(c); });
  return line.starts_with(prefix);
}

}  // namespace

ExpiringCredentials parse_sts_credentials(std::string_view xml, const std::string& where) {
  pugi::xml_document doc;
  if (!doc.load_buffer(xml.data(), xml.size()))
    throw IoError(fmt::format("{}: the answer is no XML: {}", where, trim(xml.substr(0, 200))));
  if (pugi::xml_node error = doc.child("ErrorResponse").child("Error"); error) {
    throw IoError(fmt::format("{}: {}: {}", where, error.child_value("Code"), error.child_value("Message")));
  }
  pugi::xml_node c = doc.child("AssumeRoleWithWebIdentityResponse").child("AssumeRoleWithWebIdentityResult");
  if (!c) c = doc.child("AssumeRoleResponse").child("AssumeRoleResult");
  c = c.child("Credentials");
  ExpiringCredentials out;
  out.credentials = {c.child_value("AccessKeyId"), c.child_value("SecretAccessKey"), c.child_value("SessionToken")};
  if (out.credentials.access_key.empty() || out.credentials.secret_key.empty())
    throw IoError(fmt::format("{}: the answer has no AccessKeyId and SecretAccessKey", where));
  if (const std::string e = c.child_value("Expiration"); !e.empty()) {
    out.expires_at = parse_utc_time(e);
    if (!out.expires_at) throw IoError(fmt::format("{}: the Expiration '{}' is no UTC time", where, e.substr(0, 64)));
  }
  return out;
}

namespace {

// The keys, `token_field` and the expiry of a JSON answer or output (`what` names it in errors).
ExpiringCredentials credentials_in(const nlohmann::json& j, const char* token_field, const std::string& what) {
  ExpiringCredentials out;
  out.credentials = {json_util::string_member(j, "AccessKeyId"), json_util::string_member(j, "SecretAccessKey"), json_util::string_member(j, token_field)};
  if (out.credentials.access_key.empty() || out.credentials.secret_key.empty())
    throw IoError(what + " has no AccessKeyId and SecretAccessKey");
  if (const std::string e = json_util::string_member(j, "Expiration"); !e.empty()) {
    out.expires_at = parse_utc_time(e);
    if (!out.expires_at) throw IoError(fmt::format("{}'s Expiration '{}' is no UTC time", what, e.substr(0, 64)));
  }
  return out;
}

}  // namespace

ExpiringCredentials parse_json_credentials(std::string_view json, const std::string& where) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw IoError(fmt::format("{}: the answer is no JSON object: {}", where, trim(json.substr(0, 200))));
  if (const std::string code = json_util::string_member(j, "Code"); !code.empty() && code != "Success")
    throw IoError(fmt::format("{}: the answer's Code is '{}': {}", where, code.substr(0, 100),
                              json_util::string_member(j, "Message").substr(0, 200)));
  return credentials_in(j, "Token", where + ": the answer");
}

ExpiringCredentials parse_process_credentials(std::string_view json, const std::string& where) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw IoError(fmt::format("{}: its output is no JSON object: {}", where, trim(json.substr(0, 200))));
  auto version = j.find("Version");
  if (version == j.end() || !version->is_number_integer() || version->get<int64_t>() != 1)
    throw IoError(fmt::format("{}: its output's Version is not 1", where));
  return credentials_in(j, "SessionToken", where + ": its output");
}

bool on_ec2() {
  // Nitro instances name their vendor; older Xen ones carry an "ec2" UUID.
  return read_sys_starts_with("/sys/class/dmi/id/sys_vendor", "amazon ec2") ||
         read_sys_starts_with("/sys/class/dmi/id/board_vendor", "amazon ec2") ||
         read_sys_starts_with("/sys/hypervisor/uuid", "ec2");
}

std::shared_ptr<const AwsCredentialSource> AwsCredentialSource::fixed(S3Credentials credentials, std::string where) {
  auto s = std::shared_ptr<AwsCredentialSource>(new AwsCredentialSource());
  s->kind_ = Kind::kFixed;
  s->where_ = std::move(where);
  s->held_ = std::move(credentials);
  s->renew_at_ = std::chrono::system_clock::time_point::max();
  return s;
}

std::shared_ptr<const AwsCredentialSource> AwsCredentialSource::web_identity(std::string token_file, std::string role_arn,
                                                                             std::string session_name,
                                                                             std::string sts_endpoint) {
  auto s = std::shared_ptr<AwsCredentialSource>(new AwsCredentialSource());
  s->kind_ = Kind::kWebIdentity;
  s->where_ = fmt::format("web identity (role {}, token file {}) at {}", role_arn, token_file, sts_endpoint);
  s->token_file_ = std::move(token_file);
  s->role_arn_ = std::move(role_arn);
  s->session_name_ = std::move(session_name);
  s->url_ = std::move(sts_endpoint);
  return s;
}

std::shared_ptr<const AwsCredentialSource> AwsCredentialSource::assume_role(S3Credentials source, std::string role_arn,
                                                                            std::string session_name,
                                                                            std::string external_id,
                                                                            std::string sts_endpoint, std::string region) {
  auto s = std::shared_ptr<AwsCredentialSource>(new AwsCredentialSource());
  s->kind_ = Kind::kAssumedRole;
  s->where_ = fmt::format("the role {} assumed with key {} at {}", role_arn, source.access_key, sts_endpoint);
  s->source_ = std::move(source);
  s->role_arn_ = std::move(role_arn);
  s->session_name_ = std::move(session_name);
  s->external_id_ = std::move(external_id);
  s->url_ = std::move(sts_endpoint);
  s->region_ = std::move(region);
  return s;
}

std::shared_ptr<const AwsCredentialSource> AwsCredentialSource::container(std::string url, std::string token,
                                                                          std::string token_file) {
  const std::string host = url_host(url);
  const bool ipv4_loopback =
      host.starts_with("127.") && host.find_first_not_of("0123456789.") == std::string::npos;
  const bool allowed_http = host == "localhost" || host == "::1" || ipv4_loopback || host == "169.254.170.2" ||
                            host == "169.254.170.23" || host == "fd00:ec2::23";
  if (!url.starts_with("https://") && !(url.starts_with("http://") && allowed_http))
    throw ValueError(fmt::format("the container credentials URL '{}' is neither https:// nor on the loopback or AWS's "
                                 "container hosts (169.254.170.2, 169.254.170.23, fd00:ec2::23)",
                                 url));
  auto s = std::shared_ptr<AwsCredentialSource>(new AwsCredentialSource());
  s->kind_ = Kind::kContainer;
  s->where_ = "the container credentials endpoint " + url;
  s->url_ = std::move(url);
  s->token_ = std::move(token);
  s->token_file_ = std::move(token_file);
  return s;
}

std::shared_ptr<const AwsCredentialSource> AwsCredentialSource::process(std::string command, std::string profile) {
  auto s = std::shared_ptr<AwsCredentialSource>(new AwsCredentialSource());
  s->kind_ = Kind::kProcess;
  s->where_ = fmt::format("the credential_process of AWS profile '{}' ({})", profile, command);
  s->url_ = std::move(command);
  return s;
}

std::shared_ptr<const AwsCredentialSource> AwsCredentialSource::instance_metadata(std::string endpoint) {
  auto s = std::shared_ptr<AwsCredentialSource>(new AwsCredentialSource());
  s->kind_ = Kind::kInstanceMetadata;
  s->where_ = "the EC2 instance metadata service at " + endpoint;
  s->url_ = std::move(endpoint);
  return s;
}

S3Credentials AwsCredentialSource::get() const {
  std::lock_guard lock(mu_);
  const auto now = std::chrono::system_clock::now();
  if (held_ && now < renew_at_) return *held_;
  ExpiringCredentials fresh = fetch();
  held_ = fresh.credentials;
  if (!fresh.expires_at) {
    renew_at_ = std::chrono::system_clock::time_point::max();
  } else {
    // Clamped to the year 2200: the clock's nanoseconds end in 2262.
    const int64_t at = std::min<int64_t>(*fresh.expires_at, int64_t{7258118400});
    const auto expires = std::chrono::system_clock::time_point(std::chrono::seconds(at));
    const auto life = std::chrono::duration_cast<std::chrono::seconds>(expires - now);
    renew_at_ = expires - std::min<std::chrono::seconds>(std::chrono::minutes(5), life / 2);
  }
  return *held_;
}

bool AwsCredentialSource::renew_after_refusal(const std::string& access_key) const {
  if (kind_ == Kind::kFixed) return false;
  std::lock_guard lock(mu_);
  if (held_ && held_->access_key == access_key) held_.reset();
  return true;
}

ExpiringCredentials AwsCredentialSource::fetch() const {
  switch (kind_) {
    case Kind::kWebIdentity:
      return fetch_web_identity();
    case Kind::kAssumedRole:
      return fetch_assumed_role();
    case Kind::kContainer:
      return fetch_container();
    case Kind::kProcess:
      return fetch_process();
    case Kind::kInstanceMetadata:
      return fetch_instance_metadata();
    case Kind::kFixed:
      break;
  }
  return {*held_, std::nullopt};
}

ExpiringCredentials AwsCredentialSource::fetch_web_identity() const {
  std::string token;
  try {
    token = trim(read_text(token_file_));
  } catch (const IoError& e) {
    throw IoError(fmt::format("getting AWS credentials from {}: {}", where_, e.what()));
  }
  if (token.empty())
    throw IoError(fmt::format("getting AWS credentials from {}: the token file '{}' is empty", where_, token_file_));
  return ask_sts("AssumeRoleWithWebIdentity", {{"WebIdentityToken", token}}, /*signed_request=*/false);
}

ExpiringCredentials AwsCredentialSource::fetch_assumed_role() const {
  std::vector<std::pair<std::string, std::string>> fields;
  if (!external_id_.empty()) fields.emplace_back("ExternalId", external_id_);
  return ask_sts("AssumeRole", std::move(fields), /*signed_request=*/true);
}

ExpiringCredentials AwsCredentialSource::ask_sts(const std::string& action,
                                                 std::vector<std::pair<std::string, std::string>> fields,
                                                 bool signed_request) const {
  const std::string what = "getting AWS credentials from " + where_;
  fields.emplace_back("RoleArn", role_arn_);
  fields.emplace_back("RoleSessionName", session_name_);
  std::sort(fields.begin(), fields.end());
  std::string body = "Action=" + action + "&Version=2011-06-15";
  for (const auto& [name, value] : fields) body += "&" + name + "=" + uri_encode(value, false);
  const auto bytes = std::as_bytes(std::span(body.data(), body.size()));
  HttpRequest request{"POST", url_ + "/", {{"content-type", "application/x-www-form-urlencoded"}}, bytes};
  if (signed_request) {
    const std::string host = url_.substr(url_.find("://") + 3);
    const std::string date = amz_date_now();
    SignedRequest signed_parts{"POST", "/", "", {{"content-type", "application/x-www-form-urlencoded"}, {"host", host},
                                                  {"x-amz-date", date}}, sha256_hex(bytes)};
    if (!source_.session_token.empty()) signed_parts.headers["x-amz-security-token"] = source_.session_token;
    request.headers.emplace_back("x-amz-date", date);
    if (!source_.session_token.empty()) request.headers.emplace_back("x-amz-security-token", source_.session_token);
    request.headers.emplace_back("authorization", sigv4_authorization(signed_parts, source_, region_, "sts", date));
  }
  request.connect_timeout_s = 10;
  request.total_timeout_s = 60;
  const HttpResponse r = send_with_retries(request, what, /*any_status=*/true);
  if (r.status != 200) {
    // STS's error document names the cause (an expired token, a role that does not trust it).
    pugi::xml_document doc;
    if (doc.load_buffer(r.body.data(), r.body.size()) && doc.child("ErrorResponse")) parse_sts_credentials(r.body, what);
    throw IoError(fmt::format("{}: HTTP {}: {}", what, r.status, trim(std::string_view(r.body).substr(0, 300))));
  }
  return parse_sts_credentials(r.body, what);
}

ExpiringCredentials AwsCredentialSource::fetch_process() const {
  const std::string what = "getting AWS credentials from " + where_;
  // The SDKs run it the same way each time: its standard output read whole, its error left to the
  // terminal, a non-zero exit an error.
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(url_.c_str(), "r"), &::pclose);
  if (!pipe) throw IoError(what + ": cannot start it");
  std::string output;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe.get())) > 0;) {
    output.append(buffer, n);
    if (output.size() > kMaxAnswer) throw IoError(fmt::format("{}: more than {} bytes of output", what, kMaxAnswer));
  }
  const int status = ::pclose(pipe.release());
  if (status != 0) {
    throw IoError(fmt::format("{}: it {}", what,
                              WIFEXITED(status) ? fmt::format("exited with status {}", WEXITSTATUS(status))
                                                : std::string("did not exit normally")));
  }
  return parse_process_credentials(output, what);
}

ExpiringCredentials AwsCredentialSource::fetch_container() const {
  const std::string what = "getting AWS credentials from " + where_;
  HttpRequest request{"GET", url_, {}, {}};
  std::string token = token_;
  if (!token_file_.empty()) {
    try {
      token = trim(read_text(token_file_));
    } catch (const IoError& e) {
      throw IoError(fmt::format("{}: {}", what, e.what()));
    }
  }
  if (token.find_first_of("\r\n") != std::string::npos)
    throw IoError(what + ": the authorization token holds a line break");
  if (!token.empty()) request.headers.emplace_back("authorization", token);
  request.connect_timeout_s = 2;
  request.total_timeout_s = 10;
  return parse_json_credentials(send_with_retries(request, what).body, what);
}

ExpiringCredentials AwsCredentialSource::fetch_instance_metadata() const {
  const std::string what = "getting AWS credentials from " + where_;
  HttpRequest token_request{"PUT", url_ + "/latest/api/token", {{"x-aws-ec2-metadata-token-ttl-seconds", "21600"}}, {}};
  token_request.connect_timeout_s = 2;
  token_request.total_timeout_s = 10;
  const std::string token = trim(send_with_retries(token_request, what + " (its session token)").body);
  const std::string base = url_ + "/latest/meta-data/iam/security-credentials/";
  HttpRequest role_request{"GET", base, {{"x-aws-ec2-metadata-token", token}}, {}};
  role_request.connect_timeout_s = 2;
  role_request.total_timeout_s = 10;
  std::string role = send_with_retries(role_request, what + " (the instance's role)").body;
  role = trim(role.substr(0, role.find('\n')));
  if (role.empty()) throw IoError(what + ": the instance has no IAM role");
  if (role.find_first_of("/?#%") != std::string::npos)
    throw IoError(fmt::format("{}: the role name '{}' is no name", what, role.substr(0, 100)));
  HttpRequest credentials_request{"GET", base + role, {{"x-aws-ec2-metadata-token", token}}, {}};
  credentials_request.connect_timeout_s = 2;
  credentials_request.total_timeout_s = 10;
  return parse_json_credentials(send_with_retries(credentials_request, what).body, what + " (role " + role + ")");
}

}  // namespace tessel::detail
