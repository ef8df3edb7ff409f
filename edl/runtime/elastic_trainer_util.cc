// The free functions elastic_trainer.h declares beside ElasticTrainer: choosing the communicator
// backend and hashing a Trainable's state (the value every rank compares after a re-form).
#include <cstring>
#include <vector>

#include "edl/runtime/cuda_plugin.h"
#include "edl/runtime/elastic_trainer.h"

namespace edl::runtime {

StatusOr<std::string> SelectCommBackend(const std::string& comm, bool on_device,
                                        bool nccl_available) {
  if (comm == "auto") return std::string(on_device && nccl_available ? "nccl" : "gloo");
  if (comm == "gloo") return comm;
  if (comm == "nccl") {
    if (!on_device) {
      return Status::InvalidArgument(
          "--comm nccl needs --device cuda: NCCL reduces GPU memory and this trainer's tensors "
          "are in host memory; use --comm gloo (or auto) with --device cpu");
    }
    if (!nccl_available) {
      return Status::FailedPrecondition(
          "--comm nccl: the CUDA plugin here has no NCCL communicator (built without NCCL); "
          "rebuild with NCCL installed (cmake -DEDL_USE_NCCL=ON) or use --comm gloo");
    }
    return comm;
  }
  return Status::InvalidArgument("--comm '" + comm + "' is unknown; use auto, nccl or gloo");
}

bool NcclAvailable() { return CudaPluginSymbol("edl_cuda_new_nccl_communicator_v1").ok(); }

StatusOr<uint64_t> StateHash(Trainable* trainable) {
  uint64_t h = 0xcbf29ce484222325ULL;
  // FNV-1a-style over 8-byte words, then the tail bytes: a fraction of the byte-wise cost, which
  // every re-form pays on its critical path (the sync event carries the hash).
  auto mix = [&h](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, b + i, 8);
      h = (h ^ w) * 0x100000001b3ULL;
      h ^= h >> 29;  // the product carries low bits up only: fold the high ones back down
    }
    for (; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ULL;
  };
  std::vector<char> host;
  for (const StateTensor& t : trainable->StateTensors()) {
    host.resize(t.bytes);
    EDL_RETURN_IF_ERROR(trainable->CopyToHost(t, host.data()));
    mix(t.name.data(), t.name.size());
    mix(host.data(), host.size());
  }
  return h;
}

}  // namespace edl::runtime
