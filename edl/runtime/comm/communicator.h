// Communicator: the data plane between the trainers of one generation (collectives over Gloo/TCP
// on CPU, NCCL on GPU), plus the rendezvous store a communicator bootstraps from.
//
// A communicator is created for exactly one generation (rank, world size fixed) and is never
// re-used across generations: a re-form builds a new one. After any failed collective or Abort(),
// the communicator stays failed (every later call returns the same error); the owner destroys it
// and builds the next one (in Gloo, an IoException leaves the transport unusable).
//
// Thread-safety: collectives are issued from one thread at a time. Abort() may be called from any
// thread, also while a collective is blocked in another; it makes that collective and every later
// one return Status::Aborted instead of hanging on a dead peer.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "edl/base/dtype.h"
#include "edl/base/status.h"

namespace edl::runtime {

using ::edl::DataType;  // edl/base/dtype.h
using ::edl::DataTypeSize;
enum class ReduceOp { kSum, kMax };

// Rendezvous key-value store. In production the server's KV reached through the local client
// (keys scoped by job and generation there); tests use an in-process one. Thread-safe.
class KvStore {
 public:
  virtual ~KvStore() = default;
  virtual Status Set(const std::string& key, const std::string& value) = 0;
  // NotFound when the key is absent.
  virtual Status Get(const std::string& key, std::string* value) = 0;
  // Blocks until `key` exists, up to `timeout`; Timeout if it never appears.
  virtual Status Wait(const std::string& key, std::chrono::milliseconds timeout,
                      std::string* value) = 0;
};

struct CommOptions {
  int rank = 0;        // this process's rank in the generation, 0 <= rank < world_size
  int world_size = 1;  // number of ranks in the generation
  int64_t generation = 0;
  // Prefix for every rendezvous key this communicator writes, e.g. "gen/7/gloo"; must be unique
  // per communicator instance (a retry of the same generation adds an attempt number).
  std::string key_prefix;
  KvStore* store = nullptr;  // not owned; must outlive the communicator's construction
  // Bound on rendezvous and on every collective; a dead peer turns into an error after this.
  std::chrono::milliseconds timeout{30000};
  // Gloo: address to bind and advertise (an IP of this host); empty means the loopback address.
  std::string host;
  // NCCL: CUDA device ordinal and the cudaStream_t (as void*) collectives are enqueued on.
  int cuda_device = -1;
  void* cuda_stream = nullptr;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // "gloo" or "nccl".
  virtual const char* backend() const = 0;

  // In-place reduction of `count` elements at `data` across all ranks; every rank gets the result.
  // `data` is host memory for Gloo, device memory for NCCL.
  virtual Status AllReduce(void* data, size_t count, DataType type, ReduceOp op) = 0;
  // Copies `bytes` bytes at `data` from rank `root` to every rank.
  virtual Status Broadcast(void* data, size_t bytes, int root) = 0;
  virtual Status Barrier() = 0;
  // Unblocks any collective in flight and fails all later ones with Aborted. Idempotent.
  virtual void Abort() = 0;
  virtual bool aborted() const = 0;

 protected:
  Communicator() = default;
};

// Each returns InvalidArgument for bad options, Timeout/Unavailable when rendezvous fails.
StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const CommOptions& options);
// Only where edl/config.h says EDL_HAVE_NCCL; returns FailedPrecondition otherwise.
StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const CommOptions& options);

}  // namespace edl::runtime
