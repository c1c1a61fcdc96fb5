// This process's part of a multi-process job that Python drives (a JAX job, one process per host):
// the job's meeting points through a Python object (tessel/_job.py, over JAX's coordination
// service), and the job's devices, which JAX numbers sparsely (process p's CPU devices from
// p * 2048) while a tessel Runtime numbers its devices 0 .. n-1.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nanobind/nanobind.h>

#include "tessel/runtime/process_group.h"
#include "tessel/sharding/named_sharding.h"

namespace tessel::python {

// A ProcessGroup whose all_gather is `impl.all_gather(bytes, what) -> list[bytes]`, called with the
// GIL held (the save that meets releases it). A Python exception there becomes tessel's Error.
class PythonProcessGroup final : public ProcessGroup {
 public:
  PythonProcessGroup(nanobind::object impl, int index, int count);
  ~PythonProcessGroup() override;
  int index() const override { return index_; }
  int count() const override { return count_; }
  std::vector<std::string> all_gather(const std::string& mine, std::string_view what) override;

 private:
  nanobind::object impl_;
  int index_, count_;
};

// The job's devices: ids as the framework numbers them, ascending, each one's process, and this
// process's index. A Runtime::part_of_job over `processes` numbers them by position.
struct JobDevices {
  std::vector<int64_t> ids;
  std::vector<int> processes;
  int process_index = 0;

  // Throws ValueError unless ids ascend without repeats and match processes one to one.
  void check() const;
  // The sharding on the positions of its devices among ids; throws ValueError naming `what` for a
  // device the job lacks.
  NamedSharding to_positions(const NamedSharding& sharding, const std::string& what) const;
  int64_t id_at(int64_t position) const { return ids.at(static_cast<size_t>(position)); }
};

}  // namespace tessel::python
