// Train-step ratios taken within rounds (bench/train_bench.sh prints them next to bench_train's).
// Each round runs, one right after another, the model's GEMMs with every core (that round's GEMM
// bound: the step's FLOPs at that rate) and one step on each mesh, starting at the next mesh each
// round; a ratio is taken inside a round and the medians over the rounds are reported. This
// machine's speed drifts from minute to minute (a shared host): in separate benchmarks a fast or
// slow minute falls on one side of a ratio only, in a round on both.
// Usage: bench_train_rounds mlp|lm ROUNDS MESH...   (ratios are to the first mesh's step)
// Prints one JSON object per mesh. `bench_train_rounds serve mlp|lm MESH` steps on request instead
// (see serve()).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "train_models.h"
#include "tessel/core/error.h"
#include "tessel/models/train.h"
#include "tessel/ops/detail/local.h"
#include "tessel/runtime/runtime.h"

namespace {

using namespace tessel;
using bench::Gemm;
using bench::TrainModel;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The value at fraction q of the sorted values (nearest rank; the middle two averaged for the
// median of an even count).
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  if (q == 0.5 && n % 2 == 0) return (v[n / 2 - 1] + v[n / 2]) / 2;
  return v[std::min(n - 1, static_cast<size_t>(q * static_cast<double>(n)))];
}
double median(const std::vector<double>& v) { return quantile(v, 0.5); }

// The model's mean SGEMM rate (FLOP/s) over its shapes with every core, each shape timed as the
// median of 3 calls: the products as a 1-device op runs them (inside its spread region, split over
// the pool's threads).
class GemmRate {
 public:
  explicit GemmRate(const std::vector<Gemm>& gemms) : gemms_(gemms), rt_(Runtime::host(1)) {
    for (const Gemm& g : gemms_) {
      a_.emplace_back(static_cast<size_t>(g.m * g.k), 0.5f);
      b_.emplace_back(static_cast<size_t>(g.k * g.n), 0.25f);
      c_.emplace_back(static_cast<size_t>(g.m * g.n));
    }
  }
  double measure() {
    double sum = 0;
    ops::detail::run_spread(rt_, [&] { sum = sum_of_rates(); });
    return sum / static_cast<double>(gemms_.size());
  }

 private:
  double sum_of_rates() {
    double sum = 0;
    for (size_t i = 0; i < gemms_.size(); ++i) {
      const Gemm& g = gemms_[i];
      std::vector<double> times;
      for (int rep = 0; rep < 3; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        ops::detail::gemm(DType::kF32, g.trans_a, g.trans_b, g.m, g.n, g.k,
                          reinterpret_cast<const std::byte*>(a_[i].data()),
                          reinterpret_cast<const std::byte*>(b_[i].data()), reinterpret_cast<std::byte*>(c_[i].data()),
                          false);
        times.push_back(seconds_since(t0));
      }
      sum += 2.0 * static_cast<double>(g.m * g.n * g.k) / median(times);
    }
    return sum;
  }

  std::vector<Gemm> gemms_;
  Runtime rt_;
  std::vector<std::vector<float>> a_, b_, c_;
};

// One model's training on one mesh, two steps taken (the allocator's caches warm).
class MeshRun {
 public:
  MeshRun(const TrainModel& m, const std::string& mesh_text) : mesh_(mesh_text) {
    const LogicalRules rules = models::default_rules();
    const Mesh mesh = Mesh::parse(mesh_text, rules.mesh_axes());
    const nn::ByteDataset data = nn::ByteDataset::open(nn::ByteDataset::default_path());
    rt_ = std::make_unique<Runtime>(Runtime::host(mesh.device_count()));
    trainer_ = std::make_unique<models::Trainer>(*rt_, m.config(), mesh, rules, m.optimizer);
    state_ = std::make_unique<State>(trainer_->init(0));
    batch_ = std::make_unique<nn::Batch>(trainer_->batch(&data, {}, m.batch, m.seq));
    for (int i = 0; i < 2; ++i) step();
  }
  const std::string& mesh() const { return mesh_; }
  // One step; its wall time in seconds.
  double step() {
    const auto t0 = std::chrono::steady_clock::now();
    trainer_->step(*state_, *batch_, steps_++);
    return seconds_since(t0);
  }

 private:
  std::string mesh_;
  std::unique_ptr<Runtime> rt_;
  std::unique_ptr<models::Trainer> trainer_;
  std::unique_ptr<State> state_;
  std::unique_ptr<nn::Batch> batch_;
  int64_t steps_ = 0;
};

void run(const std::string& name, int rounds, const std::vector<std::string>& meshes) {
  const TrainModel m = bench::train_model(name);
  std::vector<MeshRun> runs;
  for (const std::string& mesh : meshes) runs.emplace_back(m, mesh);
  std::vector<std::vector<double>> seconds(runs.size());
  GemmRate rate(m.gemms);
  rate.measure();  // warm
  std::vector<double> bounds;
  for (int round = 0; round < rounds; ++round) {
    bounds.push_back(m.step_flops / rate.measure());
    // Each round starts at the next mesh: none always runs right after the GEMMs.
    for (size_t i = 0; i < runs.size(); ++i) {
      const size_t k = (static_cast<size_t>(round) + i) % runs.size();
      seconds[k].push_back(runs[k].step());
    }
  }
  for (size_t k = 0; k < runs.size(); ++k) {
    std::vector<double> to_first, to_bound;
    for (int round = 0; round < rounds; ++round) {
      to_first.push_back(seconds[k][round] / seconds[0][round]);
      to_bound.push_back(seconds[k][round] / bounds[round]);
    }
    std::printf("{\"model\": \"%s\", \"mesh\": \"%s\", \"rounds\": %d, \"step_s\": %.6g, \"bound_s\": %.6g, "
                "\"to_bound\": %.4f, \"to_first\": %.4f, \"to_first_q1\": %.4f, \"to_first_q3\": %.4f}\n",
                name.c_str(), runs[k].mesh().c_str(), rounds, median(seconds[k]), median(bounds), median(to_bound),
                median(to_first), quantile(to_first, 0.25), quantile(to_first, 0.75));
  }
}

// Steps on request, for a peer's rounds in another process (bench/torch_rounds.py): "ready" once
// warm, then for each line read one step and its seconds; ends at the end of the input.
void serve(const std::string& name, const std::string& mesh) {
  MeshRun run(bench::train_model(name), mesh);
  std::printf("ready\n");
  std::fflush(stdout);
  for (int c; (c = std::getchar()) != EOF;) {
    if (c != '\n') continue;
    std::printf("%.9g\n", run.step());
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "serve") {
    try {
      serve(argv[2], argv[3]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 2;
    }
    return 0;
  }
  if (argc < 4) {
    std::fprintf(stderr, "usage: bench_train_rounds mlp|lm ROUNDS MESH...\n       bench_train_rounds serve mlp|lm MESH\n");
    return 2;
  }
  try {
    const int rounds = std::atoi(argv[2]);
    if (rounds < 1) throw tessel::ValueError(std::string("bench_train_rounds: ROUNDS must be a positive number, got ") + argv[2]);
    run(argv[1], rounds, std::vector<std::string>(argv + 3, argv + argc));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return 0;
}
