# edl/runtime/comm/nccl: the NCCL communicator. Included by the top-level CMakeLists.txt into the
# CUDA plugin libedl_cuda.so only when it found NCCL (EDL_HAVE_NCCL); appends to its lists.
list(APPEND EDL_CUDA_PLUGIN_SOURCES
  ${CMAKE_SOURCE_DIR}/edl/runtime/comm/nccl/nccl_communicator.cc
  ${CMAKE_SOURCE_DIR}/edl/runtime/comm/nccl/nccl_util.cc)
list(APPEND EDL_CUDA_PLUGIN_LIBS ${NCCL_LIBRARY} CUDA::cudart ${CMAKE_DL_LIBS})
