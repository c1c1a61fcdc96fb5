// The runtimes of the tests under mpirun: this rank's part of 8 devices, and the same 8 devices
// in one process as the reference every result is compared with.
#pragma once

#include <mpi.h>

#include "tessel/runtime/mpi.h"

namespace tessel::testing {

inline constexpr int64_t kMpiDevices = 8;

inline Runtime& mpi() {
  static Runtime rt = [] {
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return mpi_runtime({.devices = kMpiDevices / size});
  }();
  return rt;
}

inline Runtime& reference() {
  static Runtime rt = Runtime::host(kMpiDevices);
  return rt;
}

}  // namespace tessel::testing
