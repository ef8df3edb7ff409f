// Compiled into libedl_cuda.so only (the CUDA plugin, cuda_plugin.h): the ABI tag the loader in
// libedl checks before calling any other entry point. EDL_CUDA_PLUGIN_ABI expands here, at the
// plugin's build.
#include "edl/runtime/cuda_plugin.h"

extern "C" __attribute__((visibility("default"))) const char* edl_cuda_plugin_abi() {
  return EDL_CUDA_PLUGIN_ABI;
}
