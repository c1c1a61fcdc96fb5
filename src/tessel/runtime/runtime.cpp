#include "tessel/runtime/runtime.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "tessel/core/error.h"
#include "tessel/runtime/communicator.h"
#include "tessel/runtime/device.h"
#include "tessel/runtime/process_group.h"
#include "tessel/runtime/worker_pool.h"

namespace tessel {
namespace {
constexpr int64_t kMaxDevices = 4096;
}

struct Runtime::Impl {
  // Devices are shared with their buffers' allocations, which may outlive the Runtime handle.
  std::vector<std::shared_ptr<Device>> devices;
  std::vector<Device*> device_ptrs;
  WorkerPool pool;
  std::unique_ptr<Communicator> communicator;
  std::unique_ptr<ProcessGroup> processes;
  int process_index = 0;
  int process_count = 1;
  int64_t local_devices = 0;

  explicit Impl(int threads) : pool(threads) {}
};

int64_t Runtime::default_device_count() {
  const char* env = std::getenv("TESSEL_DEVICES");
  if (!env) return 8;
  std::string_view text(env);
  int64_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || n < 1 || n > kMaxDevices)
    throw ValueError(fmt::format("TESSEL_DEVICES must be a device count from 1 to {}, got '{}'",
                                 kMaxDevices, text));
  return n;
}

Runtime Runtime::host(RuntimeOptions options) {
  const int64_t n = options.devices == 0 ? default_device_count() : options.devices;
  if (n < 1 || n > kMaxDevices)
    throw ValueError(fmt::format("a host runtime has 1 to {} devices, got {}", kMaxDevices, n));
  options.devices = n;
  return multi_process(options, 0, 1, [](WorkerPool& pool, std::span<Device* const> devices) {
    return std::make_unique<InProcessCommunicator>(pool, devices);
  });
}

Runtime Runtime::host(int64_t devices) {
  if (devices < 1 || devices > kMaxDevices)
    throw ValueError(fmt::format("a host runtime has 1 to {} devices, got {}", kMaxDevices, devices));
  RuntimeOptions options;
  options.devices = devices;
  return host(options);
}

int64_t Runtime::device_count() const { return static_cast<int64_t>(impl_->devices.size()); }

Device& Runtime::device(int64_t id) const {
  if (id < 0 || id >= device_count())
    throw ValueError(fmt::format("device {} does not exist: the runtime has devices 0 to {}", id,
                                 device_count() - 1));
  return *impl_->devices[static_cast<size_t>(id)];
}

std::shared_ptr<Device> Runtime::shared_device(int64_t id) const {
  device(id);
  return impl_->devices[static_cast<size_t>(id)];
}

namespace {

void check_options(const RuntimeOptions& options) {
  if (options.memory_limit && *options.memory_limit < 0)
    throw ValueError(fmt::format("memory limit must not be negative, got {}", *options.memory_limit));
  if (options.threads < 0)
    throw ValueError(fmt::format("worker thread count must not be negative, got {}", options.threads));
}

}  // namespace

Runtime Runtime::multi_process(RuntimeOptions options, int process_index, int process_count,
                               const CommunicatorFactory& make_communicator) {
  const int64_t k = options.devices == 0 ? default_device_count() : options.devices;
  if (process_count < 1 || process_index < 0 || process_index >= process_count)
    throw ValueError(fmt::format("process {} of {} does not exist", process_index, process_count));
  if (k < 1 || k * process_count > kMaxDevices)
    throw ValueError(fmt::format("{} processes of {} devices: a runtime has 1 to {} devices", process_count, k,
                                 kMaxDevices));
  check_options(options);
  std::vector<int> owners;
  for (int64_t id = 0; id < k * process_count; ++id) owners.push_back(static_cast<int>(id / k));
  return Runtime(make_impl(options, owners, process_index, process_count, make_communicator));
}

Runtime Runtime::part_of_job(std::span<const int> device_processes, int process_index, RuntimeOptions options) {
  const auto n = static_cast<int64_t>(device_processes.size());
  if (n < 1 || n > kMaxDevices)
    throw ValueError(fmt::format("a job's runtime has 1 to {} devices, got {}", kMaxDevices, n));
  check_options(options);
  int process_count = 0;
  for (int p : device_processes) {
    if (p < 0) throw ValueError(fmt::format("a device's process index must not be negative, got {}", p));
    process_count = std::max(process_count, p + 1);
  }
  if (std::find(device_processes.begin(), device_processes.end(), process_index) == device_processes.end())
    throw ValueError(fmt::format("process {} owns none of the job's {} devices", process_index, n));
  return Runtime(make_impl(options, {device_processes.begin(), device_processes.end()}, process_index, process_count,
                           [](WorkerPool& pool, std::span<Device* const> devices) {
                             return std::make_unique<InProcessCommunicator>(pool, devices);
                           }));
}

std::shared_ptr<Runtime::Impl> Runtime::make_impl(const RuntimeOptions& options, const std::vector<int>& owners,
                                                  int process_index, int process_count,
                                                  const CommunicatorFactory& make_communicator) {
  auto impl = std::make_shared<Impl>(options.threads);
  impl->process_index = process_index;
  impl->process_count = process_count;
  for (size_t id = 0; id < owners.size(); ++id) {
    impl->devices.push_back(std::make_shared<Device>(static_cast<int64_t>(id), owners[id], options.memory_limit));
    impl->device_ptrs.push_back(impl->devices.back().get());
    if (owners[id] == process_index) ++impl->local_devices;
  }
  impl->communicator = make_communicator(impl->pool, impl->device_ptrs);
  impl->processes = impl->communicator->new_process_group();
  return impl;
}

int Runtime::process_index() const { return impl_->process_index; }
int Runtime::process_count() const { return impl_->process_count; }
int64_t Runtime::local_device_count() const { return impl_->local_devices; }

bool Runtime::is_addressable(int64_t id) const {
  return device(id).process_index() == process_index();
}

WorkerPool& Runtime::pool() const { return impl_->pool; }
Communicator& Runtime::communicator() const { return *impl_->communicator; }
ProcessGroup& Runtime::processes() const { return *impl_->processes; }
std::unique_ptr<ProcessGroup> Runtime::new_process_group() const { return impl_->communicator->new_process_group(); }

void Runtime::check_mesh(const Mesh& mesh) const {
  for (int64_t id : mesh.device_ids())
    if (id < 0 || id >= device_count())
      throw ValueError(fmt::format("{} uses device {}, but the runtime has devices 0 to {}",
                                   mesh.to_string(), id, device_count() - 1));
}

void Runtime::release_cached_memory() const {
  for (auto& d : impl_->devices) d->release_cached_memory();
}

}  // namespace tessel
