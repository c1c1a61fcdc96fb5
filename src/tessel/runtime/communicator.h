// The Communicator moves bytes between devices. Every collective and every reshard is planned as
// a list of CopyTasks and ReduceTasks over device buffers and handed to the Communicator, so a
// multi-process implementation (MPI) slots in under the same callers: in one process both ends of
// a task are addressable and the in-process implementation copies memory directly; across
// processes each side passes its own pointer and the other is null.
//
//   rt.communicator().copy(tasks, tessel::DType::kF32);
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "tessel/core/box.h"
#include "tessel/core/dtype.h"

namespace tessel {

class Device;
class ProcessGroup;
class WorkerPool;

enum class Reduction { kSum, kMax, kMin, kMean };
std::string_view name(Reduction op);  // "sum", "max", "min", "mean"

// Copy `region` from a buffer holding `src_box` on `src_device` into a buffer holding `dst_box`
// on `dst_device`. All three boxes are in one coordinate frame (normally the global array's).
struct CopyTask {
  int64_t src_device = 0;
  const std::byte* src = nullptr;
  Box src_box;
  int64_t dst_device = 0;
  std::byte* dst = nullptr;
  Box dst_box;
  Box region;
  // The destination is a replica sharing the bytes another task writes (replicas stored once in
  // one process): the traffic is counted, nothing is copied.
  bool replica = false;
};

// out[region] = op over inputs, in order, of input[region], for every output: the first output's
// device computes it and sends it to the others (an all-reduce piece in one pass). Every input
// holds `in_box`, every output `out_box`. Outputs of one process may share a buffer (replicas
// stored once): it is written once. Float16 and bfloat16 accumulate in float32 and round
// once; integer sums wrap; mean divides the sum by the number of inputs; max and min propagate
// NaN.
struct ReduceTask {
  std::vector<std::pair<int64_t, const std::byte*>> inputs;  // (device, buffer)
  Box in_box;
  std::vector<std::pair<int64_t, std::byte*>> outputs;  // (device, buffer)
  Box out_box;
  Box region;
};

// Whether output k of the task has the buffer of an earlier output (the bytes are written there).
bool repeats_an_output(const ReduceTask& task, size_t k);

class Communicator {
 public:
  virtual ~Communicator() = default;
  // Runs every task; returns when all are done. Tasks must not write overlapping bytes.
  virtual void copy(std::span<const CopyTask> tasks, DType dtype) = 0;
  virtual void reduce(std::span<const ReduceTask> tasks, DType dtype, Reduction op) = 0;
  // A new group of the processes, independent of every other (a thread may use one while another
  // thread uses another). Every process must create its groups in the same order.
  virtual std::unique_ptr<ProcessGroup> new_process_group();
};

// One process: tasks run on the worker pool as direct memory copies, large ones split so every
// thread has work; bytes that cross devices are added to the receiving device's account.
class InProcessCommunicator final : public Communicator {
 public:
  // `devices` is indexed by device id; both must outlive the communicator.
  InProcessCommunicator(WorkerPool& pool, std::span<Device* const> devices);
  void copy(std::span<const CopyTask> tasks, DType dtype) override;
  void reduce(std::span<const ReduceTask> tasks, DType dtype, Reduction op) override;

 private:
  WorkerPool& pool_;
  std::vector<Device*> devices_;
};

}  // namespace tessel
