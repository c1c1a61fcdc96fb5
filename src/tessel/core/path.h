// Path arguments: a local path, or a URL that names one (file:///abs/path). Every other URL
// (s3://, gs://, http(s)://, hf://, file://host/...) is refused before anything is read or
// written: without this, `s3://bucket/run` silently became the local folder `./s3:/bucket/run`.
//
//   std::filesystem::path dir = tessel::local_path(arg, "--checkpoint-dir");  // "file:///x" -> "/x"
//   tessel::url_scheme("gs://bucket/ckpt");                                   // "gs"
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace tessel {

// The scheme of a URL (RFC 3986: a letter, then letters, digits, '+', '-' or '.', then "://"),
// lowercased: "s3" for "s3://bucket/x", "file" for "file:///x"; "" when `text` is not a URL.
std::string url_scheme(std::string_view text);

// `text` as a local path: itself when it is not a URL; the percent-decoded path of a file URL
// without a host (file:///abs, file://localhost/abs). Throws ValueError starting with
// "`what`: " (when `what` is not empty) for any other URL, saying that object stores are not
// supported yet, and for a file URL with a host, a query, a fragment or a bad escape.
std::filesystem::path local_path(std::string_view text, std::string_view what);

}  // namespace tessel
