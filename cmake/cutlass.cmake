# CUTLASS/CuTe headers: CUTLASS_DIR (a checkout or install with include/cute), else the pinned
# nvidia-cutlass wheel unpacked into .deps/ by tools/fetch_cutlass.py. Machines with no network
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
