// tessel over MPI (Open MPI): each process (rank) hosts k virtual devices and the global device
// list spans the ranks in rank order (rank r holds devices r*k .. r*k+k-1), so a Mesh over all
// of them is the same object on every rank. Arrays hold only their addressable shards; every
// collective and reshard runs unchanged, the MpiCommunicator moving the bytes that cross
// processes (point-to-point, each rank posting its sends and receives in the same task order)
// and copying the rest directly.
//
//   int main(int argc, char** argv) {
//     tessel::MpiSession mpi(argc, argv);                 // MPI_Init_thread ... MPI_Finalize
//     tessel::Runtime rt = tessel::mpi_runtime({.devices = 4});   // 4 devices per rank
//     auto mesh = tessel::Mesh::parse("data=2,fsdp=4");   // mpirun -np 2: devices 0..7
//   }
#pragma once

#include <chrono>
#include <memory>

#include "tessel/runtime/process_group.h"
#include "tessel/runtime/runtime.h"

namespace tessel {

// Initializes MPI for this process (any thread may call it) and finalizes it at the end. One per
// process; throws Error if MPI is already initialized or fails to start.
class MpiSession {
 public:
  MpiSession();
  MpiSession(int& argc, char**& argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Call after an error this process reports, before it ends. If the other processes failed
  // too, all end normally; if one of them does not arrive within `grace` (it is still working,
  // or waiting for this one), the whole job is aborted (MPI_Abort) rather than left hanging.
  void end_after_error(std::chrono::seconds grace = std::chrono::seconds(10));

 private:
  MpiSession(int* argc, char*** argv);
  int rank_ = 0;
  int size_ = 1;
  std::unique_ptr<ProcessGroup> ending_;
};

// The runtime of this rank: options.devices devices on each of MPI_COMM_WORLD's ranks. Needs a
// live MpiSession. Every rank must pass the same options.devices; a difference is reported on
// every rank (ValueError naming the counts) before anything else runs. Its processes() meet
// within options.meeting_timeout or fail, naming who is missing.
Runtime mpi_runtime(RuntimeOptions options = {});

}  // namespace tessel
