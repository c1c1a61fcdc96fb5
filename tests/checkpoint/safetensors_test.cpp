// safetensors: random states written (one file and sharded sets) and restored onto other meshes
// bit for bit through the same restore as Orbax items; headers validated as the format's own
// reader does, every bad one a clear error.
#include <fstream>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../runtime/runtime_test_util.h"
#include "../test_util.h"
#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/items.h"
#include "tessel/checkpoint/detail/store/safetensors_file.h"
#include "tessel/checkpoint/safetensors.h"
#include "tessel/checkpoint/target.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {
using detail::is_safetensors;
// The ladder on `mesh` for the item in `dir`.
State restore_target(const std::filesystem::path& dir, const Mesh& mesh, TargetSpec spec = {}) {
  spec.mesh = mesh;
  return make_target(CheckpointItem::open(dir), spec);
}

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::TempDir;

State random_state(std::mt19937& rng, const Runtime& rt, const Mesh& mesh, int leaves,
                   std::map<std::string, HostArray>& values) {
  State state;
  for (int i = 0; i < leaves; ++i) {
    const Shape shape = testing::random_shape(rng);
    HostArray h = testing::random_host(rng, shape, all_dtypes()[rng() % all_dtypes().size()]);
    const std::string path = "model/layers/" + std::to_string(i) + "/" + (i % 2 ? "mlp/up_proj" : "attn") + "/weight";
    const NamedSharding s(mesh, testing::random_spec(rng, mesh, shape.rank()));
    state.insert(path, Variable(kParam, device_put(rt, h, s)));
    values.emplace(path, std::move(h));
  }
  return state;
}

// A target of every saved tensor on `mesh`, each with a random spec.
State random_target(std::mt19937& rng, const fs::path& source, const Mesh& mesh) {
  State target;
  for (const auto& [path, v] : CheckpointItem::open(source).abstract_state())
    target.insert(path, Variable::abstract(kParam, v.shape(), v.dtype(),
                                           NamedSharding(mesh, testing::random_spec(rng, mesh, v.shape().rank()))));
  return target;
}

TEST(Safetensors, RandomStatesRoundTripOntoOtherMeshes) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(20261124);
  int sets = 0;
  for (int iter = 0; iter < 16; ++iter) {
    TempDir tmp;
    std::map<std::string, HostArray> values;
    const Mesh mesh = testing::random_mesh(rng);
    const State state = random_state(rng, rt, mesh, (iter % 2 ? 3 : 1) + static_cast<int>(rng() % 5), values);
    SafetensorsSaveOptions options;  // odd iterations: a file limit, 1 byte (a file per tensor) or a few hundred
    options.max_file_bytes = iter % 2 == 0 ? 0 : iter % 4 == 1 ? 1 : 64 + static_cast<int64_t>(rng() % 512);
    options.metadata = {{"format", "pt"}, {"iter", std::to_string(iter)}};
    save_safetensors(tmp.path() / "out", state, options);
    const bool set = fs::exists(tmp.path() / "out" / "model.safetensors.index.json");
    sets += set;
    EXPECT_EQ(set, !fs::exists(tmp.path() / "out" / "model.safetensors")) << iter;
    // The directory, the index or the single file: the same tensors.
    for (const fs::path& source : {tmp.path() / "out", set ? tmp.path() / "out" / "model.safetensors.index.json"
                                                           : tmp.path() / "out" / "model.safetensors"}) {
      ASSERT_TRUE(is_safetensors(source)) << source;
      EXPECT_EQ(find_item_dir(source), source);
      const ItemMetadata meta = read_item_metadata(source);
      EXPECT_EQ(meta.format, StorageFormat::kSafetensors);
      if (!set) EXPECT_EQ(meta.format_metadata.at("iter"), std::to_string(iter));
      const Mesh other = testing::random_mesh_over(rng, Mesh({{"all", 8}}));
      RestoreStats stats;
      const State got = restore(rt, source, random_target(rng, source, other), {}, &stats);
      ASSERT_EQ(got.size(), values.size());
      int64_t bytes = 0;
      for (const auto& [path, h] : values) {
        EXPECT_EQ(to_host(got.at(path).array()), h) << path << " from " << source;
        bytes += static_cast<int64_t>(h.bytes().size());
      }
      EXPECT_EQ(stats.bytes_read, bytes) << "each tensor byte is read once";
      EXPECT_TRUE(verify(CheckpointItem::open(source)).faults.empty());
    }
  }
  EXPECT_GE(sets, 4);
}

TEST(Safetensors, FileLayoutIsTheFormats) {
  Runtime rt = Runtime::host(4);
  TempDir tmp;
  State state;
  const Mesh mesh = Mesh::parse("x=2,y=2");
  state.insert("b/w", Variable(kParam, device_put(rt, testing::iota({3, 5}, DType::kI8), NamedSharding(mesh, {{}, {"y"}}))));
  state.insert("a", Variable(kParam, device_put(rt, testing::iota({4}, DType::kF64), NamedSharding(mesh, {{"x"}}))));
  save_safetensors(tmp.path() / "out", state, {.metadata = {{"format", "pt"}}});
  std::ifstream in(tmp.path() / "out" / "model.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ((8 + n) % 64, 0u) << "data starts 64-byte aligned (the format asks for 8)";
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  // The wider dtype first, so each tensor is aligned to its item size.
  EXPECT_EQ(header["a"]["dtype"], "F64");
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json::array({0, 32}));
  EXPECT_EQ(header["b.w"]["dtype"], "I8");
  EXPECT_EQ(header["b.w"]["shape"], nlohmann::json::array({3, 5}));
  EXPECT_EQ(header["b.w"]["data_offsets"], nlohmann::json::array({32, 47}));
  EXPECT_EQ(bytes.size(), 8 + n + 47);
  const HostArray b = testing::iota({3, 5}, DType::kI8);
  for (size_t i = 0; i < 15; ++i) EXPECT_EQ(static_cast<std::byte>(bytes[8 + n + 32 + i]), b.bytes()[i]) << i;
  EXPECT_FALSE(fs::exists(tmp.path() / "out.tmp"));
  EXPECT_THROW(save_safetensors(tmp.path() / "out", state), IoError);
  State dotted;
  dotted.insert("a.b/c", Variable(kParam, device_put(rt, testing::iota({2}), NamedSharding(mesh, {}))));
  EXPECT_THAT([&] { save_safetensors(tmp.path() / "dotted", dotted); },
              ::testing::ThrowsMessage<ValueError>(HasSubstr("'a.b' holds a '.'")));
}

// The writer pads each header so the data starts 64-byte aligned, whatever the header's length:
// a tensor at a multiple of 64 in the data (the first one at least) restores by mapping the file's
// bytes when a block is the whole tensor, as loading a model onto one device or replicated does.
TEST(Safetensors, TensorsAtAlignedOffsetsRestoreMapped) {
  Runtime rt = Runtime::host(8);
  std::mt19937 rng(20261128);
  const HostArray big = testing::random_host(rng, Shape{512, 1024}, DType::kF32);  // 2 MiB
  const HostArray odd = testing::random_host(rng, Shape{301}, DType::kF32);
  const HostArray after = testing::random_host(rng, Shape{1024, 256}, DType::kF32);  // 1 MiB, after `odd`
  const Mesh mesh = Mesh::parse("x=2");
  for (int iter = 0; iter < 6; ++iter) {
    TempDir tmp;
    State state;  // f32 tensors in name order: "a.big" at 0, "b.odd" at 2 MiB, "c.after" 301 floats later
    state.insert("a/big", Variable(kParam, device_put(rt, big, NamedSharding(mesh, {{"x"}}))));
    state.insert("b/odd", Variable(kParam, device_put(rt, odd, NamedSharding(mesh, {}))));
    state.insert("c/after", Variable(kParam, device_put(rt, after, NamedSharding(mesh, {}))));
    // Metadata of every length mod 64 moves where an unpadded data section would start.
    save_safetensors(tmp.path() / "out", state, {.metadata = {{"note", std::string(rng() % 200, 'x')}}});
    const fs::path file = tmp.path() / "out" / "model.safetensors";
    std::ifstream in(file, std::ios::binary);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(in.get())) << (8 * i);
    EXPECT_EQ((8 + n) % 64, 0u) << iter;
    State target;  // every tensor whole on every device of data=8
    const Mesh data8 = Mesh::parse("data=8");
    for (const auto& [path, h] : {std::pair{"a/big", &big}, {"b/odd", &odd}, {"c/after", &after}})
      target.insert(path, Variable::abstract(kParam, h->shape(), DType::kF32, NamedSharding(data8, {})));
    RestoreStats stats;
    const State got = restore(rt, file, target, {}, &stats);
    EXPECT_EQ(stats.bytes_mapped, int64_t{2} << 20) << "the first tensor maps; the one after 301 floats cannot";
    EXPECT_EQ(to_host(got.at("a/big").array()), big);
    EXPECT_EQ(to_host(got.at("b/odd").array()), odd);
    EXPECT_EQ(to_host(got.at("c/after").array()), after);
  }
}

std::string header_file(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json + data;
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

TEST(Safetensors, BadHeadersAreClearErrors) {
  TempDir tmp;
  const std::string ok = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  struct Case {
    std::string bytes, message;
  };
  const std::vector<Case> cases = {
      {"abc", "too short"},
      {std::string("\xff\xff\xff\xff\x00\x00\x00\x00", 8) + "{}", "more than safetensors' limit"},
      {std::string("\x40\x00\x00\x00\x00\x00\x00\x00", 8) + "{}", "a header of 64 bytes in a file of 10"},
      {header_file("[1]", ""), "JSON object"},
      {header_file("{\"w\":", ""), "invalid JSON"},
      {header_file(ok, "1234567"), "the file holds 7 data bytes"},
      {header_file(ok, "123456789"), "the file holds 9 data bytes"},
      {header_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "12345678"), "takes 12 bytes"},
      {header_file(R"({"w":{"dtype":"Q8","shape":[2],"data_offsets":[0,2]}})", "12"), "unknown safetensors dtype"},
      {header_file(R"({"w":{"dtype":"F8_E8M0","shape":[2],"data_offsets":[0,2]}})", "12"), "not supported by tessel yet"},
      {header_file(R"({"w":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}})", "12"), "negative"},
      {header_file(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[2,0]}})", "12"), "end before they begin"},
      {header_file(R"({"w":{"dtype":"U8","shape":[2]}})", "12"), "no \"data_offsets\""},
      {header_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", "123"),
       "a gap or an overlap"},
      {header_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", "1234"), "a gap or an overlap"},
      {header_file(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,2]}})", "12"), "more than 2^63"},
      {header_file(R"({"__metadata__":{"a":1}})", ""), "'a' is not a string"},
      {header_file(R"({"__metadata__":[1]})", ""), "__metadata__ is not an object or null"},
      {header_file(R"({"a..b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "1"), "not a path"},
      {header_file(R"({"a/b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "1"), "not a path"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const fs::path f = tmp.path() / ("bad" + std::to_string(i) + ".safetensors");
    write(f, cases[i].bytes);
    try {
      read_item_metadata(f);
      ADD_FAILURE() << "case " << i << " was accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(cases[i].message)) << "case " << i;
      EXPECT_THAT(e.what(), HasSubstr(f.filename().string())) << "case " << i << " names the file";
    }
  }
}

// The reference reader takes `__metadata__: null` as no metadata; such files are published.
TEST(Safetensors, NullMetadataIsNoMetadata) {
  TempDir tmp;
  const fs::path f = tmp.path() / "null.safetensors";
  write(f, header_file(R"({"__metadata__":null,"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", "\x01\x02"));
  const ItemMetadata m = read_item_metadata(f);
  EXPECT_TRUE(m.format_metadata.empty());
  ASSERT_EQ(m.params.size(), 1u);
  EXPECT_EQ(m.params.front().path, "w");
  const HostArray got = read_box(CheckpointItem::open(f), "w", Box::full(Shape({2})));
  EXPECT_EQ(got, HostArray::from<uint8_t>({2}, {1, 2}));
}

TEST(Safetensors, BadIndexesAreClearErrors) {
  TempDir tmp;
  write(tmp.path() / "a.safetensors", header_file(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "1"));
  write(tmp.path() / "b.safetensors", header_file(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "1"));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"weight_map": {"w": "../a.safetensors"}})", "'../a.safetensors'"},
      {R"({"weight_map": {"w": "missing.safetensors"}})", "missing.safetensors"},
      {R"({"weight_map": {"w": "a.safetensors", "v": "b.safetensors"}})", "is in both"},
      {R"({"weight_map": {"v": "a.safetensors"}})", "does not hold it"},
      {R"({"weight_map": []})", "no \"weight_map\" object"},
      {R"({"weight_map": {"w": 3}})", "is not a file name"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const fs::path f = tmp.path() / ("i" + std::to_string(i) + ".safetensors.index.json");
    write(f, cases[i].first);
    EXPECT_THAT([&] { read_item_metadata(f); }, ::testing::ThrowsMessage<Error>(HasSubstr(cases[i].second))) << i;
  }
  // A file that is neither: not taken for safetensors at all.
  EXPECT_FALSE(is_safetensors(tmp.path() / "nothing.safetensors"));
  EXPECT_THROW(find_item_dir(tmp.path() / "a.safetensors", 3), ValueError);
}

TEST(Safetensors, AFileCutShortIsAnErrorNamingIt) {
  Runtime rt = Runtime::host(2);
  TempDir tmp;
  // Cut after the target was planned from it.
  write(tmp.path() / "cut.safetensors", header_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                                                    std::string(16, '\x01')));
  const State target = restore_target(tmp.path() / "cut.safetensors", Mesh::parse("x=2"));
  fs::resize_file(tmp.path() / "cut.safetensors", fs::file_size(tmp.path() / "cut.safetensors") - 4);
  EXPECT_THAT([&] { restore(rt, tmp.path() / "cut.safetensors", target); },
              ::testing::ThrowsMessage<Error>(HasSubstr("cut.safetensors")));
}

TEST(Safetensors, AWriterTakesOneTensorAtATime) {
  Runtime rt = Runtime::host(4);
  std::mt19937 rng(7);
  TempDir tmp;
  std::map<std::string, HostArray> values;
  const Mesh mesh = Mesh::parse("x=4");
  const State state = random_state(rng, rt, mesh, 5, values);
  {
    SafetensorsWriter w(tmp.path() / "out", state.to_abstract(), {.max_file_bytes = 64});
    std::vector<std::string> paths = state.paths();
    std::reverse(paths.begin(), paths.end());  // any order
    for (size_t i = 0; i + 1 < paths.size(); ++i) w.write(paths[i], state.at(paths[i]).array());
    for (size_t i = 0; i + 1 < paths.size(); ++i) {  // again, one with elements (an empty one has no blocks)
      if (state.at(paths[i]).shape().num_elements() == 0) continue;
      EXPECT_THAT([&] { w.write(paths[i], state.at(paths[i]).array()); },
                  ::testing::ThrowsMessage<ValueError>(HasSubstr("given twice")));
      break;
    }
    EXPECT_THAT([&] { w.write("nope", state.at(paths[0]).array()); },
                ::testing::ThrowsMessage<ValueError>(HasSubstr("not one of the tensors")));
    EXPECT_THAT([&] { w.commit(); }, ::testing::ThrowsMessage<ValueError>(HasSubstr("never written")));
    EXPECT_TRUE(fs::exists(tmp.path() / "out.tmp"));
  }
  EXPECT_FALSE(fs::exists(tmp.path() / "out.tmp")) << "an abandoned writer leaves nothing";
  EXPECT_FALSE(fs::exists(tmp.path() / "out"));
  SafetensorsWriter w(tmp.path() / "out", state.to_abstract(), {.max_file_bytes = 64});
  for (const auto& [path, v] : state) w.write(path, v.array());
  w.commit();
  const State got = restore(rt, tmp.path() / "out", random_target(rng, tmp.path() / "out", Mesh::parse("y=2,z=2")));
  for (const auto& [path, h] : values) EXPECT_EQ(to_host(got.at(path).array()), h) << path;
}

TEST(CheckpointWriterTest, AnOrbaxItemOneArrayAtATime) {
  Runtime rt = Runtime::host(4);
  std::mt19937 rng(8);
  for (bool ocdbt : {true, false}) {
    TempDir tmp;
    std::map<std::string, HostArray> values;
    const Mesh mesh = Mesh::parse("x=2,y=2");
    const State state = random_state(rng, rt, mesh, 5, values);
    {
      CheckpointWriter w(tmp.path() / "item", state.to_abstract(), {.use_ocdbt = ocdbt});
      std::string first = state.paths().front();  // one with elements: an empty leaf has no blocks
      for (const auto& [path, v] : state)
        if (v.shape().num_elements() > 0) {
          first = path;
          break;
        }
      w.write(first, state.at(first).array());
      EXPECT_THAT([&] { w.write(first, state.at(first).array()); },
                  ::testing::ThrowsMessage<ValueError>(HasSubstr("given twice")));
      EXPECT_THAT([&] { w.commit(); }, ::testing::ThrowsMessage<ValueError>(HasSubstr("never written")));
    }
    EXPECT_TRUE(fs::is_empty(tmp.path())) << "an abandoned writer leaves nothing";
    CheckpointWriter w(tmp.path() / "item", state.to_abstract(), {.compression = Compression::zstd(), .use_ocdbt = ocdbt});
    std::vector<std::string> paths = state.paths();
    std::reverse(paths.begin(), paths.end());
    for (const std::string& p : paths) w.write(p, state.at(p).array());
    w.commit();
    EXPECT_TRUE(verify(CheckpointItem::open(tmp.path() / "item")).faults.empty());
    const State got = restore(rt, tmp.path() / "item", random_target(rng, tmp.path() / "item", Mesh::parse("z=4")));
    for (const auto& [path, h] : values) EXPECT_EQ(to_host(got.at(path).array()), h) << path;
    // The same item as save() writes, file for file.
    save(tmp.path() / "saved", state, {.compression = Compression::zstd(), .use_ocdbt = ocdbt});
    EXPECT_EQ(read_item_metadata(tmp.path() / "item").params.size(), read_item_metadata(tmp.path() / "saved").params.size());
  }
}

}  // namespace
}  // namespace tessel
