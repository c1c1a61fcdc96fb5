#include "tessel/runtime/mpi.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <tuple>
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
// number) matches on both ends without any extra handshake. Bytes are sent from and received into
// the callers' memory, which must stay put until wait().
class Exchange {
 public:
  Exchange(MPI_Comm comm, int processes)
      : comm_(comm), sent_(static_cast<size_t>(processes)), received_(static_cast<size_t>(processes)) {}
  ~Exchange() {
    // A failure between posting and waiting must not leave MPI writing into freed buffers.
    if (!requests_.empty()) MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }
  void send(int peer, std::span<const std::byte> bytes) {
    post(peer, const_cast<std::byte*>(bytes.data()), bytes.size(), sent_, true);
  }
  void receive(int peer, std::span<std::byte> into) { post(peer, into.data(), into.size(), received_, false); }
  void wait() {
    std::vector<MPI_Request> pending = std::move(requests_);
    requests_.clear();
    if (!pending.empty())
      check(MPI_Waitall(static_cast<int>(pending.size()), pending.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  }

 private:
  void post(int peer, std::byte* data, size_t size, std::vector<int>& counter, bool is_send) {
    // Both sides know the size, so both cut the same pieces (none for an empty buffer).
    for (int64_t at = 0; at < static_cast<int64_t>(size); at += kMaxMessage) {
      const int n = static_cast<int>(std::min<int64_t>(kMaxMessage, static_cast<int64_t>(size) - at));
      const int tag = counter[static_cast<size_t>(peer)]++ % kTagLimit;
      MPI_Request r;
      if (is_send) {
        check(MPI_Isend(data + at, n, MPI_BYTE, peer, tag, comm_, &r), "MPI_Isend");
      } else {
        check(MPI_Irecv(data + at, n, MPI_BYTE, peer, tag, comm_, &r), "MPI_Irecv");
      }
      requests_.push_back(r);
    }
  }
  MPI_Comm comm_;
  std::vector<int> sent_, received_;
  std::vector<MPI_Request> requests_;
};

// Host memory for the pieces that cannot go straight from or into a device buffer, kept from one
// call to the next: fresh pages would be faulted in (and cleared) for every message.
class Scratch {
 public:
  std::span<std::byte> take(int64_t bytes) {
    const auto n = static_cast<size_t>(bytes);
    for (; current_ < blocks_.size(); ++current_, used_ = 0) {
      Block& b = blocks_[current_];
      if (b.size - used_ >= n) {
        std::span<std::byte> out(b.data.get() + used_, n);
        used_ += (n + 63) / 64 * 64;
        return out;
      }
    }
    const size_t size = std::max(n, kBlock);
    blocks_.push_back({std::unique_ptr<std::byte[]>(new std::byte[size]), size});
    used_ = 0;
    return take(bytes);
  }
  // Every piece taken is free again; blocks beyond kKeep bytes go back to the system.
  void reset() {
    size_t kept = 0, i = 0;
    for (; i < blocks_.size() && kept + blocks_[i].size <= kKeep; ++i) kept += blocks_[i].size;
    blocks_.resize(i);
    current_ = used_ = 0;
  }

 private:
  static constexpr size_t kBlock = size_t{4} << 20, kKeep = size_t{512} << 20;
  struct Block {
    std::unique_ptr<std::byte[]> data;
    size_t size;
  };
  std::vector<Block> blocks_;
  size_t current_ = 0, used_ = 0;
};

// Where `region` starts in a buffer holding `box`, in elements, when the region is one contiguous
// run of it (a flat piece, whole trailing dimensions): then its bytes go to and from MPI in place.
std::optional<int64_t> contiguous_offset(const Box& region, const Box& box) {
  size_t d = 0;
  while (d < region.rank() && region.extent(d) == 1) ++d;  // leading single rows
  if (d < region.rank()) ++d;                               // then one partial dimension
  for (; d < region.rank(); ++d) {
    if (region.start(d) != box.start(d) || region.stop(d) != box.stop(d)) return std::nullopt;
  }
  return box.offset_of(region.starts());
}

void pack(const std::byte* src, const Box& src_box, const Box& region, size_t item, std::span<std::byte> out) {
  const auto isize = static_cast<int64_t>(item);
  for_each_run(region, src_box, region, [&](int64_t s, int64_t d, int64_t n) {
    std::memcpy(out.data() + d * isize, src + s * isize, static_cast<size_t>(n * isize));
  });
}

void unpack(std::span<const std::byte> in, std::byte* dst, const Box& dst_box, const Box& region, size_t item) {
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

// Bytes within a process move as in one process; bytes between processes by MPI point to point,
// straight from and into device buffers where the piece is contiguous there. Called by one thread
// at a time (the one driving the devices).
class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(WorkerPool& pool, std::span<Device* const> devices, int rank, int size,
                  std::chrono::seconds timeout)
      : local_(pool, devices), devices_(devices.begin(), devices.end()), rank_(rank), size_(size), timeout_(timeout) {}

  std::unique_ptr<ProcessGroup> new_process_group() override { return std::make_unique<MpiProcessGroup>(timeout_); }

  void copy(std::span<const CopyTask> tasks, DType dtype) override {
    const size_t item = item_size(dtype);
    scratch_.reset();
    std::vector<CopyTask> local;
    std::vector<std::pair<const CopyTask*, std::span<std::byte>>> staged;  // received, still to unpack
    Exchange x(comm_.get(), size_);
    for (const CopyTask& t : tasks) {
      if (t.region.empty()) continue;
      check_region_inside(t.region, t.src_box, t.dst_box, "copy task:");
      const int from = process(t.src_device), to = process(t.dst_device);
      const int64_t bytes = t.region.volume() * static_cast<int64_t>(item);
      if (from == rank_ && to == rank_) {
        local.push_back(t);
      } else if (to == rank_) {
        need(t.dst, t.dst_device);
        device(t.dst_device).add_received(bytes);
        if (t.replica) {  // the sender cannot know that the bytes are already on their way here
          x.receive(from, scratch_.take(bytes));
        } else if (auto at = contiguous_offset(t.region, t.dst_box)) {
          x.receive(from, {t.dst + *at * static_cast<int64_t>(item), static_cast<size_t>(bytes)});
        } else {
          staged.emplace_back(&t, scratch_.take(bytes));
          x.receive(from, staged.back().second);
        }
      } else if (from == rank_) {
        need(t.src, t.src_device);
        x.send(to, outgoing(t.src, t.src_box, t.region, item));
      }
    }
    local_.copy(local, dtype);
    x.wait();
    for (const auto& [t, bytes] : staged) unpack(bytes, t->dst, t->dst_box, t->region, item);
  }

  void reduce(std::span<const ReduceTask> tasks, DType dtype, Reduction op) override {
    detail::check_reduction(dtype, op);
    const size_t item = item_size(dtype);
    scratch_.reset();
    // 1. Every input travels to the process of the task's first output, which reduces them in
    //    input order (the same order, so the same bits, as in one process). One input from another
    //    process may land in the first output itself: the kernel reads each slice before writing it.
    std::vector<ReduceTask> here;
    Exchange gather(comm_.get(), size_);
    for (const ReduceTask& t : tasks) {
      if (t.region.empty()) continue;
      check_region_inside(t.region, t.in_box, t.out_box, "reduce task:");
      if (t.inputs.empty() || t.outputs.empty()) throw ValueError("reduce task without inputs or outputs");
      const auto& [first_dev, first] = t.outputs.front();
      const int owner = process(first_dev);
      const int64_t bytes = t.region.volume() * static_cast<int64_t>(item);
      if (owner != rank_) {
        for (const auto& [dev, data] : t.inputs) {
          if (process(dev) != rank_) continue;
          need(data, dev);
          gather.send(owner, outgoing(data, t.in_box, t.region, item));
        }
        continue;
      }
      need(first, first_dev);
      std::byte* landing = nullptr;  // where the first input from elsewhere may go: the result's place
      if (auto at = contiguous_offset(t.region, t.out_box)) {
        landing = first + *at * static_cast<int64_t>(item);
        if (overlaps_an_input(t, landing, bytes, item)) landing = nullptr;
      }
      ReduceTask r{{}, t.region, {}, t.out_box, t.region};
      for (const auto& [dev, data] : t.inputs) {
        if (process(dev) == rank_) {
          need(data, dev);
          r.inputs.emplace_back(dev, outgoing(data, t.in_box, t.region, item).data());
          continue;
        }
        std::span<std::byte> into = landing ? std::span<std::byte>(landing, static_cast<size_t>(bytes)) : scratch_.take(bytes);
        landing = nullptr;
        gather.receive(process(dev), into);
        device(first_dev).add_received(bytes);
        r.inputs.emplace_back(dev, into.data());
      }
      for (const auto& [dev, data] : t.outputs) {
        if (process(dev) != rank_) continue;
        need(data, dev);
        r.outputs.emplace_back(dev, data);
      }
      here.push_back(std::move(r));
    }
    gather.wait();
    local_.reduce(here, dtype, op);
    // 2. The result goes from the first output to the outputs in other processes.
    std::vector<std::tuple<const ReduceTask*, std::byte*, std::span<std::byte>>> staged;
    Exchange scatter(comm_.get(), size_);
    for (const ReduceTask& t : tasks) {
      if (t.region.empty()) continue;
      const auto& [first_dev, first] = t.outputs.front();
      const int owner = process(first_dev);
      const int64_t bytes = t.region.volume() * static_cast<int64_t>(item);
      for (size_t k = 0; k < t.outputs.size(); ++k) {
        const auto& [dev, data] = t.outputs[k];
        const int p = process(dev);
        if (p == owner) continue;
        if (owner == rank_) {
          scatter.send(p, outgoing(first, t.out_box, t.region, item));
        } else if (p == rank_) {
          need(data, dev);
          device(dev).add_received(bytes);
          // The sender cannot see that replicas here share a buffer: a repeat lands in scratch.
          if (repeats_an_output(t, k)) {
            scatter.receive(owner, scratch_.take(bytes));
          } else if (auto at = contiguous_offset(t.region, t.out_box)) {
            scatter.receive(owner, {data + *at * static_cast<int64_t>(item), static_cast<size_t>(bytes)});
          } else {
            staged.emplace_back(&t, data, scratch_.take(bytes));
            scatter.receive(owner, std::get<2>(staged.back()));
          }
        }
      }
    }
    scatter.wait();
    for (const auto& [t, dst, bytes] : staged) unpack(bytes, dst, t->out_box, t->region, item);
  }

 private:
  Device& device(int64_t id) const { return *devices_.at(static_cast<size_t>(id)); }
  int process(int64_t id) const { return device(id).process_index(); }
  static void need(const void* data, int64_t id) {
    if (!data) throw ValueError(fmt::format("device {} belongs to this process, but its buffer is missing", id));
  }

  // The bytes of `region` in a buffer holding `box`: in place when contiguous, else packed into
  // scratch memory (valid until the next call).
  std::span<const std::byte> outgoing(const std::byte* data, const Box& box, const Box& region, size_t item) {
    const int64_t bytes = region.volume() * static_cast<int64_t>(item);
    if (auto at = contiguous_offset(region, box)) {
      return {data + *at * static_cast<int64_t>(item), static_cast<size_t>(bytes)};
    }
    std::span<std::byte> out = scratch_.take(bytes);
    pack(data, box, region, item, out);
    return out;
  }

  // Whether bytes [at, at + n) share memory with one of the task's input buffers on this process.
  bool overlaps_an_input(const ReduceTask& t, const std::byte* at, int64_t n, size_t item) const {
    for (const auto& [dev, data] : t.inputs) {
      if (process(dev) != rank_ || !data) continue;
      const std::byte* end = data + t.in_box.volume() * static_cast<int64_t>(item);
      if (at < end && data < at + n) return true;
    }
    return false;
  }

  InProcessCommunicator local_;
  std::vector<Device*> devices_;
  int rank_, size_;
  std::chrono::seconds timeout_;
  OwnedComm comm_;
  Scratch scratch_;
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
