#include "teacher/teacher_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <list>
#include <numeric>
#include <thread>

#include <glog/logging.h>

#include "edl/base/thread_annotations.h"
#include "edl/net/admission.h"
#include "edl/net/framed_socket.h"
#include "edl/proto/frame.h"

namespace edl::teacher {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using std::chrono::milliseconds;

class TeacherServer::Impl {
 public:
  Impl(TeacherServerOptions o, int classes, InferFn infer, CheckFn check)
      : o_(std::move(o)), classes_(classes), infer_(std::move(infer)), check_(std::move(check)) {}
  ~Impl() { Stop(); }

  Status Start();
  Status Register(const std::string& server, const std::string& advertise_host);
  void Stop();
  int port() const { return port_; }
  TeacherStats TakeStats() {
    MutexLock l(&mu_);
    TeacherStats s = period_;
    period_ = TeacherStats{};
    return s;
  }
  TeacherStats Totals() const {
    MutexLock l(&mu_);
    return totals_;
  }
  size_t queued() const {
    MutexLock l(&mu_);
    return jobs_.size();
  }

 private:
  struct Student {
    std::unique_ptr<net::FramedSocket> sock;
    std::thread thread;
    uint64_t id = 0;             // its admission_ id (non-zero, unique)
    int queued = 0;              // requests of this student waiting or running; guarded by mu_
    bool authenticated = false;  // holds one of --max_students; guarded by mu_
    bool done = false;           // its thread has returned; guarded by mu_
  };
  struct Job {
    std::shared_ptr<Student> student;
    proto::TeacherRequest request;
    Clock::time_point received;
  };

  void AcceptLoop();
  // Admits `s` among the connections that have not authenticated: the oldest of them (from the
  // same source when that source is at its bound) is shut down to make room.
  void AdmitUnauthenticated(const std::shared_ptr<Student>& s, const std::string& source);
  // After `s` proved the secret: it takes one of --max_students, or the refusal says why.
  Status TakeStudentSlot(Student* s);
  void StudentLoop(std::shared_ptr<Student> s);
  void InferLoop();
  void ServerLoop(std::string server, proto::Hello hello, std::unique_ptr<net::FramedSocket> sock);
  StatusOr<std::unique_ptr<net::FramedSocket>> ConnectServer(const std::string& server,
                                                             const proto::Hello& hello,
                                                             int* heartbeat_ms);
  void Reply(Student* s, const proto::TeacherReply& r);
  // Drops the queued (not yet running) requests of `s`: the one numbered *req_id, or all when
  // req_id is null. True when one was dropped.
  bool DropQueued(Student* s, const uint64_t* req_id);
  // The reply to `r` from its rows [n, classes] of logits.
  proto::TeacherReply Answer(const proto::TeacherRequest& r, const float* rows) const;
  bool stopping() const {
    MutexLock l(&mu_);
    return stop_;
  }

  const TeacherServerOptions o_;
  const int classes_;
  const InferFn infer_;
  const CheckFn check_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread accept_, infer_thread_, server_thread_;

  mutable Mutex mu_;
  std::condition_variable cv_;  // jobs queued, or stop
  bool stop_ GUARDED_BY(mu_) = false;
  // Every connection with a live thread: unauthenticated ones (bounded by admission_) and students
  // (bounded by --max_students).
  std::list<std::shared_ptr<Student>> students_ GUARDED_BY(mu_);
  net::AdmissionControl admission_ GUARDED_BY(mu_){o_.unauthenticated.max_total > 0
                                                       ? o_.unauthenticated
                                                       : net::AdmissionControl::FromFileLimit()};
  uint64_t next_id_ GUARDED_BY(mu_) = 0;
  std::deque<Job> jobs_ GUARDED_BY(mu_);
  TeacherStats period_ GUARDED_BY(mu_), totals_ GUARDED_BY(mu_);
  net::FramedSocket* server_conn_ GUARDED_BY(mu_) = nullptr;  // for Stop's Shutdown
};

// ---- listening

Status TeacherServer::Impl::Start() {
  if (classes_ <= 0) return Status::InvalidArgument("teacher: the model has no classes");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string what = o_.bind_host + ":" + std::to_string(o_.port);
  if (int rc = ::getaddrinfo(o_.bind_host.c_str(), std::to_string(o_.port).c_str(), &hints, &res);
      rc != 0) {
    return Status::InvalidArgument("--bind " + what + ": " + gai_strerror(rc));
  }
  Status last = Status::IOError("no address for " + what);
  for (addrinfo* a = res; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last = PosixError("socket for " + what, errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 64) != 0) {
      last = PosixError("listen on " + what, errno)
                 .WithContext("is the port taken? pick another --port");
      ::close(fd);
      continue;
    }
    listen_fd_ = fd;
  }
  ::freeaddrinfo(res);
  if (listen_fd_ < 0) return last;
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  accept_ = std::thread([this] { AcceptLoop(); });
  infer_thread_ = std::thread([this] { InferLoop(); });
  return Status::OK();
}

void TeacherServer::Impl::Stop() {
  std::list<std::shared_ptr<Student>> students;
  {
    MutexLock l(&mu_);
    stop_ = true;
    for (auto& s : students_) s->sock->Shutdown();
    if (server_conn_ != nullptr) server_conn_->Shutdown();
  }
  cv_.notify_all();
  if (accept_.joinable()) accept_.join();
  if (infer_thread_.joinable()) infer_thread_.join();
  if (server_thread_.joinable()) server_thread_.join();
  {
    MutexLock l(&mu_);
    students.swap(students_);
    jobs_.clear();
  }
  for (auto& s : students) {
    if (s->thread.joinable()) s->thread.join();
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

void TeacherServer::Impl::AcceptLoop() {
  while (!stopping()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(milliseconds(100));
      continue;
    }
    char host[NI_MAXHOST] = "?", serv[NI_MAXSERV] = "?";
    ::getnameinfo(reinterpret_cast<sockaddr*>(&peer), len, host, sizeof(host), serv, sizeof(serv),
                  NI_NUMERICHOST | NI_NUMERICSERV);
    auto s = std::make_shared<Student>();
    s->sock = std::make_unique<net::FramedSocket>(fd, std::string(host) + ":" + serv);
    // Reap the threads of students that have gone (joined without the lock).
    std::vector<std::shared_ptr<Student>> finished;
    {
      MutexLock l(&mu_);
      for (auto it = students_.begin(); it != students_.end();) {
        if ((*it)->done) {
          finished.push_back(*it);
          it = students_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& f : finished) f->thread.join();
    // Not counted against --max_students until it proves the secret: connections that never do
    // cannot lock students out, they only push out each other (the oldest first).
    AdmitUnauthenticated(s, host);
    MutexLock l(&mu_);
    students_.push_back(s);
    s->thread = std::thread([this, s] { StudentLoop(s); });
  }
}

void TeacherServer::Impl::AdmitUnauthenticated(const std::shared_ptr<Student>& s,
                                               const std::string& source) {
  MutexLock l(&mu_);
  s->id = ++next_id_;
  const uint64_t evict = admission_.Admit(s->id, source);
  if (evict == 0) return;
  for (const auto& other : students_) {
    if (other->id != evict) continue;
    LOG_EVERY_N(WARNING, 50) << "teacher: closing " << other->sock->peer()
                             << ": it has not authenticated and " << admission_.limits().max_total
                             << " unauthenticated connections in all, or "
                             << admission_.limits().max_per_source
                             << " from one address, are the most a teacher holds";
    other->sock->Shutdown();  // its handshake fails at once; its thread ends
  }
}

Status TeacherServer::Impl::TakeStudentSlot(Student* s) {
  MutexLock l(&mu_);
  admission_.Remove(s->id);
  int students = 0;
  for (const auto& other : students_) students += other->authenticated && !other->done ? 1 : 0;
  if (students >= o_.max_students) {
    LOG_EVERY_N(WARNING, 50) << "teacher: refusing student " << s->sock->peer() << ": "
                             << o_.max_students << " students connected (--max_students)";
    return Status::Unavailable("teacher " + o_.name + " serves " + std::to_string(o_.max_students) +
                               " students at most (--max_students), and has that many");
  }
  s->authenticated = true;
  return Status::OK();
}

// ---- one student

void TeacherServer::Impl::StudentLoop(std::shared_ptr<Student> s) {
  proto::Welcome w;
  w.job_id = o_.service;
  proto::Hello hello;
  Status st = net::AuthenticatePeer(
      s->sock.get(), o_.secret, w, o_.handshake_timeout, &hello, [this, &s](const proto::Hello& h) {
        if (h.role != proto::Role::kStudent) {
          return Status::InvalidArgument("a teacher serves only role 'student', not '" +
                                         std::string(proto::NameOf(h.role)) + "'");
        }
        if (h.service != o_.service) {
          return Status::NotFound("teacher " + o_.name + " serves service '" + o_.service +
                                  "', not '" + h.service + "'");
        }
        return TakeStudentSlot(s.get());
      });
  if (!st.ok()) {
    LOG_EVERY_N(WARNING, 20) << "teacher: handshake with " << s->sock->peer()
                             << " failed: " << st.ToString();
  }
  while (st.ok() && !stopping()) {
    json j;
    st = s->sock->Receive(&j, milliseconds(500));
    if (st.IsTimeout()) {
      st = Status::OK();
      continue;
    }
    if (!st.ok()) break;
    const std::string type = proto::TypeOf(j);
    if (type == proto::msg::kHeartbeat) continue;
    if (type == proto::msg::kTeacherCancel) {
      proto::TeacherCancel c;
      if (st = c.DecodeFrom(j); !st.ok()) break;
      if (DropQueued(s.get(), &c.req_id)) {
        proto::TeacherReply reply;
        reply.req_id = c.req_id;
        reply.status = Status::Aborted("cancelled by the student before its forward pass");
        reply.classes = classes_;
        Reply(s.get(), reply);
      }
      continue;
    }
    proto::TeacherRequest r;
    if (type != proto::msg::kTeacherRequest) {
      st = Status::InvalidArgument("a teacher accepts only 'teacher_request', got " +
                                   proto::Quote(proto::TypeOf(j)));
    } else {
      st = r.DecodeFrom(j);
    }
    if (!st.ok()) {
      LOG(WARNING) << "teacher: closing " << s->sock->peer() << ": " << st.ToString();
      json e;
      proto::ErrorMsg::From(st).EncodeTo(&e);
      (void)s->sock->Send(e, o_.io_timeout);
      break;
    }
    const size_t k = r.top_k > 0 ? std::min(r.top_k, classes_) : classes_;
    Status bad;
    if (r.indices.size() * k > proto::kMaxTeacherValues) {
      bad = Status::InvalidArgument(
          "an answer of " + std::to_string(r.indices.size()) + " samples x " + std::to_string(k) +
          " logits exceeds " + std::to_string(proto::kMaxTeacherValues) +
          " values; ask fewer samples per request or set --distill_top_k");
    } else if (check_) {
      bad = check_(r);
    }
    MutexLock l(&mu_);
    if (bad.ok() && s->queued >= o_.max_queued_per_student) {
      bad = Status::Unavailable("more than " + std::to_string(o_.max_queued_per_student) +
                                " requests queued from this student");
    }
    if (!bad.ok()) {
      l.Unlock();
      proto::TeacherReply reply;
      reply.req_id = r.req_id;
      reply.status = bad;
      reply.classes = classes_;
      Reply(s.get(), reply);
      continue;
    }
    s->queued++;
    jobs_.push_back({s, std::move(r), Clock::now()});
    cv_.notify_all();
  }
  s->sock->Shutdown();
  DropQueued(s.get(), nullptr);  // nobody reads their answers any more
  MutexLock l(&mu_);
  admission_.Remove(s->id);  // a handshake that failed: no longer pending
  s->done = true;
}

bool TeacherServer::Impl::DropQueued(Student* s, const uint64_t* req_id) {
  MutexLock l(&mu_);
  size_t dropped = 0;
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (it->student.get() == s && (req_id == nullptr || it->request.req_id == *req_id)) {
      it = jobs_.erase(it);
      s->queued--;
      ++dropped;
    } else {
      ++it;
    }
  }
  int64_t& counter = req_id == nullptr ? totals_.orphaned : totals_.cancelled;
  counter += static_cast<int64_t>(dropped);
  (req_id == nullptr ? period_.orphaned : period_.cancelled) += static_cast<int64_t>(dropped);
  if (dropped > 0 && req_id == nullptr) {
    LOG(INFO) << "teacher: dropped " << dropped << " queued requests of " << s->sock->peer()
              << " (connection closed)";
  }
  return dropped > 0;
}

void TeacherServer::Impl::Reply(Student* s, const proto::TeacherReply& r) {
  json j;
  r.EncodeTo(&j);
  Status st = s->sock->Send(j, o_.io_timeout);
  if (!st.ok()) {
    LOG(WARNING) << "teacher: reply to " << s->sock->peer() << " failed: " << st.ToString();
    s->sock->Shutdown();
  }
}

// ---- inference with adaptive batching

proto::TeacherReply TeacherServer::Impl::Answer(const proto::TeacherRequest& r,
                                                const float* rows) const {
  proto::TeacherReply a;
  a.req_id = r.req_id;
  a.classes = classes_;
  a.rows = static_cast<int>(r.indices.size());
  const bool topk = r.top_k > 0 && r.top_k < classes_;
  a.k = topk ? r.top_k : classes_;
  a.values.reserve(static_cast<size_t>(a.rows) * a.k);
  std::vector<int32_t> order(classes_);
  for (int i = 0; i < a.rows; ++i) {
    const float* row = rows + static_cast<size_t>(i) * classes_;
    if (!topk) {
      a.values.insert(a.values.end(), row, row + classes_);
      continue;
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + a.k, order.end(),
                      [row](int32_t x, int32_t y) { return row[x] > row[y]; });
    for (int c = 0; c < a.k; ++c) {
      a.values.push_back(row[order[c]]);
      a.classes_of.push_back(order[c]);
    }
  }
  return a;
}

void TeacherServer::Impl::InferLoop() {
  std::vector<Job> pass;
  std::vector<const proto::TeacherRequest*> reqs;
  std::vector<float> logits;
  while (true) {
    pass.clear();
    {
      MutexLock l(&mu_);
      cv_.wait(l.native(), [this]() REQUIRES(mu_) { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      // Everything that queued while the previous pass ran, up to max_batch samples (always at
      // least one request).
      size_t samples = 0;
      while (!jobs_.empty() && (pass.empty() || samples + jobs_.front().request.indices.size() <=
                                                    static_cast<size_t>(o_.max_batch))) {
        samples += jobs_.front().request.indices.size();
        pass.push_back(std::move(jobs_.front()));
        jobs_.pop_front();
      }
    }
    reqs.clear();
    for (const Job& j : pass) reqs.push_back(&j.request);
    Status st = infer_(reqs, &logits);
    size_t total = 0;
    for (const Job& j : pass) total += j.request.indices.size();
    if (st.ok() && logits.size() != total * classes_) {
      st = Status::Internal("the model returned " + std::to_string(logits.size()) + " logits for " +
                            std::to_string(total) + " samples");
    }
    size_t at = 0;
    for (const Job& j : pass) {
      proto::TeacherReply a;
      if (st.ok()) {
        a = Answer(j.request, logits.data() + at * classes_);
      } else {
        a.req_id = j.request.req_id;
        a.status = st;
        a.classes = classes_;
      }
      at += j.request.indices.size();
      Reply(j.student.get(), a);
      const double ms =
          std::chrono::duration<double, std::milli>(Clock::now() - j.received).count();
      const auto n = static_cast<int64_t>(j.request.indices.size());
      MutexLock l(&mu_);
      j.student->queued--;
      period_.requests++;
      period_.samples += n;
      period_.latency_ms_sum += ms;
      totals_.requests++;
      totals_.samples += n;
      totals_.latency_ms_sum += ms;
    }
    MutexLock l(&mu_);
    period_.passes++;
    totals_.passes++;
  }
}

// ---- registration with the edl server

StatusOr<std::unique_ptr<net::FramedSocket>> TeacherServer::Impl::ConnectServer(
    const std::string& server, const proto::Hello& hello, int* heartbeat_ms) {
  std::string host;
  int port = 0;
  EDL_RETURN_IF_ERROR(net::ParseHostPort(server, "--server", &host, &port));
  auto sock = net::FramedSocket::ConnectTcp(host, port, o_.handshake_timeout);
  if (!sock.ok()) return sock.status();
  proto::Welcome w;
  EDL_RETURN_IF_ERROR(
      net::AuthenticateToServer(sock.value().get(), o_.secret, hello, o_.handshake_timeout, &w)
          .WithContext("registering with the server " + server));
  *heartbeat_ms = w.heartbeat_ms;
  return sock;
}

Status TeacherServer::Impl::Register(const std::string& server, const std::string& advertise_host) {
  proto::Hello hello;
  hello.role = proto::Role::kTeacher;
  hello.node = o_.name;
  hello.host = advertise_host;
  hello.port = port_;
  hello.service = o_.service;
  int hb = 1000;
  auto sock = ConnectServer(server, hello, &hb);
  if (!sock.ok()) return sock.status();
  LOG(INFO) << "teacher " << o_.name << ": registered with " << server << " as " << advertise_host
            << ":" << port_ << " in service " << o_.service;
  server_thread_ = std::thread([this, server, hello, s = std::move(sock.value())]() mutable {
    ServerLoop(server, hello, std::move(s));
  });
  return Status::OK();
}

void TeacherServer::Impl::ServerLoop(std::string server, proto::Hello hello,
                                     std::unique_ptr<net::FramedSocket> sock) {
  int hb = 1000;
  milliseconds backoff(200);
  auto last_report = Clock::now();
  while (!stopping()) {
    if (!sock) {
      auto s = ConnectServer(server, hello, &hb);
      if (!s.ok()) {
        LOG_EVERY_N(WARNING, 10) << "teacher " << o_.name << ": " << s.status().ToString()
                                 << "; retrying";
        std::this_thread::sleep_for(backoff);
        backoff = std::min(backoff * 2, milliseconds(5000));
        continue;
      }
      sock = std::move(s.value());
      backoff = milliseconds(200);
      LOG(INFO) << "teacher " << o_.name << ": registered again with " << server;
    }
    {
      MutexLock l(&mu_);
      if (stop_) break;
      server_conn_ = sock.get();
    }
    // Heartbeat with the load since the last one; wait for the server's word meanwhile.
    json j;
    Status st = sock->Receive(&j, milliseconds(hb));
    if (st.ok() && proto::TypeOf(j) == proto::msg::kError) {
      proto::ErrorMsg e;
      st = e.DecodeFrom(j).ok() ? e.ToStatus() : Status::Corruption("undecodable error");
    }
    if (st.ok() || st.IsTimeout()) {
      const auto now = Clock::now();
      const TeacherStats t = TakeStats();
      proto::ServiceStats s;
      s.requests = t.requests;
      s.samples = t.samples;
      s.period_s = std::chrono::duration<double>(now - last_report).count();
      s.latency_ms = t.requests > 0 ? t.latency_ms_sum / t.requests : 0;
      last_report = now;
      json out;
      s.EncodeTo(&out);
      st = sock->Send(out, o_.io_timeout);
    }
    if (!st.ok() && !stopping()) {
      LOG(WARNING) << "teacher " << o_.name << ": lost the server " << server << ": "
                   << st.ToString() << "; reconnecting";
      MutexLock l(&mu_);
      server_conn_ = nullptr;
      l.Unlock();
      sock.reset();
    }
  }
  MutexLock l(&mu_);
  server_conn_ = nullptr;
}

// ---------------------------------------------------------------------------------------------

TeacherServer::TeacherServer(TeacherServerOptions options, int classes, InferFn infer,
                             CheckFn check)
    : impl_(std::make_unique<Impl>(std::move(options), classes, std::move(infer),
                                   std::move(check))) {}
TeacherServer::~TeacherServer() = default;
Status TeacherServer::Start() { return impl_->Start(); }
Status TeacherServer::Register(const std::string& server, const std::string& advertise_host) {
  return impl_->Register(server, advertise_host);
}
void TeacherServer::Stop() { impl_->Stop(); }
int TeacherServer::port() const { return impl_->port(); }
TeacherStats TeacherServer::TakeStats() { return impl_->TakeStats(); }
TeacherStats TeacherServer::Totals() const { return impl_->Totals(); }
size_t TeacherServer::queued() const { return impl_->queued(); }

}  // namespace edl::teacher
