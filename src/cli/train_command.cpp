// tessel train: the main job. Trains a model on virtual devices with data, FSDP and tensor
// parallelism falling out of the mesh and the logical axis rules; checkpoints with the train
// state's shardings and resumes onto any mesh with the same data position.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/items.h"
#include "tessel/checkpoint/manager.h"
#include "tessel/core/error.h"
#include "tessel/detail/text_util.h"
#include "tessel/models/maxtext.h"
#include "tessel/models/maxtext_checkpoint.h"
#include "tessel/models/train.h"
#include "tessel/runtime/process_group.h"
#include "tessel/sharding/rules_io.h"
#include "tessel/models/model_config.h"
#include "tessel/state/plan.h"

namespace tessel::cli {
namespace {

// The built-in model: a small byte-level LM that learns visibly within a minute on 2 cores.
constexpr const char* kDefaultModel = R"(model: transformer
vocab: 256
embed: 128
layers: 4
heads: 4
mlp: 512
)";

struct TrainArgs {
  ModelArgs model;
  std::string mesh = "data=2,fsdp=2,tensor=2", layout = "tessel", data, checkpoint_dir, metrics, optimizer = "adamw";
  std::string init_from;
  int64_t steps = 300, batch = 16, seq = 128, warmup = 20, checkpoint_every = 0, log_every = 10, keep = 3;
  double lr = 3e-3, clip = 1.0, weight_decay = 0.1;
  uint64_t seed = 0;
  std::optional<int64_t> stop_at;
  bool resume = false;
  RuntimeArgs runtime;
  StorageArgs storage;
};

std::string duration(double seconds) {
  const auto s = static_cast<int64_t>(std::max(0.0, std::round(seconds)));
  return fmt::format("{}:{:02d}", s / 60, s % 60);
}

// The parameters of the checkpoint at `path` placed as `abstract`'s parameters, and a fresh
// optimizer state: the start of a fine-tuning run.
State init_from_checkpoint(const Runtime& rt, const models::Trainer& t, const State& abstract, const std::string& path,
                           std::string* note) {
  const CheckpointItem item = CheckpointItem::find(path);
  const State params = std::get<0>(abstract.split(Filter::kind(kParam), Filter::all()));
  std::string where;
  State placed;
  try {
    placed = params_from_checkpoint(rt, item, params, &where);
  } catch (const ValueError& e) {
    throw ValueError(fmt::format("--init-from {}", e.what()));
  }
  *note = fmt::format("  initialized {} parameters from {}{}\n", params.size(), item.dir().string(), where);
  return State::merge({placed, nn::init_optimizer(t.optimizer(), placed)});
}

std::string plan_summary(const models::Trainer& t, const State& abstract, const TrainArgs& a) {
  auto [params, opt] = abstract.split(Filter::kind(kParam), Filter::all());
  PlanOptions po;
  po.optimizer = a.optimizer == "sgd" ? Optimizer::kSgdMomentum : Optimizer::kAdamW;
  const MemoryPlan p = plan(params, po);
  using text_util::format_bytes;
  std::string out = fmt::format("tessel train: {} ({} parameters, {}) on {}\n", t.model().family(), p.param_count,
                                format_bytes(p.param_bytes), t.mesh().to_string());
  const auto* mlp = std::get_if<DotReluDotConfig>(&t.model().config);
  out += fmt::format("  batch {} x {} {} sharded {} | {} lr {:g}, warmup {}, cosine to step {}\n", a.batch,
                     mlp ? "depth" : "seq", mlp ? mlp->depth : a.seq, t.batch_sharding().spec().to_string(), a.optimizer,
                     a.lr, a.warmup, a.steps);
  out += fmt::format("  per device (max over {} devices): params {}, gradients {}, optimizer state {}, total {}\n",
                     p.device_count, format_bytes(p.params_per_device.max), format_bytes(p.gradients_per_device.max),
                     format_bytes(p.optimizer_per_device.max), format_bytes(p.total.max));
  return out;
}

// A digest of a file's contents (FNV-1a), "" for no file: enough to tell two copies apart.
std::string file_digest(const std::string& path) {
  if (path.empty()) return "";
  std::ifstream in(path, std::ios::binary);
  if (!in) return "unreadable";
  uint64_t h = 14695981039346656037ull;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    for (std::streamsize i = 0; i < in.gcount(); ++i) h = (h ^ static_cast<unsigned char>(buf[i])) * 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

// What every process must agree on before training together: the arguments and the files they name.
nlohmann::json configuration(const TrainArgs& a) {
  const std::string data = a.data.empty() ? nn::ByteDataset::default_path().string() : a.data;
  return nlohmann::json{{"model", a.model.model},   {"model_file", file_digest(a.model.model)},
                   {"base", a.model.base},   {"base_file", file_digest(a.model.base)}, {"set", a.model.sets},
                   {"rules", a.model.rules},   {"rules_file", file_digest(a.model.rules)},
                   {"mesh", a.mesh},     {"data", a.data}, {"data_file", file_digest(data)},
                   {"checkpoint_dir", a.checkpoint_dir}, {"layout", a.layout}, {"optimizer", a.optimizer},
                   {"steps", a.steps},   {"batch", a.batch}, {"seq", a.seq}, {"warmup", a.warmup},
                   {"checkpoint_every", a.checkpoint_every}, {"keep", a.keep}, {"lr", a.lr}, {"clip", a.clip},
                   {"weight_decay", a.weight_decay}, {"seed", a.seed}, {"resume", a.resume}, {"init_from", a.init_from},
                   {"stop_at", a.stop_at ? *a.stop_at : -1}, {"storage", a.storage.storage}, {"zarr3", a.storage.zarr3}};
}

// Throws ValueError on every process unless all were started with the same configuration, naming
// the first setting that differs and its values.
void check_same_configuration(ProcessGroup& group, const TrainArgs& a) {
  const nlohmann::json mine = configuration(a);
  const std::vector<std::string> all = group.all_gather(mine.dump(), "comparing the training configurations");
  const nlohmann::json first = nlohmann::json::parse(all[0]);
  for (size_t p = 1; p < all.size(); ++p) {
    const nlohmann::json other = nlohmann::json::parse(all[p]);
    for (const auto& [key, value] : first.items()) {
      if (other.value(key, nlohmann::json()) == value) continue;
      auto shown = [](const nlohmann::json& v) {
        std::string s = v.is_string() ? v.get<std::string>() : v.dump();
        return s.size() > 120 ? s.substr(0, 120) + "..." : s;
      };
      auto flag = [](std::string k) {
        std::replace(k.begin(), k.end(), '_', '-');
        return "--" + k;
      };
      if (key.ends_with("_file")) {
        throw ValueError(fmt::format("the training configuration differs between processes: the file {} names has "
                                     "other contents on process {} than on process 0",
                                     flag(key.substr(0, key.size() - 5)), p));
      }
      throw ValueError(fmt::format("the training configuration differs between processes: {} is '{}' on process 0 "
                                   "and '{}' on process {}", flag(key), shown(value), shown(other[key]), p));
    }
  }
}

// Where a process that is not the leader sends what the leader prints.
std::ostream& discard() {
  static std::ostream null(nullptr);
  return null;
}

void train(const TrainArgs& a) {
  if (a.steps < 0) throw ValueError(fmt::format("--steps must be at least 0, got {}", a.steps));
  if (a.batch < 1 || a.seq < 1) throw ValueError("--batch and --seq must be positive");
  if (a.checkpoint_every < 0) throw ValueError("--checkpoint-every must be at least 0");
  if (a.stop_at && *a.stop_at < 1) throw ValueError(fmt::format("--stop-at must be at least 1, got {}", *a.stop_at));
  if (a.log_every < 1) throw ValueError("--log-every must be at least 1");
  if (!(a.lr > 0) || !std::isfinite(a.lr)) throw ValueError(fmt::format("--lr must be a positive number, got {}", a.lr));
  if (a.optimizer != "adamw" && a.optimizer != "sgd") {
    throw ValueError("--optimizer must be adamw or sgd, got '" + a.optimizer + "'");
  }
  if ((a.resume || a.checkpoint_every > 0 || a.steps == 0) && a.checkpoint_dir.empty()) {
    throw ValueError(a.resume ? "--resume needs --checkpoint-dir"
                              : (a.steps == 0 ? "--steps 0 saves the initial state: give --checkpoint-dir"
                                              : "--checkpoint-every needs --checkpoint-dir"));
  }
  if (a.model.model.empty() && !a.model.base.empty()) throw ValueError("--base needs --model (a MaxText model file)");
  const ModelConfig model = a.model.model.empty() ? parse_model_config(kDefaultModel, "<built-in model>")
                                                  : load_model(a.model);
  const LogicalRules rules = model_rules(model, a.model, [] { return models::default_rules(); });
  const Mesh mesh = Mesh::parse(a.mesh, rules.mesh_axes());
  Runtime rt = make_runtime(a.runtime);
  check_same_configuration(rt.processes(), a);
  const bool leader = rt.processes().is_leader();
  std::ostream& out = leader ? std::cout : discard();
  nn::OptimizerConfig opt;
  opt.kind = a.optimizer == "sgd" ? nn::OptimizerKind::kSgd : nn::OptimizerKind::kAdamW;
  opt.schedule = {.peak = a.lr, .warmup = a.warmup, .decay_steps = std::max<int64_t>(a.steps - a.warmup, 0)};
  opt.clip_norm = a.clip;
  opt.weight_decay = a.weight_decay;
  models::Trainer trainer(rt, model, mesh, rules, opt);
  const bool lm = model.is_lm();
  std::optional<nn::ByteDataset> data;
  if (lm) data = nn::ByteDataset::open(a.data.empty() ? nn::ByteDataset::default_path() : std::filesystem::path(a.data));

  if (data && data->size() <= a.seq) {
    throw ValueError(fmt::format("the training text {} has {} bytes; --seq {} needs at least {}", data->path().string(),
                                 data->size(), a.seq, a.seq + 1));
  }
  const State abstract = trainer.eval_shape();
  // Everything that can fail on bad input happens before the first line of output.
  std::string resumed;

  const bool maxtext_layout = a.layout == "maxtext";
  // MaxText 0.2.5 keeps DeepSeek V3's routing bias under nnx_aux: saved so, read either way.
  const auto* maxtext_config = std::get_if<MaxTextConfig>(&model.config);
  const bool aux_bias = maxtext_config && maxtext_aux_routing_bias(*maxtext_config);
  if (maxtext_layout && a.optimizer != "adamw")
    throw ValueError("--layout maxtext saves MaxText's TrainState, whose opt_state is AdamW's: use --optimizer adamw");
  if (const auto* m = std::get_if<MaxTextConfig>(&model.config); m && m->mu_dtype != m->weight_dtype)
    throw ValueError(fmt::format("mu_dtype {} differs from weight_dtype {}: tessel's AdamW keeps its moments in the "
                                 "parameters' dtype", name(m->mu_dtype), name(m->weight_dtype)));
  std::optional<CheckpointManager> ckpt;
  if (!a.checkpoint_dir.empty()) {
    CheckpointManagerOptions options;
    options.max_to_keep = a.keep;
    options.save.rules = rules;  // a restore onto another mesh resolves the logical axes with them
    apply_storage(a.storage, options.save);
    if (maxtext_layout) {
      options.item_name = kMaxTextItem;
      options.save.sequence_nodes.insert(kMaxTextSequenceNode);
      options.save.empty_nodes.insert(kMaxTextEmptyNode);
    }
    ckpt.emplace(rt, a.checkpoint_dir, options);
  }
  State state;
  nn::DataPosition position{.seed = a.seed, .step = 0};
  int64_t start = 0;
  std::optional<int64_t> latest;
  if (ckpt) latest = ckpt->latest_step();
  if (a.resume && latest) {
    const auto t0 = std::chrono::steady_clock::now();
    start = *latest;
    if (maxtext_layout) {
      int64_t saved = 0;
      // MaxText 0.2.5 also keeps its RNG state (nnx_aux), which tessel's training does not use.
      RestoreOptions partial;
      partial.partial = true;
      bool saved_aux = false;
      if (aux_bias) {
        const CheckpointItem item = CheckpointItem::open(ckpt->item_dir(*latest, kMaxTextItem));
        for (const auto& [path, v] : abstract)
          saved_aux = saved_aux || (!maxtext_aux_bias_path(path).empty() && item.metadata().find(maxtext_aux_bias_path(path)));
      }
      state = from_maxtext_layout(ckpt->restore(rt, *latest, maxtext_layout_target(abstract, saved_aux), partial),
                                  abstract, &saved, saved_aux);
      // The saved step counts the updates: MaxText's directory N holds step N + 1 (it saves after
      // the update), tessel's holds step N.
      if (saved != start + 1 && saved != start)
        throw ValueError(fmt::format("{}: the TrainState's step is {}, the directory's {} (MaxText's directory N "
                                     "holds step N + 1)",
                                     ckpt->step_dir(start).string(), saved, start));
      start = saved;
    } else {
      state = ckpt->restore(rt, *latest, abstract);
    }
    // A MaxText run records no data position: tessel's data order continues from the step.
    const std::vector<ItemInfo> items = list_items(ckpt->step_dir(*latest));
    const bool has_position =
        std::any_of(items.begin(), items.end(), [](const ItemInfo& i) { return i.name == "data"; });
    position = has_position ? nn::DataPosition::from_json(ckpt->restore_json(*latest, "data"), data ? &*data : nullptr)
                            : nn::DataPosition{.seed = a.seed, .step = start};
    if (position.step != start) {
      throw ValueError(fmt::format("checkpoint step {} records data position {}: the checkpoint is inconsistent",
                                   start, position.step));
    }
    resumed = fmt::format("  resumed step {} from {} onto {} in {:.2f} s\n", start, ckpt->step_dir(*latest).string(),
                             mesh.to_string(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  } else {
    if (ckpt && latest && !a.resume) {
      throw ValueError(fmt::format("{} already holds step {}: pass --resume to continue it, or another --checkpoint-dir",
                                   a.checkpoint_dir, *latest));
    }
    state = a.init_from.empty() ? trainer.init(a.seed) : init_from_checkpoint(rt, trainer, abstract, a.init_from, &resumed);
  }
  out << plan_summary(trainer, abstract, a);
  if (data) out << fmt::format("  data: {} ({} bytes)\n", data->path().string(), data->size());
  out << resumed;
  auto save = [&](int64_t step) {
    nn::DataPosition at = position;
    at.step = step;
    const std::map<std::string, std::string> items{{"data", at.to_json(data ? &*data : nullptr)}};
    if (maxtext_layout) {
      // MaxText saves after an update: its directory N holds step N + 1 (step 0 only in directory 0).
      // A directory that holds step N already (tessel's numbering before 0.2.5's) keeps N + 1 apart.
      int64_t dir = std::max<int64_t>(step - 1, 0);
      const std::vector<int64_t> have = ckpt->all_steps();
      if (std::find(have.begin(), have.end(), dir) != have.end()) dir = step;
      ckpt->save_async(dir, to_maxtext_layout(rt, state, step, aux_bias), items);
    } else {
      ckpt->save_async(step, state, items);
    }
  };
  const int64_t end = a.stop_at ? std::min(*a.stop_at, a.steps) : a.steps;
  if (a.steps == 0 || start >= end) {
    if (ckpt && !(a.resume && latest)) save(start);
    if (ckpt) ckpt->wait();
    out << fmt::format("nothing to train: at step {} of {}{}\n", start, a.steps,
                             ckpt && !(a.resume && latest) ? fmt::format("; saved step {} to {}", start, a.checkpoint_dir) : "");
    return;
  }

  std::ofstream metrics;
  if (!a.metrics.empty() && leader) {
    metrics.open(a.metrics, a.resume ? std::ios::app : std::ios::trunc);
    if (!metrics) throw IoError("cannot write the metrics file " + a.metrics);
  }
  // Under mpirun stdout is a pty whatever mpirun's own output is: print whole lines there.
  const bool tty = rt.process_count() == 1 && isatty(STDOUT_FILENO) != 0;
  const int64_t tokens_per_step = a.batch * (lm ? a.seq : 1);
  const auto begin = std::chrono::steady_clock::now();
  double first_loss = NAN, last_loss = NAN;
  for (int64_t step = start; step < end; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    position.step = step;
    const nn::Batch batch = trainer.batch(data ? &*data : nullptr, position, a.batch, a.seq);
    const models::StepMetrics m = trainer.step(state, batch, step);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!std::isfinite(m.loss)) throw Error(fmt::format("step {}: the loss is {} (lower --lr?)", step + 1, m.loss));
    if (std::isnan(first_loss)) first_loss = m.loss;
    last_loss = m.loss;
    const double tokens_per_s = static_cast<double>(tokens_per_step) / seconds;
    if (metrics.is_open()) {
      metrics << nlohmann::json{{"step", step + 1}, {"loss", m.loss}, {"tokens_per_s", tokens_per_s},
                                {"grad_norm", m.grad_norm}, {"lr", m.lr}, {"step_s", seconds}}.dump()
              << "\n";
      metrics.flush();
    }
    const int64_t done = step + 1 - start, total = end - start;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    const double eta = elapsed / static_cast<double>(done) * static_cast<double>(total - done);
    const int width = 24, filled = static_cast<int>(width * done / total);
    const std::string line =
        fmt::format("[{}{}] step {}/{} loss {:.4f} | {:.0f} tokens/s | grad norm {:.3f} | lr {:.2e} | ETA {}",
                    std::string(static_cast<size_t>(filled), '#'), std::string(static_cast<size_t>(width - filled), '.'),
                    step + 1, a.steps, m.loss, tokens_per_s, m.grad_norm, m.lr, duration(eta));
    if (tty) {
      out << "\r" << line << "\x1b[K" << std::flush;
      if (done % a.log_every == 0 || step + 1 == end) out << "\n";
    } else if (done % a.log_every == 0 || step + 1 == end || done == 1) {
      out << line << "\n" << std::flush;
    }
    if (ckpt && ((a.checkpoint_every > 0 && (step + 1) % a.checkpoint_every == 0) || step + 1 == end)) {
      save(step + 1);
    }
  }
  if (ckpt) ckpt->wait();
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  out << fmt::format("trained steps {}..{} in {} ({:.0f} tokens/s): loss {:.4f} -> {:.4f}{}\n", start + 1, end,
                           duration(elapsed), static_cast<double>(tokens_per_step * (end - start)) / elapsed, first_loss, last_loss,
                           ckpt ? "; checkpoints in " + a.checkpoint_dir : "");
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* c = app.add_subcommand("train", "Train a model on virtual devices (data, FSDP and tensor parallelism)");
  add_model_options(c, args->model,
                    "Model YAML (default: a small byte-level transformer LM), or MaxText's model file with --base",
                    "Logical axis rules, YAML or JSON (default: built-in MaxText-style rules; with --base, "
                    "base.yml's); with --base, a custom mesh-and-rule file");
  c->add_option("--mesh", args->mesh, "Mesh, e.g. data=2,fsdp=2,tensor=2 (axes the rules declare default to 1)")
      ->capture_default_str();
  c->add_option("--steps", args->steps, "Train until this step (0: initialize and save)")->capture_default_str();
  c->add_option("--stop-at", args->stop_at, "Stop (and save) after this step; the schedule still spans --steps");
  c->add_option("--batch", args->batch, "Global batch size")->capture_default_str();
  c->add_option("--seq", args->seq, "Sequence length (LM)")->capture_default_str();
  c->add_option("--lr", args->lr, "Peak learning rate (linear warmup, cosine decay to 10%)")->capture_default_str();
  c->add_option("--warmup", args->warmup, "Warmup steps")->capture_default_str();
  c->add_option("--optimizer", args->optimizer, "adamw or sgd (with momentum 0.9)")->capture_default_str();
  c->add_option("--clip", args->clip, "Global gradient-norm clipping (0: none)")->capture_default_str();
  c->add_option("--weight-decay", args->weight_decay, "AdamW's decoupled weight decay")->capture_default_str();
  c->add_option("--seed", args->seed, "Seed of the parameters and of the data order")->capture_default_str();
  path_option(c->add_option("--data", args->data, "Training text (default: /usr/share/common-licenses/GPL-3)"));
  location_option(c->add_option("--checkpoint-dir", args->checkpoint_dir,
                                "Save checkpoints here (Orbax layout), local or s3://, gs://bucket/prefix"));
  c->add_option("--layout", args->layout,
                "Checkpoint layout: tessel (the train state as item 'default') or maxtext (MaxText's TrainState as "
                "item 'items': params/params/..., opt_state/0/{count,mu,nu}, step)")
      ->check(CLI::IsMember({"tessel", "maxtext"}))
      ->capture_default_str();
  c->add_option("--checkpoint-every", args->checkpoint_every, "Save every K steps (and always at the end)");
  c->add_option("--keep", args->keep, "Checkpoints to keep")->capture_default_str();
  c->add_flag("--resume", args->resume, "Continue from the latest checkpoint, on the mesh given now");
  location_option(c->add_option("--init-from", args->init_from,
                            "Start from the parameters of this checkpoint (tessel's tree, MaxText's params/params, "
                            "or one converted from safetensors) with a fresh optimizer; a checkpoint --resume finds "
                            "comes first"));
  path_option(c->add_option("--metrics", args->metrics, "Write one JSON object per step to this file (jsonl)"));
  c->add_option("--log-every", args->log_every, "Progress line every K steps")->capture_default_str();
  add_runtime_options(c, args->runtime);
  add_multi_process_options(c, args->runtime);
  add_storage_options(c, args->storage);
  c->callback([args] { train(*args); });
}

}  // namespace tessel::cli
