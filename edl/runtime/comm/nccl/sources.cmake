# edl/runtime/comm/nccl: the NCCL communicator. Included by edl/runtime/comm/sources.cmake only when
# the top-level CMake found NCCL (EDL_HAVE_NCCL); otherwise nccl_unavailable.cc provides the stub.
list(APPEND EDL_SOURCES runtime/comm/nccl/nccl_communicator.cc)
list(APPEND EDL_LINK_LIBS ${NCCL_LIBRARY} CUDA::cudart)
