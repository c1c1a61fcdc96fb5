// A virtual device: an id, the process that owns it, and its memory accounts. Every Buffer is
// charged to one device; an allocation past the device's limit throws OutOfMemoryError naming
// the device, the request and what holds the memory.
//
//   auto rt = tessel::Runtime::host(8);
//   rt.device(3).set_memory_limit(64 << 20);
//   rt.device(3).memory_stats().in_use   // bytes held by live buffers on device 3
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace tessel {

struct MemoryStats {
  int64_t in_use = 0;   // bytes of live buffers
  int64_t peak = 0;     // highest in_use since creation or reset_peak()
  int64_t buffers = 0;  // live buffers (of non-zero size)
  int64_t cached = 0;   // freed blocks kept for reuse (not in use, counted against the limit)
  std::optional<int64_t> limit;
  // Bytes that reached this device from other devices, ever: the traffic a real device would
  // see, counted also where a replica shares another local replica's memory and nothing moved.
  int64_t bytes_received = 0;
};

// Live memory grouped by the label of the arrays that hold it.
struct MemoryHolder {
  std::string label;
  int64_t bytes = 0;
  int64_t buffers = 0;
};

class Device {
 public:
  Device(int64_t id, int process_index, std::optional<int64_t> memory_limit);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  int64_t id() const { return id_; }
  int process_index() const { return process_index_; }

  MemoryStats memory_stats() const;
  // Largest first.
  std::vector<MemoryHolder> memory_holders() const;
  // nullopt: no limit. Throws ValueError on a negative limit. Existing buffers stay.
  void set_memory_limit(std::optional<int64_t> bytes);
  void reset_peak();
  void release_cached_memory();

  // Low level, used by Buffer: 64-byte aligned memory charged to `label`. Zero bytes gives
  // nullptr and charges nothing. Throws OutOfMemoryError.
  std::byte* allocate(int64_t bytes, const std::string& label);
  void deallocate(std::byte* data, int64_t bytes, const std::string& label) noexcept;
  // allocate and deallocate in two halves, for buffers of several devices that share one block
  // of memory (replicas in one process): the accounts (charged like an allocation, limit
  // included; throws OutOfMemoryError) and the memory (from and back to this device's cache;
  // `label` only names a failure).
  void charge(int64_t bytes, const std::string& label);
  void uncharge(int64_t bytes, const std::string& label) noexcept;
  std::byte* take_block(int64_t bytes, const std::string& label);
  void return_block(std::byte* data, int64_t bytes) noexcept;
  // Traffic accounting by the Communicator.
  void add_received(int64_t bytes);

 private:
  std::string out_of_memory_message(int64_t bytes, const std::string& label) const;
  void charge_locked(int64_t bytes, const std::string& label);
  void uncharge_locked(int64_t bytes, const std::string& label);
  void trim_cache(int64_t keep);  // frees cached blocks until at most `keep` bytes stay cached

  const int64_t id_;
  const int process_index_;
  mutable std::mutex mu_;
  MemoryStats stats_;
  std::unordered_map<std::string, MemoryHolder> holders_;
  std::multimap<int64_t, std::byte*> cache_;  // rounded size -> freed block
};

}  // namespace tessel
