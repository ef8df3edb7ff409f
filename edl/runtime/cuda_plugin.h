// The CUDA plugin: libedl_cuda.so holds everything that links a CUDA library (the resnet50 CUDA
// backend on cuDNN/cuBLAS and the NCCL communicator). The `edl` binary and libedl never link
// CUDA; `edl train --device cuda` (or --device auto) loads the plugin with dlopen on first use,
// so `edl server`, `edl client`, `edl ctl`, `edl launch`, `edl ckpt` and CPU trainers never map a
// CUDA library and run on hosts without one (docs/GPU.md, "The CUDA plugin").
//
// Where the plugin is looked for, first match wins:
//   1. $EDL_CUDA_PLUGIN (a path to the .so; an error if it cannot be loaded),
//   2. the directory of libedl.so (the build directory, or lib/ of a bundle),
//   3. the directory of the running executable.
// The plugin exports edl_cuda_plugin_abi() (kCudaPluginAbi below): a plugin from another edl
// build is refused rather than called with mismatched C++ types.
//
// Thread-safety: every function here may be called from any thread; the plugin is loaded once
// per process and stays loaded.
#pragma once

#include <string>

#include "edl/base/status.h"
#include "edl/config.h"

namespace edl::runtime {

// The plugin's file name.
inline constexpr const char* kCudaPluginFile = "libedl_cuda.so";
// What edl_cuda_plugin_abi() returns in a plugin this binary can use; bump the number when an
// exported entry point changes its signature. A macro, not a function: each side must use the
// value it was compiled with (a function in libedl would answer for the plugin too).
#define EDL_CUDA_PLUGIN_ABI "edl-cuda-plugin/2 edl/" EDL_VERSION " " __VERSION__

// Loads the plugin (once). FailedPrecondition naming what is missing and the fix when it is not
// found, cannot be loaded (e.g. the CUDA libraries it needs are absent) or is from another build.
Status LoadCudaPlugin();
// The path the plugin was loaded from ("" before a successful LoadCudaPlugin).
std::string CudaPluginPath();

// The exported symbol `name` of the plugin (loading it first). NotFound when the plugin lacks it
// (e.g. built without NCCL); the errors of LoadCudaPlugin otherwise.
StatusOr<void*> CudaPluginSymbol(const std::string& name);

// Typed convenience: reinterprets the symbol as a function pointer of type F.
template <typename F>
StatusOr<F*> CudaPluginFunction(const std::string& name) {
  auto sym = CudaPluginSymbol(name);
  if (!sym.ok()) return sym.status();
  return reinterpret_cast<F*>(sym.value());
}

}  // namespace edl::runtime
