# The installed package (docs/api.md): the public headers (cmake/public_headers.txt) and the
# Loom headers they include, under include/loom (a program includes "tensor/tensor.h",
# "strategies/fabric.h", ...), the static libraries and the tools, a CMake package with
# namespaced targets (find_package(Loom 0.1 CONFIG REQUIRED); Loom::loom for everything, or the
# layers Loom::core, Loom::kernels, Loom::tensor, Loom::nn, Loom::optim, Loom::comm,
# Loom::strategies, Loom::data, Loom::text), a pkg-config file (loom.pc) and two Debian packages (cpack -G
# DEB): loom (the tools: component runtime) and loom-dev (headers, libraries, CMake package and
# pkg-config file: component dev).
# Included at the end of the top-level CMakeLists.txt.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(loom_layers loom_core loom_kernels loom_tensor loom_nn loom_optim loom_comm loom_strategies
                loom_data loom_text)
if(LOOM_WITH_CUDA)
  list(INSERT loom_layers 0 loom_kernels_cuda)
endif()
foreach(target IN LISTS loom_layers)
  string(REPLACE "loom_" "" short ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${short})
endforeach()
set_target_properties(loom_options PROPERTIES EXPORT_NAME options)

# Loom::loom: every layer.
add_library(loom INTERFACE)
target_link_libraries(loom INTERFACE loom_strategies loom_data loom_text)

# GNU's OpenMP runtime (libgomp, the one Debian's oneDNN runs on: the top-level
# CMakeLists.txt) is linked by its path on the build machine; installed, Loom::kernels names
# Loom::gomp instead (kernels/CMakeLists.txt), which LoomConfig.cmake finds on the machine that
# uses the package.

install(TARGETS loom loom_options ${loom_layers}
        EXPORT LoomTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/loom)
install(TARGETS train_gpt loom-sim loomrun loom_ckpt loom_trace loom-perf loom_tokenize loom_generate
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)

# The headers: the public list and the Loom headers it includes (cmake/header_closure.cmake),
# CUDA's and NCCL's only in builds with them. ${PROJECT_BINARY_DIR}/loom_installed_headers.txt
# lists them; tests/package/consumer.sh compiles each one alone against the install.
include(${PROJECT_SOURCE_DIR}/cmake/header_closure.cmake)
set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             ${PROJECT_SOURCE_DIR}/cmake/public_headers.txt)
loom_public_headers(loom_public_headers ${PROJECT_SOURCE_DIR}/cmake/public_headers.txt)
loom_header_closure(loom_installed_headers ${PROJECT_SOURCE_DIR} ${loom_public_headers})
loom_check_device_headers(${PROJECT_SOURCE_DIR} ${loom_installed_headers})
list(JOIN loom_installed_headers "\n" loom_installed_lines)
file(WRITE ${PROJECT_BINARY_DIR}/loom_installed_headers.txt "${loom_installed_lines}\n")
# The closure was computed when CMake configured; an #include added since then would be
# missing from the install, so the install recomputes it and refuses a stale one.
install(CODE "include(\"${PROJECT_SOURCE_DIR}/cmake/header_closure.cmake\")
  loom_header_closure(now \"${PROJECT_SOURCE_DIR}\" ${loom_public_headers})
  if(NOT now STREQUAL \"${loom_installed_headers}\")
    message(FATAL_ERROR \"Loom's public headers include other headers than when \"
                        \"${PROJECT_BINARY_DIR} was configured: run cmake on it again\")
  endif()" COMPONENT dev)
foreach(header IN LISTS loom_installed_headers)
  get_filename_component(dir ${header} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/${header}
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/loom/${dir} COMPONENT dev)
endforeach()

install(EXPORT LoomTargets NAMESPACE Loom:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Loom
        COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/LoomConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/LoomConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Loom)
# 0.x: a minor version may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/LoomConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/LoomConfig.cmake ${PROJECT_BINARY_DIR}/LoomConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Loom COMPONENT dev)

# pkg-config: the libraries in link order and what they need. Loom's libraries are static, so
# a program links their dependencies too: those with a pkg-config file are Requires (not
# Requires.private, whose libraries only --static lists), oneDNN and its OpenMP runtime
# follow Loom's libraries in Libs (GNU's OpenMP runtime by name: -lgomp, which GCC's own
# library folder holds, for clang too).
set(loom_pc_libs
    "-lloom_text -lloom_data -lloom_strategies -lloom_comm -lloom_optim -lloom_nn -lloom_tensor -lloom_kernels")
set(loom_pc_requires "liburing libxxhash libcrypto")
set(loom_pc_extra "-ldnnl -lgomp -lrt -pthread")
if(LOOM_WITH_UCX)
  string(APPEND loom_pc_requires " ucx")
endif()
if(LOOM_WITH_CUDA)
  string(APPEND loom_pc_libs " -lloom_kernels_cuda")
endif()
string(APPEND loom_pc_libs " -lloom_core")  # below every layer, so last
if(LOOM_WITH_CUDA)
  # cuBLASLt is loaded on first use, not linked (kernels/cuda/cublaslt_library.h): -ldl.
  string(APPEND loom_pc_extra " -L${CUDAToolkit_LIBRARY_DIR} -lcudart -ldl")
  if(LOOM_WITH_NCCL)  # by name, with the folder it was found in (as CUDA's libraries)
    get_filename_component(loom_nccl_dir ${NCCL_LIBRARY} DIRECTORY)
    string(APPEND loom_pc_extra " -L${loom_nccl_dir} -lnccl")
  endif()
endif()
# A sanitized build's libraries call the sanitizer's runtime, which the program links by the
# same flag (as loom_options' INTERFACE link option gives CMake consumers).
if(loom_sanitizers)
  string(APPEND loom_pc_extra " -fsanitize=${loom_sanitizers}")
endif()
set(loom_pc_cflags "-I\${includedir}/loom -std=c++20 -DLOOM_WITH_CUDA=$<BOOL:${LOOM_WITH_CUDA}> -DLOOM_WITH_NCCL=$<BOOL:${LOOM_WITH_NCCL}>")
if(LOOM_WITH_CUDA)  # the public tensor/cuda/ headers include cuda_runtime_api.h
  foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    string(APPEND loom_pc_cflags " -I${dir}")
  endforeach()
endif()
# Relocatable: the prefix is found from the file's own place (${pcfiledir}).
file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/loom.pc CONTENT "prefix=\${pcfiledir}/../..
libdir=\${prefix}/${CMAKE_INSTALL_LIBDIR}
includedir=\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}

Name: loom
Description: Loom, a C++20 runtime for distributed training
Version: ${PROJECT_VERSION}
Requires: ${loom_pc_requires}
Cflags: ${loom_pc_cflags}
Libs: -L\${libdir} ${loom_pc_libs} ${loom_pc_extra}
")
install(FILES ${PROJECT_BINARY_DIR}/loom.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT dev)

# cpack -G DEB (from the build directory): two packages, loom_<version>_<arch>.deb with the
# tools (component runtime) and loom-dev_<version>_<arch>.deb with what a program is built
# with (component dev). Depends: the tools' shared libraries (tests/package/consumer.sh checks
# each library the tools load against this list); for loom-dev, the -dev packages of what the
# static libraries link and LoomConfig.cmake finds. The CUDA toolkit and NCCL (a CUDA build)
# are not Debian packages here: neither is named.
set(CPACK_PACKAGE_NAME loom)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "Loom developers")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Loom: a C++20 runtime for distributed training")
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
# zstd, as Ubuntu's own packages since 21.10: dpkg reads it since 1.21.18 (Debian 12 has
# 1.21.22). Against CPack's default, gzip: 1.0 s against 5.0 s for the release build's two
# packages, and 10% smaller (2026-12-02).
set(CPACK_DEBIAN_COMPRESSION_TYPE zstd)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME loom)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION science)
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION  # each after the summary line
    "The tools: train_gpt, loomrun, loom-ckpt, loom-trace and loom-perf.")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS
    "libc6, libstdc++6, libgcc-s1, libgomp1, libdnnl2, libssl3, liburing2, libxxhash0, libhwloc15")
set(CPACK_DEBIAN_DEV_PACKAGE_NAME loom-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_COMPONENT_DEV_DESCRIPTION
    "Development files: public headers, static libraries, CMake package, loom.pc.")
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
    "libgomp1, libdnnl-dev, libssl-dev, liburing-dev, libxxhash-dev, pkg-config")
# loomrun launches the ranks of a trainer built with loom-dev.
set(CPACK_DEBIAN_DEV_PACKAGE_RECOMMENDS "loom (= ${PROJECT_VERSION})")
if(LOOM_WITH_UCX)
  string(APPEND CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS ", libucx0")
  string(APPEND CPACK_DEBIAN_DEV_PACKAGE_DEPENDS ", libucx-dev")
endif()
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
include(CPack)
