# The CUDA backend: every .cu under src/cuda (one kernel instantiation per small file), built for
# sm_90a. ptxas reports registers and fails the build on any register spill.
file(GLOB_RECURSE OPENMLA_CUDA_SOURCES CONFIGURE_DEPENDS
     ${PROJECT_SOURCE_DIR}/src/cuda/*.cu ${PROJECT_SOURCE_DIR}/src/cuda/*.cc)
add_library(openmla_cuda STATIC ${OPENMLA_CUDA_SOURCES})
target_include_directories(openmla_cuda
  PUBLIC ${PROJECT_SOURCE_DIR}/include
  PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_include_directories(openmla_cuda SYSTEM PRIVATE ${OPENMLA_CUTLASS_INCLUDE}
                           ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_INCLUDE_DIRS}/cccl)
target_link_libraries(openmla_cuda PUBLIC CUDA::cudart_static)
set_target_properties(openmla_cuda PROPERTIES CUDA_SEPARABLE_COMPILATION OFF
                                              CUDA_RESOLVE_DEVICE_SYMBOLS ON)
set(OPENMLA_CUDA_FLAGS
    -gencode=arch=compute_90a,code=sm_90a
    --expt-relaxed-constexpr --expt-extended-lambda
    -Xptxas=-v,-warn-spills,-warn-lmem-usage,-Werror
    -lineinfo)
target_compile_options(openmla_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${OPENMLA_CUDA_FLAGS}>)
target_compile_options(openmla_cuda PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${OPENMLA_HOST_WARNINGS}>)
