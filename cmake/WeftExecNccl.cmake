# NCCL executor of weft_exec (owned by the exec module). Compiled only when WEFT_ENABLE_NCCL is ON
# and the CUDA toolkit (with a CUDA compiler) and NCCL (nccl.h + libnccl) are found; otherwise the
# build goes on without it and the NCCL tests report themselves skipped. NCCL is searched in
# NCCL_ROOT / $NCCL_ROOT, the CUDA toolkit, and the pip wheel nvidia-nccl-cu* of the Python used.
set(WEFT_HAVE_NCCL OFF)
if(WEFT_ENABLE_NCCL AND TARGET weft_exec)
  find_package(CUDAToolkit QUIET)
  include(CheckLanguage)
  check_language(CUDA)
  set(_weft_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT})
  find_package(Python3 QUIET COMPONENTS Interpreter)
  if(Python3_Interpreter_FOUND)
    execute_process(COMMAND ${Python3_EXECUTABLE} -c
      "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])"
      OUTPUT_VARIABLE _weft_nccl_pip OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_weft_nccl_pip)
      list(APPEND _weft_nccl_hints ${_weft_nccl_pip})
    endif()
  endif()
  find_path(WEFT_NCCL_INCLUDE_DIR nccl.h HINTS ${_weft_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
  find_library(WEFT_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_weft_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
    PATH_SUFFIXES lib lib64)
  if(CUDAToolkit_FOUND AND CMAKE_CUDA_COMPILER AND WEFT_NCCL_INCLUDE_DIR AND WEFT_NCCL_LIBRARY)
    enable_language(CUDA)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    # Kernels in their own library: the C++ warning flags of weft_options are not nvcc flags.
    add_library(weft_exec_nccl_kernels STATIC ${CMAKE_CURRENT_SOURCE_DIR}/src/exec/nccl/pack_kernels.cu)
    set_target_properties(weft_exec_nccl_kernels PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}"
      POSITION_INDEPENDENT_CODE ON)
    target_link_libraries(weft_exec_nccl_kernels PUBLIC CUDA::cudart)
    target_sources(weft_exec PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src/exec/nccl/nccl_executor.cpp)
    target_include_directories(weft_exec PRIVATE ${WEFT_NCCL_INCLUDE_DIR})
    target_link_libraries(weft_exec PUBLIC weft_exec_nccl_kernels CUDA::cudart ${WEFT_NCCL_LIBRARY})
    target_compile_definitions(weft_exec PUBLIC WEFT_HAVE_NCCL=1)
    set(WEFT_HAVE_NCCL ON)
    set(WEFT_MODULE_TARGETS ${WEFT_MODULE_TARGETS} weft_exec_nccl_kernels)
    message(STATUS "weft: NCCL executor enabled (${WEFT_NCCL_LIBRARY})")
  else()
    message(STATUS "weft: NCCL executor disabled (CUDA toolkit/compiler or NCCL not found)")
  endif()
endif()
