#include "edl/net/trainer_channel.h"

#include <glog/logging.h>

#include "edl/proto/frame.h"

namespace edl::net {

using nlohmann::json;
using std::chrono::milliseconds;

namespace {
constexpr milliseconds kSendTimeout(10000);
constexpr milliseconds kKvTimeout(30000);     // set/get: the server answers at once
constexpr milliseconds kKvWaitMargin(10000);  // wait: the server's own timeout plus this
}  // namespace

StatusOr<proto::SpareAssign> WaitAsSpare(const std::string& socket_path,
                                         const std::string& spare_id,
                                         milliseconds connect_timeout) {
  auto sock = FramedSocket::ConnectUnix(socket_path, connect_timeout);
  if (!sock.ok()) return sock.status().WithContext("spare " + spare_id);
  proto::SpareHello hello;
  hello.spare_id = spare_id;
  EDL_RETURN_IF_ERROR(sock.value()->Send(hello.Encoded(), connect_timeout));
  for (;;) {
    json j;
    // No bound on the wait itself: a spare is needed when a trainer fails, whenever that is. Each
    // receive is bounded so a broken socket is noticed; the client writes a frame at once.
    Status s = sock.value()->Receive(&j, milliseconds(60000));
    if (s.IsTimeout()) continue;
    if (!s.ok()) {
      return Status::Aborted("spare " + spare_id + ": its client closed the connection (" +
                             s.ToString() + "): released, or the client exited");
    }
    const auto type = j.find("type");
    if (type != j.end() && *type == proto::msg::kError) {
      proto::ErrorMsg e;
      EDL_RETURN_IF_ERROR(e.DecodeFrom(j));
      return e.ToStatus().WithContext("spare " + spare_id);
    }
    if (type != j.end() && *type == proto::msg::kSpareAssign) {
      proto::SpareAssign a;
      EDL_RETURN_IF_ERROR(a.DecodeFrom(j).WithContext("spare " + spare_id + "'s assignment"));
      return a;
    }
    if (type == j.end() || (*type != proto::msg::kHeartbeat && *type != proto::msg::kWelcome)) {
      return Status::Corruption(
          "spare " + spare_id + ": the client at " + socket_path + " sent " +
          (type == j.end() ? std::string("a frame without a type") : type->dump()) +
          " instead of spare_assign");
    }
  }
}

StatusOr<std::unique_ptr<TrainerChannel>> TrainerChannel::Connect(const std::string& socket_path,
                                                                  const std::string& trainer_id,
                                                                  milliseconds timeout,
                                                                  milliseconds heartbeat) {
  if (socket_path.empty()) {
    return Status::InvalidArgument(
        "no client socket: EDL_CLIENT_SOCKET is unset; run the trainer "
        "under `edl client` or `edl launch`");
  }
  auto sock = FramedSocket::ConnectUnix(socket_path, timeout);
  if (!sock.ok()) return sock.status().WithContext("trainer " + trainer_id);
  proto::TrainerHello hello;
  hello.trainer_id = trainer_id;
  json j;
  hello.EncodeTo(&j);
  EDL_RETURN_IF_ERROR(sock.value()->Send(j, timeout));
  EDL_RETURN_IF_ERROR(
      sock.value()->Receive(&j, timeout).WithContext("waiting for the client's welcome"));
  if (proto::TypeOf(j) == proto::msg::kError) {
    proto::ErrorMsg e;
    EDL_RETURN_IF_ERROR(e.DecodeFrom(j));
    return e.ToStatus();
  }
  if (proto::TypeOf(j) != proto::msg::kWelcome) {
    return Status::Corruption("client at " + socket_path + " answered " +
                              proto::Quote(proto::TypeOf(j)) + " instead of welcome");
  }
  return std::unique_ptr<TrainerChannel>(
      new TrainerChannel(std::move(sock.value()), trainer_id, heartbeat));
}

TrainerChannel::TrainerChannel(std::unique_ptr<FramedSocket> sock, std::string trainer_id,
                               milliseconds heartbeat)
    : sock_(std::move(sock)), trainer_id_(std::move(trainer_id)), heartbeat_(heartbeat) {
  reader_ = std::thread([this] { ReaderLoop(); });
  heartbeater_ = std::thread([this] { HeartbeatLoop(); });
}

TrainerChannel::~TrainerChannel() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.notify_all();
  sock_->Shutdown();
  reader_.join();
  heartbeater_.join();
}

void TrainerChannel::ReaderLoop() {
  while (true) {
    {
      MutexLock lock(&mu_);
      if (stop_) return;
    }
    json msg;
    Status s = sock_->Receive(&msg, milliseconds(200));
    if (s.IsTimeout()) continue;
    if (!s.ok()) {
      MutexLock lock(&mu_);
      if (!stop_)
        LOG(WARNING) << "trainer " << trainer_id_ << ": channel to client broken: " << s.ToString();
      broken_ = true;
      broken_reason_ = s;
      cv_.notify_all();
      return;
    }
    HandleMessage(msg);
  }
}

void TrainerChannel::HandleMessage(const json& msg) {
  const std::string& type = proto::TypeOf(msg);
  if (type == proto::msg::kGeneration) {
    proto::GenerationUpdate u;
    Status s = u.DecodeFrom(msg);
    MutexLock lock(&mu_);
    if (s.ok()) s = u.ApplyTo(&latest_);
    if (!s.ok()) {
      LOG(ERROR) << "trainer " << trainer_id_ << ": bad generation from client: " << s.ToString();
      return;
    }
    have_generation_ = true;
    cv_.notify_all();
  } else if (type == proto::msg::kKvReply) {
    proto::KvReply r;
    Status s = r.DecodeFrom(msg);
    if (!s.ok()) {
      LOG(ERROR) << "trainer " << trainer_id_ << ": bad kv reply: " << s.ToString();
      return;
    }
    MutexLock lock(&mu_);
    replies_[r.req_id] = std::move(r);
    cv_.notify_all();
  } else if (type == proto::msg::kServiceMembers) {
    proto::ServiceMembers m;
    Status s = m.DecodeFrom(msg);
    MutexLock lock(&mu_);
    if (!s.ok() || members_.count(m.service) == 0) {
      LOG(ERROR) << "trainer " << trainer_id_ << ": bad or unasked member list from client: "
                 << (s.ok() ? "service '" + m.service + "' is not watched" : s.ToString());
      return;
    }
    const std::string service = m.service;  // the right side is evaluated (and moved) first
    members_[service] = {++members_seq_, std::move(m)};
    cv_.notify_all();
  } else {
    LOG(WARNING) << "trainer " << trainer_id_ << ": ignoring unexpected message '" << type << "'";
  }
}

Status TrainerChannel::WatchService(const std::string& service) {
  {
    MutexLock lock(&mu_);
    members_.emplace(service, std::make_pair(uint64_t{0}, proto::ServiceMembers()));
  }
  proto::ServiceWatch w;
  w.service = service;
  return SendProto(w);
}

Status TrainerChannel::WaitServiceMembers(const std::string& service, uint64_t* version,
                                          std::chrono::milliseconds timeout,
                                          proto::ServiceMembers* out) {
  MutexLock lock(&mu_);
  auto newer = [&]() REQUIRES(mu_) {
    auto it = members_.find(service);
    return it != members_.end() && it->second.first > *version;
  };
  cv_.wait_for(lock.native(), timeout, [&]() REQUIRES(mu_) { return stop_ || broken_ || newer(); });
  if (newer()) {
    const auto& [seq, m] = members_.at(service);
    *version = seq;
    *out = m;
    return Status::OK();
  }
  if (broken_ || stop_) return Status::Unavailable("the channel to the node's client broke");
  return Status::Timeout("no member list of service '" + service + "' yet");
}

void TrainerChannel::HeartbeatLoop() {
  MutexLock lock(&mu_);
  while (!stop_ && !broken_) {
    lock.Unlock();
    Status s = sock_->Send(json{{"type", proto::msg::kHeartbeat}}, kSendTimeout);
    lock.Lock();
    if (!s.ok()) return;
    cv_.wait_for(lock.native(), heartbeat_, [this]() REQUIRES(mu_) { return stop_ || broken_; });
  }
}

Status TrainerChannel::SendMsg(const json& msg) {
  {
    MutexLock lock(&mu_);
    if (broken_)
      return Status::Unavailable("trainer channel is broken: " + broken_reason_.ToString());
  }
  return sock_->Send(msg, kSendTimeout);
}

bool TrainerChannel::Latest(proto::GenerationInfo* out) const {
  MutexLock lock(&mu_);
  if (!have_generation_) return false;
  *out = latest_;
  return true;
}

Status TrainerChannel::WaitGeneration(int64_t after, milliseconds timeout,
                                      proto::GenerationInfo* out) {
  MutexLock lock(&mu_);
  const bool got = cv_.wait_for(lock.native(), timeout, [&]() REQUIRES(mu_) {
    return (have_generation_ && latest_.generation > after) || broken_ || stop_;
  });
  if (have_generation_ && latest_.generation > after) {
    *out = latest_;
    return Status::OK();
  }
  if (broken_)
    return Status::Unavailable("trainer channel is broken: " + broken_reason_.ToString());
  (void)got;
  return Status::Timeout("no generation after " + std::to_string(after) + " within " +
                         std::to_string(timeout.count()) + " ms");
}

Status TrainerChannel::KvCall(proto::KvRequest req, milliseconds timeout, std::string* value) {
  {
    MutexLock lock(&mu_);
    req.req_id = next_req_id_++;
  }
  json j;
  req.EncodeTo(&j);
  EDL_RETURN_IF_ERROR(SendMsg(j));
  MutexLock lock(&mu_);
  const bool got = cv_.wait_for(lock.native(), timeout, [&]() REQUIRES(mu_) {
    return replies_.count(req.req_id) > 0 || broken_ || stop_;
  });
  auto it = replies_.find(req.req_id);
  if (it == replies_.end()) {
    if (broken_)
      return Status::Unavailable("trainer channel is broken: " + broken_reason_.ToString());
    (void)got;
    return Status::Timeout(std::string("kv ") + proto::NameOf(req.op) + " '" + req.key +
                           "': no reply within " + std::to_string(timeout.count()) +
                           " ms (is the server reachable?)");
  }
  proto::KvReply r = std::move(it->second);
  replies_.erase(it);
  if (r.status.ok() && value != nullptr) *value = std::move(r.value);
  return r.status;
}

Status TrainerChannel::KvSet(const std::string& key, const std::string& value) {
  proto::KvRequest r;
  r.op = proto::KvOp::kSet;
  r.key = key;
  r.value = value;
  return KvCall(std::move(r), kKvTimeout, nullptr);
}

Status TrainerChannel::KvGet(const std::string& key, std::string* value) {
  proto::KvRequest r;
  r.op = proto::KvOp::kGet;
  r.key = key;
  return KvCall(std::move(r), kKvTimeout, value);
}

Status TrainerChannel::KvWait(const std::string& key, milliseconds timeout, std::string* value) {
  proto::KvRequest r;
  r.op = proto::KvOp::kWait;
  r.key = key;
  r.timeout_ms = timeout.count();
  return KvCall(std::move(r), timeout + kKvWaitMargin, value);
}

Status TrainerChannel::ReportReady(int64_t generation) {
  proto::Ready r;
  r.trainer_id = trainer_id_;
  r.generation = generation;
  return SendProto(r);
}

Status TrainerChannel::ReportProgress(const ProgressReport& p) {
  proto::Progress m;
  m.trainer_id = trainer_id_;
  m.report = p;
  return SendProto(m);
}

Status TrainerChannel::ReportEvent(const json& event) {
  if (!event.is_object())
    return Status::InvalidArgument("ReportEvent: the event must be a JSON object");
  proto::Event m;
  m.trainer_id = trainer_id_;
  m.event = event;
  return SendProto(m);
}

bool TrainerChannel::connected() const {
  MutexLock lock(&mu_);
  return !broken_ && !stop_;
}

}  // namespace edl::net
