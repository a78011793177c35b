# The installed headers (docs/api.md, "Installed headers"): the public list
# (cmake/public_headers.txt) and the Loom headers it includes, directly or not. Used by
# cmake/install.cmake when CMake configures, and again by the install itself, which refuses
# to install a closure that the sources no longer match (a header gained an #include since
# the build directory was configured).

# loom_public_headers(<out> <list file>): the headers of the list whose option (the line's
# second word, if any) is ON in the calling scope.
function(loom_public_headers out list_file)
  file(STRINGS "${list_file}" lines)
  set(headers "")
  foreach(line IN LISTS lines)
    string(STRIP "${line}" line)
    if(line STREQUAL "" OR line MATCHES "^#")
      continue()
    endif()
    string(REGEX REPLACE "[ \t]+" ";" words "${line}")
    list(GET words 0 header)
    list(LENGTH words n)
    if(n GREATER 1)
      list(GET words 1 option)
      if(NOT ${option})
        continue()
      endif()
    endif()
    list(APPEND headers ${header})
  endforeach()
  set(${out} ${headers} PARENT_SCOPE)
endfunction()

# loom_header_closure(<out> <source root> <header>...): the headers given and every header
# they include with #include "..." (from the repository root, as every Loom include is),
# directly or not; sorted. #if is not evaluated: an include under #if counts.
function(loom_header_closure out root)
  set(todo ${ARGN})
  set(done "")
  while(todo)
    list(POP_FRONT todo header)
    list(FIND done ${header} seen)  # not IN_LIST: the install runs this under CMake's old policies
    if(NOT seen EQUAL -1)
      continue()
    endif()
    if(NOT EXISTS "${root}/${header}")
      message(FATAL_ERROR "Loom's installed headers: ${header} is not in ${root}")
    endif()
    list(APPEND done ${header})
    file(STRINGS "${root}/${header}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" included "${line}")
      if(NOT EXISTS "${root}/${included}")
        message(FATAL_ERROR "Loom's installed headers: ${header} includes \"${included}\", "
                            "which is not a path from the repository root")
      endif()
      list(APPEND todo ${included})
    endforeach()
  endwhile()
  list(SORT done)
  set(${out} ${done} PARENT_SCOPE)
endfunction()

# loom_check_device_headers(<source root> <header>...): a CUDA or NCCL header (under a
# cuda/ or nccl/ folder, or including CUDA's or NCCL's own headers) only in a build with
# LOOM_WITH_CUDA (NCCL: LOOM_WITH_NCCL).
function(loom_check_device_headers root)
  foreach(header IN LISTS ARGN)
    file(STRINGS "${root}/${header}" device_includes
         REGEX "^[ \t]*#[ \t]*include[ \t]*<(cuda|cublas|cub/|nccl)")
    set(needs "")
    if(header MATCHES "(^|/)nccl/" OR device_includes MATCHES "<nccl")
      set(needs LOOM_WITH_NCCL)
    elseif(header MATCHES "(^|/)cuda/" OR device_includes)
      set(needs LOOM_WITH_CUDA)
    endif()
    if(needs AND NOT ${needs})
      message(FATAL_ERROR "Loom's installed headers: ${header} (needed by a public header, "
                          "cmake/public_headers.txt) is a device header, and ${needs} is off")
    endif()
  endforeach()
endfunction()
