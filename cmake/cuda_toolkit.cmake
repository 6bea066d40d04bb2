# cuda_toolkit.cmake — which CUDA toolkit builds ferry: a system one, or the pieces of
# the toolkit that pip installs (cuda-toolkit[nvcc,cccl]: nvidia-cuda-nvcc, -crt,
# -runtime, -cccl and nvidia-nvvm). Included before enable_language(CUDA); it sets
# CMAKE_CUDA_COMPILER and CUDAToolkit_ROOT and says in the log which toolkit it chose.
#
# FERRY_CUDA_TOOLKIT:
#   auto    a system toolkit of the line FERRY_CUDA_LINE (same major, at least that
#           minor) when there is one, else the pip one (the default);
#   system  a system toolkit only;
#   pip     the pip one only (`pip install` brings it: backend/ferry_build.py).
# A CMAKE_CUDA_COMPILER given on the command line (or CUDACXX) is used as it is.
#
# The system toolkit is looked for where CMake and nvcc users expect it, in this
# order: nvcc on PATH, $CUDA_PATH/bin, $CUDA_HOME/bin, /usr/local/cuda/bin. The
# backend (backend/ferry_build.py) looks in the same places, in the same order, to
# decide whether pip must bring the toolkit: keep the two in step.
#
# The pip layout (site-packages/nvidia/cu13/{bin,include,lib,nvvm}) is a toolkit
# but for two things: nvcc links with -L$TOP/lib64 where the wheels have lib/, and
# lib/ lacks libcudart.so. So the chosen pip toolkit is assembled in the build tree
# from symlinks (nvcc finds its pieces relative to the path it was started by, not
# its real path).

set(FERRY_CUDA_TOOLKIT "auto" CACHE STRING
  "Where the CUDA toolkit comes from: auto (system if ${FERRY_CUDA_LINE}+, else pip), system, pip")
set_property(CACHE FERRY_CUDA_TOOLKIT PROPERTY STRINGS auto system pip)
if(NOT FERRY_CUDA_TOOLKIT MATCHES "^(auto|system|pip)$")
  message(FATAL_ERROR "FERRY_CUDA_TOOLKIT='${FERRY_CUDA_TOOLKIT}': expected auto, system or pip")
endif()

string(REPLACE "." ";" _ferry_line "${FERRY_CUDA_LINE}")
list(GET _ferry_line 0 _ferry_cuda_major)
set(_ferry_pip_requirement "cuda-toolkit[nvcc,cccl]==${FERRY_CUDA_LINE}.*")

# nvcc's release ("13.0.88") into OUT, or "" when it does not run.
function(_ferry_nvcc_version nvcc out)
  execute_process(COMMAND "${nvcc}" --version OUTPUT_VARIABLE text ERROR_QUIET
    RESULT_VARIABLE rc)
  set(version "")
  if(rc EQUAL 0 AND text MATCHES "V([0-9]+\\.[0-9]+\\.[0-9]+)")
    set(version "${CMAKE_MATCH_1}")
  endif()
  set(${out} "${version}" PARENT_SCOPE)
endfunction()

# TRUE in OUT when VERSION belongs to ferry's line: same major, at least its minor.
function(_ferry_in_line version out)
  set(ok FALSE)
  if(version MATCHES "^([0-9]+)\\." AND CMAKE_MATCH_1 EQUAL _ferry_cuda_major
     AND NOT version VERSION_LESS FERRY_CUDA_LINE)
    set(ok TRUE)
  endif()
  set(${out} ${ok} PARENT_SCOPE)
endfunction()

# The first system nvcc in the usual places: path and version, or "".
function(_ferry_find_system_nvcc path_out version_out)
  find_program(_nvcc_on_path nvcc NO_CACHE NO_PACKAGE_ROOT_PATH NO_CMAKE_PATH
    NO_CMAKE_ENVIRONMENT_PATH NO_CMAKE_SYSTEM_PATH NO_CMAKE_INSTALL_PREFIX)
  set(candidates "")
  if(_nvcc_on_path)
    list(APPEND candidates "${_nvcc_on_path}")
  endif()
  foreach(var CUDA_PATH CUDA_HOME)
    if(DEFINED ENV{${var}} AND NOT "$ENV{${var}}" STREQUAL "")
      list(APPEND candidates "$ENV{${var}}/bin/nvcc")
    endif()
  endforeach()
  list(APPEND candidates "/usr/local/cuda/bin/nvcc")
  foreach(nvcc IN LISTS candidates)
    if(EXISTS "${nvcc}" AND NOT IS_DIRECTORY "${nvcc}")
      _ferry_nvcc_version("${nvcc}" version)
      if(version)
        set(${path_out} "${nvcc}" PARENT_SCOPE)
        set(${version_out} "${version}" PARENT_SCOPE)
        return()
      endif()
    endif()
  endforeach()
  set(${path_out} "" PARENT_SCOPE)
  set(${version_out} "" PARENT_SCOPE)
endfunction()

# The pip toolkit's root (site-packages/nvidia/cuNN) as the build's Python sees it, or "".
function(_ferry_find_pip_toolkit out)
  set(python "${Python_EXECUTABLE}")
  if(NOT python)
    find_program(python NAMES python3 python NO_CACHE)
  endif()
  set(root "")
  if(python)
    execute_process(COMMAND "${python}" -c [[
import os, sys
for entry in sys.path:
    root = os.path.join(entry or os.curdir, "nvidia", "cu" + sys.argv[1])
    if os.path.isfile(os.path.join(root, "bin", "nvcc")):
        print(os.path.abspath(root))
        break
]] "${_ferry_cuda_major}" OUTPUT_VARIABLE root OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  endif()
  set(${out} "${root}" PARENT_SCOPE)
endfunction()

# A toolkit directory in the build tree made of symlinks into the pip layout.
function(_ferry_assemble_pip_toolkit pip_root out)
  set(dir "${CMAKE_BINARY_DIR}/cuda-toolkit-pip")
  file(REMOVE_RECURSE "${dir}")  # its targets move with every isolated pip build
  file(MAKE_DIRECTORY "${dir}/bin")
  file(GLOB tools "${pip_root}/bin/*")
  foreach(tool IN LISTS tools)
    get_filename_component(name "${tool}" NAME)
    file(CREATE_LINK "${tool}" "${dir}/bin/${name}" SYMBOLIC)
  endforeach()
  foreach(sub include nvvm)
    file(CREATE_LINK "${pip_root}/${sub}" "${dir}/${sub}" SYMBOLIC)
  endforeach()
  # lib/ gets the development names a toolkit has and the wheels lack (libcudart.so
  # beside libcudart.so.13): find_package(CUDAToolkit) insists on finding libcudart.so,
  # although ferry links the static runtime.
  file(MAKE_DIRECTORY "${dir}/lib")
  file(GLOB libs "${pip_root}/lib/*")
  foreach(lib IN LISTS libs)
    get_filename_component(name "${lib}" NAME)
    file(CREATE_LINK "${lib}" "${dir}/lib/${name}" SYMBOLIC)
    if(name MATCHES "^(lib.+\\.so)\\.[0-9]+$")
      set(dev_name "${CMAKE_MATCH_1}")
      if(NOT EXISTS "${pip_root}/lib/${dev_name}")
        file(CREATE_LINK "${lib}" "${dir}/lib/${dev_name}" SYMBOLIC)
      endif()
    endif()
  endforeach()
  file(CREATE_LINK lib "${dir}/lib64" SYMBOLIC)
  set(${out} "${dir}" PARENT_SCOPE)
endfunction()

# A compiler given by the user (-DCMAKE_CUDA_COMPILER or CUDACXX) is theirs, unless
# it is the one this file chose on an earlier run.
set(_ferry_given "")
if(DEFINED CMAKE_CUDA_COMPILER AND NOT CMAKE_CUDA_COMPILER STREQUAL "${_FERRY_CUDA_CHOSEN}")
  set(_ferry_given "${CMAKE_CUDA_COMPILER}")
elseif(NOT DEFINED CMAKE_CUDA_COMPILER AND DEFINED ENV{CUDACXX} AND NOT "$ENV{CUDACXX}" STREQUAL "")
  set(_ferry_given "$ENV{CUDACXX}")
endif()

if(_ferry_given)
  message(STATUS "ferry: CUDA toolkit: the given compiler ${_ferry_given}")
else()
  set(_ferry_nvcc "")
  if(NOT FERRY_CUDA_TOOLKIT STREQUAL "pip")
    _ferry_find_system_nvcc(_ferry_sys_nvcc _ferry_sys_version)
    set(_ferry_sys_ok FALSE)
    if(_ferry_sys_nvcc)
      _ferry_in_line("${_ferry_sys_version}" _ferry_sys_ok)
    endif()
    if(_ferry_sys_ok)
      set(_ferry_nvcc "${_ferry_sys_nvcc}")
      message(STATUS "ferry: CUDA toolkit: system, CUDA ${_ferry_sys_version} (${_ferry_sys_nvcc})")
    elseif(FERRY_CUDA_TOOLKIT STREQUAL "system")
      if(_ferry_sys_nvcc)
        message(FATAL_ERROR "ferry: the system CUDA toolkit (${_ferry_sys_nvcc}) is "
          "${_ferry_sys_version}; ferry needs ${FERRY_CUDA_LINE} or a later ${_ferry_cuda_major}.x")
      endif()
      message(FATAL_ERROR "ferry: FERRY_CUDA_TOOLKIT=system but no nvcc on PATH, in "
        "$CUDA_PATH/bin, $CUDA_HOME/bin or /usr/local/cuda/bin")
    elseif(_ferry_sys_nvcc)
      message(STATUS "ferry: the system CUDA toolkit ${_ferry_sys_version} (${_ferry_sys_nvcc}) "
        "is not ${FERRY_CUDA_LINE}+ of CUDA ${_ferry_cuda_major}: trying the pip toolkit")
    endif()
  endif()
  if(NOT _ferry_nvcc)
    _ferry_find_pip_toolkit(_ferry_pip_root)
    if(NOT _ferry_pip_root)
      message(FATAL_ERROR "ferry: no CUDA ${FERRY_CUDA_LINE}+ toolkit: none on this machine "
        "(nvcc on PATH, $CUDA_PATH, $CUDA_HOME, /usr/local/cuda) and none from pip for "
        "${Python_EXECUTABLE}. `pip install .` brings one (${_ferry_pip_requirement}); a plain "
        "CMake build needs it installed in that Python (pip install '${_ferry_pip_requirement}') "
        "or a system toolkit")
    endif()
    _ferry_nvcc_version("${_ferry_pip_root}/bin/nvcc" _ferry_pip_version)
    _ferry_in_line("${_ferry_pip_version}" _ferry_pip_ok)
    if(NOT _ferry_pip_ok)
      message(FATAL_ERROR "ferry: the pip CUDA toolkit at ${_ferry_pip_root} is "
        "'${_ferry_pip_version}'; ferry needs ${_ferry_pip_requirement}")
    endif()
    _ferry_assemble_pip_toolkit("${_ferry_pip_root}" _ferry_root)
    set(_ferry_nvcc "${_ferry_root}/bin/nvcc")
    message(STATUS "ferry: CUDA toolkit: pip, CUDA ${_ferry_pip_version} (${_ferry_pip_root}, "
      "assembled in ${_ferry_root})")
    set(CUDAToolkit_ROOT "${_ferry_root}")
  endif()
  # With the CUDA language enabled, find_package(CUDAToolkit) takes the toolkit of
  # this compiler.
  set(CMAKE_CUDA_COMPILER "${_ferry_nvcc}" CACHE FILEPATH "CUDA compiler" FORCE)
  set(_FERRY_CUDA_CHOSEN "${_ferry_nvcc}" CACHE INTERNAL "the nvcc cuda_toolkit.cmake chose")
endif()
