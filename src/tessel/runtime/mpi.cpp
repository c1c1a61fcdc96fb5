#include "tessel/runtime/mpi.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <deque>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "tessel/core/box_copy.h"
#include "tessel/core/error.h"
#include "tessel/runtime/communicator.h"
#include "tessel/runtime/detail/kernels.h"
#include "tessel/runtime/device.h"

namespace tessel {
namespace {

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(rc, text, &n);
  throw Error(fmt::format("{} failed: {}", call, std::string(text, static_cast<size_t>(n))));
}

// One message is at most this large (MPI counts are ints); larger payloads go in pieces.
constexpr int64_t kMaxMessage = int64_t{1} << 30;
constexpr int kTagLimit = 32767;  // the least MPI_TAG_UB the standard allows

// The messages of one exchange. Each side numbers its messages to and from every peer in the
// order it posts them, and both sides walk the tasks in the same order, so a message's tag (its
// number) matches on both ends without any extra handshake.
class Exchange {
 public:
  explicit Exchange(int processes) : sent_(static_cast<size_t>(processes)), received_(static_cast<size_t>(processes)) {}
  ~Exchange() {
    // A failure between posting and waiting must not leave MPI writing into freed buffers.
    if (!requests_.empty()) MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }

  void send(int peer, std::vector<std::byte> bytes) {
    buffers_.push_back(std::move(bytes));
    post(peer, buffers_.back(), sent_, true);
  }
  // The buffer the bytes will land in, valid after wait().
  std::vector<std::byte>& receive(int peer, int64_t size) {
    buffers_.emplace_back(static_cast<size_t>(size));
    post(peer, buffers_.back(), received_, false);
    return buffers_.back();
  }
  void wait() {
    std::vector<MPI_Request> pending = std::move(requests_);
    requests_.clear();
    if (!pending.empty())
      check(MPI_Waitall(static_cast<int>(pending.size()), pending.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  }

 private:
  void post(int peer, std::vector<std::byte>& buf, std::vector<int>& counter, bool is_send) {
    // Both sides know the size, so both cut the same pieces (none for an empty buffer).
    for (int64_t at = 0; at < static_cast<int64_t>(buf.size()); at += kMaxMessage) {
      const int n = static_cast<int>(std::min<int64_t>(kMaxMessage, static_cast<int64_t>(buf.size()) - at));
      const int tag = counter[static_cast<size_t>(peer)]++ % kTagLimit;
      MPI_Request r;
      if (is_send) {
        check(MPI_Isend(buf.data() + at, n, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r), "MPI_Isend");
      } else {
        check(MPI_Irecv(buf.data() + at, n, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r), "MPI_Irecv");
      }
      requests_.push_back(r);
    }
  }
  std::vector<int> sent_, received_;
  std::vector<MPI_Request> requests_;
  std::deque<std::vector<std::byte>> buffers_;  // stable addresses while MPI uses them
};

std::vector<std::byte> pack(const std::byte* src, const Box& src_box, const Box& region, size_t item) {
  std::vector<std::byte> out(static_cast<size_t>(region.volume()) * item);
  const auto isize = static_cast<int64_t>(item);
  for_each_run(region, src_box, region, [&](int64_t s, int64_t d, int64_t n) {
    std::memcpy(out.data() + d * isize, src + s * isize, static_cast<size_t>(n * isize));
  });
  return out;
}

void unpack(const std::vector<std::byte>& in, std::byte* dst, const Box& dst_box, const Box& region, size_t item) {
  const auto isize = static_cast<int64_t>(item);
  for_each_run(region, region, dst_box, [&](int64_t s, int64_t d, int64_t n) {
    std::memcpy(dst + d * isize, in.data() + s * isize, static_cast<size_t>(n * isize));
  });
}

// Bytes within a process move as in one process; bytes between processes by MPI point to point.
class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(WorkerPool& pool, std::span<Device* const> devices, int rank, int size)
      : local_(pool, devices), devices_(devices.begin(), devices.end()), rank_(rank), size_(size) {}

  void copy(std::span<const CopyTask> tasks, DType dtype) override {
    const size_t item = item_size(dtype);
    std::vector<CopyTask> local;
    struct Incoming {
      const CopyTask* task;
      std::vector<std::byte>* bytes;
    };
    std::vector<Incoming> incoming;
    Exchange x(size_);
    for (const CopyTask& t : tasks) {
      if (t.region.empty()) continue;
      check_region_inside(t.region, t.src_box, t.dst_box, "copy task:");
      const int from = process(t.src_device), to = process(t.dst_device);
      if (from == rank_ && to == rank_) {
        local.push_back(t);
      } else if (to == rank_) {
        need(t.dst, t.dst_device);
        incoming.push_back({&t, &x.receive(from, t.region.volume() * static_cast<int64_t>(item))});
      } else if (from == rank_) {
        need(t.src, t.src_device);
        x.send(to, pack(t.src, t.src_box, t.region, item));
      }
    }
    local_.copy(local, dtype);
    x.wait();
    for (const Incoming& in : incoming) {
      unpack(*in.bytes, in.task->dst, in.task->dst_box, in.task->region, item);
      device(in.task->dst_device).add_received(static_cast<int64_t>(in.bytes->size()));
    }
  }

  void reduce(std::span<const ReduceTask> tasks, DType dtype, Reduction op) override {
    detail::check_reduction(dtype, op);
    const size_t item = item_size(dtype);
    // 1. Every input travels to the process of the task's first output, which reduces them in
    //    input order (the same order, so the same bits, as in one process).
    struct Owned {
      const ReduceTask* task;
      std::vector<std::vector<std::byte>*> inputs;
    };
    std::vector<Owned> owned;
    std::deque<std::vector<std::byte>> packed_here;
    Exchange gather(size_);
    for (const ReduceTask& t : tasks) {
      if (t.region.empty()) continue;
      check_region_inside(t.region, t.in_box, t.out_box, "reduce task:");
      if (t.inputs.empty() || t.outputs.empty()) throw ValueError("reduce task without inputs or outputs");
      const int owner = process(t.outputs.front().first);
      const int64_t bytes = t.region.volume() * static_cast<int64_t>(item);
      if (owner == rank_) {
        Owned o{&t, {}};
        for (const auto& [dev, data] : t.inputs) {
          if (process(dev) == rank_) {
            need(data, dev);
            packed_here.push_back(pack(data, t.in_box, t.region, item));
            o.inputs.push_back(&packed_here.back());
          } else {
            o.inputs.push_back(&gather.receive(process(dev), bytes));
          }
        }
        owned.push_back(std::move(o));
      } else {
        for (const auto& [dev, data] : t.inputs) {
          if (process(dev) != rank_) continue;
          need(data, dev);
          gather.send(owner, pack(data, t.in_box, t.region, item));
        }
      }
    }
    gather.wait();
    std::vector<ReduceTask> here;
    for (const Owned& o : owned) {
      ReduceTask r{{}, o.task->region, {}, o.task->out_box, o.task->region};
      for (size_t k = 0; k < o.inputs.size(); ++k) r.inputs.emplace_back(o.task->inputs[k].first, o.inputs[k]->data());
      for (const auto& [dev, data] : o.task->outputs) {
        if (process(dev) != rank_) continue;
        need(data, dev);
        r.outputs.emplace_back(dev, data);
      }
      here.push_back(std::move(r));
    }
    local_.reduce(here, dtype, op);
    // 2. The result goes from the first output to the outputs in other processes.
    struct Incoming {
      const ReduceTask* task;
      std::byte* dst;
      int64_t device;
      std::vector<std::byte>* bytes;
    };
    std::vector<Incoming> incoming;
    Exchange scatter(size_);
    for (const ReduceTask& t : tasks) {
      if (t.region.empty()) continue;
      const auto& [first_dev, first] = t.outputs.front();
      const int owner = process(first_dev);
      for (const auto& [dev, data] : t.outputs) {
        const int p = process(dev);
        if (p == owner) continue;
        if (owner == rank_) {
          scatter.send(p, pack(first, t.out_box, t.region, item));
        } else if (p == rank_) {
          need(data, dev);
          incoming.push_back({&t, data, dev, &scatter.receive(owner, t.region.volume() * static_cast<int64_t>(item))});
        }
      }
    }
    scatter.wait();
    for (const Incoming& in : incoming) {
      unpack(*in.bytes, in.dst, in.task->out_box, in.task->region, item);
      device(in.device).add_received(static_cast<int64_t>(in.bytes->size()));
    }
  }

 private:
  Device& device(int64_t id) const { return *devices_.at(static_cast<size_t>(id)); }
  int process(int64_t id) const { return device(id).process_index(); }
  static void need(const void* data, int64_t id) {
    if (!data) throw ValueError(fmt::format("device {} belongs to this process, but its buffer is missing", id));
  }

  InProcessCommunicator local_;
  std::vector<Device*> devices_;
  int rank_, size_;
};

}  // namespace

MpiSession::MpiSession(int& argc, char**& argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) throw Error("MPI is already initialized: one MpiSession per process");
  int provided = 0;
  check(MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    throw Error("this MPI cannot be called from more than one thread (MPI_THREAD_SERIALIZED)");
  }
  // Errors come back as codes (turned into exceptions) instead of aborting every rank.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiSession::~MpiSession() { MPI_Finalize(); }

Runtime mpi_runtime(RuntimeOptions options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw Error("mpi_runtime needs MPI: create a tessel::MpiSession first");
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int64_t k = options.devices == 0 ? Runtime::default_device_count() : options.devices;
  options.devices = k;
  check_same_on_all_ranks(std::to_string(k), "devices per process");
  return Runtime::multi_process(options, rank, size, [rank, size](WorkerPool& pool, std::span<Device* const> devices) {
    return std::make_unique<MpiCommunicator>(pool, devices, rank, size);
  });
}

void check_same_on_all_ranks(const std::string& text, const std::string& what) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  uint64_t n = text.size();
  check(MPI_Bcast(&n, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD), "MPI_Bcast");
  std::string root = rank == 0 ? text : std::string(n, '\0');
  if (n > 0) check(MPI_Bcast(root.data(), static_cast<int>(n), MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
  const int mine = root == text ? INT_MAX : rank;
  int first = INT_MAX;
  check(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce");
  if (first == INT_MAX) return;
  // The differing rank's text, for everyone's message.
  uint64_t m = first == rank ? text.size() : 0;
  check(MPI_Bcast(&m, 1, MPI_UINT64_T, first, MPI_COMM_WORLD), "MPI_Bcast");
  std::string other = first == rank ? text : std::string(m, '\0');
  if (m > 0) check(MPI_Bcast(other.data(), static_cast<int>(m), MPI_CHAR, first, MPI_COMM_WORLD), "MPI_Bcast");
  auto shorten = [](const std::string& s) { return s.size() > 200 ? s.substr(0, 200) + "..." : s; };
  throw ValueError(fmt::format("the {} differs between ranks: rank 0 has '{}', rank {} has '{}'", what, shorten(root),
                               first, shorten(other)));
}

}  // namespace tessel
