#include "tessel/runtime/device.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "tessel/core/error.h"
#include "tessel/detail/text_util.h"

namespace tessel {
namespace {

// Blocks this large are kept after free: faulting fresh pages in costs more than the copy into
// them, so a steady training step or repeated reshard reuses the same memory (XLA's allocator
// does the same). Small blocks go straight back to malloc, which is fast for them.
constexpr int64_t kCacheMin = int64_t{1} << 20;
constexpr int64_t kAlign = 64;

// Buffers from 2 MiB up are placed on 2 MiB boundaries and marked for transparent huge pages:
// first-touch faults of fresh 4 KiB pages otherwise dominate filling a large shard (restore, init);
// a restore of 16 MiB shards runs about 2.5x faster on huge pages, and a training step's activations
// (the LM's [2048, 256] are 2 MiB each) are read back from memory with one TLB entry each. Sizes are
// rounded to whole huge pages only from 32 MiB up (at most 6% more), so that freed blocks of near
// sizes are reused; below that the partial huge page at the end stays in small pages.
constexpr int64_t kHugeMin = int64_t{2} << 20;
constexpr int64_t kHugeRound = int64_t{32} << 20;
constexpr int64_t kHugePage = int64_t{2} << 20;

int64_t rounded(int64_t bytes) {
  int64_t unit = bytes >= kHugeRound ? kHugePage : bytes >= kCacheMin ? 4096 : kAlign;
  return (bytes + unit - 1) / unit * unit;
}

std::byte* allocate_block(int64_t size) {
  void* p = nullptr;
  // Blocks from 1 MiB up start on a page boundary: a durable save writes them to the disk
  // directly (O_DIRECT), which wants the bytes' address aligned (512 bytes on ext4 here).
  const int64_t align = size < kCacheMin ? kAlign : size < kHugeMin ? 4096 : kHugePage;
  if (::posix_memalign(&p, static_cast<size_t>(align), static_cast<size_t>(size)) != 0) return nullptr;
  if (size >= kHugeMin) ::madvise(p, static_cast<size_t>(size), MADV_HUGEPAGE);  // advice only: failure is harmless
  return static_cast<std::byte*>(p);
}

void sort_largest_first(std::vector<MemoryHolder>& list) {
  std::sort(list.begin(), list.end(), [](const MemoryHolder& a, const MemoryHolder& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.label < b.label;
  });
}

}  // namespace

Device::Device(int64_t id, int process_index, std::optional<int64_t> memory_limit)
    : id_(id), process_index_(process_index) {
  set_memory_limit(memory_limit);
}

Device::~Device() { trim_cache(0); }

MemoryStats Device::memory_stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

std::vector<MemoryHolder> Device::memory_holders() const {
  std::vector<MemoryHolder> out;
  {
    std::lock_guard lock(mu_);
    for (const auto& [label, h] : holders_) out.push_back(h);
  }
  sort_largest_first(out);
  return out;
}

void Device::set_memory_limit(std::optional<int64_t> bytes) {
  if (bytes && *bytes < 0)
    throw ValueError(fmt::format("device {}: memory limit must not be negative, got {}", id_, *bytes));
  std::lock_guard lock(mu_);
  stats_.limit = bytes;
}

void Device::reset_peak() {
  std::lock_guard lock(mu_);
  stats_.peak = stats_.in_use;
}

void Device::release_cached_memory() {
  std::lock_guard lock(mu_);
  trim_cache(0);
}

void Device::trim_cache(int64_t keep) {
  while (stats_.cached > keep && !cache_.empty()) {
    auto it = std::prev(cache_.end());  // largest first
    stats_.cached -= it->first;
    std::free(it->second);
    cache_.erase(it);
  }
}

std::string Device::out_of_memory_message(int64_t bytes, const std::string& label) const {
  std::string holders;
  std::vector<MemoryHolder> list;
  for (const auto& [l, h] : holders_) list.push_back(h);
  sort_largest_first(list);
  for (size_t i = 0; i < list.size() && i < 5; ++i)
    holders += fmt::format("{}{} {} in {} buffer{}", i ? ", " : "", list[i].label,
                           text_util::format_bytes(list[i].bytes), list[i].buffers,
                           list[i].buffers == 1 ? "" : "s");
  if (list.size() > 5) holders += fmt::format(", and {} more", list.size() - 5);
  return fmt::format(
      "device {}: out of memory: cannot allocate {} for {} (limit {}, in use {}{}{})", id_,
      text_util::format_bytes(bytes), label, text_util::format_bytes(*stats_.limit), text_util::format_bytes(stats_.in_use),
      holders.empty() ? "" : " by ", holders);
}

void Device::charge_locked(int64_t bytes, const std::string& label) {
  if (stats_.limit) {
    if (stats_.in_use + stats_.cached + bytes > *stats_.limit) trim_cache(0);
    if (stats_.in_use + bytes > *stats_.limit)
      throw OutOfMemoryError(id_, bytes, out_of_memory_message(bytes, label));
  }
  MemoryHolder& h = holders_[label];
  h.label = label;
  h.bytes += bytes;
  h.buffers += 1;
  stats_.in_use += bytes;
  stats_.peak = std::max(stats_.peak, stats_.in_use);
  stats_.buffers += 1;
}

void Device::uncharge_locked(int64_t bytes, const std::string& label) {
  stats_.in_use -= bytes;
  stats_.buffers -= 1;
  auto it = holders_.find(label);
  if (it != holders_.end() && (it->second.bytes -= bytes, --it->second.buffers == 0))
    holders_.erase(it);
}

void Device::charge(int64_t bytes, const std::string& label) {
  if (bytes < 0) throw ValueError(fmt::format("device {}: negative allocation size {}", id_, bytes));
  if (bytes == 0) return;
  std::lock_guard lock(mu_);
  charge_locked(bytes, label);
}

void Device::uncharge(int64_t bytes, const std::string& label) noexcept {
  if (bytes == 0) return;
  std::lock_guard lock(mu_);
  uncharge_locked(bytes, label);
}

std::byte* Device::take_block(int64_t bytes, const std::string& label) {
  if (bytes <= 0) return nullptr;
  const int64_t size = rounded(bytes);
  {
    std::lock_guard lock(mu_);
    // The block of this size freed last: its bytes are likeliest still in the CPU's caches, where
    // the op about to fill it writes without first fetching the lines from memory (the oldest, as
    // multimap::find gives, is the coldest).
    if (auto [first, last] = cache_.equal_range(size); first != last) {
      const auto it = std::prev(last);
      std::byte* data = it->second;
      stats_.cached -= size;
      cache_.erase(it);
      return data;
    }
  }
  std::byte* data = allocate_block(size);
  if (!data)
    throw OutOfMemoryError(id_, bytes, fmt::format("device {}: the host has no memory left for {} "
                                                   "for {}", id_, text_util::format_bytes(bytes), label));
  return data;
}

void Device::return_block(std::byte* data, int64_t bytes) noexcept {
  if (!data) return;
  const int64_t size = rounded(bytes);
  std::lock_guard lock(mu_);
  // Keep at most as much cached as the device has ever needed at once (reserved <= 2 x peak).
  bool fits = !stats_.limit || stats_.in_use + stats_.cached + size <= *stats_.limit;
  if (size >= kCacheMin && fits && stats_.cached + size <= stats_.peak) {
    try {
      cache_.emplace(size, data);
      stats_.cached += size;
      return;
    } catch (...) {
    }
  }
  std::free(data);
}

std::byte* Device::allocate(int64_t bytes, const std::string& label) {
  charge(bytes, label);
  try {
    return take_block(bytes, label);
  } catch (...) {
    uncharge(bytes, label);
    throw;
  }
}

void Device::deallocate(std::byte* data, int64_t bytes, const std::string& label) noexcept {
  uncharge(bytes, label);
  return_block(data, bytes);
}

void Device::add_received(int64_t bytes) {
  std::lock_guard lock(mu_);
  stats_.bytes_received += bytes;
}

}  // namespace tessel
