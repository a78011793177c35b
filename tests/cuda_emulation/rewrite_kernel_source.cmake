# Rewrites a CUDA source into host C++ for the kernel emulation: the only two constructs of
# Loom's kernels that no header can supply.
#   kernel<<<grid, block, shared, stream>>>(args)
#     -> ::loom::cuda_emulation::launch("kernel", kernel, grid, block, shared, stream)(args)
#   extern __shared__ __align__(N) T name[];
#     -> T* name = static_cast<T*>(::loom::cuda_emulation::dynamic_shared_memory());
#   __shared__ T a[N], b[M];
#     -> static T a[N], b[M]; ::loom::cuda_emulation::shared_memory_in_use(a, sizeof(a)); ...
#   (one copy per kernel, shared by the block's threads, since blocks run one at a time; the
#   call fills it with 0xFF bytes the first time a thread of each block reaches it)
#   const __grid_constant__ T name   (a kernel's parameter)
#     -> const T& name
#   (the launch's one copy, which every thread of the grid reads, as CUDA's grid constants
#   are read in place; a by-value parameter is copied into each thread's call, 32 KB a thread
#   for the multi-tensor kernels' tables; a form not matched stays a by-value parameter, right
#   but slower)
# Everything else is compiled as written.
# Usage: cmake -DINPUT=<file.cu> -DOUTPUT=<file> -P rewrite_kernel_source.cmake
cmake_minimum_required(VERSION 3.25)
file(READ "${INPUT}" text)

set(name "[A-Za-z_][A-Za-z0-9_:]*(<[^<>;(){}]*>)?")
string(REGEX REPLACE "(${name})[ \t\r\n]*<<<([^;]*)>>>\\("
       "::loom::cuda_emulation::launch(\"\\1\", \\1, \\3)(" text "${text}")
string(REGEX REPLACE "const[ \t]+__grid_constant__[ \t]+(${name})[ \t]+"
       "const \\1& " text "${text}")
string(REGEX REPLACE
       "extern[ \t]+__shared__[ \t]+(__align__\\([0-9]+\\)[ \t]+)?([A-Za-z_][A-Za-z0-9_ ]*[A-Za-z0-9_])[ \t]+([A-Za-z_][A-Za-z0-9_]*)\\[\\];"
       "\\2* \\3 = static_cast<\\2*>(::loom::cuda_emulation::dynamic_shared_memory());"
       text "${text}")

while(TRUE)
  string(REGEX MATCH "__shared__[ \t]+([A-Za-z_][A-Za-z0-9_:]*)[ \t]+([^;]*);" declaration "${text}")
  if(NOT declaration)
    break()
  endif()
  set(type "${CMAKE_MATCH_1}")
  set(declarators "${CMAKE_MATCH_2}")
  set(replacement "static ${type} ${declarators};")
  string(REPLACE "," ";" declarator_list "${declarators}")
  foreach(declarator IN LISTS declarator_list)
    if(NOT declarator MATCHES "^[ \t]*([A-Za-z_][A-Za-z0-9_]*)")
      message(FATAL_ERROR "${INPUT}: cannot read the __shared__ declaration '${declaration}'")
    endif()
    string(APPEND replacement
           " ::loom::cuda_emulation::shared_memory_in_use(${CMAKE_MATCH_1}, sizeof(${CMAKE_MATCH_1}));")
  endforeach()
  string(REPLACE "${declaration}" "${replacement}" text "${text}")
endwhile()

foreach(left_over "<<<" "__shared__")
  string(FIND "${text}" "${left_over}" position)
  if(NOT position EQUAL -1)
    message(FATAL_ERROR "${INPUT}: a '${left_over}' that rewrite_kernel_source.cmake does not "
                        "recognise is left; teach it the new form")
  endif()
endforeach()
# Written only when it changes, so that only what depends on a changed kernel is rebuilt.
set(text "#line 1 \"${INPUT}\"\n${text}")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" previous)
  if(previous STREQUAL text)
    return()
  endif()
endif()
file(WRITE "${OUTPUT}.tmp" "${text}")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
