# Fails naming every kernels/cuda/X.cu without a tests/cuda_emulation/test_X.cpp that is built
# (listed in this folder's CMakeLists.txt), so that no kernel is added without emulation tests.
# Usage: cmake -DKERNEL_DIR=<kernels/cuda> -DTEST_DIR=<tests/cuda_emulation> -P check_coverage.cmake
file(GLOB kernels "${KERNEL_DIR}/*.cu")
file(READ "${TEST_DIR}/CMakeLists.txt" build_list)
set(missing)
foreach(kernel IN LISTS kernels)
  get_filename_component(name "${kernel}" NAME_WE)
  if(NOT EXISTS "${TEST_DIR}/test_${name}.cpp" OR NOT build_list MATCHES "loom_emulation_test\\(test_${name} ")
    list(APPEND missing "kernels/cuda/${name}.cu (expected tests/cuda_emulation/test_${name}.cpp, built by loom_emulation_test)")
  endif()
endforeach()
list(LENGTH kernels count)
if(missing)
  string(REPLACE ";" "\n  " missing "${missing}")
  message(FATAL_ERROR "CUDA kernels without emulation tests:\n  ${missing}")
endif()
message(STATUS "all ${count} kernel sources in ${KERNEL_DIR} have emulation tests")
