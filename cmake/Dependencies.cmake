# Every dependency is a Debian 12 package; docs/dependencies.md says why each one.
find_package(nlohmann_json 3.10 REQUIRED)   # nlohmann-json3-dev
find_package(yaml-cpp 0.7 REQUIRED)         # libyaml-cpp-dev
find_package(fmt 9 REQUIRED)                # libfmt-dev
find_package(CLI11 2.1 REQUIRED)            # libcli11-dev
find_package(PkgConfig REQUIRED)            # pkg-config
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)   # libzstd-dev
pkg_check_modules(BLOSC REQUIRED IMPORTED_TARGET blosc)    # libblosc-dev
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)  # libopenblas-dev
find_package(dnnl 2.6 CONFIG REQUIRED)     # libdnnl-dev (oneDNN; its OpenMP runtime is libgomp, g++'s)
set(MPI_CXX_SKIP_MPICXX ON)                 # the C API only (the C++ bindings are deprecated)
find_package(MPI REQUIRED COMPONENTS CXX)   # libopenmpi-dev (mpirun: openmpi-bin)
find_package(CURL 7.74 REQUIRED)            # libcurl4-openssl-dev (object stores over HTTP)
find_package(OpenSSL 3 REQUIRED)            # libssl-dev (AWS signatures, GCS service-account JWTs, checksums)
find_package(pugixml 1.11 REQUIRED)         # libpugixml-dev (S3's XML answers)
if(TESSEL_BUILD_TESTS)
  find_package(GTest REQUIRED)              # libgtest-dev
endif()
if(TESSEL_BUILD_BENCH)
  find_package(benchmark REQUIRED)          # libbenchmark-dev
endif()
