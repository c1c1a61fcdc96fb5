// Conversions: the target ladder picks and places the leaves, restore reads a batch of them at a
// time straight into their blocks, a StateWriter writes them from there.
#include "tessel/checkpoint/convert.h"

#include <chrono>
#include <map>

#include "tessel/checkpoint/detail/orbax_layout.h"
#include "tessel/checkpoint/manager.h"
#include "tessel/core/error.h"
#include "tessel/runtime/cast.h"

namespace tessel {
namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The writer for `target` (abstract, keyed by the result's paths) in the format asked for.
std::unique_ptr<StateWriter> make_writer(CheckpointFormat format, const fs::path& dst, const State& target,
                                         const ConvertOptions& options, const std::optional<LogicalRules>& rules) {
  if (format == CheckpointFormat::kSafetensors) return std::make_unique<SafetensorsWriter>(dst, target, options.safetensors);
  SaveOptions save = options.orbax;
  save.rules = rules;
  if (!options.as_step) return std::make_unique<CheckpointWriter>(dst, target, save);
  // A CheckpointManager step, written inside `dst`'s temporary directory (step_root).
  save.checkpoint_metadata = false;
  const fs::path step_dir = dst / std::to_string(options.as_step->step);
  std::error_code ec;
  fs::create_directories(step_dir, ec);
  if (ec) throw IoError("cannot create '" + step_dir.string() + "': " + ec.message());
  return std::make_unique<CheckpointWriter>(step_dir / options.as_step->item, target, save);
}

// A directory of steps appears whole: written as `<dst>.orbax-checkpoint-tmp`, renamed at the end,
// removed on failure.
class StepRoot {
 public:
  explicit StepRoot(const fs::path& dst) : dst_(dst) {
    std::error_code ec;
    if (fs::exists(dst, ec)) throw IoError("cannot save to '" + dst.string() + "': it already exists");
    tmp_ = detail::begin_tmp_dir(dst);
  }
  ~StepRoot() {
    std::error_code ec;
    if (!committed_) fs::remove_all(tmp_, ec);
  }
  const fs::path& tmp() const { return tmp_; }
  void commit(bool durable) {
    detail::commit_tmp_dir(tmp_, dst_, durable, /*commit_file=*/false);
    committed_ = true;
  }

 private:
  fs::path dst_, tmp_;
  bool committed_ = false;
};

// A key map's conversion: each target tensor made on the host from its source tensors (restored
// onto one device), then written.
ConvertReport convert_mapped(const Runtime& rt, const CheckpointItem& src, const fs::path& dst,
                             const ConvertOptions& options, CheckpointFormat format) {
  const TargetSpec& spec = options.target;
  if (spec.mesh || !spec.specs.empty() || !spec.logical_axes.empty() || !spec.axis_map.empty() || !spec.paths.empty() ||
      !spec.shardings.empty() || options.as_step || !options.extra.empty()) {
    throw ValueError("a key map converts on one device: leave out the mesh, paths, shardings, logical axes, axis map "
                     "and step layout");
  }
  const auto t0 = std::chrono::steady_clock::now();
  State source = src.abstract_state();
  if (!spec.select.empty()) {
    State picked;
    for (const std::string& p : select_paths(source, spec.select)) picked.insert(p, source.at(p));
    source = std::move(picked);
  }
  const MapPlan plan = plan_key_map(*options.map, source);
  const Mesh host({{"host", 1}});
  const NamedSharding on_host(host, PartitionSpec{});
  State target;
  for (const auto& [path, v] : plan.target)
    target.insert(rename_path(path, spec.rename),
                  Variable::abstract(kParam, v.shape(), options.dtype.value_or(v.dtype()), on_host));
  std::unique_ptr<StateWriter> writer = make_writer(format, dst, target, options, std::nullopt);
  std::map<std::string, HostArray> cache;  // the sources of the last tensor (an unstacked source feeds several)
  RestoreOptions restore_options;
  restore_options.partial = true;
  restore_options.staging_bytes = options.staging_bytes;
  ConvertReport report;
  for (const MappedTensor& t : plan.tensors) {
    State wanted;
    for (const std::string& p : t.sources)
      if (!cache.contains(p))
        wanted.insert(p, Variable::abstract(kParam, source.at(p).shape(), source.at(p).dtype(), on_host));
    std::map<std::string, HostArray> next;
    for (const std::string& p : t.sources)
      if (auto it = cache.find(p); it != cache.end()) next.emplace(p, std::move(it->second));
    if (!wanted.empty())
      for (const auto& [p, v] : restore(rt, src, wanted, restore_options)) next.emplace(p, to_host(v.array()));
    cache = std::move(next);
    std::vector<const HostArray*> inputs;
    for (const std::string& p : t.sources) inputs.push_back(&cache.at(p));
    Array made = device_put(rt, apply_mapped(t, inputs), on_host);
    if (options.dtype) made = cast(made, *options.dtype);
    writer->write(rename_path(t.path, spec.rename), made);
    report.bytes += made.nbytes();
  }
  writer->commit();
  report.written = format;
  report.source_tensors = static_cast<int64_t>(source.size());
  report.tensors = static_cast<int64_t>(target.size());
  report.seconds = seconds_since(t0);
  report.map_forward = plan.forward;
  return report;
}

}  // namespace

CheckpointFormat convert_format(const CheckpointItem& src, const ConvertOptions& options) {
  if (options.to) return *options.to;
  return src.format() == StorageFormat::kSafetensors ? CheckpointFormat::kOrbax : CheckpointFormat::kSafetensors;
}

ConvertReport convert(const Runtime& rt, const CheckpointItem& src, const fs::path& dst, const ConvertOptions& options) {
  const CheckpointFormat format = convert_format(src, options);
  if (format == CheckpointFormat::kSafetensors && (options.as_step || !options.extra.empty()))
    throw ValueError("a step layout and extra leaves are Orbax's: safetensors holds tensors only");
  if (options.map) return convert_mapped(rt, src, dst, options, format);
  const auto t0 = std::chrono::steady_clock::now();
  TargetSpec spec = options.target;
  if (!spec.rules) spec.rules = src.metadata().rules;
  if (!spec.mesh) spec.mesh = one_device_mesh(spec.rules);
  State placed = make_target(src, spec, rt.device_count());
  if (options.dtype) {
    State cast;
    for (const auto& [path, v] : placed)
      cast.insert(path, Variable::abstract(v.kind(), v.shape(), *options.dtype, v.sharding(), v.partitioning()));
    placed = std::move(cast);
  }
  State target = rename_prefixes(placed, spec.rename);  // checks the renames before anything is written
  for (const ExtraLeaf& e : options.extra)
    target.insert(e.path, Variable::abstract(e.kind, e.value.shape(), e.value.dtype(), NamedSharding(*spec.mesh, {})));
  std::optional<StepRoot> root;
  if (options.as_step) root.emplace(dst);
  std::unique_ptr<StateWriter> writer = make_writer(format, root ? root->tmp() : dst, target, options, spec.rules);
  // A batch of tensors (at most batch_bytes, or one larger tensor) is restored, written from its
  // blocks and dropped before the next, so memory stays near the largest tensor.
  RestoreOptions restore_options;
  restore_options.partial = true;
  restore_options.staging_bytes = options.staging_bytes;
  ConvertReport report;
  int64_t batch_bytes = 0;
  State batch;
  auto flush = [&] {
    if (batch.empty()) return;
    for (const auto& [path, v] : restore(rt, src, batch, restore_options)) writer->write(rename_path(path, spec.rename), v.array());
    batch = State();
    batch_bytes = 0;
  };
  for (const auto& [path, v] : placed) {
    if (batch_bytes > 0 && batch_bytes + v.nbytes() > options.batch_bytes) flush();
    batch.insert(path, v);
    batch_bytes += v.nbytes();
    report.bytes += v.nbytes();
  }
  flush();
  for (const ExtraLeaf& e : options.extra) {
    const HostBlock whole{Box::full(e.value.shape()), e.value.bytes()};
    writer->write(e.path, std::span<const HostBlock>(&whole, 1));
  }
  writer->commit();
  if (root) {
    write_step_metadata(root->tmp() / std::to_string(options.as_step->step), {options.as_step->item});
    root->commit(options.orbax.durable);
  }
  report.written = format;
  report.source_tensors = static_cast<int64_t>(src.abstract_state().size());
  report.tensors = static_cast<int64_t>(placed.size());
  report.seconds = seconds_since(t0);
  return report;
}

}  // namespace tessel
