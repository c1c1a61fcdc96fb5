#include "tessel/runtime/communicator.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "tessel/core/box_copy.h"
#include "tessel/core/error.h"
#include "tessel/runtime/detail/kernels.h"
#include "tessel/runtime/device.h"
#include "tessel/runtime/process_group.h"
#include "tessel/runtime/worker_pool.h"

namespace tessel {

std::unique_ptr<ProcessGroup> Communicator::new_process_group() { return std::make_unique<SingleProcessGroup>(); }

namespace {

// Below this many bytes in one call the pool's wake-up costs more than it saves.
constexpr int64_t kInlineBytes = int64_t{256} << 10;
// Work units: pieces of about this size keep both threads busy to the end.
constexpr int64_t kPieceBytes = int64_t{2} << 20;

struct Piece {
  size_t task;
  Box region;
};

// Calls writing more than this go out with streaming stores: their targets outgrow the caches,
// so a normal store's read of each line first only adds traffic.
constexpr int64_t kStreamBytes = int64_t{32} << 20;

template <class Task>
int64_t total_bytes(std::span<const Task> tasks, size_t item) {
  int64_t total = 0;
  for (const Task& t : tasks) total += t.region.volume() * static_cast<int64_t>(item);
  return total;
}

// Runs run(task, region) over every task: small calls inline as they are, large ones cut into
// pieces (about kPieceBytes each) spread over the pool.
template <class Task, class Run>
void run_tasks(WorkerPool& pool, std::span<const Task> tasks, size_t item, const Run& run) {
  if (total_bytes(tasks, item) < kInlineBytes) {
    for (const Task& t : tasks) run(t, t.region);
    return;
  }
  std::vector<Piece> pieces;
  const int64_t max_elements = std::max<int64_t>(1, kPieceBytes / static_cast<int64_t>(item));
  for (size_t t = 0; t < tasks.size(); ++t)
    if (!tasks[t].region.empty())
      for (Box& b : split_box(tasks[t].region, max_elements)) pieces.push_back({t, std::move(b)});
  pool.parallel_for(static_cast<int64_t>(pieces.size()), [&](int64_t i) {
    const Piece& p = pieces[static_cast<size_t>(i)];
    run(tasks[p.task], p.region);
    detail::stream_fence();  // the pool's hand-back orders normal stores only
  });
}

}  // namespace

bool repeats_an_output(const ReduceTask& task, size_t k) {
  for (size_t j = 0; j < k; ++j)
    if (task.outputs[j].second == task.outputs[k].second) return true;
  return false;
}

std::string_view name(Reduction op) {
  switch (op) {
    case Reduction::kSum: return "sum";
    case Reduction::kMax: return "max";
    case Reduction::kMin: return "min";
    case Reduction::kMean: return "mean";
  }
  return "?";
}

InProcessCommunicator::InProcessCommunicator(WorkerPool& pool, std::span<Device* const> devices)
    : pool_(pool), devices_(devices.begin(), devices.end()) {}

void InProcessCommunicator::copy(std::span<const CopyTask> tasks, DType dtype) {
  const size_t item = item_size(dtype);
  for (const CopyTask& t : tasks) {
    if (t.region.empty()) continue;
    check_region_inside(t.region, t.src_box, t.dst_box, "copy task:");
    if (!t.src || !t.dst)
      throw ValueError(fmt::format("copy task from device {} to device {}: a buffer is not "
                                   "addressable in this process", t.src_device, t.dst_device));
    if (t.src_device != t.dst_device)
      devices_.at(static_cast<size_t>(t.dst_device))
          ->add_received(t.region.volume() * static_cast<int64_t>(item));
  }
  const auto isize = static_cast<int64_t>(item);
  const bool stream = total_bytes(tasks, item) > kStreamBytes;
  auto run = [&](const CopyTask& t, const Box& region) {
    for_each_run(region, t.src_box, t.dst_box, [&](int64_t s, int64_t d, int64_t n) {
      std::byte* dst = t.dst + d * isize;
      const std::byte* src = t.src + s * isize;
      if (stream)
        detail::stream_copy(dst, src, static_cast<size_t>(n * isize));
      else
        std::memcpy(dst, src, static_cast<size_t>(n * isize));
    });
  };
  std::vector<CopyTask> writes;
  for (const CopyTask& t : tasks)
    if (!t.replica) writes.push_back(t);
  run_tasks(pool_, std::span<const CopyTask>(writes), item, run);
}

void InProcessCommunicator::reduce(std::span<const ReduceTask> tasks, DType dtype, Reduction op) {
  detail::check_reduction(dtype, op);
  const size_t item = item_size(dtype);
  for (const ReduceTask& t : tasks) {
    if (t.region.empty()) continue;
    check_region_inside(t.region, t.in_box, t.out_box, "reduce task:");
    if (t.inputs.empty() || t.outputs.empty()) throw ValueError("reduce task without inputs or outputs");
    const int64_t bytes = t.region.volume() * static_cast<int64_t>(item);
    const int64_t owner = t.outputs.front().first;
    for (const auto& [device, data] : t.inputs) {
      if (!data)
        throw ValueError(fmt::format("reduce task: the buffer of device {} is not addressable "
                                     "in this process", device));
      if (device != owner) devices_.at(static_cast<size_t>(owner))->add_received(bytes);
    }
    for (size_t k = 0; k < t.outputs.size(); ++k) {
      const auto& [device, data] = t.outputs[k];
      if (!data)
        throw ValueError(fmt::format("reduce task into device {}: the buffer is not addressable "
                                     "in this process", device));
      if (device != owner) devices_.at(static_cast<size_t>(device))->add_received(bytes);
    }
  }
  const auto isize = static_cast<int64_t>(item);
  // Results go out in slices small enough to still be in cache when copied to the other outputs.
  constexpr int64_t kSlice = 4096;
  int64_t written = 0;
  for (const ReduceTask& t : tasks)
    for (size_t k = 0; k < t.outputs.size(); ++k)
      if (!repeats_an_output(t, k)) written += t.region.volume() * isize;
  const bool stream = written > kStreamBytes;
  auto run = [&](const ReduceTask& t, const Box& region) {
    std::vector<const std::byte*> in(t.inputs.size());
    // Streamed results are summed into a scratch slice that stays in L1, then streamed to every
    // output; otherwise into the first output, then copied from there.
    std::vector<std::byte> scratch(stream ? static_cast<size_t>(kSlice * isize) : 0);
    std::vector<std::byte*> targets;  // each buffer once: replicas in one process may share one
    for (size_t k = 0; k < t.outputs.size(); ++k)
      if (!repeats_an_output(t, k)) targets.push_back(t.outputs[k].second);
    for_each_run(region, t.in_box, t.out_box, [&](int64_t s, int64_t d, int64_t n) {
      for (int64_t base = 0; base < n; base += kSlice) {
        const int64_t m = std::min(kSlice, n - base);
        const auto bytes = static_cast<size_t>(m * isize);
        for (size_t k = 0; k < in.size(); ++k) in[k] = t.inputs[k].second + (s + base) * isize;
        const int64_t at = (d + base) * isize;
        std::byte* sum = stream ? scratch.data() : t.outputs.front().second + at;
        detail::reduce_run(dtype, op, in.data(), in.size(), sum, m);
        for (size_t k = stream ? 0 : 1; k < targets.size(); ++k) {
          if (stream)
            detail::stream_copy(targets[k] + at, sum, bytes);
          else
            std::memcpy(targets[k] + at, sum, bytes);
        }
      }
    });
  };
  run_tasks(pool_, tasks, item, run);
}

}  // namespace tessel
