// Gloo implementation of Communicator (CPU, TCP transport).
//
// One gloo context per communicator, connected as a full mesh over a gloo Store adapter that maps
// onto our KvStore under options.key_prefix. The connect is gloo's connectFullMesh, step for step
// (hostname keys, pair addresses, one connect per peer), redone here (InterruptibleContext) so
// that CommOptions::interrupt can end it: a poller asks it every kInterruptEvery and, on a non-OK
// answer, signals the pairs, which wakes a connect waiting for a peer that will never come (a
// member of a superseded generation) instead of leaving it to options.timeout. Every collective
// uses gloo's option-struct API (gloo::allreduce / broadcast / barrier) and nothing else: mixing
// it with the older algorithm classes on one context hung with 4 ranks.
//
// Abort: gloo has no public cancel. A pair that hits an error (tcp::Pair::signalException) wakes
// every unbound buffer pending on it and closes its socket; we reach that same path from another
// thread through tcp::Pair::signalExceptionExternal (protected; see PairAccess). The blocked
// collective then throws gloo::IoException, which we turn into Aborted. Closing the socket also
// makes the peers' collectives fail at once, so an abort on one rank spreads to the others. Every
// collective also carries options.timeout, so even a path the abort misses is bounded.
//
// Failure is sticky (in Gloo, after an IoException the transport is unusable): the
// first error is kept in failed_ and returned by every later call.
//
// A collective that throws may leave sends in flight on the pairs that did not fail: gloo's device
// thread completes them later and signals the collective's unbound buffers (handleSendCompletion),
// which the option struct owns. So the options of a failed collective are not destroyed when it
// returns: they are kept (graveyard_) until the destructor has closed every pair, after which no
// completion can reach them. Likewise an Abort() racing with the end of a collective that
// succeeded: the options are destroyed under abort_mu_, which Abort() holds while it signals the
// pairs. (ThreadSanitizer found buffers destroyed under a late completion and under an abort.)
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <thread>

#include <glog/logging.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/pair.h>

#include "edl/base/thread_annotations.h"
#include "edl/runtime/comm/communicator.h"

namespace edl::runtime {
namespace {

// ---------------------------------------------------------------------------------------------
// gloo::rendezvous::Store over our KvStore. gloo expects exceptions; the factory catches them.

class KvStoreAdapter : public gloo::rendezvous::Store {
 public:
  KvStoreAdapter(KvStore* store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_->Set(Key(key), std::string(data.begin(), data.end())));
  }
  std::vector<char> get(const std::string& key) override {
    std::string value;
    Check(store_->Wait(Key(key), timeout_, &value));  // gloo may get before the key is set
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (const std::string& key : keys) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      std::string value;
      Check(store_->Wait(Key(key), std::max(left, std::chrono::milliseconds(0)), &value));
    }
  }

 private:
  std::string Key(const std::string& key) const { return prefix_ + "/" + key; }
  static void Check(const Status& s) {
    if (!s.ok()) throw gloo::IoException(s.ToString());
  }

  KvStore* const store_;  // not owned; outlives the rendezvous (CommOptions contract)
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;
};

// Reaches tcp::Pair::signalExceptionExternal (protected) through a pointer to member formed in a
// derived class, which the language allows; no object of this type is ever created.
struct PairAccess : gloo::transport::tcp::Pair {
  static void Signal(gloo::transport::tcp::Pair* pair, const std::string& msg) {
    auto fn = &PairAccess::signalExceptionExternal;
    (pair->*fn)(msg);
  }
};

// Signals every tcp pair of `context` (a gloo::Context or a transport context), so that whatever
// waits on one throws; a pair that already failed ignores it.
template <typename Ctx>
void SignalPairs(Ctx* context, int rank, int size, const std::string& why) {
  for (int i = 0; i < size; ++i) {
    if (i == rank) continue;
    auto* pair = dynamic_cast<gloo::transport::tcp::Pair*>(context->getPair(i).get());
    if (pair == nullptr) continue;
    try {
      PairAccess::Signal(pair, why);
    } catch (const std::exception& e) {
      LOG(WARNING) << "gloo rank " << rank << ": signalling pair " << i << ": " << e.what();
    }
  }
}

// Asks `interrupt` every kInterruptEvery on its own thread until stopped; on the first non-OK
// answer keeps it and signals the pairs of `context`, so a connect blocked on a peer throws.
class ConnectInterrupter {
 public:
  ConnectInterrupter(const std::function<Status(CommPhase)>& interrupt,
                     gloo::transport::Context* context, int rank, int size) {
    if (!interrupt) return;
    thread_ = std::thread([this, &interrupt, context, rank, size] {
      for (;;) {
        Status s = interrupt(CommPhase::kConstruct);
        MutexLock lock(&mu_);
        if (done_) return;
        if (!s.ok()) {
          interrupted_ = s;
          lock.Unlock();
          SignalPairs(context, rank, size, "rendezvous interrupted: " + s.ToString());
          return;
        }
        cv_.wait_for(lock.native(), kInterruptEvery, [this]() REQUIRES(mu_) { return done_; });
        if (done_) return;
      }
    });
  }
  ~ConnectInterrupter() { (void)Stop(); }  // an exception unwinds past the Stop() that reads it
  // Stops the poller (joins it); returns the interrupt's answer if it ended the connect, else OK.
  Status Stop() {
    {
      MutexLock lock(&mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    MutexLock lock(&mu_);
    return interrupted_;
  }

 private:
  Mutex mu_;
  std::condition_variable cv_;
  bool done_ GUARDED_BY(mu_) = false;
  Status interrupted_ GUARDED_BY(mu_);
  std::thread thread_;
};

// gloo::rendezvous::Context whose full-mesh connect CommOptions::interrupt can end (top of file).
class InterruptibleContext : public gloo::rendezvous::Context {
 public:
  using gloo::rendezvous::Context::Context;

  // gloo's connectFullMesh with the interrupter running over the connects. Throws what gloo
  // throws; *interrupted is the interrupt's answer when it ended the connect.
  void ConnectFullMesh(gloo::rendezvous::Store& store,
                       std::shared_ptr<gloo::transport::Device>& dev,
                       const std::function<Status(CommPhase)>& interrupt, Status* interrupted) {
    char hostname[256] = {};
    if (gethostname(hostname, sizeof(hostname) - 1) != 0) {
      throw std::system_error(errno, std::system_category(), "gethostname");
    }
    const std::string host(hostname);
    store.set("rank_" + std::to_string(rank), std::vector<char>(host.begin(), host.end()));
    int local_rank = 0;
    for (int i = 0; i < rank; ++i) {
      const std::vector<char> other = store.get("rank_" + std::to_string(i));
      local_rank += std::string(other.begin(), other.end()) == host;
    }
    auto transport = dev->createContext(rank, size);
    transport->setTimeout(getTimeout());
    std::vector<char> addresses;
    for (int i = 0; i < size; ++i) {
      if (i == rank) continue;
      auto& pair = transport->createPair(i);
      pair->setLocalRank(local_rank);
      const std::vector<char> bytes = pair->address().bytes();
      addresses.insert(addresses.end(), bytes.begin(), bytes.end());
    }
    store.set(std::to_string(rank), addresses);
    ConnectInterrupter interrupter(interrupt, transport.get(), rank, size);
    try {
      for (int i = 0; i < size; ++i) {
        if (i == rank) continue;
        store.wait({std::to_string(i)}, getTimeout());
        std::vector<char> all = store.get(std::to_string(i));
        transport->getPair(i)->connect(extractAddress(all, i));
      }
    } catch (...) {
      *interrupted = interrupter.Stop();
      throw;
    }
    *interrupted = interrupter.Stop();
    if (!interrupted->ok()) throw gloo::IoException(interrupted->ToString());  // raced the end
    device_ = dev;
    transportContext_ = std::move(transport);
  }
};

template <typename T>
gloo::AllreduceOptions::Func ReduceFunc(ReduceOp op) {
  using Fn = void (*)(void*, const void*, const void*, size_t);
  return op == ReduceOp::kSum ? static_cast<Fn>(&gloo::sum<T>) : static_cast<Fn>(&gloo::max<T>);
}

// ---------------------------------------------------------------------------------------------

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(const CommOptions& options, std::shared_ptr<gloo::rendezvous::Context> context)
      : options_(options), context_(std::move(context)) {}

  ~GlooCommunicator() override {
    MutexLock lock(&abort_mu_);  // no Abort() may touch the pairs past here
    if (!graveyard_.empty()) CloseAllPairs("communicator destroyed after a failed collective");
    graveyard_.clear();
    context_.reset();
  }

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  const char* backend() const override { return "gloo"; }

  Status AllReduce(void* data, size_t count, DataType type, ReduceOp op) override;
  Status Broadcast(void* data, size_t bytes, int root) override;
  Status Barrier() override;
  void Abort() override;
  bool aborted() const override { return aborted_.load(); }

 private:
  // Runs gloo's collective `fn` on `opts` and turns gloo's exceptions into a sticky Status; the
  // options of a collective that threw are kept until the pairs are closed (top of the file).
  template <typename Opts, typename Fn>
  Status Run(const char* what, std::shared_ptr<Opts> opts, Fn&& fn);
  // Makes every pair fail (closing its socket): blocked collectives here and on the peers throw.
  void CloseAllPairs(const char* why) REQUIRES(abort_mu_);
  std::string Name() const {
    return "gloo communicator of generation " + std::to_string(options_.generation) + " (rank " +
           std::to_string(options_.rank) + "/" + std::to_string(options_.world_size) + ")";
  }

  const CommOptions options_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::atomic<bool> aborted_{false};
  // Held while the pairs are signalled (CloseAllPairs) and while the options of a collective,
  // which own the buffers a signal wakes, are destroyed; Abort() against destruction likewise.
  Mutex abort_mu_;
  Status failed_;  // first error; touched only by the collective thread
  std::vector<std::shared_ptr<void>>
      graveyard_;  // options of failed collectives (collective thread)
};

template <typename Opts, typename Fn>
Status GlooCommunicator::Run(const char* what, std::shared_ptr<Opts> opts, Fn&& fn) {
  if (!failed_.ok()) return failed_;
  if (aborted_) return failed_ = Status::Aborted(Name() + " was aborted; build a new one");
  try {
    fn(*opts);
    // An Abort() from another thread signals the pairs' pending buffers; it must not do so while
    // the options (owning this collective's buffers) are being destroyed.
    MutexLock lock(&abort_mu_);
    opts.reset();
    return Status::OK();
  } catch (const std::exception& e) {
    graveyard_.push_back(std::move(opts));
    if (aborted_) {
      failed_ = Status::Aborted(Name() + ": " + what + " aborted");
    } else {
      failed_ = Status::IOError(Name() + ": " + what +
                                " failed (a peer died, hung or closed): " + e.what());
    }
    return failed_;
  }
}

Status GlooCommunicator::AllReduce(void* data, size_t count, DataType type, ReduceOp op) {
  if (count == 0) return Status::OK();
  auto opts = std::make_shared<gloo::AllreduceOptions>(context_);
  opts->setTimeout(options_.timeout);
  switch (type) {
    case DataType::kFloat32:
      opts->setOutput(static_cast<float*>(data), count);
      opts->setReduceFunction(ReduceFunc<float>(op));
      break;
    case DataType::kFloat64:
      opts->setOutput(static_cast<double*>(data), count);
      opts->setReduceFunction(ReduceFunc<double>(op));
      break;
    case DataType::kInt64:
      opts->setOutput(static_cast<int64_t*>(data), count);
      opts->setReduceFunction(ReduceFunc<int64_t>(op));
      break;
    case DataType::kInt32:
      opts->setOutput(static_cast<int32_t*>(data), count);
      opts->setReduceFunction(ReduceFunc<int32_t>(op));
      break;
    default:
      return Status::InvalidArgument(Name() +
                                     ": AllReduce supports float32, float64, int64 and "
                                     "int32; convert the buffer first");
  }
  return Run("allreduce", std::move(opts), [](gloo::AllreduceOptions& o) { gloo::allreduce(o); });
}

Status GlooCommunicator::Broadcast(void* data, size_t bytes, int root) {
  if (root < 0 || root >= options_.world_size) {
    return Status::InvalidArgument(Name() + ": broadcast root " + std::to_string(root) +
                                   " out of range");
  }
  if (bytes == 0) return Status::OK();
  auto opts = std::make_shared<gloo::BroadcastOptions>(context_);
  opts->setTimeout(options_.timeout);
  opts->setRoot(root);
  opts->setOutput(static_cast<uint8_t*>(data), bytes);
  return Run("broadcast", std::move(opts), [](gloo::BroadcastOptions& o) { gloo::broadcast(o); });
}

Status GlooCommunicator::Barrier() {
  auto opts = std::make_shared<gloo::BarrierOptions>(context_);
  opts->setTimeout(options_.timeout);
  return Run("barrier", std::move(opts), [](gloo::BarrierOptions& o) { gloo::barrier(o); });
}

void GlooCommunicator::Abort() {
  MutexLock lock(&abort_mu_);
  if (aborted_.exchange(true) || !context_) return;
  CloseAllPairs("communicator aborted by the elastic runtime");
}

void GlooCommunicator::CloseAllPairs(const char* why) {
  SignalPairs(context_.get(), context_->rank, context_->size, Name() + ": " + why);
}

Status ValidateOptions(const CommOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return Status::InvalidArgument("communicator options: rank " + std::to_string(o.rank) +
                                   " is not in [0, world_size=" + std::to_string(o.world_size) +
                                   ")");
  }
  if (o.store == nullptr) return Status::InvalidArgument("communicator options: store is null");
  if (o.key_prefix.empty()) {
    return Status::InvalidArgument(
        "communicator options: key_prefix is empty; use e.g. gen/7/gloo");
  }
  if (o.timeout.count() <= 0) return Status::InvalidArgument("communicator timeout must be > 0");
  return Status::OK();
}

}  // namespace

StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const CommOptions& options) {
  EDL_RETURN_IF_ERROR(ValidateOptions(options));
  const std::string host = options.host.empty() ? "127.0.0.1" : options.host;
  Status interrupted;  // the interrupt's answer, when it ended the connect
  try {
    gloo::transport::tcp::attr attr(host.c_str());
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<InterruptibleContext>(options.rank, options.world_size);
    context->setTimeout(options.timeout);
    KvStoreAdapter store(options.store, options.key_prefix, options.timeout);
    context->ConnectFullMesh(store, device, options.interrupt, &interrupted);
    return std::unique_ptr<Communicator>(new GlooCommunicator(options, std::move(context)));
  } catch (const std::exception& e) {
    const std::string where =
        "gloo rendezvous of generation " + std::to_string(options.generation) + " (rank " +
        std::to_string(options.rank) + "/" + std::to_string(options.world_size) + ", keys " +
        options.key_prefix + ", host " + host + ")";
    if (!interrupted.ok()) return interrupted.WithContext(where);
    const std::string what = e.what();
    const std::string msg = where + " failed: " + what;
    if (what.find("Timeout") != std::string::npos || what.find("timeout") != std::string::npos) {
      return Status::Timeout(msg + "; did every member of the generation start?");
    }
    return Status::Unavailable(msg);
  }
}

}  // namespace edl::runtime
