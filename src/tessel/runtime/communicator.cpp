#include "tessel/runtime/communicator.h"

#include <algorithm>
#include <cstring>
#include <optional>

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

// A result's bytes into their target: with streaming stores in calls that write past the caches.
void put(bool stream, std::byte* dst, const std::byte* src, size_t bytes) {
  if (stream)
    detail::stream_copy(dst, src, bytes);
  else
    std::memcpy(dst, src, bytes);
}

// Results are summed in slices small enough to stay in L1 until copied to their outputs.
constexpr int64_t kSlice = 4096;

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

// Tasks that read the same inputs and write one output each, their regions the inputs' box cut
// along one dimension: a reduce-scatter's group. Cut on an inner dimension (FSDP weight gradients
// split on a small embed: rows of 32 floats), each task's sum ran over short, strided pieces of
// all the inputs; taken together, the strips' runs follow one another in the inputs, are summed
// as long runs into a scratch slice in L1 and copied from there to their outputs. Each element's
// sum is the same either way: the inputs added in order.
struct Strips {
  const ReduceTask* first;  // every task reads its inputs
  size_t dim;
  int64_t outer;  // rows: the inputs' box's extents before `dim` multiplied
  int64_t inner;  // elements per step along `dim`
  std::vector<const ReduceTask*> tasks;  // by their start along `dim`
};

// The dimension along which `region` cuts `box` (equal in every other), or -1.
int cut_dimension(const Box& region, const Box& box) {
  int dim = -1;
  for (size_t d = 0; d < box.rank(); ++d) {
    if (region.start(d) == box.start(d) && region.stop(d) == box.stop(d)) continue;
    if (dim >= 0) return -1;
    dim = static_cast<int>(d);
  }
  return dim;
}

// `members` as strips, or nullopt: each cuts the inputs' box along the same dimension, its output
// holds it as the inputs do past that dimension (so a run is contiguous on both sides), and its
// runs are short (below kSlice / 2 elements on average; longer ones are summed in place).
std::optional<Strips> as_strips(std::span<const ReduceTask> tasks, const std::vector<size_t>& members) {
  const Box& in = tasks[members.front()].in_box;
  const int dim = cut_dimension(tasks[members.front()].region, in);
  if (dim < 0 || in.rank() == 0) return std::nullopt;
  const auto d = static_cast<size_t>(dim);
  Strips s{&tasks[members.front()], d, 1, 1, {}};
  for (size_t e = 0; e < d; ++e) s.outer *= in.extent(e);
  for (size_t e = d + 1; e < in.rank(); ++e) s.inner *= in.extent(e);
  int64_t volume = 0;
  for (size_t m : members) {
    const ReduceTask& t = tasks[m];
    if (t.region.empty() || cut_dimension(t.region, in) != dim) return std::nullopt;
    for (size_t e = d + 1; e < in.rank(); ++e)
      if (t.out_box.extent(e) != in.extent(e)) return std::nullopt;
    volume += t.region.volume();
    s.tasks.push_back(&t);
  }
  if (volume >= kSlice / 2 * s.outer * static_cast<int64_t>(members.size())) return std::nullopt;
  std::sort(s.tasks.begin(), s.tasks.end(),
            [d](const ReduceTask* a, const ReduceTask* b) { return a->region.start(d) < b->region.start(d); });
  return s;
}

// Takes the groups of tasks that are strips (see Strips) out of `tasks` into `strips`; the other
// tasks go to `rest`.
void take_strips(std::span<const ReduceTask> tasks, std::vector<Strips>& strips,
                 std::vector<ReduceTask>& rest) {
  std::vector<bool> taken(tasks.size(), false);
  auto single = [&](size_t i) { return !taken[i] && tasks[i].outputs.size() == 1; };
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (!single(i)) continue;
    std::vector<size_t> members{i};
    for (size_t j = i + 1; j < tasks.size(); ++j)
      if (single(j) && tasks[j].in_box == tasks[i].in_box && tasks[j].inputs == tasks[i].inputs) members.push_back(j);
    if (members.size() < 2) continue;
    std::optional<Strips> s = as_strips(tasks, members);
    if (!s) continue;
    for (size_t m : members) taken[m] = true;
    strips.push_back(std::move(*s));
  }
  if (strips.empty()) return;
  for (size_t i = 0; i < tasks.size(); ++i)
    if (!taken[i]) rest.push_back(tasks[i]);
}

// Sums each group of strips (see Strips) in pieces of whole rows of its inputs, about kPieceBytes
// each, spread over the pool; `stream` as the whole call decided.
void sum_strips(WorkerPool& pool, const std::vector<Strips>& strips, DType dtype, Reduction op, int64_t isize,
                bool stream) {
  struct RowPiece {
    const Strips* strips;
    int64_t begin, end;  // rows
  };
  std::vector<RowPiece> pieces;
  int64_t total = 0;
  for (const Strips& s : strips) {
    int64_t per_row = 0;
    for (const ReduceTask* t : s.tasks) per_row += t->region.extent(s.dim) * s.inner;
    total += per_row * s.outer;
    const int64_t rows = std::max<int64_t>(1, kPieceBytes / isize / std::max<int64_t>(per_row, 1));
    for (int64_t o = 0; o < s.outer; o += rows) pieces.push_back({&s, o, std::min(s.outer, o + rows)});
  }
  auto run_piece = [&](const RowPiece& p) {
    const Strips& s = *p.strips;
    const ReduceTask& first = *s.first;
    const Box& in_box = first.in_box;
    const int64_t row = in_box.extent(s.dim) * s.inner;
    std::vector<const std::byte*> in(first.inputs.size());
    std::vector<std::byte> scratch(static_cast<size_t>(kSlice * isize));
    struct Pending {
      int64_t at, count;
      std::byte* out;
    };
    std::vector<Pending> pending;
    int64_t batch_at = 0, batch_count = 0;
    auto flush = [&] {
      if (batch_count == 0) return;
      for (size_t k = 0; k < in.size(); ++k) in[k] = first.inputs[k].second + batch_at * isize;
      detail::reduce_run(dtype, op, in.data(), in.size(), scratch.data(), batch_count);
      for (const Pending& r : pending)
        put(stream, r.out, scratch.data() + (r.at - batch_at) * isize, static_cast<size_t>(r.count * isize));
      pending.clear();
      batch_count = 0;
    };
    // Runs join the batch while they follow it in the inputs and it stays within one slice.
    auto emit = [&](int64_t at, int64_t count, std::byte* out) {
      for (int64_t base = 0; base < count; base += kSlice) {
        const int64_t n = std::min(kSlice, count - base);
        if (batch_count > 0 && (at + base != batch_at + batch_count || batch_count + n > kSlice)) flush();
        if (batch_count == 0) batch_at = at + base;
        pending.push_back({at + base, n, out + base * isize});
        batch_count += n;
      }
    };
    // Row p.begin's coordinates before `dim`, then advanced like an odometer.
    std::vector<int64_t> point(in_box.starts().begin(), in_box.starts().end());
    for (size_t e = s.dim, left = static_cast<size_t>(p.begin); e-- > 0;) {
      point[e] = in_box.start(e) + static_cast<int64_t>(left % static_cast<size_t>(in_box.extent(e)));
      left /= static_cast<size_t>(in_box.extent(e));
    }
    for (int64_t o = p.begin; o < p.end; ++o) {
      for (const ReduceTask* t : s.tasks) {
        point[s.dim] = t->region.start(s.dim);
        const int64_t at = o * row + (t->region.start(s.dim) - in_box.start(s.dim)) * s.inner;
        std::byte* out = t->outputs.front().second + t->out_box.offset_of(point) * isize;
        emit(at, t->region.extent(s.dim) * s.inner, out);
      }
      for (size_t e = s.dim; e-- > 0;) {
        if (++point[e] < in_box.stop(e)) break;
        point[e] = in_box.start(e);
      }
    }
    flush();
  };
  if (total * isize < kInlineBytes) {
    for (const RowPiece& p : pieces) run_piece(p);
  } else {
    pool.parallel_for(static_cast<int64_t>(pieces.size()), [&](int64_t i) {
      run_piece(pieces[static_cast<size_t>(i)]);
      detail::stream_fence();
    });
  }
  // Small parts run inline may still stream: the call as a whole decided it.
  detail::stream_fence();
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
      put(stream, t.dst + d * isize, t.src + s * isize, static_cast<size_t>(n * isize));
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
        for (size_t k = stream ? 0 : 1; k < targets.size(); ++k) put(stream, targets[k] + at, sum, bytes);
      }
    });
  };
  std::vector<Strips> strips;
  std::vector<ReduceTask> rest;
  if (tasks.size() > 1) take_strips(tasks, strips, rest);
  if (strips.empty()) return run_tasks(pool_, tasks, item, run);
  run_tasks(pool_, std::span<const ReduceTask>(rest), item, run);

  sum_strips(pool_, strips, dtype, op, isize, stream);
}

}  // namespace tessel
