#include "tessel/runtime/mpi.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "tessel/core/box_copy.h"
#include "tessel/core/error.h"
#include "tessel/runtime/communicator.h"
#include "tessel/runtime/detail/kernels.h"
#include "tessel/runtime/device.h"
#include "tessel/runtime/process_group.h"

namespace tessel {
namespace {

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(rc, text, &n);
  throw Error(fmt::format("{} failed: {}", call, std::string(text, static_cast<size_t>(n))));
}

// A duplicate of MPI_COMM_WORLD, so tessel's messages never meet the application's (or another
// group's). Freed before MPI_Finalize, or left to it.
class OwnedComm {
 public:
  OwnedComm() { check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup"); }
  ~OwnedComm() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  OwnedComm(const OwnedComm&) = delete;
  OwnedComm& operator=(const OwnedComm&) = delete;
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// One message is at most this large (MPI counts are ints); larger payloads go in pieces.
constexpr int64_t kMaxMessage = int64_t{1} << 30;
constexpr int kTagLimit = 32767;  // the least MPI_TAG_UB the standard allows

// The messages of one exchange. Each side numbers its messages to and from every peer in the
// order it posts them, and both sides walk the tasks in the same order, so a message's tag (its
// number) matches on both ends without any extra handshake.
class Exchange {
 public:
  Exchange(MPI_Comm comm, int processes)
      : comm_(comm), sent_(static_cast<size_t>(processes)), received_(static_cast<size_t>(processes)) {}
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
        check(MPI_Isend(buf.data() + at, n, MPI_BYTE, peer, tag, comm_, &r), "MPI_Isend");
      } else {
        check(MPI_Irecv(buf.data() + at, n, MPI_BYTE, peer, tag, comm_, &r), "MPI_Irecv");
      }
      requests_.push_back(r);
    }
  }
  MPI_Comm comm_;
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

// Meeting points by point-to-point messages on a communicator of its own: every process sends its
// bytes to process 0, which answers with everyone's. MPI's collectives cannot give up waiting, so
// both sides poll, and a process that does not arrive in time is named rather than waited for
// forever.
class MpiProcessGroup final : public ProcessGroup {
 public:
  explicit MpiProcessGroup(std::chrono::seconds timeout) : timeout_(timeout) {
    MPI_Comm_rank(comm_.get(), &rank_);
    MPI_Comm_size(comm_.get(), &size_);
  }
  int index() const override { return rank_; }
  int count() const override { return size_; }
  void set_timeout(std::chrono::seconds timeout) { timeout_ = timeout; }

  std::vector<std::string> all_gather(const std::string& mine, std::string_view what) override {
    if (mine.size() > static_cast<size_t>(INT_MAX)) throw ValueError(fmt::format("{}: a message over 2 GiB", what));
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    if (rank_ != 0) {
      MPI_Request sent;
      check(MPI_Isend(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, 0, kUp, comm_.get(), &sent), "MPI_Isend");
      std::string all;
      if (!receive(0, kDown, all, deadline)) {
        MPI_Cancel(&sent);
        MPI_Request_free(&sent);
        throw Error(fmt::format("{}: process 0 did not answer within {} s (stopped, or died)", what, timeout_.count()));
      }
      check(MPI_Wait(&sent, MPI_STATUS_IGNORE), "MPI_Wait");
      return unpack_all(all);
    }
    std::vector<std::string> all(static_cast<size_t>(size_));
    all[0] = mine;
    std::vector<bool> arrived(static_cast<size_t>(size_), false);
    arrived[0] = true;
    for (int r = 1; r < size_; ++r) {
      if (receive(r, kUp, all[static_cast<size_t>(r)], deadline)) continue;
      std::vector<int> missing;
      for (int q = r; q < size_; ++q) {
        if (q == r || !probe(q, kUp)) missing.push_back(q);
      }
      throw Error(fmt::format("{}: process{} {} did not arrive within {} s (stopped, or died)", what,
                              missing.size() > 1 ? "es" : "", fmt::join(missing, ", "), timeout_.count()));
    }
    const std::string packed = pack_all(all);
    if (packed.size() > static_cast<size_t>(INT_MAX)) throw ValueError(fmt::format("{}: messages over 2 GiB", what));
    std::vector<MPI_Request> sends(static_cast<size_t>(size_ - 1));
    for (int r = 1; r < size_; ++r) {
      check(MPI_Isend(packed.data(), static_cast<int>(packed.size()), MPI_CHAR, r, kDown, comm_.get(),
                      &sends[static_cast<size_t>(r - 1)]),
            "MPI_Isend");
    }
    if (!sends.empty()) check(MPI_Waitall(static_cast<int>(sends.size()), sends.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    return all;
  }

 private:
  static constexpr int kUp = 1, kDown = 2;

  bool probe(int from, int tag) {
    int flag = 0;
    check(MPI_Iprobe(from, tag, comm_.get(), &flag, MPI_STATUS_IGNORE), "MPI_Iprobe");
    return flag != 0;
  }

  // Waits for the next message from `from`; false when the deadline passes first.
  bool receive(int from, int tag, std::string& out, std::chrono::steady_clock::time_point deadline) {
    auto pause = std::chrono::microseconds(20);
    for (;;) {
      int flag = 0;
      MPI_Status status;
      check(MPI_Iprobe(from, tag, comm_.get(), &flag, &status), "MPI_Iprobe");
      if (flag) {
        int n = 0;
        MPI_Get_count(&status, MPI_CHAR, &n);
        out.assign(static_cast<size_t>(n), '\0');
        check(MPI_Recv(out.data(), n, MPI_CHAR, from, tag, comm_.get(), MPI_STATUS_IGNORE), "MPI_Recv");
        return true;
      }
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  static std::string pack_all(const std::vector<std::string>& all) {
    std::string out;
    for (const std::string& s : all) {
      const uint64_t n = s.size();
      out.append(reinterpret_cast<const char*>(&n), sizeof n);
      out += s;
    }
    return out;
  }

  std::vector<std::string> unpack_all(const std::string& in) const {
    std::vector<std::string> all;
    size_t at = 0;
    while (at + sizeof(uint64_t) <= in.size()) {
      uint64_t n = 0;
      std::memcpy(&n, in.data() + at, sizeof n);
      at += sizeof n;
      if (n > in.size() - at) break;
      all.push_back(in.substr(at, n));
      at += n;
    }
    if (all.size() != static_cast<size_t>(size_) || at != in.size()) {
      throw Error("a meeting point's answer from process 0 is malformed");
    }
    return all;
  }

  OwnedComm comm_;
  std::chrono::seconds timeout_;
  int rank_ = 0, size_ = 1;
};

// Bytes within a process move as in one process; bytes between processes by MPI point to point.
class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(WorkerPool& pool, std::span<Device* const> devices, int rank, int size,
                  std::chrono::seconds timeout)
      : local_(pool, devices), devices_(devices.begin(), devices.end()), rank_(rank), size_(size), timeout_(timeout) {}

  std::unique_ptr<ProcessGroup> new_process_group() override { return std::make_unique<MpiProcessGroup>(timeout_); }

  void copy(std::span<const CopyTask> tasks, DType dtype) override {
    const size_t item = item_size(dtype);
    std::vector<CopyTask> local;
    struct Incoming {
      const CopyTask* task;
      std::vector<std::byte>* bytes;
    };
    std::vector<Incoming> incoming;
    Exchange x(comm_.get(), size_);
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
    Exchange gather(comm_.get(), size_);
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
    Exchange scatter(comm_.get(), size_);
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
  std::chrono::seconds timeout_;
  OwnedComm comm_;
};

}  // namespace

MpiSession::MpiSession() : MpiSession(nullptr, nullptr) {}

MpiSession::MpiSession(int& argc, char**& argv) : MpiSession(&argc, &argv) {}

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) throw Error("MPI is already initialized: one MpiSession per process");
  int provided = 0;
  check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    throw Error("this MPI cannot be called from several threads at once (MPI_THREAD_MULTIPLE), which a "
                "background checkpoint save needs");
  }
  // Errors come back as codes (turned into exceptions) instead of aborting every rank.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  ending_ = std::make_unique<MpiProcessGroup>(std::chrono::seconds(10));
}

MpiSession::~MpiSession() {
  ending_.reset();
  MPI_Finalize();
}

void MpiSession::end_after_error(std::chrono::seconds grace) {
  // When every process failed (an error they agreed on), they all arrive and end normally. A lone
  // failure would leave the others waiting for this process forever: end them all.
  auto& group = static_cast<MpiProcessGroup&>(*ending_);
  group.set_timeout(grace);
  try {
    group.all_gather("failed", "ending after an error");
  } catch (const Error&) {
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

Runtime mpi_runtime(RuntimeOptions options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw Error("mpi_runtime needs MPI: create a tessel::MpiSession first");
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int64_t k = options.devices == 0 ? Runtime::default_device_count() : options.devices;
  options.devices = k;
  {
    MpiProcessGroup group(options.meeting_timeout);
    check_same(group, std::to_string(k), "devices per process");
  }
  const std::chrono::seconds timeout = options.meeting_timeout;
  return Runtime::multi_process(options, rank, size, [rank, size, timeout](WorkerPool& pool, std::span<Device* const> devices) {
    return std::make_unique<MpiCommunicator>(pool, devices, rank, size, timeout);
  });
}

}  // namespace tessel
