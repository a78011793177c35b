# The installed package (docs/api.md): headers under include/loom (a program includes
# "tensor/tensor.h", "strategies/fabric.h", ...), the static libraries and the tools, a CMake
# package with namespaced targets (find_package(Loom 0.1 CONFIG REQUIRED); Loom::loom for
# everything, or the layers Loom::core, Loom::kernels, Loom::tensor, Loom::nn, Loom::optim,
# Loom::comm, Loom::strategies, Loom::data), a pkg-config file (loom.pc) and a Debian package
# (cpack -G DEB).
# Included at the end of the top-level CMakeLists.txt.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(loom_layers loom_core loom_kernels loom_tensor loom_nn loom_optim loom_comm loom_strategies
                loom_data)
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
target_link_libraries(loom INTERFACE loom_strategies loom_data)

install(TARGETS loom loom_options ${loom_layers}
        EXPORT LoomTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/loom)
install(TARGETS train_gpt loomrun loom_ckpt loom_trace loom-perf
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
foreach(dir core kernels tensor nn optim comm strategies data)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/loom
          FILES_MATCHING PATTERN "*.h")
endforeach()
install(EXPORT LoomTargets NAMESPACE Loom:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Loom)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/LoomConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/LoomConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Loom)
# 0.x: a minor version may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/LoomConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/LoomConfig.cmake ${PROJECT_BINARY_DIR}/LoomConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Loom)

# pkg-config: the libraries in link order and what they need. Loom's libraries are static, so
# a program links their dependencies too: those with a pkg-config file are Requires (not
# Requires.private, whose libraries only --static lists), oneDNN and its OpenMP runtime
# follow Loom's libraries in Libs.
set(loom_pc_libs
    "-lloom_data -lloom_strategies -lloom_comm -lloom_optim -lloom_nn -lloom_tensor -lloom_kernels")
set(loom_pc_requires "liburing libxxhash libcrypto")
set(loom_pc_extra "-ldnnl ${LOOM_GOMP_LIBRARY} -lrt -pthread")
if(LOOM_WITH_UCX)
  string(APPEND loom_pc_requires " ucx")
endif()
if(LOOM_WITH_CUDA)
  string(APPEND loom_pc_libs " -lloom_kernels_cuda")
endif()
string(APPEND loom_pc_libs " -lloom_core")  # below every layer, so last
if(LOOM_WITH_CUDA)
  string(APPEND loom_pc_extra " -L${CUDAToolkit_LIBRARY_DIR} -lcublasLt -lcudart")
  if(LOOM_WITH_NCCL)
    string(APPEND loom_pc_extra " ${NCCL_LIBRARY}")
  endif()
endif()
# A sanitized build's libraries call the sanitizer's runtime, which the program links by the
# same flag (as loom_options' INTERFACE link option gives CMake consumers).
if(loom_sanitizers)
  string(APPEND loom_pc_extra " -fsanitize=${loom_sanitizers}")
endif()
set(loom_pc_cflags "-I\${includedir}/loom -std=c++20 -DLOOM_WITH_CUDA=$<BOOL:${LOOM_WITH_CUDA}> -DLOOM_WITH_NCCL=$<BOOL:${LOOM_WITH_NCCL}>")
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
install(FILES ${PROJECT_BINARY_DIR}/loom.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# cpack -G DEB (from the build directory): loom_<version>_<arch>.deb.
set(CPACK_PACKAGE_NAME loom)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "Loom developers")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Loom: a C++20 runtime for distributed training")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "liburing2, libxxhash0, libhwloc15, libdnnl2, libssl3")
if(LOOM_WITH_UCX)
  string(APPEND CPACK_DEBIAN_PACKAGE_DEPENDS ", libucx0")
endif()
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
include(CPack)
