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
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "edl/base/dtype.h"
#include "edl/base/status.h"

namespace edl::runtime {

using ::edl::DataType;  // edl/base/dtype.h
using ::edl::DataTypeSize;
enum class ReduceOp { kSum, kMax };

// What a communicator is doing when it polls CommOptions::interrupt.
enum class CommPhase {
  kConstruct,   // rendezvous and init (ncclCommInitRankConfig, ncclCommShrink)
  kCollective,  // a collective (or group of them) in flight
};

// One buffer of Communicator::BroadcastAll.
struct BroadcastBuffer {
  void* data = nullptr;
  size_t bytes = 0;
};

// How often a communicator's wait asks CommOptions::interrupt (it may take a lock in the
// membership source), in both backends.
inline constexpr std::chrono::milliseconds kInterruptEvery{5};

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
  // NCCL: polled (every kInterruptEvery) by every wait of the communicator, during its
  // construction and in every collective; a non-OK answer ends that wait at once, aborts the
  // NCCL communicator and becomes the sticky error. The elastic runtime answers Aborted when a
  // newer generation supersedes one under construction, when a failure generation newer than
  // this one is committed, and at shutdown. Must stay callable for the communicator's whole life.
  // Gloo polls it (at the same rate) only while it connects the pairs of its construction: its
  // key waits go through `store`, a hung collective through Abort().
  std::function<Status(CommPhase)> interrupt;
  // The trainer id of each rank (may be empty): names the trainers in errors that involve two
  // ranks, e.g. two ranks on one GPU.
  std::vector<std::string> rank_names;
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
  // Broadcasts every buffer from `root` (same list, same order on every rank). NCCL enqueues the
  // device buffers as one group (ncclGroupStart/End) and waits once; the default broadcasts the
  // buffers one by one.
  virtual Status BroadcastAll(const std::vector<BroadcastBuffer>& buffers, int root) {
    for (const BroadcastBuffer& b : buffers) {
      Status s = Broadcast(b.data, b.bytes, root);
      if (!s.ok()) return s;
    }
    return Status::OK();
  }
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

// The network interface that holds address `ip` on this host ("" when none does, or `ip` is not
// an IP literal).
std::string InterfaceOfAddress(const std::string& ip);
// NCCL's socket transport picks an interface by its own guess, and a wrong guess shows only as
// init timeouts; the trainer knows the address it advertises (CommOptions::host). Unless the
// user set NCCL_SOCKET_IFNAME, it is set to "=<the interface holding `host`>" (an exact match)
// for this process, before NCCL's first init reads it. Returns the value NCCL will use ("" when
// neither the user nor `host` names one: NCCL's own guess). CreateNcclCommunicator calls it.
std::string DefaultNcclSocketIfname(const std::string& host);

// The NCCL_VERSION_CODE of the NCCL library the CUDA plugin runs with (ncclGetVersion: 22809 for
// 2.28.9), or 0 when there is no plugin with NCCL.
int NcclRuntimeVersion();

// The communicator of generation options.generation built from `parent` (a NCCL communicator of
// the previous generation) with ncclCommShrink: the ranks of `parent` minus `excluded_ranks`, the
// survivors keeping their relative order (nccl_reform.h decides when that applies). With
// `abort_parent` (a failure: a peer is dead) NCCL first ends the parent's operations in flight
// (NCCL_SHRINK_ABORT); the parent is unusable afterwards either way and the caller destroys it.
// options.rank / world_size: this rank's place in the shrunk communicator; store and key_prefix
// are not used. Every survivor calls this with the same `excluded_ranks`. FailedPrecondition when
// the running NCCL is older than 2.27 (no ncclCommShrink): build with CreateNcclCommunicator.
StatusOr<std::unique_ptr<Communicator>> ShrinkNcclCommunicator(
    Communicator* parent, const std::vector<int>& excluded_ranks, bool abort_parent,
    const CommOptions& options);

}  // namespace edl::runtime
