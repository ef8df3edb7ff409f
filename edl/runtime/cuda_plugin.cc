// Finding and loading libedl_cuda.so (cuda_plugin.h).
#include "edl/runtime/cuda_plugin.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "edl/base/thread_annotations.h"

namespace edl::runtime {
namespace {

Mutex mu;
void* handle GUARDED_BY(mu) = nullptr;  // never closed: the plugin's code stays in use
std::string loaded_path GUARDED_BY(mu);

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

bool FileExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The places kCudaPluginFile is looked for when $EDL_CUDA_PLUGIN is not set, in order.
std::vector<std::string> Candidates() {
  std::vector<std::string> out;
  Dl_info info{};
  // Any function of libedl names the library's own file.
  if (::dladdr(reinterpret_cast<void*>(&LoadCudaPlugin), &info) != 0 && info.dli_fname != nullptr) {
    out.push_back(DirName(info.dli_fname) + "/" + kCudaPluginFile);
  }
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    const std::string p = DirName(exe) + "/" + kCudaPluginFile;
    if (out.empty() || out.front() != p) out.push_back(p);
  }
  return out;
}

const char kFix[] =
    "build edl with the CUDA toolkit, cuDNN and NCCL installed (cmake -DEDL_USE_CUDA=ON; the build "
    "writes libedl_cuda.so next to libedl.so) and keep the plugin there, set EDL_CUDA_PLUGIN to "
    "its path, or use --device cpu";

Status LoadLocked() REQUIRES(mu) {
  if (handle != nullptr) return Status::OK();
  std::string path;
  const char* env = std::getenv("EDL_CUDA_PLUGIN");
  if (env != nullptr && env[0] != '\0') {
    path = env;
    if (!FileExists(path)) {
      return Status::FailedPrecondition("the CUDA plugin EDL_CUDA_PLUGIN=" + path +
                                        " does not exist; point EDL_CUDA_PLUGIN at libedl_cuda.so, "
                                        "unset it to use the one next to libedl.so, or use "
                                        "--device cpu");
    }
  } else {
    std::string looked;
    for (const std::string& c : Candidates()) {
      if (FileExists(c)) {
        path = c;
        break;
      }
      looked += (looked.empty() ? "" : ", ") + c;
    }
    if (path.empty()) {
      return Status::FailedPrecondition(
          std::string("the CUDA plugin ") + kCudaPluginFile + " was not found (looked at " +
          looked + "); " + (EDL_HAVE_CUDA ? "" : "this edl was configured without CUDA; ") + kFix);
    }
  }
  void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* why = ::dlerror();
    return Status::FailedPrecondition(
        "could not load the CUDA plugin " + path + ": " + (why ? why : "unknown dlopen error") +
        "; the CUDA libraries it was built against (CUDA runtime, cuBLAS, cuDNN, NCCL of the "
        "toolkit at build time) are missing or of another major version: install them or add "
        "their directory to LD_LIBRARY_PATH (scripts/build_gpu_bundle.sh shows how), or rebuild "
        "edl against the CUDA installed here");
  }
  using AbiFn = const char*();
  auto* abi = reinterpret_cast<AbiFn*>(::dlsym(h, "edl_cuda_plugin_abi"));
  const std::string want = EDL_CUDA_PLUGIN_ABI;
  const std::string got = abi != nullptr ? abi() : "<no edl_cuda_plugin_abi>";
  if (got != want) {
    ::dlclose(h);
    return Status::FailedPrecondition("the CUDA plugin " + path + " is from another edl build (" +
                                      got + ", this binary needs " + want +
                                      "); use the libedl_cuda.so built with this edl");
  }
  handle = h;
  loaded_path = path;
  return Status::OK();
}

}  // namespace

Status LoadCudaPlugin() {
  MutexLock lock(&mu);
  return LoadLocked();
}

std::string CudaPluginPath() {
  MutexLock lock(&mu);
  return loaded_path;
}

StatusOr<void*> CudaPluginSymbol(const std::string& name) {
  MutexLock lock(&mu);
  EDL_RETURN_IF_ERROR(LoadLocked());
  ::dlerror();
  void* sym = ::dlsym(handle, name.c_str());
  if (sym == nullptr) {
    return Status::NotFound("the CUDA plugin " + loaded_path + " has no " + name);
  }
  return sym;
}

}  // namespace edl::runtime
