// Where a checkpoint lives: a local path, or a prefix in an object store bucket (s3://bucket/key,
// gs://bucket/key). A value: parsing checks it, `/` appends checked names, and nothing here reads
// or writes (the checkpoint layer's storage does, by the location's kind).
//
//   auto ckpt = tessel::Location::parse("s3://runs/llama/checkpoints", "--checkpoint-dir");
//   ckpt.kind() == tessel::Location::Kind::kS3;  ckpt.bucket() == "runs";
//   (ckpt / "7" / "items").string() == "s3://runs/llama/checkpoints/7/items"
//   tessel::Location("ckpt").is_local();  // a plain path converts implicitly
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace tessel {

class Location {
 public:
  enum class Kind { kLocal, kS3, kGcs };

  Location() = default;
  // parse(text, ""): a path as given (not resolved), or the bucket a URL names; a path that holds
  // a URL ("s3://b/x" in a std::filesystem::path) is that URL, as it was always meant.
  Location(const std::filesystem::path& path) : Location(parse(path.string(), "")) {}  // NOLINT
  Location(const char* text) : Location(parse(text, "")) {}                           // NOLINT
  Location(const std::string& text) : Location(parse(text, "")) {}                    // NOLINT

  // `text` as a location: a local path, a file URL (file:///abs, as local_path takes it),
  // s3://bucket[/key] or gs://bucket[/key]. Throws ValueError starting with "`what`: " for any
  // other URL, a bad bucket name, or a key with an empty, "." or ".." component.
  static Location parse(std::string_view text, std::string_view what);

  Kind kind() const { return kind_; }
  bool is_local() const { return kind_ == Kind::kLocal; }
  // The local path; throws ValueError for a bucket location (naming it and `what`).
  const std::filesystem::path& local(std::string_view what = "") const;
  // The bucket and the object key prefix ("" at the bucket's root; no leading or trailing '/').
  const std::string& bucket() const { return bucket_; }
  const std::string& key() const { return key_; }
  // "s3", "gs", or "" for a local path.
  std::string_view scheme() const;

  // This location with `relative` appended: '/'-separated names, each checked as parse checks a
  // key's (for a local path, as std::filesystem::path's operator/ does).
  Location operator/(std::string_view relative) const;
  // The last name ("" at a bucket's root), and the location above it.
  std::string filename() const;
  Location parent() const;

  // The path, or the URL "s3://bucket/key".
  std::string string() const;

  friend bool operator==(const Location&, const Location&) = default;

 private:
  struct Local {};
  Location(Local, std::filesystem::path path) : path_(std::move(path)) {}
  Kind kind_ = Kind::kLocal;
  std::filesystem::path path_;
  std::string bucket_;
  std::string key_;
};

}  // namespace tessel
