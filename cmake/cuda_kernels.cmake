# The CUDA backend: every .cu/.cc under src/cuda (one kernel instantiation per small file), built
# for sm_90a. ptxas prints every kernel's registers, stack and spills into the build log (-v) and
# fails the build on any register spill (-warn-spills + -Werror). -warn-lmem-usage is left out on
# purpose: it also fails a kernel with a legitimate stack frame (printf, assert, a small indexed
# local table); such frames still show as "bytes stack frame" in the log.
file(GLOB_RECURSE OPENMLA_CUDA_SOURCES CONFIGURE_DEPENDS
     ${PROJECT_SOURCE_DIR}/src/cuda/*.cu ${PROJECT_SOURCE_DIR}/src/cuda/*.cc)

# One CUDA runtime per binary: the library, the GPU tests and the tools all link the shared
# libcudart (mixing it with cudart_static gives a program two runtimes). Set before any CUDA
# target is created, so tests/ and bench/ inherit it.
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)

add_library(openmla_cuda STATIC ${OPENMLA_CUDA_SOURCES})
target_include_directories(openmla_cuda
  PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
  PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_include_directories(openmla_cuda SYSTEM PRIVATE ${OPENMLA_CUTLASS_INCLUDE}
                           ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_INCLUDE_DIRS}/cccl)
# The backend uses core's names and formats (dtype_name, kv_format_name): cuda depends on core,
# which lives in `openmla`. Static libraries may depend on each other; CMake repeats them on the
# link line.
target_link_libraries(openmla_cuda PUBLIC CUDA::cudart PRIVATE openmla)
set_target_properties(openmla_cuda PROPERTIES CUDA_SEPARABLE_COMPILATION OFF
                                              CUDA_RUNTIME_LIBRARY Shared)
# OPENMLA_DENSE_DECODE_TRACE: the dense decode kernel records a clock64 timeline of one CTA
# (research/profile_dense_decode.sh builds a second tree with it). The stamps cost registers, so
# that build may spill and ptxas warnings stay warnings there; never on in a normal build.
option(OPENMLA_DENSE_DECODE_TRACE "Diagnostic build: dense decode kernel timeline stamps" OFF)
set(OPENMLA_PTXAS_FLAGS -Xptxas=-v,-warn-spills,-Werror)
if(OPENMLA_DENSE_DECODE_TRACE)
  set(OPENMLA_PTXAS_FLAGS -Xptxas=-v,-warn-spills)
  target_compile_definitions(openmla_cuda PRIVATE OPENMLA_DENSE_DECODE_TRACE=1)
endif()
set(OPENMLA_CUDA_FLAGS
    -gencode=arch=compute_90a,code=sm_90a
    --expt-relaxed-constexpr --expt-extended-lambda
    ${OPENMLA_PTXAS_FLAGS}
    -Xcompiler=-Wall,-Wextra
    -lineinfo)
target_compile_options(openmla_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${OPENMLA_CUDA_FLAGS}>)
target_compile_options(openmla_cuda PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${OPENMLA_HOST_WARNINGS}>)

# The dense decode instantiations are exactly the kernels src/cuda/sm90/attention/supported.h
# declares (OPENMLA_SM90_DENSE_DECODE_KERNELS, which also drives the dispatch and its messages):
# one instantiations/dense_decode_<dtype>_d<d_qk>_sm90.cu per X(dtype, element, d_qk) entry.
file(READ ${PROJECT_SOURCE_DIR}/src/cuda/sm90/attention/supported.h _supported_h)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             ${PROJECT_SOURCE_DIR}/src/cuda/sm90/attention/supported.h)
# The macro's body: continuation lines joined, then its #define line.
string(REPLACE "\\\n" " " _supported_h "${_supported_h}")
string(REGEX MATCH "#define OPENMLA_SM90_DENSE_DECODE_KERNELS[^\n]*" _dense_decode_macro
       "${_supported_h}")
string(REGEX MATCHALL "X\\(k[A-Z0-9]+, [^,)]+, [0-9]+\\)" _dense_decode_entries
       "${_dense_decode_macro}")
set(_dense_decode_expected)
foreach(_entry IN LISTS _dense_decode_entries)
  string(REGEX MATCH "X\\(k([A-Z0-9]+), [^,]+, ([0-9]+)\\)" _match "${_entry}")
  string(TOLOWER "${CMAKE_MATCH_1}" _dtype)
  list(APPEND _dense_decode_expected "dense_decode_${_dtype}_d${CMAKE_MATCH_2}_sm90.cu")
endforeach()
set(_dense_decode_dir ${PROJECT_SOURCE_DIR}/src/cuda/sm90/dense_decode/instantiations)
file(GLOB _dense_decode_files RELATIVE ${_dense_decode_dir} CONFIGURE_DEPENDS ${_dense_decode_dir}/*.cu)
list(SORT _dense_decode_expected)
list(SORT _dense_decode_files)
if(NOT _dense_decode_expected STREQUAL _dense_decode_files)
  message(FATAL_ERROR "dense decode: src/cuda/sm90/attention/supported.h declares the kernels "
                      "${_dense_decode_expected} but instantiations/ holds ${_dense_decode_files}")
endif()
