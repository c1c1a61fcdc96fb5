#include "job.h"

#include <algorithm>
#include <utility>

#include <nanobind/stl/string.h>

#include "tessel/core/error.h"

namespace nb = nanobind;

namespace tessel::python {

PythonProcessGroup::PythonProcessGroup(nb::object impl, int index, int count)
    : impl_(std::move(impl)), index_(index), count_(count) {
  if (count < 1 || index < 0 || index >= count)
    throw ValueError("process " + std::to_string(index) + " of " + std::to_string(count) + " does not exist");
}

PythonProcessGroup::~PythonProcessGroup() {
  // The last reference may go on a thread without the GIL (a save's).
  nb::gil_scoped_acquire gil;
  impl_.reset();
}

std::vector<std::string> PythonProcessGroup::all_gather(const std::string& mine, std::string_view what) {
  nb::gil_scoped_acquire gil;
  std::vector<std::string> out;
  try {
    nb::object parts = impl_.attr("all_gather")(nb::bytes(mine.data(), mine.size()), nb::str(what.data(), what.size()));
    for (nb::handle part : parts) {
      nb::bytes b = nb::cast<nb::bytes>(part);
      out.emplace_back(static_cast<const char*>(b.data()), b.size());
    }
  } catch (nb::python_error& e) {
    // The Python error ends here (the GIL is held); its message goes on as tessel's Error.
    throw Error(nb::cast<std::string>(nb::str(e.value())));
  }
  if (out.size() != static_cast<size_t>(count_))
    throw Error(std::string(what) + ": the job's meeting returned " + std::to_string(out.size()) + " parts for " +
                std::to_string(count_) + " processes");
  return out;
}

void JobDevices::check() const {
  if (ids.empty() || ids.size() != processes.size())
    throw ValueError("a job's devices: " + std::to_string(ids.size()) + " ids for " + std::to_string(processes.size()) +
                     " process indices");
  for (size_t i = 1; i < ids.size(); ++i)
    if (ids[i] <= ids[i - 1]) throw ValueError("a job's device ids must ascend without repeats");
}

NamedSharding JobDevices::to_positions(const NamedSharding& sharding, const std::string& what) const {
  std::vector<int64_t> positions;
  for (int64_t id : sharding.mesh().device_ids()) {
    auto it = std::lower_bound(ids.begin(), ids.end(), id);
    if (it == ids.end() || *it != id)
      throw ValueError(what + ": its sharding " + sharding.to_string() + " uses device " + std::to_string(id) +
                       ", which this job does not have (its devices are " + std::to_string(ids.front()) + " .. " +
                       std::to_string(ids.back()) + ")");
    positions.push_back(it - ids.begin());
  }
  return NamedSharding(Mesh(sharding.mesh().axes(), std::move(positions)), sharding.spec());
}

}  // namespace tessel::python
