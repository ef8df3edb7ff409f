// TrainerChannel: a trainer's connection to its node's `edl client` over the Unix socket named by
// EDL_CLIENT_SOCKET. It receives committed generations (pushed by the client), relays rendezvous
// KV requests, readiness, progress and events to the job server, and pings the client every
// `heartbeat` so the client can detect a hung (e.g. SIGSTOPped) trainer.
//
// Thread-safety: every method is thread-safe. A background reader thread receives generation
// pushes and KV replies; a heartbeat thread sends pings. The destructor stops both (bounded).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "edl/base/status.h"
#include "edl/base/thread_annotations.h"
#include "edl/net/framed_socket.h"
#include "edl/proto/messages.h"
#include "edl/proto/service_messages.h"

namespace edl::net {

using ProgressReport = proto::ProgressReport;

// A warm spare's side of the channel (PROTOCOL.md, "Spares"): connects to `socket_path`, says
// spare_hello as `spare_id` and blocks until the client assigns an identity (returned), however
// long that takes. Aborted when the client closes the socket (it released the spare, or exited);
// Unavailable / Timeout when the socket does not answer within `connect_timeout`; the client's
// refusal as its status. The connection is closed on return: the assigned trainer connects anew.
StatusOr<proto::SpareAssign> WaitAsSpare(const std::string& socket_path,
                                         const std::string& spare_id,
                                         std::chrono::milliseconds connect_timeout);

// A trainer's heartbeat period. The client reads two periods of silence from a stopped process
// (state T) as proof that it is stopped (jobclient/client.cc), so this bounds how long a job waits
// on a SIGSTOPped trainer; a ping over a Unix socket costs next to nothing.
inline constexpr std::chrono::milliseconds kTrainerHeartbeat{200};

class TrainerChannel {
 public:
  // Connects and introduces itself as `trainer_id`. The client refuses ids it did not start
  // (FailedPrecondition). Unavailable / Timeout when the socket does not answer within `timeout`.
  static StatusOr<std::unique_ptr<TrainerChannel>> Connect(
      const std::string& socket_path, const std::string& trainer_id,
      std::chrono::milliseconds timeout, std::chrono::milliseconds heartbeat = kTrainerHeartbeat);
  ~TrainerChannel();
  TrainerChannel(const TrainerChannel&) = delete;
  TrainerChannel& operator=(const TrainerChannel&) = delete;

  // Newest committed generation received; false if none yet.
  bool Latest(proto::GenerationInfo* out) const;
  // Blocks until a committed generation with number > `after` has arrived (returns at once if one
  // has). Timeout when none arrives in time; Unavailable when the channel broke.
  Status WaitGeneration(int64_t after, std::chrono::milliseconds timeout,
                        proto::GenerationInfo* out);

  // Rendezvous KV on the server; keys are scoped by job by the server. Callers put the
  // generation in the key (e.g. "g7/nccl_id").
  Status KvSet(const std::string& key, const std::string& value);
  Status KvGet(const std::string& key, std::string* value);  // NotFound when absent
  Status KvWait(const std::string& key, std::chrono::milliseconds timeout,
                std::string* value);  // Timeout

  Status ReportReady(int64_t generation);  // a joiner finished preparing
  Status ReportProgress(const ProgressReport& p);
  Status ReportEvent(const nlohmann::json& event);  // appended to the job's events log
  bool connected() const;

  // Distillation (PROTOCOL.md, "Services"): asks the client for the member lists of `service`
  // (the client watches it at the server and relays every list).
  Status WatchService(const std::string& service);
  // Waits up to `timeout` for a member list of `service` newer than *version (0: none seen yet)
  // and sets *version to its number. Timeout when none came; Unavailable when the channel broke.
  Status WaitServiceMembers(const std::string& service, uint64_t* version,
                            std::chrono::milliseconds timeout, proto::ServiceMembers* out);

 private:
  TrainerChannel(std::unique_ptr<FramedSocket> sock, std::string trainer_id,
                 std::chrono::milliseconds heartbeat);
  void ReaderLoop();
  void HeartbeatLoop();
  void HandleMessage(const nlohmann::json& msg);
  Status SendMsg(const nlohmann::json& msg);
  // Encodes a proto message (anything with EncodeTo(json*)) and sends it.
  template <typename Msg>
  Status SendProto(const Msg& m) {
    nlohmann::json j;
    m.EncodeTo(&j);
    return SendMsg(j);
  }
  Status KvCall(proto::KvRequest req, std::chrono::milliseconds timeout, std::string* value);

  const std::unique_ptr<FramedSocket> sock_;
  const std::string trainer_id_;
  const std::chrono::milliseconds heartbeat_;

  mutable Mutex mu_;
  std::condition_variable cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  bool broken_ GUARDED_BY(mu_) = false;
  Status broken_reason_ GUARDED_BY(mu_);
  bool have_generation_ GUARDED_BY(mu_) = false;
  proto::GenerationInfo latest_ GUARDED_BY(mu_);
  uint64_t next_req_id_ GUARDED_BY(mu_) = 1;
  // Arrived replies, taken by the waiting caller.
  std::map<uint64_t, proto::KvReply> replies_ GUARDED_BY(mu_);
  // Newest member list of each watched service, with its number (counting every list received).
  std::map<std::string, std::pair<uint64_t, proto::ServiceMembers>> members_ GUARDED_BY(mu_);
  uint64_t members_seq_ GUARDED_BY(mu_) = 0;

  std::thread reader_;
  std::thread heartbeater_;
};

}  // namespace edl::net
