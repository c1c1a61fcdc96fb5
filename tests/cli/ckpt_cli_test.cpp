// tessel ckpt: info, verify, restore, export, reshard, and their errors.
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/cli_test_util.h"

namespace tessel {
namespace {
namespace fs = std::filesystem;

struct Written {
  testing::TempDir tmp;
  fs::path item = tmp.path() / "item";
  explicit Written(const std::string& layout = "") {
    const std::string cmd = std::string(TESSEL_CKPT_HELPER) + " item " + item.string() + " none " + layout;
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }
};

TEST(CkptCli, InfoListsEveryParameter) {
  Written w;
  Result r = run("ckpt info " + w.item.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("decoder/layers/0/mlp/wi/kernel"));
  EXPECT_THAT(r.out, HasSubstr("f32[64,128]"));
  EXPECT_THAT(r.out, HasSubstr("PartitionSpec('fsdp', 'tensor') on Mesh(data=2, fsdp=2, tensor=2)"));
  EXPECT_THAT(r.out, HasSubstr("(embed, mlp)"));
  Result j = run("ckpt info --json " + w.item.string());
  ASSERT_EQ(j.rc, 0) << j.err;
  auto info = nlohmann::json::parse(j.out);
  EXPECT_GT(info["params"].size(), 30u);
  EXPECT_GT(info["stored_bytes"].get<int64_t>(), 0);
}

TEST(CkptCli, InfoShowsStepsAndTheStepsItems) {
  testing::TempDir tmp;
  // A directory of steps whose steps are bare items (as StandardCheckpointer.save("ckpt/5") writes).
  for (const char* step : {"5", "9"}) {
    const std::string cmd = std::string(TESSEL_CKPT_HELPER) + " item " + (tmp.path() / step).string() + " none";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  Result bare = run("ckpt info " + tmp.path().string());
  ASSERT_EQ(bare.rc, 0) << bare.err;
  EXPECT_THAT(bare.out, HasSubstr("steps: 5, 9 (latest 9)"));
  EXPECT_THAT(bare.out, ::testing::Not(HasSubstr("items")));
  EXPECT_THAT(bare.out, HasSubstr("item " + (tmp.path() / "9").string()));
  // A step of named items beside a JSON item: each listed with what it holds.
  const fs::path step = tmp.path() / "run" / "3";
  fs::create_directories(step / "meta");
  tmp.write("run/3/meta/metadata", "{}");
  const std::string cmd = std::string(TESSEL_CKPT_HELPER) + " item " + (step / "items").string() + " none";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  Result named = run("ckpt info " + (tmp.path() / "run").string() + " --json");
  ASSERT_EQ(named.rc, 0) << named.err;
  auto j = nlohmann::json::parse(named.out);
  EXPECT_EQ(j["steps"], nlohmann::json::array({3}));
  ASSERT_EQ(j["items"].size(), 2u);
  EXPECT_EQ(j["items"][0]["name"], "items");
  EXPECT_EQ(j["items"][0]["holds_arrays"], true);
  EXPECT_EQ(j["items"][1]["name"], "meta");
  EXPECT_EQ(j["items"][1]["holds_arrays"], false);
  expect_one_line_error(run("ckpt info " + (tmp.path() / "run").string() + " --item meta"), 1, "holds no arrays");
}

TEST(CkptCli, RestoreOntoAnotherMeshReportsDevicesAndSpeed) {
  Written w;
  Result r = run("ckpt restore " + w.item.string() + " --mesh data=1,fsdp=4,tensor=2 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["devices"].size(), 8u);
  EXPECT_GT(j["target_bytes"].get<int64_t>(), 0);
  EXPECT_GT(j["peak_rss_bytes"].get<int64_t>(), 0);
  // Only some parameters, with the saved rules re-resolved for the new mesh.
  Result p = run("ckpt restore " + w.item.string() + " --mesh tensor=4 --paths token_embedder/embedding,extra/ints");
  ASSERT_EQ(p.rc, 0) << p.err;
  EXPECT_THAT(p.out, HasSubstr("restored 2 parameters"));
  expect_one_line_error(run("ckpt restore " + w.item.string() + " --mesh tensor=4 --paths nope"), 1, "'nope' is not in");
  // Rules that name an axis the mesh lacks fail naming the parameter.
  const fs::path rules = w.tmp.write("rules.yml", "logical_axis_rules: [[embed, fsdp]]\n");
  expect_one_line_error(run("ckpt restore " + w.item.string() + " --mesh tensor=4 --rules " + rules.string() +
                            " --paths extra/ints"),
                        1, "extra/ints");
}

TEST(CkptCli, VerifyFindsACorruptChunk) {
  Written w("files");
  ASSERT_EQ(run("ckpt verify " + w.item.string()).rc, 0);
  const fs::path chunk = w.item / "token_embedder.embedding" / "0.0";
  {
    std::fstream f(chunk, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    f.put('\x7f');
  }
  Result r = run("ckpt verify " + w.item.string());
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.out, HasSubstr("FAULT 'token_embedder/embedding' chunk 0.0"));
  EXPECT_THAT(r.err, HasSubstr("1 faults"));
}

TEST(CkptCli, ExportWritesNpyAndReshardWritesANewLayout) {
  Written w;
  const fs::path npy = w.tmp.path() / "ints.npy";
  Result e = run("ckpt export " + w.item.string() + " --path extra/ints --out " + npy.string());
  ASSERT_EQ(e.rc, 0) << e.err;
  const std::string bytes = testing::read_file(npy);
  EXPECT_EQ(bytes.substr(0, 6), "\x93NUMPY");
  EXPECT_THAT(bytes, HasSubstr("'descr': '<i4', 'fortran_order': False, 'shape': (5,7,3)"));
  EXPECT_EQ(bytes.size(), 128u + 5 * 7 * 3 * 4);
  const fs::path dst = w.tmp.path() / "resharded";
  Result s = run("ckpt reshard " + w.item.string() + " " + dst.string() + " --mesh fsdp=8 --paths decoder/decoder_norm/scale,token_embedder/embedding --compression zstd");
  ASSERT_EQ(s.rc, 0) << s.err;
  Result info = run("ckpt info --json " + dst.string());
  auto j = nlohmann::json::parse(info.out);
  ASSERT_EQ(j["params"].size(), 2u);
  EXPECT_EQ(j["params"][1]["compression"], "zstd:1");
  EXPECT_THAT(j["params"][1]["saved_sharding"].get<std::string>(), HasSubstr("Mesh(data=1, fsdp=8, tensor=1)"));
  expect_one_line_error(run("ckpt reshard " + w.item.string() + " " + dst.string() + " --mesh fsdp=8"), 1, "already exists");
  EXPECT_EQ(j["storage"], "OCDBT, zarr v2");
  // Into each other layout, and back.
  const fs::path files3 = w.tmp.path() / "files3";
  Result f = run("ckpt reshard " + w.item.string() + " " + files3.string() + " --mesh tensor=8 --storage files --zarr3");
  ASSERT_EQ(f.rc, 0) << f.err;
  EXPECT_TRUE(fs::exists(files3 / "token_embedder.embedding" / "zarr.json"));
  EXPECT_THAT(run("ckpt info " + files3.string()).out, HasSubstr("(files, zarr3)"));
  EXPECT_EQ(run("ckpt verify " + files3.string()).rc, 0);
  const fs::path back = w.tmp.path() / "back";
  ASSERT_EQ(run("ckpt reshard " + files3.string() + " " + back.string() + " --mesh data=2,fsdp=2,tensor=2").rc, 0);
  const fs::path a = w.tmp.path() / "a.npy", b = w.tmp.path() / "b.npy";
  ASSERT_EQ(run("ckpt export " + w.item.string() + " --path decoder/layers/1/mlp/wo/kernel --out " + a.string()).rc, 0);
  ASSERT_EQ(run("ckpt export " + back.string() + " --path decoder/layers/1/mlp/wo/kernel --out " + b.string()).rc, 0);
  EXPECT_EQ(testing::read_file(a), testing::read_file(b));
  expect_one_line_error(run("ckpt reshard " + w.item.string() + " " + (w.tmp.path() / "x").string() +
                            " --mesh fsdp=8 --storage tar"),
                        2, "--storage");
}

TEST(CkptCli, BadDirectoriesAndStepsAreNamed) {
  testing::TempDir tmp;
  expect_one_line_error(run("ckpt info " + (tmp.path() / "none").string()), 1, "does not exist");
  expect_one_line_error(run("ckpt info " + tmp.path().string()), 1, "holds no checkpoint");
  expect_one_line_error(run("ckpt verify " + tmp.path().string() + " --step 3"), 1, "holds no checkpoint");
  std::ofstream(tmp.path() / "notes.txt") << "not a checkpoint";
  expect_one_line_error(run("ckpt info " + (tmp.path() / "notes.txt").string()), 1,
                        "neither a checkpoint directory nor a .safetensors file");
}

// Orbax's own checkpoints: OCDBT with zarr v2 (a direct save) and zarr3 (a composite one, whose
// PyTree is the 'state' item).
TEST(CkptCli, ReadsOrbaxCheckpoints) {
  const std::string compat = testing::testdata("orbax/compat_checkpoints").string();
  Result r = run("ckpt info " + compat + "/v0_checkpoints/direct_checkpoint/checkpoint_metadata_present/"
                 "pytree_checkpointable_has_metadata");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("(OCDBT, zarr v2)"));
  EXPECT_THAT(r.out, HasSubstr("i32[8]"));
  const std::string v1 = compat + "/v1_checkpoints/composite_checkpoint/checkpoint_metadata_present/"
                         "pytree_checkpointable_has_metadata";
  r = run("ckpt info " + v1);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("/state (OCDBT, zarr3)"));
  EXPECT_THAT(r.out, HasSubstr("i32[3]"));
  r = run("ckpt verify " + v1);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("2 arrays, 2 chunks"));
  expect_one_line_error(run("ckpt verify " + compat + "/v0_checkpoints/direct_checkpoint/critical_metadata_alterations/"
                            "missing_pytree_data_dir_d"),
                        1, "/d/");}

}  // namespace
}  // namespace tessel

namespace tessel {
namespace {

// MaxText merges a model file's logical_axis_rules over base.yml's (llama2-7b.yml: norm -> fsdp);
// given the model file, a restore by MaxText's logical_shardings.json places as MaxText does.
TEST(CkptCli, LogicalAxesResolveWithTheRulesMaxTextMergesForTheModel) {
  const std::string base = testing::testdata("maxtext/base.yml").string();
  const std::string model = " --model " + testing::testdata("maxtext/models/llama2-7b.yml").string() + " --base " + base;
  const std::string tiny = " --set base_emb_dim=32 --set base_num_query_heads=4 --set base_num_kv_heads=4"
                           " --set head_dim=8 --set base_mlp_dim=64 --set base_num_decoder_layers=2 --set vocab_size=256";
  testing::TempDir dir;
  const fs::path run_dir = dir.path() / "run", dump = dir.path() / "dump";
  Result r = run("train" + model + tiny + " --batch 8 --seq 16 --mesh fsdp=8 --steps 1 --layout maxtext"
                 " --checkpoint-dir " + run_dir.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  r = run("plan" + model + tiny + " --mesh fsdp=2,tensor=4 --optimizer adamw --dump-shardings " + dump.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  auto specs = [&](const std::string& name, const std::string& target) {
    const fs::path dst = dir.path() / name;
    Result s = run("ckpt reshard " + run_dir.string() + " " + dst.string() + " --item items --mesh fsdp=2,tensor=4" + target);
    EXPECT_EQ(s.rc, 0) << s.err;
    std::map<std::string, std::string> out;
    Result info = run("ckpt info --json " + dst.string());
    EXPECT_EQ(info.rc, 0) << info.err;
    if (info.rc != 0) return out;
    const auto j = nlohmann::json::parse(info.out);
    for (const auto& p : j["params"]) out[p["path"]] = p["saved_sharding"];
    return out;
  };
  const auto by_model = specs("by_model", " --logical-axes " + (dump / "logical_shardings.json").string() + model + tiny);
  const auto named = specs("named", " --shardings " + (dump / "named_shardings.json").string() + model + tiny);
  const auto by_base = specs("by_base", " --logical-axes " + (dump / "logical_shardings.json").string() + " --rules " + base);
  ASSERT_GT(by_model.size(), 20u);
  EXPECT_EQ(by_model, named);
  // base.yml's rules alone put the norms elsewhere: the model file's rule is what placed them.
  ASSERT_EQ(by_base.size(), by_model.size());
  int norms = 0;
  for (const auto& [path, spec] : by_model) {
    if (by_base.at(path) == spec) continue;
    EXPECT_THAT(path, HasSubstr("norm")) << spec << " vs " << by_base.at(path);
    EXPECT_THAT(spec, HasSubstr("'fsdp'")) << path;
    ++norms;
  }
  EXPECT_GT(norms, 0);
  expect_one_line_error(run("ckpt reshard " + run_dir.string() + " " + (dir.path() / "x").string() +
                            " --item items --mesh fsdp=8 --model " + testing::testdata("maxtext/models/llama2-7b.yml").string()),
                        1, "give --base");
  expect_one_line_error(run("ckpt reshard " + run_dir.string() + " " + (dir.path() / "x").string() +
                            " --item items --mesh fsdp=8 --set vocab_size=256"),
                        1, "--set overrides a MaxText config");
}

}  // namespace
}  // namespace tessel
