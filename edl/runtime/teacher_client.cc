#include "edl/runtime/teacher_client.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>

#include <glog/logging.h>

#include "edl/base/thread_annotations.h"
#include "edl/net/framed_socket.h"
#include "edl/proto/frame.h"
#include "edl/proto/service_messages.h"

namespace edl::runtime {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

// Batches are keyed by (seed, indices); the map compares the indices too, so a hash collision
// only costs a second lookup.
uint64_t BatchKey(const std::vector<int64_t>& indices, uint64_t seed) {
  uint64_t h = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  for (int64_t i : indices) h = (h ^ static_cast<uint64_t>(i)) * 0x100000001B3ull;
  return h;
}

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

}  // namespace

// ---------------------------------------------------------------------------------------------

class TeacherClient::Impl {
 public:
  explicit Impl(TeacherClientOptions o) : o_(std::move(o)), start_(Clock::now()) {}
  ~Impl() { Stop(); }

  Status Start();
  void Stop();
  void Request(const std::vector<int64_t>& indices, uint64_t seed);
  Status Get(const std::vector<int64_t>& indices, uint64_t seed, int classes, float* logits,
             uint8_t* has);
  TeacherCounters counters() const {
    MutexLock l(&mu_);
    return counters_;
  }
  std::vector<std::string> Connected() const {
    MutexLock l(&mu_);
    std::vector<std::string> out;
    for (const auto& [name, t] : teachers_) {
      if (!t->dead) out.push_back(name);
    }
    return out;
  }

 private:
  struct Batch {
    std::vector<int64_t> indices;
    uint64_t seed = 0;
    uint64_t req_id = 0;  // of the request in flight; 0: not sent
    std::string teacher;  // who has it; empty: waiting for a teacher
    Clock::time_point sent;
    std::set<std::string> tried;  // teachers that failed it or were too slow
    bool done = false;
    bool counted_resend = false;
    std::vector<float> rows;  // [n, classes] once done
  };
  struct Teacher {
    std::string name, addr;
    std::unique_ptr<net::FramedSocket> sock;
    std::thread reader;
    double latency_ms = -1;  // moving average of answered requests; -1: none yet
    int inflight = 0;
    bool dead = false;
  };
  struct Send {
    std::shared_ptr<Teacher> teacher;
    nlohmann::json msg;
  };

  void DiscoveryLoop();  // the server's member lists
  void FeedLoop();       // the node client's (o_.feed)
  void UseMembers(const proto::ServiceMembers& m);
  void MaintenanceLoop();
  void ReaderLoop(std::shared_ptr<Teacher> t);
  StatusOr<std::unique_ptr<net::FramedSocket>> Connect(const std::string& addr);
  // Applies the desired member list: connects new teachers (without the lock), drops gone ones.
  void Reconcile();
  // Marks a teacher dead and returns its requests to the queue. REQUIRES: mu_ held.
  void DropTeacher(Teacher* t, const std::string& why) REQUIRES(mu_);
  // Assigns waiting batches to teachers; the sends to do after unlocking go to *out.
  void Dispatch(std::vector<Send>* out) REQUIRES(mu_);
  void DoSends(std::vector<Send>* sends);
  std::shared_ptr<Batch> FindOrAdd(const std::vector<int64_t>& indices, uint64_t seed)
      REQUIRES(mu_);
  std::shared_ptr<Batch> Find(const std::vector<int64_t>& indices, uint64_t seed) REQUIRES(mu_);
  void Erase(const std::shared_ptr<Batch>& b) REQUIRES(mu_);
  // The student gives up on b's request at its teacher (not answered yet): queues a
  // teacher_cancel, sent by the maintenance thread, so the teacher does not compute it for nobody.
  void Abandon(Batch* b) REQUIRES(mu_);
  void OnReply(Teacher* t, const proto::TeacherReply& r);

  const TeacherClientOptions o_;
  const Clock::time_point start_;
  std::thread discovery_, maintenance_;
  std::unique_ptr<net::FramedSocket> server_;  // the discovery thread's; Shutdown from Stop

  mutable Mutex mu_;
  std::condition_variable cv_;  // a batch is done, a teacher changed, or stop
  // Guarded by mu_.
  bool stop_ GUARDED_BY(mu_) = false;
  TeacherCounters counters_ GUARDED_BY(mu_);
  std::map<std::string, std::string> desired_ GUARDED_BY(mu_);  // name -> HOST:PORT
  std::vector<std::string> known_services_ GUARDED_BY(mu_);
  bool ever_listed_ GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<Teacher>> teachers_ GUARDED_BY(mu_);
  std::map<std::string, Clock::time_point> next_try_ GUARDED_BY(mu_);  // connect backoff
  std::vector<std::shared_ptr<Teacher>> graveyard_ GUARDED_BY(mu_);    // readers to join
  std::unordered_multimap<uint64_t, std::shared_ptr<Batch>> batches_ GUARDED_BY(mu_);
  std::deque<std::shared_ptr<Batch>> order_ GUARDED_BY(mu_);  // oldest first, for the cap
  std::unordered_map<uint64_t, std::shared_ptr<Batch>> by_req_ GUARDED_BY(mu_);
  std::vector<Send> cancels_ GUARDED_BY(mu_);  // teacher_cancel messages to send
  uint64_t next_req_ GUARDED_BY(mu_) = 1;
};

Status TeacherClient::Impl::Start() {
  if (o_.service.empty()) return Status::InvalidArgument("--distill: the service name is empty");
  if (o_.classes <= 0) return Status::InvalidArgument("TeacherClient: classes must be > 0");
  if (o_.server.empty() && o_.feed == nullptr && o_.teachers.empty()) {
    return Status::InvalidArgument(
        "--distill " + o_.service +
        " needs its teachers' server: run under `edl client` (it relays the teacher list), or give "
        "--distill_server HOST:PORT (the edl server the teachers register with) or "
        "--distill_teachers HOST:PORT,...");
  }
  for (const std::string& a : o_.teachers) {
    std::string host;
    int port = 0;
    EDL_RETURN_IF_ERROR(net::ParseHostPort(a, "--distill_teachers", &host, &port));
    MutexLock l(&mu_);
    desired_[a] = a;
    ever_listed_ = true;
  }
  if (!o_.server.empty()) {
    auto s = Connect(o_.server);
    if (!s.ok()) return s.status().WithContext("--distill_server");
    server_ = std::move(s.value());
    proto::Hello hello;
    hello.role = proto::Role::kStudent;
    hello.service = o_.service;
    proto::Welcome w;
    EDL_RETURN_IF_ERROR(
        net::AuthenticateToServer(server_.get(), o_.secret, hello, o_.io_timeout, &w)
            .WithContext("--distill_server " + o_.server));
    discovery_ = std::thread([this] { DiscoveryLoop(); });
  } else if (o_.feed != nullptr) {
    EDL_RETURN_IF_ERROR(o_.feed->Watch(o_.service).WithContext("--distill " + o_.service));
    discovery_ = std::thread([this] { FeedLoop(); });
  }
  maintenance_ = std::thread([this] { MaintenanceLoop(); });
  return Status::OK();
}

void TeacherClient::Impl::Stop() {
  std::vector<std::shared_ptr<Teacher>> all;
  {
    MutexLock l(&mu_);
    if (stop_ && !maintenance_.joinable() && !discovery_.joinable()) return;
    stop_ = true;
    for (auto& [name, t] : teachers_) {
      t->dead = true;
      all.push_back(t);
    }
    for (auto& t : graveyard_) all.push_back(t);
    teachers_.clear();
    graveyard_.clear();
  }
  cv_.notify_all();
  if (server_) server_->Shutdown();
  if (discovery_.joinable()) discovery_.join();
  if (maintenance_.joinable()) maintenance_.join();
  for (auto& t : all) {
    if (t->sock) t->sock->Shutdown();
    if (t->reader.joinable()) t->reader.join();
  }
}

StatusOr<std::unique_ptr<net::FramedSocket>> TeacherClient::Impl::Connect(const std::string& addr) {
  std::string host;
  int port = 0;
  EDL_RETURN_IF_ERROR(net::ParseHostPort(addr, "teacher address", &host, &port));
  return net::FramedSocket::ConnectTcp(host, port, o_.io_timeout);
}

// ---- discovery: the server's member lists

void TeacherClient::Impl::DiscoveryLoop() {
  while (true) {
    nlohmann::json j;
    Status s = server_->Receive(&j, milliseconds(500));
    {
      MutexLock l(&mu_);
      if (stop_) return;
    }
    if (s.IsTimeout()) continue;
    if (!s.ok()) {
      // The server went away: keep the teachers we have; they keep answering.
      LOG(WARNING) << "distill: lost the server " << o_.server << " (" << s.ToString()
                   << "); keeping the current teacher list";
      MutexLock l(&mu_);
      cv_.wait_for(l.native(), std::chrono::hours(24 * 365),
                   [this]() REQUIRES(mu_) { return stop_; });
      return;
    }
    const std::string type = proto::TypeOf(j);
    if (type == proto::msg::kError) {
      proto::ErrorMsg e;
      LOG(ERROR) << "distill: the server " << o_.server << " sent an error: "
                 << (e.DecodeFrom(j).ok() ? e.ToStatus().ToString() : "(undecodable)");
      continue;
    }
    if (type != proto::msg::kServiceMembers) continue;  // heartbeats and future messages
    proto::ServiceMembers m;
    if (Status d = m.DecodeFrom(j); !d.ok() || m.service != o_.service) {
      LOG(ERROR) << "distill: bad member list from " << o_.server << ": "
                 << (d.ok() ? "for service '" + m.service + "'" : d.ToString());
      continue;
    }
    UseMembers(m);
  }
}

void TeacherClient::Impl::FeedLoop() {
  uint64_t version = 0;
  while (true) {
    proto::ServiceMembers m;
    Status s = o_.feed->Next(o_.service, &version, milliseconds(500), &m);
    {
      MutexLock l(&mu_);
      if (stop_) return;
    }
    if (s.IsTimeout()) continue;
    if (!s.ok()) {
      // The client went away (the trainer stops too): keep the teachers we have meanwhile.
      LOG(WARNING) << "distill: lost the node client's teacher list (" << s.ToString()
                   << "); keeping the current teacher list";
      MutexLock l(&mu_);
      cv_.wait_for(l.native(), std::chrono::hours(24 * 365),
                   [this]() REQUIRES(mu_) { return stop_; });
      return;
    }
    UseMembers(m);
  }
}

void TeacherClient::Impl::UseMembers(const proto::ServiceMembers& m) {
  MutexLock l(&mu_);
  desired_.clear();
  for (const proto::ServiceMember& t : m.members) {
    desired_[t.name] = t.host + ":" + std::to_string(t.port);
  }
  known_services_ = m.known;
  if (!m.members.empty()) ever_listed_ = true;
  LOG(INFO) << "distill: service " << o_.service << " has " << m.members.size() << " teachers";
  cv_.notify_all();
}

// ---- maintenance: connections, re-sends, dispatch

void TeacherClient::Impl::Reconcile() {
  std::vector<std::pair<std::string, std::string>> to_connect;
  std::vector<std::shared_ptr<Teacher>> to_join;
  {
    MutexLock l(&mu_);
    for (auto it = teachers_.begin(); it != teachers_.end();) {
      auto d = desired_.find(it->first);
      if (it->second->dead || d == desired_.end() || d->second != it->second->addr) {
        if (!it->second->dead) DropTeacher(it->second.get(), "removed from the service");
        graveyard_.push_back(it->second);
        it = teachers_.erase(it);
      } else {
        ++it;
      }
    }
    const auto now = Clock::now();
    for (const auto& [name, addr] : desired_) {
      auto retry = next_try_.find(name);
      if (teachers_.count(name) == 0 && (retry == next_try_.end() || now >= retry->second)) {
        to_connect.emplace_back(name, addr);
        next_try_[name] = now + milliseconds(500);  // a dead address is retried twice a second
      }
    }
    to_join.swap(graveyard_);
  }
  for (auto& t : to_join) {
    if (t->sock) t->sock->Shutdown();
    if (t->reader.joinable()) t->reader.join();
  }
  for (const auto& [name, addr] : to_connect) {
    auto sock = Connect(addr);
    Status s = sock.status();
    if (s.ok()) {
      proto::Hello hello;
      hello.role = proto::Role::kStudent;
      hello.service = o_.service;
      proto::Welcome w;
      s = net::AuthenticateToServer(sock.value().get(), o_.secret, hello, o_.io_timeout, &w);
    }
    if (!s.ok()) {
      LOG_EVERY_N(WARNING, 20) << "distill: teacher " << name << " at " << addr
                               << " not usable: " << s.ToString();
      continue;
    }
    auto t = std::make_shared<Teacher>();
    t->name = name;
    t->addr = addr;
    t->sock = std::move(sock.value());
    LOG(INFO) << "distill: connected to teacher " << name << " at " << addr;
    MutexLock l(&mu_);
    if (stop_) return;  // the socket closes with t
    t->reader = std::thread([this, t] { ReaderLoop(t); });
    teachers_[name] = t;
    cv_.notify_all();
  }
}

void TeacherClient::Impl::DropTeacher(Teacher* t, const std::string& why) {
  if (t->dead) return;
  t->dead = true;
  LOG(WARNING) << "distill: dropping teacher " << t->name << " (" << t->addr << "): " << why;
  for (auto& [key, b] : batches_) {
    if (b->teacher == t->name && !b->done) {
      by_req_.erase(b->req_id);
      b->tried.insert(t->name);
      b->teacher.clear();
      b->req_id = 0;
      if (!b->counted_resend) {
        counters_.resent++;
        b->counted_resend = true;
      }
    }
  }
  if (t->sock) t->sock->Shutdown();
  cv_.notify_all();
}

void TeacherClient::Impl::Dispatch(std::vector<Send>* out) {
  for (const auto& b : order_) {
    if (b->done || !b->teacher.empty()) continue;
    // The live teacher with room and the lowest expected wait: measured latency times the queue
    // it would join. One that already failed this batch only when no other is left.
    Teacher* best = nullptr;
    double best_score = std::numeric_limits<double>::infinity();
    for (int pass = 0; pass < 2 && best == nullptr; ++pass) {
      for (const auto& [name, t] : teachers_) {
        if (t->dead || t->inflight >= o_.max_inflight_per_teacher) continue;
        if (pass == 0 && b->tried.count(name)) continue;
        const double lat = t->latency_ms < 0 ? 0.0 : t->latency_ms;
        const double score = (lat + 1.0) * (t->inflight + 1);
        if (score < best_score) {
          best_score = score;
          best = t.get();
        }
      }
    }
    if (best == nullptr) continue;
    b->teacher = best->name;
    b->req_id = next_req_++;
    b->sent = Clock::now();
    best->inflight++;
    by_req_[b->req_id] = b;
    counters_.requests++;
    proto::TeacherRequest r;
    r.req_id = b->req_id;
    r.indices = b->indices;
    r.aug_seed = b->seed;
    r.random_crop = o_.random_crop;
    r.pad = o_.pad;
    r.flip = o_.flip;
    r.top_k = o_.top_k;
    Send s;
    s.teacher = teachers_[best->name];
    r.EncodeTo(&s.msg);
    out->push_back(std::move(s));
  }
}

void TeacherClient::Impl::DoSends(std::vector<Send>* sends) {
  for (Send& s : *sends) {
    Status st = s.teacher->sock->Send(s.msg, o_.io_timeout);
    if (!st.ok()) {
      MutexLock l(&mu_);
      DropTeacher(s.teacher.get(), "send failed: " + st.ToString());
    }
  }
  sends->clear();
}

void TeacherClient::Impl::MaintenanceLoop() {
  std::vector<Send> sends;
  while (true) {
    Reconcile();
    {
      MutexLock l(&mu_);
      if (stop_) return;
      const auto now = Clock::now();
      for (auto& b : order_) {
        if (b->done || b->teacher.empty() || now - b->sent < o_.resend_after) continue;
        // Only to a live teacher that has not had it: asking the same slow teacher twice would
        // only add to its queue.
        bool other = false;
        for (const auto& [name, t] : teachers_) {
          other = other || (!t->dead && name != b->teacher && b->tried.count(name) == 0);
        }
        if (!other) continue;
        // The slow teacher keeps the request in its count until it answers (the cancel's
        // Aborted reply, or the logits when its pass had started) or is dropped.
        Abandon(b.get());
        by_req_.erase(b->req_id);
        b->tried.insert(b->teacher);
        b->teacher.clear();
        b->req_id = 0;
        counters_.resent++;
      }
      Dispatch(&sends);
      for (Send& c : cancels_) sends.push_back(std::move(c));
      cancels_.clear();
    }
    DoSends(&sends);
    MutexLock l(&mu_);
    cv_.wait_for(l.native(), milliseconds(20), [this]() REQUIRES(mu_) { return stop_; });
    if (stop_) return;
  }
}

// ---- replies

void TeacherClient::Impl::ReaderLoop(std::shared_ptr<Teacher> t) {
  while (true) {
    nlohmann::json j;
    Status s = t->sock->Receive(&j, milliseconds(500));
    if (s.IsTimeout()) {
      MutexLock l(&mu_);
      if (t->dead || stop_) return;
      continue;
    }
    if (!s.ok()) {
      MutexLock l(&mu_);
      DropTeacher(t.get(), "connection lost: " + s.ToString());
      return;
    }
    if (proto::TypeOf(j) == proto::msg::kError) {
      proto::ErrorMsg e;
      MutexLock l(&mu_);
      DropTeacher(t.get(), "it sent an error: " +
                               (e.DecodeFrom(j).ok() ? e.ToStatus().ToString() : "(undecodable)"));
      return;
    }
    proto::TeacherReply r;
    if (proto::TypeOf(j) != proto::msg::kTeacherReply || !(s = r.DecodeFrom(j)).ok()) {
      MutexLock l(&mu_);
      DropTeacher(t.get(),
                  s.ok() ? "unexpected message " + proto::Quote(proto::TypeOf(j)) : s.ToString());
      return;
    }
    OnReply(t.get(), r);
  }
}

void TeacherClient::Impl::OnReply(Teacher* t, const proto::TeacherReply& r) {
  MutexLock l(&mu_);
  t->inflight = std::max(0, t->inflight - 1);
  auto it = by_req_.find(r.req_id);
  if (it == by_req_.end()) return;  // re-sent meanwhile, or the step went on without it
  std::shared_ptr<Batch> b = it->second;
  if (b->teacher != t->name) return;
  by_req_.erase(it);
  const size_t n = b->indices.size();
  const int k = o_.top_k > 0 ? std::min(o_.top_k, o_.classes) : o_.classes;
  std::string bad;
  if (!r.status.ok()) {
    LOG(WARNING) << "distill: teacher " << t->name
                 << " failed a request: " << proto::Escape(r.status.ToString(), 1024);
    b->tried.insert(t->name);
    b->teacher.clear();
    b->req_id = 0;
    return;
  } else if (r.classes != o_.classes) {
    bad = "its model has " + std::to_string(r.classes) + " classes, the student's data " +
          std::to_string(o_.classes);
  } else if (static_cast<size_t>(r.rows) != n || r.k != k) {
    bad = "answered " + std::to_string(r.rows) + " rows of " + std::to_string(r.k) +
          " values for a request of " + std::to_string(n) + " samples and " + std::to_string(k) +
          " values each";
  } else if (o_.top_k > 0 && k < o_.classes && r.classes_of.size() != r.values.size()) {
    bad = "answered a top-k request without the classes of its values";
  }
  if (!bad.empty()) {
    LOG(ERROR) << "distill: teacher " << t->name << " (" << t->addr << ") answered with the wrong "
               << "shape: " << bad << "; check that it serves the same model family and dataset";
    DropTeacher(t, "wrong answer shape");
    return;
  }
  const double ms = Ms(Clock::now() - b->sent);
  t->latency_ms = t->latency_ms < 0 ? ms : 0.8 * t->latency_ms + 0.2 * ms;
  b->rows.assign(n * o_.classes, -std::numeric_limits<float>::infinity());
  for (size_t i = 0; i < n; ++i) {
    for (int c = 0; c < k; ++c) {
      const size_t v = i * k + c;
      const int cls = r.classes_of.empty() ? c : r.classes_of[v];
      b->rows[i * o_.classes + cls] = r.values[v];
    }
  }
  b->done = true;
  b->teacher.clear();
  cv_.notify_all();
}

// ---- the training thread's side

std::shared_ptr<TeacherClient::Impl::Batch> TeacherClient::Impl::Find(
    const std::vector<int64_t>& indices, uint64_t seed) {
  auto range = batches_.equal_range(BatchKey(indices, seed));
  for (auto it = range.first; it != range.second; ++it) {
    if (it->second->seed == seed && it->second->indices == indices) return it->second;
  }
  return nullptr;
}

std::shared_ptr<TeacherClient::Impl::Batch> TeacherClient::Impl::FindOrAdd(
    const std::vector<int64_t>& indices, uint64_t seed) {
  if (auto b = Find(indices, seed)) return b;
  auto b = std::make_shared<Batch>();
  b->indices = indices;
  b->seed = seed;
  batches_.emplace(BatchKey(indices, seed), b);
  order_.push_back(b);
  while (order_.size() > o_.max_batches) Erase(order_.front());  // asked too far ahead
  return b;
}

void TeacherClient::Impl::Erase(const std::shared_ptr<Batch>& b) {
  auto range = batches_.equal_range(BatchKey(b->indices, b->seed));
  for (auto it = range.first; it != range.second; ++it) {
    if (it->second == b) {
      batches_.erase(it);
      break;
    }
  }
  order_.erase(std::remove(order_.begin(), order_.end(), b), order_.end());
  Abandon(b.get());
  if (b->req_id != 0) by_req_.erase(b->req_id);  // a late answer is then ignored
}

void TeacherClient::Impl::Abandon(Batch* b) {
  if (b->done || b->req_id == 0 || b->teacher.empty()) return;
  auto t = teachers_.find(b->teacher);
  if (t == teachers_.end() || t->second->dead || cancels_.size() >= 4 * o_.max_batches) return;
  proto::TeacherCancel c;
  c.req_id = b->req_id;
  Send s;
  s.teacher = t->second;
  c.EncodeTo(&s.msg);
  cancels_.push_back(std::move(s));
  counters_.cancelled++;
}

void TeacherClient::Impl::Request(const std::vector<int64_t>& indices, uint64_t seed) {
  if (indices.empty() || indices.size() > proto::kMaxTeacherBatch) return;
  std::vector<Send> sends;
  {
    MutexLock l(&mu_);
    FindOrAdd(indices, seed);
    Dispatch(&sends);
  }
  DoSends(&sends);
}

Status TeacherClient::Impl::Get(const std::vector<int64_t>& indices, uint64_t seed, int classes,
                                float* logits, uint8_t* has) {
  const size_t n = indices.size();
  if (classes != o_.classes) {
    return Status::InvalidArgument("TeacherClient: asked for " + std::to_string(classes) +
                                   " classes, built for " + std::to_string(o_.classes));
  }
  if (n > proto::kMaxTeacherBatch) {
    return Status::InvalidArgument("--batch_size " + std::to_string(n) + " exceeds the " +
                                   std::to_string(proto::kMaxTeacherBatch) +
                                   " samples a teacher request may carry");
  }
  Request(indices, seed);
  MutexLock l(&mu_);
  const auto deadline = Clock::now() + o_.answer_wait;
  std::shared_ptr<Batch> b = Find(indices, seed);
  cv_.wait_until(l.native(), deadline,
                 [&]() REQUIRES(mu_) { return stop_ || b == nullptr || b->done; });
  if (!ever_listed_ && Clock::now() - start_ > o_.discovery_wait) {
    std::string known;
    for (const std::string& s : known_services_) known += (known.empty() ? "" : ", ") + s;
    return Status::NotFound("--distill " + o_.service +
                            ": no teacher of that service registered at " +
                            (o_.server.empty() ? std::string("the job's server") : o_.server) +
                            " within " + std::to_string(o_.discovery_wait.count() / 1000) +
                            " s (services there now: " + (known.empty() ? "none" : known) +
                            "); start `edl teacher --service " + o_.service + "` or fix the name");
  }
  if (b != nullptr && b->done) {
    std::copy(b->rows.begin(), b->rows.end(), logits);
    std::fill(has, has + n, uint8_t{1});
    counters_.answered += static_cast<int64_t>(n);
  } else {
    std::fill(has, has + n, uint8_t{0});
    counters_.fallback += static_cast<int64_t>(n);
  }
  if (b != nullptr) Erase(b);
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------

TeacherClient::TeacherClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TeacherClient::~TeacherClient() = default;

StatusOr<std::unique_ptr<TeacherClient>> TeacherClient::Create(
    const TeacherClientOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  EDL_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<TeacherClient>(new TeacherClient(std::move(impl)));
}

void TeacherClient::Request(const std::vector<int64_t>& indices, uint64_t aug_seed) {
  impl_->Request(indices, aug_seed);
}
Status TeacherClient::Get(const std::vector<int64_t>& indices, uint64_t aug_seed, int classes,
                          float* logits, uint8_t* has) {
  return impl_->Get(indices, aug_seed, classes, logits, has);
}
TeacherCounters TeacherClient::counters() const { return impl_->counters(); }
std::vector<std::string> TeacherClient::Connected() const { return impl_->Connected(); }

}  // namespace edl::runtime
