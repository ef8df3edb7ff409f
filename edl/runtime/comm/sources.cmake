# edl/runtime/comm: communicators and rendezvous stores (included by edl/CMakeLists.txt).
list(APPEND EDL_SOURCES
  runtime/comm/memory_kv_store.cc
  runtime/comm/file_kv_store.cc
  runtime/comm/nccl_reform.cc
  runtime/comm/gloo/gloo_communicator.cc
)
# The NCCL communicator lives in comm/nccl/ and is built into the CUDA plugin libedl_cuda.so (the
# top-level CMakeLists.txt); libedl's CreateNcclCommunicator() loads the plugin, so libedl itself
# never links NCCL or the CUDA runtime.
list(APPEND EDL_SOURCES runtime/comm/nccl_plugin.cc)
list(APPEND EDL_LINK_LIBS gloo)  # GlooConfig.cmake's imported target
# Debian's libgloo-dev lacks gloo/common/memory.h, which tcp/pair.h includes; see compat/.
set_source_files_properties(runtime/comm/gloo/gloo_communicator.cc PROPERTIES
  INCLUDE_DIRECTORIES ${CMAKE_CURRENT_SOURCE_DIR}/runtime/comm/gloo/compat)
