// main() of the tests that run under mpirun: every rank runs every test; rank 0 prints, and the
// exit status is the worst of all ranks.
#include <mpi.h>

#include <iostream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessel/runtime/mpi.h"

int main(int argc, char** argv) {
  tessel::MpiSession session(argc, argv);
  ::testing::InitGoogleMock(&argc, argv);
  if (session.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (worst != 0 && rc == 0 && session.rank() == 0) std::cerr << "a test failed on another rank\n";
  return worst;
}
