# NCCL, for the `nccl` communicator backend: looked for only when CUDA is
# built (ZS_HAVE_CUDA), in the CUDA toolkit's directories (NCCL ships inside
# some toolkits, e.g. /usr/local/cuda-13.0/lib) and the usual system paths.
# Sets ZS_HAVE_NCCL, ZS_NCCL_INCLUDE_DIR and ZS_NCCL_LIBRARY. -DZS_NCCL=OFF
# leaves the backend out; ON makes a missing NCCL an error.
set(ZS_NCCL AUTO CACHE STRING "Build the NCCL communicator backend (needs CUDA): AUTO|ON|OFF")
set_property(CACHE ZS_NCCL PROPERTY STRINGS AUTO ON OFF)
set(ZS_HAVE_NCCL OFF)
if(ZS_HAVE_CUDA AND NOT ZS_NCCL STREQUAL "OFF")
  set(zs_nccl_roots ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR} /usr/local/cuda
                    /usr/local/cuda-13.0)
  find_path(ZS_NCCL_INCLUDE_DIR nccl.h
    HINTS ${CUDAToolkit_INCLUDE_DIRS} PATHS ${zs_nccl_roots} PATH_SUFFIXES include)
  find_library(ZS_NCCL_LIBRARY nccl
    HINTS ${CUDAToolkit_LIBRARY_DIR} PATHS ${zs_nccl_roots} PATH_SUFFIXES lib64 lib)
  if(ZS_NCCL_INCLUDE_DIR AND ZS_NCCL_LIBRARY)
    set(ZS_HAVE_NCCL ON)
  elseif(ZS_NCCL STREQUAL "ON")
    message(FATAL_ERROR "ZS_NCCL=ON but nccl.h / libnccl were not found next to the CUDA toolkit; "
                        "install NCCL or set ZS_NCCL_INCLUDE_DIR and ZS_NCCL_LIBRARY")
  endif()
elseif(ZS_NCCL STREQUAL "ON")
  message(FATAL_ERROR "ZS_NCCL=ON needs CUDA (ZS_CUDA and nvcc)")
endif()
message(STATUS "zeroshard: NCCL backend ${ZS_HAVE_NCCL} ${ZS_NCCL_LIBRARY}")
