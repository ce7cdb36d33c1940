# CUTLASS/CuTe headers: CUTLASS_DIR (a checkout or install with include/cute), else the pinned
# nvidia-cutlass wheel unpacked into .deps/ by tools/fetch_cutlass.py, else that same wheel
# installed in the Python environment (`pip install .` declares it as a build requirement, see
# tools/build_backend.py), else tools/fetch_cutlass.py is run to fetch it. Machines with no network
# (the GPU device) configure with -DOPENMLA_FETCH_CUTLASS=OFF and get a clear error instead of a
# hanging pip when the headers were not carried over.
option(OPENMLA_FETCH_CUTLASS "Download the pinned CUTLASS headers into .deps/ when missing" ON)

file(STRINGS "${PROJECT_SOURCE_DIR}/tools/fetch_cutlass.py" _pin REGEX "^VERSION = ")
string(REGEX REPLACE "^VERSION = \"([0-9.]+)\".*" "\\1" OPENMLA_CUTLASS_VERSION "${_pin}")

if(DEFINED CUTLASS_DIR AND EXISTS "${CUTLASS_DIR}/include/cute/tensor.hpp")
  set(OPENMLA_CUTLASS_INCLUDE "${CUTLASS_DIR}/include")
else()
  set(_dest "${PROJECT_SOURCE_DIR}/.deps/cutlass-${OPENMLA_CUTLASS_VERSION}/include")
  if(NOT EXISTS "${_dest}/cute/tensor.hpp")
    # The pinned wheel in the build's Python environment (pip's isolated build environment).
    if(DEFINED Python3_EXECUTABLE)
      set(_python "${Python3_EXECUTABLE}")
    elseif(DEFINED Python_EXECUTABLE)
      set(_python "${Python_EXECUTABLE}")
    else()
      find_package(Python3 COMPONENTS Interpreter)
      set(_python "${Python3_EXECUTABLE}")
    endif()
    if(_python)
      execute_process(
        COMMAND "${_python}" -c [=[
import importlib.metadata, importlib.util, pathlib
spec = importlib.util.find_spec("cutlass_library")
print(importlib.metadata.version("nvidia-cutlass"))
print((pathlib.Path(spec.origin).parent / "source" / "include").as_posix())
]=]
        OUTPUT_VARIABLE _wheel OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _wheel_rc
        ERROR_QUIET)
      if(_wheel_rc EQUAL 0)
        string(REPLACE "\n" ";" _wheel "${_wheel}")
        list(GET _wheel 0 _wheel_version)
        list(GET _wheel 1 _wheel_include)
        if((_wheel_version STREQUAL OPENMLA_CUTLASS_VERSION OR
            _wheel_version MATCHES "^${OPENMLA_CUTLASS_VERSION}\\.")
           AND EXISTS "${_wheel_include}/cute/tensor.hpp")
          # Copied into .deps/ as tools/fetch_cutlass.py would: pip's build environment is
          # temporary, and a stable include path keeps a later `pip install .` incremental.
          message(STATUS "CUTLASS headers from the nvidia-cutlass wheel in the build environment")
          execute_process(COMMAND "${CMAKE_COMMAND}" -E copy_directory "${_wheel_include}" "${_dest}"
                          RESULT_VARIABLE _copy_rc)
          if(NOT _copy_rc EQUAL 0)
            set(_dest "${_wheel_include}")
          endif()
        else()
          message(STATUS "nvidia-cutlass ${_wheel_version} in ${_python}'s environment is not "
                         "the pinned ${OPENMLA_CUTLASS_VERSION}: not used")
        endif()
      endif()
    endif()
  endif()
  if(NOT EXISTS "${_dest}/cute/tensor.hpp")
    if(NOT OPENMLA_FETCH_CUTLASS)
      message(FATAL_ERROR "CUTLASS ${OPENMLA_CUTLASS_VERSION} headers not found in ${_dest} and "
                          "OPENMLA_FETCH_CUTLASS=OFF: run tools/fetch_cutlass.py where there is "
                          "a network and carry .deps/, or set CUTLASS_DIR")
    endif()
    find_package(Python3 REQUIRED COMPONENTS Interpreter)
    message(STATUS "Fetching nvidia-cutlass==${OPENMLA_CUTLASS_VERSION} headers into .deps/")
    execute_process(COMMAND "${Python3_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/tools/fetch_cutlass.py"
                    RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0)
      message(FATAL_ERROR "Could not fetch the CUTLASS headers; set CUTLASS_DIR instead")
    endif()
  endif()
  set(OPENMLA_CUTLASS_INCLUDE "${_dest}")
endif()
message(STATUS "CUTLASS headers: ${OPENMLA_CUTLASS_INCLUDE}")
