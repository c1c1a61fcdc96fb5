// tessel ckpt: inspect, verify, restore, export, reshard and convert checkpoints (Orbax PyTree
// items and safetensors files or sets).
#include <chrono>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/convert.h"
#include "tessel/checkpoint/key_map.h"
#include "tessel/checkpoint/manager.h"
#include "tessel/checkpoint/safetensors.h"
#include "tessel/checkpoint/target.h"
#include "tessel/core/error.h"
#include "tessel/detail/text_util.h"
#include "tessel/models/maxtext_checkpoint.h"
#include "tessel/nn/optimizer.h"
#include "tessel/runtime/cast.h"
#include "tessel/runtime/device.h"
#include "tessel/sharding/rules_io.h"
#include "tessel/state/init.h"

namespace tessel::cli {
namespace {
namespace fs = std::filesystem;

struct CkptArgs {
  std::string dir, dst, mesh, paths, path, out, compression = "none", to, dtype;
  ModelArgs model;                                 // --rules, or a MaxText model's merged rules
  std::string logical_axes, shardings, axis_map;  // targets for foreign checkpoints
  std::string select, rename;                      // subtrees, and where they go
  std::string map, map_vars;                       // convert: a key map between two trees
  int64_t max_file_mb = 0;
  std::optional<int64_t> step;
  std::optional<std::string> item;
  bool json = false;
  int64_t staging_mb = 256;
  int64_t memory_mb = 128;  // convert: tensors (or a map's pieces) in flight
  RuntimeArgs runtime;
  StorageArgs storage;
};

std::string spec_text(const ParamMetadata& p) {
  if (!p.sharding) return "-";
  return p.sharding->spec.to_string() + " on " + p.sharding->mesh.to_string();
}

std::string logical_text(const Partitioning& p) {
  if (p.mesh_axes) return "mesh " + p.mesh_axes->to_string();
  if (p.logical.empty()) return "-";
  std::string s = "(";
  for (size_t i = 0; i < p.logical.size(); ++i) s += (i ? ", " : "") + (p.logical[i] ? *p.logical[i] : "None");
  return s + ")";
}

// "StandardCheckpointHandler" for "orbax.checkpoint._src.handlers.standard_checkpoint_handler.StandardCheckpointHandler".
std::string short_handler(const std::string& handler) {
  const size_t dot = handler.rfind('.');
  return dot == std::string::npos ? handler : handler.substr(dot + 1);
}

void info(const CkptArgs& a) {
  nlohmann::json j;
  std::string text;
  const Location root(a.dir);
  const CheckpointItem opened = CheckpointItem::find(root, a.step, a.item);
  const Location& item = opened.dir();
  // The steps of DIR and the items of the item's step, unless DIR is the item itself, or the
  // step is one bare item.
  if (item != root) {
    const std::vector<int64_t> steps = list_steps(root);
    if (!steps.empty()) {
      j["steps"] = steps;
      text += fmt::format("steps: {} (latest {})\n", fmt::join(steps, ", "), steps.back());
    }
    const Location step_dir = item.parent();
    if (step_dir != root || steps.empty()) {
      j["items"] = nlohmann::json::array();
      std::vector<std::string> lines;
      for (const ItemInfo& i : list_items(step_dir)) {
        j["items"].push_back({{"name", i.name}, {"handler", i.handler}, {"holds_arrays", i.holds_arrays}});
        lines.push_back(fmt::format("  {} ({}{}){}", i.name, i.holds_arrays ? "arrays" : "json",
                                    i.handler.empty() ? "" : ", " + short_handler(i.handler),
                                    step_dir / i.name == item ? "  <- shown" : ""));
      }
      text += fmt::format("{}: items\n{}\n", step_dir.string(), fmt::join(lines, "\n"));
    }
  }
  j["item"] = item.string();
  const std::string storage = opened.storage();
  j["storage"] = storage;
  text += fmt::format("item {} ({})\n", item.string(), storage);
  text += fmt::format("{:<48} {:<16} {:<14} {:>12}  {:<8} {}\n", "parameter", "type", "chunks", "stored", "codec",
                      "saved sharding / logical axes");
  int64_t total = 0;
  j["params"] = nlohmann::json::array();
  for (const auto& p : opened.describe()) {
    total += p.stored_bytes;
    j["params"].push_back({{"path", p.param.path},
                           {"name", p.param.name},
                           {"dtype", std::string(name(p.dtype))},
                           {"shape", p.shape.dims()},
                           {"chunk_shape", p.chunks.dims()},
                           {"num_chunks", p.num_chunks},
                           {"stored_bytes", p.stored_bytes},
                           {"compression", p.compression.to_string()},
                           {"saved_sharding", spec_text(p.param)},
                           {"logical_axes", logical_text(p.param.partitioning)}});
    text += fmt::format("{:<48} {:<16} {:<14} {:>12}  {:<8} {} | {}\n", p.param.path, type_string(p.dtype, p.shape),
                        p.chunks.to_string() + "x" + std::to_string(p.num_chunks), text_util::format_bytes(p.stored_bytes),
                        p.compression.to_string(), spec_text(p.param), logical_text(p.param.partitioning));
  }
  j["stored_bytes"] = total;
  text += fmt::format("total stored: {}\n", text_util::format_bytes(total));
  std::cout << (a.json ? j.dump(2) + "\n" : text);
}

void verify_command(const CkptArgs& a) {
  const CheckpointItem opened = CheckpointItem::find(a.dir, a.step, a.item);
  const Location& item = opened.dir();
  const VerifyReport r = verify(opened);
  for (const auto& f : r.faults) std::cout << "FAULT " << f << "\n";
  std::cout << fmt::format("{}: {} arrays, {} chunks, {} read, {} checksums compared, {} faults\n", item.string(), r.arrays,
                           r.chunks, text_util::format_bytes(r.bytes), r.checksums, r.faults.size());
  if (r.unchecked > 0) {
    std::cout << fmt::format("not checked: {} of the {} chunks have no checksum (Orbax writes none; tessel writes a "
                             "CRC-32C per chunk): they were read and decoded, but a flipped byte in them goes "
                             "unnoticed\n",
                             r.unchecked, r.chunks);
  }
  if (!r.faults.empty()) throw Error(fmt::format("{} faults in '{}'", r.faults.size(), item.string()));
}

std::vector<std::string> select_patterns(const CkptArgs& a) {
  std::vector<std::string> out;
  for (auto p : text_util::split_commas(a.select)) out.emplace_back(p);
  return out;
}

struct Target {
  Mesh mesh;
  State state;
  std::optional<LogicalRules> rules;
  TargetSpec spec;
};

// A MaxText model's rules as MaxText merges them for it (base.yml's, the model file's, --rules as
// a custom mesh-and-rule file), else --rules, else the rules saved with the checkpoint.
std::optional<LogicalRules> target_rules(const CkptArgs& a, const CheckpointItem& item) {
  if (!a.model.model.empty() || !a.model.base.empty()) {
    if (a.model.base.empty())
      throw ValueError("--model here is MaxText's model file, whose rules place the target: give --base (MaxText's base.yml) too");
    const ModelConfig model = load_model(a.model);
    return std::get<MaxTextConfig>(model.config).rules;
  }
  if (!a.model.sets.empty()) throw ValueError("--set overrides a MaxText config: give --model and --base too");
  if (!a.model.rules.empty()) return load_rules(a.model.rules);
  return item.metadata().rules;
}

// The target of a restore onto --mesh (see make_target): the rules given, else the saved ones,
// also declare the mesh's axis order; no --mesh: one device.
TargetSpec target_spec(const CkptArgs& a, const CheckpointItem& item) {
  TargetSpec spec;
  spec.rules = target_rules(a, item);
  const bool declared = spec.rules && !spec.rules->mesh_axes().empty();
  spec.mesh = a.mesh.empty() ? one_device_mesh(spec.rules)
              : declared     ? Mesh::parse(a.mesh, spec.rules->mesh_axes())
                             : Mesh::parse(a.mesh);
  if (!a.shardings.empty()) spec.specs = load_target_specs(a.shardings);
  if (!a.logical_axes.empty()) spec.logical_axes = load_target_logical_axes(a.logical_axes);
  spec.axis_map = parse_axis_map(a.axis_map);
  if (!a.paths.empty()) {
    for (auto w : text_util::split_commas(a.paths)) spec.paths.emplace_back(w);
  }
  if (!a.select.empty()) spec.select = select_patterns(a);
  return spec;
}

Target make_target(const CkptArgs& a, const CheckpointItem& item) {
  TargetSpec spec = target_spec(a, item);
  State target = tessel::make_target(item, spec);
  return {*spec.mesh, std::move(target), spec.rules, spec};
}

int64_t peak_rss() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

Runtime runtime_for(const CkptArgs& a, const Mesh& mesh) {
  RuntimeArgs r = a.runtime;
  if (!r.devices) r.devices = mesh.device_count();
  return make_runtime(r);
}

// The target's leaves (only those of --paths when given) restored onto its mesh.
State restore_onto(const CkptArgs& a, const Runtime& rt, const CheckpointItem& item, const Target& t, RestoreStats& stats) {
  RestoreOptions options;
  options.staging_bytes = a.staging_mb << 20;
  options.partial = !a.paths.empty() || !a.select.empty();
  return restore(rt, item, t.state, options, &stats);
}

void restore_command(const CkptArgs& a) {
  const CheckpointItem opened = CheckpointItem::find(a.dir, a.step, a.item);
  const Location& item = opened.dir();
  Target t = make_target(a, opened);
  Runtime rt = runtime_for(a, t.mesh);
  RestoreStats stats;
  State state = restore_onto(a, rt, opened, t, stats);
  const double gbps = stats.seconds > 0 ? static_cast<double>(stats.target_bytes) / stats.seconds / 1e9 : 0;
  nlohmann::json j{{"item", item.string()},
                   {"mesh", t.mesh.to_string()},
                   {"params", state.size()},
                   {"target_bytes", stats.target_bytes},
                   {"bytes_read", stats.bytes_read},
                   {"chunks_read", stats.chunks_read},
                   {"staging_peak_bytes", stats.staging_peak},
                   {"peak_rss_bytes", peak_rss()},
                   {"seconds", stats.seconds},
                   {"gb_per_s", gbps}};
  j["devices"] = nlohmann::json::array();
  std::string text = fmt::format("restored {} parameters from {} onto {}\n", state.size(), item.string(), t.mesh.to_string());
  text += fmt::format("{:>8} {:>14} {:>14}\n", "device", "bytes", "peak");
  for (int64_t d : t.mesh.device_ids()) {
    const auto m = rt.device(d).memory_stats();
    j["devices"].push_back({{"device", d}, {"bytes", m.in_use}, {"peak", m.peak}});
    text += fmt::format("{:>8} {:>14} {:>14}\n", d, text_util::format_bytes(m.in_use), text_util::format_bytes(m.peak));
  }
  text += fmt::format("{} into devices ({} read from {} chunks) in {:.3f} s: {:.2f} GB/s; staging peak {}, process peak RSS {}\n",
                      text_util::format_bytes(stats.target_bytes), text_util::format_bytes(stats.bytes_read),
                      stats.chunks_read, stats.seconds, gbps, text_util::format_bytes(stats.staging_peak),
                      text_util::format_bytes(peak_rss()));
  std::cout << (a.json ? j.dump(2) + "\n" : text);
}

// The .npy header's descr: NumPy's type string (bfloat16 has none).
std::string npy_descr(DType d) {
  if (d == DType::kBF16) throw ValueError("bfloat16 has no NumPy dtype");
  return std::string(numpy_typestr(d));
}

void export_command(const CkptArgs& a) {
  const CheckpointItem item = CheckpointItem::find(a.dir, a.step, a.item);
  State saved = item.abstract_state();
  const Variable& v = saved.at(a.path);
  // NumPy has no bfloat16: such a parameter is exported as float32 (exactly).
  const DType dtype = v.dtype() == DType::kBF16 ? DType::kF32 : v.dtype();
  Runtime rt = Runtime::host(1);
  State target;
  target.insert(a.path, Variable::abstract(v.kind(), v.shape(), dtype, NamedSharding(Mesh({{"host", 1}}), {})));
  RestoreOptions options;
  options.partial = true;
  State one = restore(rt, item, target, options);
  HostArray host = to_host(one.at(a.path).array());
  std::string shape;
  for (int64_t d : v.shape()) shape += std::to_string(d) + ",";
  if (v.shape().rank() > 1) shape.pop_back();
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", npy_descr(dtype), shape);
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  std::ofstream out(a.out, std::ios::binary);
  if (!out) throw IoError("cannot write '" + a.out + "'");
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.put(static_cast<char>(len & 0xFF));
  out.put(static_cast<char>(len >> 8));
  out << header;
  out.write(reinterpret_cast<const char*>(host.bytes().data()), static_cast<std::streamsize>(host.nbytes()));
  if (!out.flush()) throw IoError("cannot write '" + a.out + "'");
  std::cout << fmt::format("{} {} -> {}{}\n", a.path, type_string(v.dtype(), v.shape()), a.out,
                           v.dtype() == DType::kBF16 ? " (as float32: NumPy has no bfloat16)" : "");
}

SaveOptions orbax_options(const CkptArgs& a, const std::optional<LogicalRules>& rules) {
  SaveOptions options;
  options.compression = Compression::parse(a.compression);
  options.rules = rules;
  apply_storage(a.storage, options);
  return options;
}

void save_orbax(const CkptArgs& a, const State& state, const std::optional<LogicalRules>& rules) {
  save(a.dst, state, orbax_options(a, rules));
}

void reshard_command(const CkptArgs& a) {
  const CheckpointItem item = CheckpointItem::find(a.dir, a.step, a.item);
  Target t = make_target(a, item);
  Runtime rt = runtime_for(a, t.mesh);
  RestoreStats stats;
  State state = rename_prefixes(restore_onto(a, rt, item, t, stats), parse_renames(a.rename));
  auto t0 = std::chrono::steady_clock::now();
  save_orbax(a, state, t.rules);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << fmt::format("{} parameters ({}) restored onto {} in {:.3f} s and saved to {} in {:.3f} s\n", state.size(),
                           text_util::format_bytes(stats.target_bytes), t.mesh.to_string(), stats.seconds, a.dst, s);
}

// The conversion's options from the command line; the library does the work (checkpoint/convert.h).
ConvertOptions convert_options(const CkptArgs& a, const CheckpointItem& item) {
  ConvertOptions o;
  if (a.to == "orbax") o.to = CheckpointFormat::kOrbax;
  if (a.to == "safetensors") o.to = CheckpointFormat::kSafetensors;
  if (!a.dtype.empty()) o.dtype = parse_dtype(a.dtype);
  TargetSpec& spec = o.target;
  if (!a.map.empty()) {
    if (!a.paths.empty() || !a.axis_map.empty())
      throw ValueError("--map picks its tensors by its rules and --select: leave out --paths and --axis-map");
    o.map = load_key_map(a.map, parse_map_vars(a.map_vars));
    // --mesh, --shardings and --logical-axes place the map's targets (an Orbax item records them).
    if (!a.mesh.empty() || !a.shardings.empty() || !a.logical_axes.empty()) spec = target_spec(a, item);
  } else {
    spec = target_spec(a, item);
  }
  if (!a.select.empty()) spec.select = select_patterns(a);
  spec.rename = parse_renames(a.rename);
  o.orbax = orbax_options(a, std::nullopt);
  o.safetensors = SafetensorsSaveOptions{.max_file_bytes = a.max_file_mb << 20, .metadata = {{"format", "pt"}}};
  o.staging_bytes = std::min<int64_t>(a.staging_mb << 20, int64_t{64} << 20);
  o.batch_bytes = a.memory_mb << 20;
  return a.to == "maxtext-params" ? maxtext_params_conversion(item, std::move(o)) : o;
}

void convert_command(const CkptArgs& a) {
  const CheckpointItem item = CheckpointItem::find(a.dir, a.step, a.item);
  const ConvertOptions o = convert_options(a, item);
  Runtime rt = runtime_for(a, o.target.mesh ? *o.target.mesh : one_device_mesh(o.target.rules));
  const ConvertReport r = convert(rt, item, a.dst, o);
  const std::string to = r.written == CheckpointFormat::kSafetensors ? "safetensors" : "orbax";
  if (r.map_forward) {
    std::cout << fmt::format("{} source tensors mapped {} by {} to {} {} tensors in {} in {:.3f} s, peak RSS {}\n",
                             r.source_tensors, *r.map_forward ? "forward" : "backward", a.map, r.tensors, to, a.dst,
                             r.seconds, text_util::format_bytes(peak_rss()));
    return;
  }
  const std::string as = a.to == "maxtext-params" ? "MaxText's parameter-only checkpoint (step 0, item 'items')"
                         : to == "orbax"          ? "an Orbax item"
                                                  : to;
  std::cout << fmt::format("{} tensors ({}) from {} written as {} to {} in {:.3f} s, peak RSS {}\n", r.tensors,
                           text_util::format_bytes(r.bytes), item.dir().string(), as, a.dst, r.seconds,
                           text_util::format_bytes(peak_rss()));
}

}  // namespace

void add_ckpt_command(CLI::App& app) {
  auto args = std::make_shared<CkptArgs>();
  CLI::App* ckpt = app.add_subcommand(
      "ckpt", "Inspect, verify, restore, export, reshard and convert checkpoints (Orbax items, safetensors)");
  ckpt->require_subcommand(1);
  auto common = [&](CLI::App* c) {
    location_option(c->add_option("dir", args->dir,
                                  "A checkpoint: an Orbax item, step directory or directory of steps; or a .safetensors "
                                  "file, a .safetensors.index.json or a directory holding model.safetensors[.index.json]; "
                                  "local, or in a bucket (s3://bucket/prefix, gs://bucket/prefix)"))
        ->required();
    c->add_option("--step", args->step, "Step to use in a directory of steps (default: the latest)");
    c->add_option("--item", args->item, "Item of the step to use (default: its only PyTree item)");
  };
  auto mesh_opts = [&](CLI::App* c, bool required = true) {
    auto* m = c->add_option("--mesh", args->mesh, required ? "Target mesh, e.g. data=2,tensor=4"
                                                           : "Mesh to restore onto on the way (default: one device)");
    if (required) m->required();
    add_model_options(c, args->model,
                      "MaxText's model file (with --base): the rules MaxText merges for it resolve --logical-axes "
                      "and the saved logical axes",
                      "Logical axis rules (default: the rules saved with the checkpoint); with --model, MaxText's "
                      "custom mesh-and-rule file");
    c->add_option("--paths", args->paths, "Only these parameters (comma-separated paths)");
    c->add_option("--select", args->select,
                  "Only the parameters matching these globs (comma-separated; '.' or '/' between levels), "
                  "e.g. 'params.params.decoder.*'");
    path_option(c->add_option("--shardings", args->shardings,
                               "Target specs by path: JSON {path: spec} or MaxText's named_shardings.json"))
        ->check(CLI::ExistingFile);
    path_option(c->add_option("--logical-axes", args->logical_axes,
                               "Target logical axes by path (MaxText's logical_shardings.json), resolved with --rules"))
        ->check(CLI::ExistingFile);
    c->add_option("--axis-map", args->axis_map, "Saved mesh axes onto target axes: old=new,... (old= drops one, *= every axis the mesh lacks)");
    c->add_option("--staging-mb", args->staging_mb, "Host staging budget for chunk decoding, MiB")->check(CLI::PositiveNumber);
    add_runtime_options(c, args->runtime);
  };
  CLI::App* i = ckpt->add_subcommand("info", "Steps, items and per parameter shape, dtype, chunks, bytes, sharding");
  common(i);
  i->add_flag("--json", args->json, "JSON output");
  i->callback([args] { info(*args); });
  CLI::App* v = ckpt->add_subcommand("verify", "Read every chunk and check sizes, decoding and CRC-32C");
  common(v);
  v->callback([args] { verify_command(*args); });
  CLI::App* r = ckpt->add_subcommand("restore", "Restore onto virtual devices and report bytes, peak memory and speed");
  common(r);
  mesh_opts(r);
  r->add_flag("--json", args->json, "JSON output");
  r->callback([args] { restore_command(*args); });
  CLI::App* e = ckpt->add_subcommand("export", "Write one parameter as a NumPy .npy file");
  common(e);
  e->add_option("--path", args->path, "Parameter path, e.g. decoder/layers/mlp/wo/kernel")->required();
  path_option(e->add_option("--out", args->out, "Output .npy file"))->required();
  e->callback([args] { export_command(*args); });
  CLI::App* s = ckpt->add_subcommand("reshard", "Restore onto a mesh and save for that layout");
  common(s);
  location_option(s->add_option("dst", args->dst, "New checkpoint directory (must not exist), local or s3://, gs://bucket/prefix"))
      ->required();
  mesh_opts(s);
  s->add_option("--compression", args->compression, "none, zstd or zstd:<level>");
  add_storage_options(s, args->storage);
  s->add_option("--rename", args->rename, "Move subtrees: old=new prefixes ('params.params=' strips one)");
  s->callback([args] { reshard_command(*args); });
  CLI::App* c = ckpt->add_subcommand(
      "convert",
      "Orbax <-> safetensors, the source's format detected.\n"
      "  tessel ckpt convert hf_model/ ckpt/params             # safetensors -> Orbax item\n"
      "  tessel ckpt convert ckpt/7 out/ --max-file-mb 4096      # Orbax -> model-0000i-of-0000N.safetensors");
  common(c);
  location_option(c->add_option("dst", args->dst,
                                "New directory (must not exist), local or s3://, gs://bucket/prefix: an Orbax item, or a "
                                "Hugging Face model directory"))
      ->required();
  c->add_option("--to", args->to,
                 "orbax, safetensors (default: the other format) or maxtext-params: MaxText's parameter-only "
                 "checkpoint as generate_param_only_checkpoint writes it (DST/0/items: params/params/... in "
                 "bfloat16 unless --dtype, step, an empty opt_state), from a tessel or MaxText train state")
      ->check(CLI::IsMember({"orbax", "safetensors", "maxtext-params"}));
  c->add_option("--dtype", args->dtype, "Cast every tensor to this dtype (e.g. bf16, f32)");
  c->add_option("--max-file-mb", args->max_file_mb, "safetensors: files of at most this many MiB, with an index")
      ->check(CLI::NonNegativeNumber);
  mesh_opts(c, false);
  c->add_option("--compression", args->compression, "Orbax: none, zstd or zstd:<level>");
  add_storage_options(c, args->storage);
  c->add_option("--rename", args->rename, "Move subtrees: old=new prefixes ('params.params=' strips one)");
  path_option(c->add_option("--map", args->map,
                            "Key map between two trees (YAML: rename by patterns, transpose, split, interleave, stack "
                            "layers, scale), applied forward or backward as the source's names match; see examples/maps/"))
      ->check(CLI::ExistingFile);
  c->add_option("--map-var", args->map_vars, "Values for the map's {names}: NAME=VALUE,...");
  c->add_option("--memory-mb", args->memory_mb,
                "Host memory for the tensors in flight, MiB (default 128): a batch of tensors, or of a map's pieces "
                "(a stacked tensor's slab), at a time; a larger one alone")
      ->check(CLI::PositiveNumber);
  c->callback([args] { convert_command(*args); });
}

}  // namespace tessel::cli
