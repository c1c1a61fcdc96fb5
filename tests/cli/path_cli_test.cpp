// Every option that takes a path refuses a URL on the command line, naming the option, and
// nothing is written (the local folder `./s3:/bucket/run` once silently held a "bucket"'s
// checkpoints); file:///path is taken as the path. A checkpoint to read may be in a bucket
// (s3://, gs://): without credentials that is a one-line error naming what is missing.
#include <fstream>

#include <fmt/format.h>

#include "cli/cli_test_util.h"

namespace tessel {
namespace {
namespace fs = std::filesystem;

// Runs tessel in `cwd`, so that a relative folder the command might create lands there.
Result run_in(const fs::path& cwd, const std::string& args) {
  testing::TempDir dir;
  const std::string out = (dir.path() / "out").string(), err = (dir.path() / "err").string();
  // No AWS credentials from this machine's environment, files or instance role; a GCS credentials file that is not
  // there (a GCS request without credentials would go out unauthenticated).
  const std::string cmd = "cd " + cwd.string() +
                          " && env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_PROFILE "
                          "-u AWS_WEB_IDENTITY_TOKEN_FILE -u AWS_CONTAINER_CREDENTIALS_RELATIVE_URI "
                          "-u AWS_CONTAINER_CREDENTIALS_FULL_URI -u STORAGE_EMULATOR_HOST -u GOOGLE_AUTH_TOKEN_FOR_TESTING "
                          "AWS_SHARED_CREDENTIALS_FILE=/nonexistent AWS_CONFIG_FILE=/nonexistent AWS_EC2_METADATA_DISABLED=true "
                          "GOOGLE_APPLICATION_CREDENTIALS=/nonexistent.json " +
                          TESSEL_CLI + " " + args + " >" + out + " 2>" + err;
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, testing::read_file(out), testing::read_file(err)};
}

struct Case {
  std::string option;  // as the error names it
  std::string args;    // with {url} where the URL goes and {item}, {examples}, {maxtext} filled in
  bool bucket = false;  // a checkpoint read: s3:// and gs:// are taken
};

TEST(PathCli, EveryPathOptionRefusesAUrlOrTakesABucketAndWritesNothing) {
  testing::TempDir tmp;
  const fs::path item = tmp.path() / "item";
  ASSERT_EQ(std::system((std::string(TESSEL_CKPT_HELPER) + " item " + item.string() + " none").c_str()), 0);
  const std::string examples = TESSEL_EXAMPLES_DIR;
  const std::string base = testing::testdata("maxtext/base.yml").string();
  const std::string model = testing::testdata("maxtext/models/qwen3-0.6b.yml").string();
  const std::vector<Case> cases = {
      {"--rules", "shardings --rules {url} --logical {examples}/models/rules.yml --mesh fsdp=2"},
      {"--logical", "shardings --rules {examples}/models/rules.yml --logical {url} --mesh fsdp=2"},
      {"--out", "shardings --mesh fsdp=2 --spec '[\"fsdp\"]' --shape 4 --out {url}"},
      {"--model", "shardings --model {url} --base {base} --devices 4"},
      {"--base", "shardings --model {model} --base {url} --devices 4"},
      {"--model", "plan --model {url} --rules {examples}/models/rules.yml --mesh fsdp=2"},
      {"--rules", "plan --model {examples}/models/transformer.yml --rules {url} --mesh fsdp=2"},
      {"--base", "plan --model {model} --base {url} --devices 4"},
      {"--dump-shardings", "plan --model {model} --base {base} --devices 4 --dump-shardings {url}"},
      {"dir", "ckpt info {url}", true},
      {"dir", "ckpt verify {url}", true},
      {"dir", "ckpt restore {url} --mesh data=2", true},
      {"--rules", "ckpt restore {item} --mesh data=2 --rules {url}"},
      {"--shardings", "ckpt restore {item} --mesh data=2 --shardings {url}"},
      {"--logical-axes", "ckpt restore {item} --mesh data=2 --logical-axes {url}"},
      {"dir", "ckpt export {url} --path embedder/embedding --out x.npy", true},
      {"--out", "ckpt export {item} --path embedder/embedding --out {url}"},
      {"dir", "ckpt reshard {url} out --mesh data=2", true},
      {"dst", "ckpt reshard {item} {url} --mesh data=2", true},
      {"dir", "ckpt convert {url} out", true},
      {"dst", "ckpt convert {item} {url}", true},
      {"--map", "ckpt convert {item} out --map {url}"},
      {"--checkpoint-dir", "train --checkpoint-dir {url} --steps 4", true},
      {"--data", "train --data {url} --steps 1"},
      {"--init-from", "train --init-from {url} --steps 1", true},
      {"--metrics", "train --metrics {url} --steps 1"},
      {"--model", "train --model {url} --steps 1"},
      {"--base", "train --model {model} --base {url} --steps 1"},
      {"--rules", "train --rules {url} --steps 1"},
  };
  const std::vector<std::string> urls = {"s3://my-bucket/run", "gs://bucket/ckpt/7", "https://example.com/x",
                                         "hf://org/model", "file://otherhost/x"};
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::string url = urls[i % urls.size()];
    const std::string args = fmt::format(fmt::runtime(c.args), fmt::arg("url", url), fmt::arg("item", item.string()),
                                         fmt::arg("examples", examples), fmt::arg("base", base),
                                         fmt::arg("model", model));
    testing::TempDir cwd;
    SCOPED_TRACE(args);
    Result r = run_in(cwd.path(), args);
    if (c.bucket && url.starts_with("s3://")) {
      expect_one_line_error(r, 1, "no AWS credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set");
      EXPECT_THAT(r.err, HasSubstr(url));
    } else if (c.bucket && url.starts_with("gs://")) {
      expect_one_line_error(r, 1, "'" + url + "': GOOGLE_APPLICATION_CREDENTIALS names '/nonexistent.json', which cannot be read");
    } else {
      expect_one_line_error(r, 2, c.option + ": '" + url + "'");
      const bool other_scheme = c.bucket && !url.starts_with("file://");
      EXPECT_THAT(r.err, HasSubstr(other_scheme ? "checkpoints are local paths, file:///path, s3://bucket/key or gs://bucket/key"
                                                : "not supported yet"));
    }
    EXPECT_TRUE(fs::is_empty(cwd.path())) << "something was written in " << cwd.path();
  }
}

TEST(PathCli, AFileUrlIsTheLocalPath) {
  testing::TempDir tmp;
  const fs::path item = tmp.path() / "item";
  ASSERT_EQ(std::system((std::string(TESSEL_CKPT_HELPER) + " item " + item.string() + " none").c_str()), 0);
  Result info = run("ckpt info file://" + item.string());
  ASSERT_EQ(info.rc, 0) << info.err;
  EXPECT_THAT(info.out, HasSubstr("item " + item.string() + " ("));
  Result converted = run("ckpt convert file://localhost" + item.string() + " file://" + (tmp.path() / "hf").string());
  ASSERT_EQ(converted.rc, 0) << converted.err;
  EXPECT_TRUE(fs::exists(tmp.path() / "hf" / "model.safetensors"));
}

}  // namespace
}  // namespace tessel
