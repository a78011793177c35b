# CUDA toolchain and NCCL discovery. Sets LOOM_WITH_CUDA / LOOM_WITH_NCCL and the targets
# loom::nccl (when found). Included from the top-level CMakeLists.txt.
#
# Architectures: CMAKE_CUDA_ARCHITECTURES defaults to 90, which CMake turns into sm_90 code
# (Hopper: H100, H200) plus compute_90 PTX that the driver compiles for newer GPUs.

if(NOT LOOM_WITH_CUDA)
  set(LOOM_WITH_NCCL OFF)
  return()
endif()

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90)
endif()
enable_language(CUDA)
# CMake 3.25 (Debian 12's) does not know nvcc's flag for C++20, which nvcc 12+ accepts.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)
find_package(CUDAToolkit REQUIRED)
# The multi-tensor kernels take up to 32,764 bytes of parameters (kernels/cuda/chunk_plan.cuh),
# which CUDA allows from 12.1 on.
if(CUDAToolkit_VERSION VERSION_LESS 12.1)
  message(FATAL_ERROR "Loom's CUDA kernels need CUDA 12.1 or newer (found ${CUDAToolkit_VERSION}): "
                      "install a newer toolkit, or configure with -DLOOM_WITH_CUDA=OFF")
endif()
message(STATUS "Loom: CUDA ${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")

# NCCL: the CUDA toolkit's copy, a system one, or NCCL_ROOT (for instance the
# nvidia/nccl folder of a PyTorch wheel: -DNCCL_ROOT=$(python3 -c 'import nvidia.nccl, os;
# print(os.path.dirname(nvidia.nccl.__file__))')).
find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
  HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib lib64)
if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
  set(loom_nccl_default ON)
else()
  set(loom_nccl_default OFF)
endif()
option(LOOM_WITH_NCCL "Build the NCCL communication backend" ${loom_nccl_default})
if(LOOM_WITH_NCCL)
  if(NOT (NCCL_INCLUDE_DIR AND NCCL_LIBRARY))
    message(FATAL_ERROR "LOOM_WITH_NCCL=ON but nccl.h / libnccl were not found; set NCCL_ROOT "
                        "to the folder holding include/nccl.h and lib/libnccl.so")
  endif()
  add_library(loom_nccl_lib INTERFACE)
  target_include_directories(loom_nccl_lib INTERFACE ${NCCL_INCLUDE_DIR})
  target_link_libraries(loom_nccl_lib INTERFACE ${NCCL_LIBRARY})
  add_library(loom::nccl ALIAS loom_nccl_lib)
  message(STATUS "Loom: NCCL ${NCCL_LIBRARY}")
endif()
