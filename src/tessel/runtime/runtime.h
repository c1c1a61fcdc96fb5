// The Runtime owns the devices, the worker pool and the communicator. It is the only state an
// operation touches and is passed explicitly (a cheap shared handle; Arrays keep theirs alive).
//
//   auto rt = tessel::Runtime::host(8);                  // 8 virtual CPU devices
//   auto mesh = tessel::Mesh::parse("data=2,fsdp=4");     // devices 0..7 of rt
//   auto x = tessel::device_put(rt, host, tessel::NamedSharding(mesh, {{"fsdp"}}));
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessel/sharding/mesh.h"

namespace tessel {

class Communicator;
class Device;
class ProcessGroup;
class WorkerPool;

struct RuntimeOptions {
  int64_t devices = 0;                  // 0: $TESSEL_DEVICES, else 8
  std::optional<int64_t> memory_limit;  // bytes per device; none by default
  int threads = 0;                      // worker threads; 0: the machine's cores
  // Several processes: how long one waits at a meeting point (ProcessGroup) for the others.
  std::chrono::seconds meeting_timeout{600};
};

class Runtime {
 public:
  // Virtual CPU devices in this process. Throws ValueError on a device count below 1 or above
  // 4096, a negative memory limit, or a malformed $TESSEL_DEVICES.
  static Runtime host(RuntimeOptions options = {});
  static Runtime host(int64_t devices);
  // $TESSEL_DEVICES if set (a positive integer), else 8.
  static int64_t default_device_count();
  // One of `process_count` processes, each with options.devices devices: device d belongs to
  // process d / options.devices. `make_communicator` builds the communicator over all devices (the
  // other processes' are placeholders that hold no memory). See tessel/runtime/mpi.h.
  using CommunicatorFactory = std::function<std::unique_ptr<Communicator>(WorkerPool&, std::span<Device* const>)>;
  static Runtime multi_process(RuntimeOptions options, int process_index, int process_count,
                               const CommunicatorFactory& make_communicator);
  // This process's part of a job whose processes another framework drives (a multi-process JAX
  // job): device d belongs to process device_processes[d] and only this process's devices hold
  // memory. Arrays, device_put and restores work on its devices; a copy or reduction between
  // processes throws ValueError (the framework moves those bytes), and processes() is this
  // process alone (a save across the job's processes brings its own ProcessGroup). Throws
  // ValueError for an empty or oversized device list, or a process index that owns no device.
  static Runtime part_of_job(std::span<const int> device_processes, int process_index, RuntimeOptions options = {});

  int64_t device_count() const;
  Device& device(int64_t id) const;  // throws ValueError naming the valid range
  // The same device as a shared owner, for allocations that may outlive this handle.
  std::shared_ptr<Device> shared_device(int64_t id) const;
  int process_index() const;         // 0 in a host runtime
  int process_count() const;         // 1 in a host runtime
  int64_t local_device_count() const;  // devices of this process
  bool is_addressable(int64_t device) const;  // owned by this process
  WorkerPool& pool() const;
  Communicator& communicator() const;
  // The processes of this runtime, for the calling thread that drives the devices. Another thread
  // (a background checkpoint save) takes a group of its own from new_process_group().
  ProcessGroup& processes() const;
  std::unique_ptr<ProcessGroup> new_process_group() const;

  // Throws ValueError if the mesh names a device this runtime does not have.
  void check_mesh(const Mesh& mesh) const;
  // Drops every device's cache of freed blocks.
  void release_cached_memory() const;

  friend bool operator==(const Runtime& a, const Runtime& b) { return a.impl_ == b.impl_; }

 private:
  struct Impl;
  static std::shared_ptr<Impl> make_impl(const RuntimeOptions& options, const std::vector<int>& owners,
                                         int process_index, int process_count,
                                         const CommunicatorFactory& make_communicator);
  explicit Runtime(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace tessel
