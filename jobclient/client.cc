#include "jobclient/client.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <csignal>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <glog/logging.h>

#include "edl/base/enum_names.h"
#include "edl/net/admission.h"
#include "edl/net/auth.h"
#include "edl/net/trainer_channel.h"
#include "edl/proto/frame.h"
#include "edl/proto/frames.h"

namespace edl::jobclient {

namespace asio = boost::asio;
using nlohmann::json;
using std::chrono::milliseconds;

Client::Client(asio::io_context* io, ClientOptions options,
               std::unique_ptr<launcher::ProcessLauncher> launcher, Clock* clock)
    : io_(io),
      options_(std::move(options)),
      launcher_(std::move(launcher)),
      clock_(clock),
      trainer_acceptor_(*io),
      sigchld_(*io, SIGCHLD),
      tick_timer_(*io),
      heartbeat_timer_(*io),
      reconnect_timer_(*io),
      servers_(options_.servers) {
  if (servers_.empty()) servers_.emplace_back(options_.server_host, options_.server_port);
}

std::string LastLogLine(const std::string& path, size_t max) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 8192);
  in.seekg(from);
  std::string tail(static_cast<size_t>(size - from), '\0');
  in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  tail.resize(static_cast<size_t>(in.gcount()));
  size_t end = tail.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return "";
  const size_t start = tail.find_last_of('\n', end);
  std::string line = tail.substr(start == std::string::npos ? 0 : start + 1, end + 1 - (start == std::string::npos ? 0 : start + 1));
  if (line.size() > max) line = line.substr(line.size() - max);
  for (char& c : line) {
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  return line;
}

namespace {

// Waits for a signalled process to exit until `deadline`, then SIGKILLs it; how it ended.
launcher::ExitInfo AwaitExit(launcher::TrainerProcess* p, std::chrono::steady_clock::time_point deadline) {
  launcher::ExitInfo info;
  while (!p->Poll(&info) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  if (!p->Poll(&info)) info = p->Stop(milliseconds(0));
  return info;
}

// A trainer this long silent (2 channel heartbeats) is checked for being stopped: a stopped
// process (state T) is the proof, the silence only rules out one caught between beats.
constexpr int64_t kStoppedSilenceUs =
    2 * std::chrono::duration_cast<std::chrono::microseconds>(net::kTrainerHeartbeat).count();

// True when /proc says `pid` is stopped (state T: SIGSTOP, SIGTSTP; not a tracer's stop).
bool ProcessStopped(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  const size_t paren = stat.rfind(')');  // the name may hold spaces and parentheses
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'T';
}

bool IsHexToken(const std::string& s) {
  if (s.size() != proto::kSessionTokenBytes) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// Reads the session token at `path`: only from a regular file of ours that nobody else can read
// or write (it proves the node's identity to the server). Empty when there is none.
std::string LoadSessionFile(const std::string& path) {
  if (path.empty()) return "";
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st;
  char buf[proto::kSessionTokenBytes + 2] = {};
  ssize_t n = -1;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
      (st.st_mode & 077) == 0) {
    n = ::read(fd, buf, sizeof(buf) - 1);
  } else {
    LOG(WARNING) << "ignoring session file " << path << ": not a regular file of this user with "
                 << "mode 0600";
  }
  ::close(fd);
  std::string token(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!token.empty() && (token.back() == '\n' || token.back() == ' ')) token.pop_back();
  return IsHexToken(token) ? token : "";
}

// Writes `token` to `path` (mode 0600) atomically: a new file, then rename.
Status SaveSessionFile(const std::string& path, const std::string& token) {
  const std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return PosixError("session file " + tmp + " (--state_dir)", errno);
  const std::string line = token + "\n";
  const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  const int err = errno;
  ::close(fd);
  if (!ok) return PosixError("session file " + tmp, err);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return PosixError("session file " + path, errno);
  return Status::OK();
}

// True when a process accepts connections on the Unix socket at `path` (another live client).
bool SocketInUse(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return false;  // binding it fails with a clear error
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool live = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return live;
}

// One client per session file: a lock held for the client's life (the kernel drops it when the
// process dies, SIGKILL included). Returns `path` when this client holds it, else "" (a second
// client under the same name and state dir: it then presents no token and the server refuses it
// with a retryable error, instead of the two taking the node from each other in turn).
std::string LockSessionFile(const std::string& path, const std::string& node, int* fd) {
  if (path.empty()) return "";
  const std::string lock = path + ".lock";
  *fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (*fd >= 0 && ::flock(*fd, LOCK_EX | LOCK_NB) == 0) return path;
  LOG(WARNING) << "another edl client of node " << node << " holds " << lock
               << "; this one does not use the node's session token (give each client its own "
                  "--node_name)";
  if (*fd >= 0) ::close(*fd);
  *fd = -1;
  return "";
}

// CPU time since boot from /proc/stat's "cpu" line, in clock ticks: busy (everything but idle and
// iowait) and total (user..steal); and the number of "cpuN" lines. False when unreadable.
bool ReadCpuTimes(uint64_t* busy, uint64_t* total, int* cores) {
  std::ifstream in("/proc/stat");
  std::string line;
  bool got = false;
  *cores = 0;
  while (std::getline(in, line) && line.rfind("cpu", 0) == 0) {
    if (line.size() > 3 && line[3] >= '0' && line[3] <= '9') {
      ++*cores;
      continue;
    }
    std::istringstream ss(line.substr(3));
    uint64_t v = 0, sum = 0, idle = 0;
    for (int i = 0; i < 8 && (ss >> v); ++i) {
      sum += v;
      if (i == 3 || i == 4) idle += v;
    }
    *busy = sum - idle;
    *total = sum;
    got = sum > 0;
  }
  return got && *cores > 0;
}

}  // namespace

Client::~Client() {
  RemoveSocket();
  if (session_lock_fd_ >= 0) ::close(session_lock_fd_);
}

void Client::RemoveSocket() {
  if (!socket_bound_) return;  // never another client's
  socket_bound_ = false;
  // Only a socket file: never whatever else the path may name by now.
  struct stat st;
  if (::lstat(options_.socket_path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
    ::unlink(options_.socket_path.c_str());
  }
}

Status Client::Start() {
  session_path_ = LockSessionFile(options_.session_path, options_.node_name, &session_lock_fd_);
  session_ = LoadSessionFile(session_path_);
  if (!session_.empty()) LOG(INFO) << "session token of node " << options_.node_name << " from " << session_path_;
  if (SocketInUse(options_.socket_path)) {
    return Status::AlreadyExists("trainer socket " + options_.socket_path + " is in use by a running "
                                 "client; give each client its own --socket_path");
  }
  struct stat st;  // left by a client that was killed: only a socket file is removed
  if (::lstat(options_.socket_path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
    ::unlink(options_.socket_path.c_str());
  }
  boost::system::error_code ec;
  asio::local::stream_protocol::endpoint ep(options_.socket_path);
  const mode_t old = ::umask(0177);  // the socket is created 0600: this node's trainers only
  trainer_acceptor_.open(ep.protocol(), ec);
  if (!ec) trainer_acceptor_.bind(ep, ec);
  socket_bound_ = !ec;
  ::umask(old);
  if (!ec) trainer_acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return FromErrorCode("trainer socket " + options_.socket_path, ec).WithContext("--socket_path");
  ::chmod(options_.socket_path.c_str(), 0600);
  AcceptTrainer();
  struct Rearm {
    Client* c;
    void operator()(const boost::system::error_code& e, int) const {
      if (e || c->shutting_down_) return;
      c->PollTrainers();
      c->sigchld_.async_wait(*this);
    }
  };
  sigchld_.async_wait(Rearm{this});
  LOG(INFO) << "edl client node " << options_.node_name << ": " << options_.slots.size()
            << " slots, " << proto::NameOf(proto::NodeModeOf(options_.restart_mode)) << " mode, trainers on "
            << options_.socket_path << ", server " << ServerAddr()
            << (servers_.size() > 1 ? " (first of " + std::to_string(servers_.size()) + ")" : "");
  if (!options_.job_types.empty()) {  // a cluster's node: it reports utilisation (node_stats)
    Status g = gpu_.Open(options_.gpu_slots ? options_.slots : std::vector<int>{});
    if (g.ok()) {
      LOG(INFO) << "GPU utilisation of " << gpu_.devices() << " GPU(s) through NVML";
    } else {
      LOG(INFO) << g.message();
    }
  }
  Connect();
  Tick();
  io_thread_.Detach();  // the io_context's thread takes over (it may be another)
  return Status::OK();
}

void Client::Shutdown(int exit_code, const std::string& why) {
  EDL_DCHECK_OWNING_THREAD(io_thread_);
  if (shutting_down_) return;
  shutting_down_ = true;
  exit_code_ = exit_code;
  LOG(INFO) << "edl client " << options_.node_name << ": shutting down: " << why;
  ReleaseSpares("", "the client is shutting down");
  for (auto& [id, t] : trainers_) t.proc->Terminate();
  const auto deadline = std::chrono::steady_clock::now() + milliseconds(options_.stop_grace_ms);
  for (auto& [id, t] : trainers_) {
    const launcher::ExitInfo info = AwaitExit(t.proc.get(), deadline);
    LOG(INFO) << "trainer " << id << " stopped: " << info.ToString();
    proto::TrainerExit e;
    e.trainer_id = id;
    e.exited = info.exited;
    e.code = info.code;
    e.signal = info.signal;
    json j;
    e.EncodeTo(&j);
    if (server_ && authenticated_) server_->Send(j);
  }
  trainers_.clear();
  for (auto& [id, sp] : spares_) {
    LOG(INFO) << "spare " << id << " released: " << AwaitExit(sp.proc.get(), deadline).ToString();
  }
  spares_.clear();
  if (teacher_runner_) teacher_runner_->StopAll(milliseconds(options_.stop_grace_ms));
  boost::system::error_code ec;
  trainer_acceptor_.close(ec);
  RemoveSocket();
  sigchld_.cancel(ec);
  tick_timer_.cancel();
  heartbeat_timer_.cancel();
  reconnect_timer_.cancel();
  auto t = std::make_shared<asio::steady_timer>(*io_, milliseconds(200));
  t->async_wait([this, t](const boost::system::error_code&) {
    if (server_) server_->Close(Status::Aborted("client exiting"));
    io_->stop();
  });
}

// ---- server connection

std::string Client::ServerAddr() const {
  return servers_[server_index_].first + ":" + std::to_string(servers_[server_index_].second);
}

void Client::Connect() {
  if (shutting_down_) return;
  auto resolver = std::make_shared<asio::ip::tcp::resolver>(*io_);
  auto socket = std::make_shared<asio::ip::tcp::socket>(*io_);
  const auto& [host, port] = servers_[server_index_];
  auto timer = std::make_shared<asio::steady_timer>(*io_, milliseconds(5000));
  timer->async_wait([socket](const boost::system::error_code& ec) {
    if (!ec) {
      boost::system::error_code ignored;
      socket->close(ignored);
    }
  });
  resolver->async_resolve(
      host, std::to_string(port),
      [this, resolver, socket, timer](const boost::system::error_code& ec,
                                      asio::ip::tcp::resolver::results_type results) {
        if (ec) {
          timer->cancel();
          return ScheduleReconnect("cannot resolve " + ServerAddr() + ": " + ec.message());
        }
        asio::async_connect(*socket, results,
                            [this, socket, timer](const boost::system::error_code& ec2,
                                                  const asio::ip::tcp::endpoint&) {
                              timer->cancel();
                              if (shutting_down_) return;
                              if (ec2) {
                                return ScheduleReconnect("connect to " + ServerAddr() + ": " + ec2.message());
                              }
                              boost::system::error_code ignored;
                              socket->set_option(asio::ip::tcp::no_delay(true), ignored);
                              net::ConnectionOptions o;
                              o.idle_timeout = milliseconds(10000);
                              o.max_frame_bytes = proto::kMaxPreAuthFrameBytes;  // until welcomed
                              server_ = net::Connection::Create(
                                  net::ToGeneric(std::move(*socket)), ServerAddr(), o);
                              authenticated_ = false;
                              handshake_.reset();  // an error before our hello proves nothing
                              auto conn = server_;
                              server_->Start([this](const json& m) { OnServerMessage(m); },
                                             [this, conn](const Status& s) {
                                               if (server_ != conn) return;
                                               authenticated_ = false;
                                               server_.reset();
                                               FailPendingKv(s);
                                               ScheduleReconnect(s.ToString());
                                             });
                            });
      });
}

void Client::ScheduleReconnect(const std::string& why) {
  if (shutting_down_) return;
  // With several servers (a leader and standbys) the next one is tried; the delay grows once per
  // round over all of them.
  // The cap is short: a server restart costs the job whatever passes between the server's return
  // and the clients' next try (a trainer that died meanwhile is handled only then), and a refused
  // connect costs the server nothing. The jitter (+-20 %) keeps many clients from trying in step.
  constexpr int64_t kMaxReconnectMs = 1000;
  server_index_ = (server_index_ + 1) % servers_.size();
  const int64_t delay_ms = backoff_ms_ * 4 / 5 + static_cast<int64_t>(jitter_() % (backoff_ms_ * 2 / 5 + 1));
  // A client that never got in says how to fix what it cannot: every few tries while it fails.
  const std::string hint =
      !ever_authenticated_ && ++failed_connects_ % 10 == 1
          ? " (no server answered yet: check that `edl server` runs there and that --server names its "
            "--server_port, default 8180; the scripts' EDL_SERVER_PORT)"
          : "";
  LOG(WARNING) << "edl client " << options_.node_name << ": server connection: " << why << "; trying "
               << ServerAddr() << " in " << delay_ms << " ms" << hint;
  reconnect_timer_.expires_after(milliseconds(delay_ms));
  if (server_index_ == 0) backoff_ms_ = std::min<int64_t>(backoff_ms_ * 2, kMaxReconnectMs);
  reconnect_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Connect();
  });
}

void Client::OnServerMessage(const json& msg) {
  EDL_DCHECK_OWNING_THREAD(io_thread_);
  if (!authenticated_) return OnHandshakeFrame(msg);
  proto::ServerFrame frame;
  if (Status s = proto::DecodeServerFrame(msg, &frame); !s.ok()) {
    if (s.code() == Status::Code::kInvalidArgument) {  // a type not of the set
      LOG(WARNING) << "ignoring unexpected '" << proto::TypeOf(msg) << "' from the server";
      return;
    }
    // After the welcome every frame is sealed, so an error then is the server's.
    if (std::holds_alternative<proto::ErrorMsg>(frame)) return OnRefused(s, /*proven=*/true);
    if (std::holds_alternative<proto::GenerationUpdate>(frame)) {
      LOG(ERROR) << "bad generation from the server: " << s.ToString() << "; reconnecting for a full one";
    }
    return server_->Close(s);
  }
  std::visit(Overloaded{
                 [&](const proto::ErrorMsg& e) { OnRefused(e.ToStatus(), /*proven=*/true); },
                 [&](const proto::Heartbeat&) {},
                 [&](const proto::GenerationUpdate& u) { OnGeneration(u); },
                 [&](const proto::Prepare& p) { OnPrepare(p); },
                 [&](const proto::Kill& k) { OnKill(k); },
                 [&](const proto::JobInfo& info) { OnJobInfo(info); },
                 [&](proto::KvReply& r) { OnKvReply(&r); },
                 [&](const proto::TeacherOrder& o) { OnTeacherOrder(o); },
                 [&](const proto::ServiceMembers& m) { OnServiceMembers(m); },
                 [&](const proto::Stop&) { Shutdown(0, "the server asked to stop (edl ctl stop)"); },
                 [&](const proto::Done&) {
                   done_ = true;
                   LOG(INFO) << "edl client " << options_.node_name << ": the job finished";
                 },
             },
             frame);
}

void Client::OnRefused(const Status& s, bool proven) {
  if (!proven) {
    // Anyone can send an unproven error (a process that took the port of a dead server): log it
    // and retry, never stop for it.
    ++unproven_refusals_;
    LOG(ERROR) << "edl client " << options_.node_name << ": " << s.ToString();
    // A client that never got in and runs nothing has nothing to protect: after a few refusals of
    // its secret it exits with the reason instead of retrying forever.
    if (!ever_authenticated_ && trainers_.empty() && unproven_refusals_ >= 3 &&
        s.code() == Status::Code::kUnauthenticated) {
      return Shutdown(2, s.ToString() + " (3 times; check --secret_file on both sides)");
    }
    return server_->Close(s);  // reconnects with backoff
  }
  LOG(ERROR) << "edl client " << options_.node_name << ": server refused us: " << s.ToString();
  // Retrying cannot help a name taken by a connected client, a secret the server refuses, or a
  // field of ours it refuses (e.g. --advertise_addr not a host): the same hello would be refused again.
  if (s.code() == Status::Code::kAlreadyExists || s.code() == Status::Code::kUnauthenticated ||
      s.code() == Status::Code::kInvalidArgument || s.code() == Status::Code::kCorruption) {
    Shutdown(2, s.ToString());
  }
}

void Client::OnHandshakeFrame(const json& msg) {
  if (handshake_ == nullptr) {  // the server's first frame: the challenge
    handshake_ = std::make_unique<net::PeerHandshake>(options_.secret, OurHello());
    json hello;
    if (Status s = handshake_->OnChallenge(msg, server_->peer(), &hello); !s.ok()) return OnRefused(s, false);
    server_->Send(hello);
    return;
  }
  proto::Welcome w;
  bool proven = false;
  if (Status s = handshake_->OnReply(msg, server_->peer(), &w, &proven); !s.ok()) return OnRefused(s, proven);
  OnWelcome(w);
}

proto::Hello Client::OurHello() {
  proto::Hello h;
  h.role = proto::Role::kClient;
  h.node = options_.node_name;
  h.host = options_.advertise_addr;
  h.mode = options_.restart_mode ? proto::NodeMode::kRestart : proto::NodeMode::kInplace;
  h.slots = options_.slots;
  h.node_token = session_;
  for (const auto& [name, type] : options_.job_types) h.job_types.push_back({name, type.settable});
  if (TeacherRunner* r = Teachers()) {
    h.services = r->Services();
    h.teacher_slots = r->slots();
    h.teachers = r->Running();
  }
  // Members of the newest generation this client holds, and prepared joiners, each with its
  // generation: a restarted server adopts the survivors and kills joiners of a change it rolled
  // back (PROTOCOL.md "Authentication").
  for (const auto& [id, t] : trainers_) {
    if (t.leaving || (!t.member && t.joining_generation == 0)) continue;
    h.trainers.push_back(id);
    auto run = runs_.find(t.job);
    const int64_t held = run == runs_.end() ? 0 : run->second.latest.generation;
    h.trainer_generations.push_back(t.member ? std::max(held, t.generation_sent) : t.joining_generation);
  }
  return h;
}

void Client::OnWelcome(const proto::Welcome& w) {
  // welcome is the server's last unsealed frame and our hello was our last one.
  server_->StartSession(handshake_->TakeSession(), proto::kMaxFrameBytes);
  handshake_.reset();
  authenticated_ = true;
  ever_authenticated_ = true;
  unproven_refusals_ = 0;
  KeepSession(w.node_token);
  backoff_ms_ = kFirstReconnectMs;
  job_id_ = w.job_id;
  heartbeat_ms_ = w.heartbeat_ms;
  server_->SetIdleTimeout(milliseconds(std::max(10000, 10 * heartbeat_ms_)));
  for (auto& [name, run] : runs_) {  // the server sends the newest generations in full next
    run.latest = run.prev = proto::GenerationInfo();
  }
  if (!options_.trainer_argv.empty()) runs_[job_id_].argv = options_.trainer_argv;
  LOG(INFO) << "edl client " << options_.node_name << ": registered with job " << job_id_;
  if (w.dropped) DropStaleTrainers();
  while (!outbox_.empty()) {
    server_->Send(outbox_.front());
    outbox_.pop_front();
  }
  ResendServiceWatches();
  Heartbeat();
}

void Client::KeepSession(const std::string& token) {
  if (token == session_ || !IsHexToken(token)) return;
  session_ = token;
  if (session_path_.empty()) return;
  Status s = SaveSessionFile(session_path_, token);
  if (!s.ok()) {
    LOG(WARNING) << "cannot keep the node's session token: " << s.ToString()
                 << "; a restarted client will wait until the server has lost this node";
  }
}

void Client::Heartbeat() {
  heartbeat_timer_.expires_after(milliseconds(heartbeat_ms_));
  heartbeat_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || shutting_down_) return;
    if (server_ && authenticated_) server_->Send(proto::Heartbeat().Encoded());
    if (server_ && authenticated_ && !options_.job_types.empty()) SendNodeStats();
    Heartbeat();
  });
}

void Client::SendNodeStats() {
  uint64_t busy = 0, total = 0;
  int cores = 0;
  if (!ReadCpuTimes(&busy, &total, &cores)) return;
  if (cpu_total_prev_ > 0 && total > cpu_total_prev_ && busy >= cpu_busy_prev_) {
    proto::NodeStats st;
    st.cpu_cores = std::min<int>(cores, static_cast<int>(proto::kMaxSlotsPerNode) * 16);
    const double share = static_cast<double>(busy - cpu_busy_prev_) / static_cast<double>(total - cpu_total_prev_);
    st.cpu_busy = std::clamp(share, 0.0, 1.0) * st.cpu_cores;
    st.gpu_util = gpu_.Sample();
    json j;
    st.EncodeTo(&j);
    server_->Send(j);
  }
  cpu_busy_prev_ = busy;
  cpu_total_prev_ = total;
}

void Client::SendToServer(const json& msg, bool queue_if_offline) {
  if (server_ && authenticated_) {
    server_->Send(msg);
  } else if (queue_if_offline && outbox_.size() < 10000) {
    outbox_.push_back(msg);
  }
}

launcher::EnvContract Client::EnvFor(const std::string& job, const proto::GenerationInfo& g,
                                     const proto::MemberInfo& m) const {
  launcher::EnvContract c;
  c.job_id = job;
  c.trainer_id = m.trainer_id;
  c.client_socket = options_.socket_path;
  c.restart_mode = options_.restart_mode;
  c.generation = g.generation;
  c.slot = m.slot;
  if (options_.gpu_slots) c.cuda_visible_devices = std::to_string(m.slot);
  c.rank = m.rank;
  c.world_size = g.world_size();
  c.local_world_size = 0;
  std::set<std::string> nodes;  // torchrun's groups: nodes in the order their first rank appears
  for (const proto::MemberInfo& o : g.members) {
    if (nodes.insert(o.node).second && o.node == options_.node_name) {
      c.group_rank = static_cast<int>(nodes.size()) - 1;
    }
    if (o.node != options_.node_name) continue;
    if (o.rank < m.rank) ++c.local_rank;
    ++c.local_world_size;
  }
  c.group_world_size = std::max<int>(1, static_cast<int>(nodes.size()));
  // Every generation change restarts a restart-mode trainer set (in place, the count of changes).
  c.restart_count =
      static_cast<int>(std::clamp<int64_t>(g.generation - 1, 0, launcher::EnvContract::kUnboundedRestarts));
  c.max_restarts = launcher::EnvContract::kUnboundedRestarts;
  c.master_addr = g.master_addr.empty() ? "127.0.0.1" : g.master_addr;
  c.master_port = g.master_port;
  return c;
}

void Client::OnGeneration(const proto::GenerationUpdate& u) {
  const std::string job = u.header.job_id.empty() ? job_id_ : u.header.job_id;
  auto run = runs_.find(job);
  if (run == runs_.end()) {
    LOG(ERROR) << "generation of job " << job << ", whose type this node was not told (no job_info); ignored";
    return;
  }
  proto::GenerationInfo next = run->second.latest;
  if (Status s = u.ApplyTo(&next); !s.ok()) {
    LOG(ERROR) << "bad generation from the server: " << s.ToString() << "; reconnecting for a full one";
    return server_->Close(s);
  }
  JobRun& r = run->second;
  if (next.generation <= r.latest.generation && r.latest.generation > 0) return;  // already held
  r.prev = r.latest;
  r.latest = std::move(next);
  r.max_world = std::max(r.max_world, r.latest.world_size());
  const proto::GenerationInfo& g = r.latest;
  const int64_t now = clock_->NowMicros();
  LOG(INFO) << "job " << job << ": generation " << g.generation << " (" << g.reason << "): world size "
            << g.world_size();
  std::vector<std::string> kill_now;
  for (auto& [id, t] : trainers_) {
    if (t.job != job) continue;
    if (g.RankOf(id) >= 0) {
      t.member = true;
      t.joining_generation = 0;
    } else if (t.joining_generation > g.generation) {
      continue;  // prepared for a later generation
    } else if (!t.member && t.joining_generation > 0) {
      kill_now.push_back(id);  // a joiner the commit left out
    } else if (!t.leaving) {
      t.member = false;
      t.leaving = true;
      if (options_.restart_mode) {
        TerminateTrainer(&t, now);
      } else {
        t.leave_deadline_us = now + options_.leave_grace_ms * 1000;
      }
    }
    PushGeneration(&t);
  }
  for (const std::string& id : kill_now) {
    LOG(INFO) << "killing joiner " << id << ": not in generation " << g.generation;
    trainers_.at(id).proc->Kill();
  }
  for (const proto::MemberInfo& m : g.members) {
    if (m.node != options_.node_name || trainers_.count(m.trainer_id)) continue;
    if (ended_.count(m.trainer_id)) continue;  // ids are never reused: an ended one is not restarted
    bool queued = false;
    for (const StartRequest& w : waiting_) queued |= w.id == m.trainer_id;
    if (queued) continue;
    StartRequest sr;
    sr.id = m.trainer_id;
    sr.job = job;
    sr.slot = m.slot;
    sr.env = EnvFor(job, g, m);
    StartTrainer(std::move(sr));
  }
  for (auto it = ended_.begin(); it != ended_.end();) {  // bounded by this node's members
    it = g.RankOf(*it) >= 0 ? std::next(it) : ended_.erase(it);
  }
  // Queued starts the commit no longer wants (e.g. replaced again) are dropped.
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    const bool wanted = it->job != job || g.RankOf(it->id) >= 0 || it->joining_generation > g.generation;
    it = wanted ? std::next(it) : waiting_.erase(it);
  }
}

void Client::OnPrepare(const proto::Prepare& p) {
  const std::string job = p.job_id.empty() ? job_id_ : p.job_id;
  for (const proto::MemberInfo& j : p.joiners) {
    if (j.node != options_.node_name ||
        std::find(options_.slots.begin(), options_.slots.end(), j.slot) == options_.slots.end()) {
      LOG(ERROR) << "prepare names joiner " << j.trainer_id << " on " << j.node << " slot " << j.slot
                 << ", not a slot of this node; ignored";
      continue;
    }
    if (trainers_.count(j.trainer_id)) continue;
    StartRequest r;
    r.id = j.trainer_id;
    r.job = job;
    r.slot = j.slot;
    proto::GenerationInfo pending;
    pending.generation = p.generation;
    pending.master_addr = p.master_addr;
    pending.master_port = p.master_port;
    pending.members.assign(static_cast<size_t>(p.world_size), j);  // sizes and this member
    r.env = EnvFor(job, pending, j);
    r.env.local_rank = 0;
    r.env.local_world_size = 1;
    r.env.joining = true;
    r.joining_generation = p.generation;
    StartTrainer(std::move(r));
  }
}

void Client::OnKill(const proto::Kill& k) {
  for (const std::string& id : k.trainer_ids) {
    auto it = trainers_.find(id);
    if (it == trainers_.end()) continue;
    LOG(WARNING) << "server asked to SIGKILL trainer " << id << " (pid " << it->second.proc->pid() << ")";
    it->second.proc->Kill();
  }
  PollTrainers();
}

void Client::OnJobInfo(const proto::JobInfo& info) {
  // The server proposes; this node's own configuration decides what runs.
  auto type = options_.job_types.find(info.job_type);
  std::string why;
  if (type == options_.job_types.end()) why = "this node offers no job type " + info.job_type;
  for (const auto& [flag, value] : info.flags) {
    if (!why.empty()) break;
    const auto& settable = type->second.settable;
    if (std::find(settable.begin(), settable.end(), flag) == settable.end()) {
      why = "flag '" + flag + "' is not settable for job type " + info.job_type + " on this node";
    } else if (flag == proto::kCheckpointDirFlag) {
      why = proto::CheckpointDirProblem(value, options_.checkpoint_root);
    }
  }
  if (!why.empty()) {
    LOG(ERROR) << "refusing job " << info.job_id << ": " << why << "; its trainers will not start here";
    runs_.erase(info.job_id);
    return;
  }
  JobRun& run = runs_[info.job_id];
  run.argv = info.Argv(type->second.argv);
  LOG(INFO) << "job " << info.job_id << " of type " << info.job_type << " may run here (" << info.flags.size()
            << " flags set)";
}

void Client::FailPendingKv(const Status& why) {
  // The server will never answer them: each trainer hears at once, not after its wait's margin
  // (a rendezvous waiting on the server that went away would otherwise sit out timeout + 10 s).
  std::vector<uint64_t> ids;
  for (const auto& [ours, route] : kv_routes_) ids.push_back(ours);
  for (uint64_t ours : ids) {
    proto::KvReply rep;
    rep.req_id = ours;
    rep.status = Status::Unavailable("the node's client lost its server connection (" + why.ToString() +
                                     "); retry");
    OnKvReply(&rep);  // relays it and drops the route
  }
}

void Client::OnKvReply(proto::KvReply* r) {
  auto route = kv_routes_.find(r->req_id);
  if (route == kv_routes_.end()) return;
  auto [trainer_id, their_id] = route->second;
  kv_routes_.erase(route);
  auto t = trainers_.find(trainer_id);
  if (t == trainers_.end() || !t->second.channel) return;
  r->req_id = their_id;
  json j;
  r->EncodeTo(&j);
  t->second.channel->Send(j);
}

// ---- trainers

void Client::AcceptTrainer() {
  trainer_acceptor_.async_accept([this](const boost::system::error_code& ec,
                                        asio::local::stream_protocol::socket socket) {
    if (shutting_down_ || ec == asio::error::operation_aborted) return;
    if (!ec) {
      net::ConnectionOptions o;
      o.idle_timeout = milliseconds(5000);  // until trainer_hello
      auto conn = net::Connection::Create(net::ToGeneric(std::move(socket)), "trainer socket", o);
      auto id = std::make_shared<std::string>();
      std::weak_ptr<net::Connection> weak = conn;
      conn->Start(
          [this, weak, id](const json& m) {
            if (auto c = weak.lock()) OnTrainerMessage(c, id.get(), m);
          },
          [this, id](const Status& s) {
            auto t = trainers_.find(*id);
            if (t != trainers_.end() && t->second.channel) {
              VLOG(1) << "trainer " << *id << " channel closed: " << s.ToString();
              t->second.channel.reset();
            }
            auto sp = spares_.find(*id);
            if (sp != spares_.end()) sp->second.channel.reset();
          });
    }
    AcceptTrainer();
  });
}

void Client::OnTrainerMessage(const std::shared_ptr<net::Connection>& conn, std::string* trainer_id,
                              const json& msg) {
  EDL_DCHECK_OWNING_THREAD(io_thread_);
  const std::string& type = proto::TypeOf(msg);
  if (trainer_id->empty() && type == proto::msg::kSpareHello) {
    proto::SpareHello h;
    Status s = h.DecodeFrom(msg);
    if (!s.ok()) return conn->Close(s);
    if (OnSpareHello(conn, h)) *trainer_id = h.spare_id;
    return;
  }
  if (auto sp = spares_.find(*trainer_id); !trainer_id->empty() && sp != spares_.end()) {
    // A waiting spare has nothing to say but heartbeats.
    if (type != proto::msg::kHeartbeat) conn->Close(Status::InvalidArgument("a spare sent " + type));
    return;
  }
  if (trainer_id->empty()) {
    proto::TrainerHello h;
    Status s = type == proto::msg::kTrainerHello ? h.DecodeFrom(msg)
                                                 : Status::InvalidArgument("expected trainer_hello first");
    auto it = s.ok() ? trainers_.find(h.trainer_id) : trainers_.end();
    if (s.ok() && it == trainers_.end() && spares_.count(h.trainer_id)) {
      SpareCannotWait(h.trainer_id);
      s = Status::FailedPrecondition("spare " + h.trainer_id + " said trainer_hello: its command cannot wait as a spare");
    } else if (s.ok() && it == trainers_.end()) {
      s = Status::FailedPrecondition("trainer id '" + h.trainer_id + "' was not started by the client of node " +
                                     options_.node_name);
    }
    if (s.ok() && it->second.channel) {
      s = Status::AlreadyExists("trainer " + h.trainer_id + " already has a channel");
    }
    if (!s.ok()) {
      LOG(WARNING) << "refusing a trainer connection: " << s.ToString();
      json e;
      proto::ErrorMsg::From(s).EncodeTo(&e);
      return conn->SendAndClose(e, s);
    }
    *trainer_id = h.trainer_id;
    Trainer& t = it->second;
    t.channel = conn;
    t.ever_connected = true;
    t.last_heard_us = clock_->NowMicros();
    t.generation_sent = 0;
    conn->SetIdleTimeout(milliseconds(0));  // liveness is judged in Tick (trainer_timeout)
    proto::Welcome w;
    w.job_id = t.job;
    w.heartbeat_ms = 500;
    json j;
    w.EncodeTo(&j);
    conn->Send(j);
    PushGeneration(&t);
    return;
  }
  auto it = trainers_.find(*trainer_id);
  if (it == trainers_.end()) return conn->Close(Status::Aborted("trainer gone"));
  Trainer& t = it->second;
  t.last_heard_us = clock_->NowMicros();
  proto::TrainerFrame frame;
  Status s = proto::DecodeTrainerFrame(msg, &frame);
  if (s.ok()) {
    s = std::visit(
        Overloaded{
            [&](const proto::Heartbeat&) { return Status::OK(); },
            [&](proto::Ready& r) {
              r.trainer_id = t.id;
              SendToServer(r.Encoded(), /*queue_if_offline=*/true);
              return Status::OK();
            },
            [&](proto::Progress& p) {
              p.trainer_id = t.id;
              SendToServer(p.Encoded(), false);
              return Status::OK();
            },
            [&](proto::Event& e) {
              if (const auto* bad = std::get_if<proto::ev::Malformed>(&e.body)) {
                // A bad event is the trainer's bug, not a broken channel: dropped, never relayed.
                if (net::LogThis(++t.dropped_events)) {
                  LOG(WARNING) << "node " << options_.node_name << ": dropped an event of trainer " << t.id
                               << ": " << bad->why.message() << " (" << t.dropped_events << " dropped so far)";
                }
                return Status::OK();
              }
              e.trainer_id = t.id;
              SendToServer(e.Encoded(), true);
              return Status::OK();
            },
            [&](proto::KvRequest& r) {
              if (!server_ || !authenticated_) {
                proto::KvReply rep;
                rep.req_id = r.req_id;
                rep.status = Status::Unavailable("the node's client is not connected to the server; retry");
                conn->Send(rep.Encoded());
                return Status::OK();
              }
              const uint64_t ours = next_req_id_++;
              kv_routes_[ours] = {t.id, r.req_id};
              r.req_id = ours;
              r.job = t.job == job_id_ ? "" : t.job;  // the server's own job keeps the unscoped form
              server_->Send(r.Encoded());
              return Status::OK();
            },
            [&](const proto::ServiceWatch& w) { return OnServiceWatch(&t, w); },
        },
        frame);
  }
  if (!s.ok()) {
    LOG(WARNING) << "trainer " << t.id << ": " << s.ToString() << "; closing its channel";
    conn->Close(s);
  }
}

void Client::PushGeneration(Trainer* t) {
  auto run = runs_.find(t->job);
  if (run == runs_.end()) return;
  const proto::GenerationInfo& prev = run->second.prev;
  const proto::GenerationInfo& latest = run->second.latest;
  if (!t->channel || latest.generation == 0 || t->generation_sent >= latest.generation) return;
  json j;
  if (t->generation_sent > 0 && t->generation_sent == prev.generation) {
    proto::GenerationUpdate::Between(prev, latest).EncodeTo(&j);
  } else {
    proto::GenerationUpdate::Full(latest).EncodeTo(&j);
  }
  t->channel->Send(j);
  t->generation_sent = latest.generation;
}

bool Client::SlotBusy(int slot) const {
  for (const auto& [id, t] : trainers_) {
    if (t.slot == slot) return true;
  }
  return false;
}

void Client::StartTrainer(StartRequest req) {
  if (shutting_down_) return;
  if (SlotBusy(req.slot)) {
    waiting_.push_back(std::move(req));  // starts once the slot's previous trainer has exited
    return;
  }
  auto run = runs_.find(req.job);
  launcher::TrainerSpec spec;
  if (run != runs_.end()) spec.argv = run->second.argv;
  spec.env = launcher::BuildTrainerEnv(req.env);
  spec.log_path = options_.log_dir + "/" + req.id + ".log";
  std::unique_ptr<launcher::TrainerProcess> spare = spec.argv.empty() ? nullptr : AssignSpare(req, spec.log_path);
  const bool from_spare = spare != nullptr;
  auto proc = from_spare         ? StatusOr<std::unique_ptr<launcher::TrainerProcess>>(std::move(spare))
              : spec.argv.empty()
                  ? StatusOr<std::unique_ptr<launcher::TrainerProcess>>(Status::FailedPrecondition(
                        "this node has no command for job " + req.job + " (no job_info accepted)"))
                  : launcher_->Start(spec);
  if (!proc.ok()) {
    LOG(ERROR) << "cannot start trainer " << req.id << ": " << proc.status().ToString();
    proto::TrainerExit e;
    e.trainer_id = req.id;
    e.exited = true;
    e.code = 127;
    e.error = proc.status().ToString().substr(0, proto::kMaxErrorLineBytes);
    json j;
    e.EncodeTo(&j);
    SendToServer(j, true);
    return;
  }
  LOG(INFO) << (from_spare ? "assigned trainer " : "started trainer ") << req.id << " (pid " << proc.value()->pid() << ", slot " << req.slot
            << ", generation " << req.env.generation << (req.env.joining ? ", joining" : "")
            << "), log " << spec.log_path;
  Trainer t;
  t.id = req.id;
  t.job = req.job;
  t.slot = req.slot;
  t.proc = std::move(proc.value());
  t.joining_generation = req.joining_generation;
  t.member = req.joining_generation == 0;
  trainers_.emplace(req.id, std::move(t));
}

void Client::StartWaiting() {
  std::deque<StartRequest> waiting;
  waiting.swap(waiting_);
  for (StartRequest& r : waiting) StartTrainer(std::move(r));
}

void Client::PollTrainers() {
  std::vector<std::pair<std::string, launcher::ExitInfo>> exited;
  for (auto& [id, t] : trainers_) {
    launcher::ExitInfo info;
    if (t.proc->Poll(&info)) exited.emplace_back(id, info);
  }
  for (auto& [id, info] : exited) {
    auto it = trainers_.find(id);
    if (it->second.channel) it->second.channel->Close(Status::Aborted("trainer exited"));
    LOG(INFO) << "trainer " << id << " (pid " << it->second.proc->pid() << ") ended: " << info.ToString();
    // A member that ended is never started again under its id (ids are never reused), even if a
    // generation still listing it arrives: a finished trainer is not run twice.
    auto run = runs_.find(it->second.job);
    if (run != runs_.end() && run->second.latest.RankOf(id) >= 0) ended_.insert(id);
    trainers_.erase(it);
    ReportExit(id, info);
  }
  PollSpares(clock_->NowMicros());
  if (!exited.empty()) StartWaiting();
}

void Client::ReportExit(const std::string& id, const launcher::ExitInfo& info) {
  proto::TrainerExit e;
  e.trainer_id = id;
  e.exited = info.exited && !info.lost;
  e.code = info.lost ? 1 : info.code;
  e.signal = info.signal;
  // Why it failed, in its own words, for `edl ctl status` (a job that keeps failing says so).
  if (!e.success()) e.error = LastLogLine(options_.log_dir + "/" + id + ".log", proto::kMaxErrorLineBytes);
  json j;
  e.EncodeTo(&j);
  SendToServer(j, /*queue_if_offline=*/true);
}

void Client::DropStaleTrainers() {
  const int64_t now = clock_->NowMicros();
  int stale = 0;
  for (auto& [id, t] : trainers_) {
    if (t.kill_deadline_us > 0) continue;
    ++stale;
    TerminateTrainer(&t, now);
  }
  if (stale == 0) {
    // Nothing ran on the token's behalf (e.g. a client's first connection to a new job, holding
    // the token of an earlier job from its session file): nothing is lost, nothing to warn about.
    LOG(INFO) << "edl client " << options_.node_name << ": the server does not know this node's "
              << "session token (kept from an earlier job, or the node was lost while no trainer "
              << "ran here); joining as a fresh node";
    return;
  }
  LOG(WARNING) << "edl client " << options_.node_name
               << ": the server dropped this node (it heard nothing from it for longer than its "
                  "heartbeat timeout: was this client stopped or cut off? or the server started a new "
                  "job), so the others went on without its trainers; stopping its "
               << stale << " stale trainer(s) (SIGTERM, then SIGKILL after --stop_grace_s) and "
               << "rejoining with fresh ones";
}

void Client::TerminateTrainer(Trainer* t, int64_t now_us) {
  if (t->kill_deadline_us > 0) return;
  // The grace counts from the moment the decision was taken (the caller's `now`), and is recorded
  // before the signal: reading the clock after Terminate() would start it late by however long
  // the signal took, and a fake clock advanced in between would postpone the SIGKILL indefinitely.
  t->kill_deadline_us = now_us + options_.stop_grace_ms * 1000;
  t->proc->Terminate();
}

void Client::Tick() {
  EDL_DCHECK_OWNING_THREAD(io_thread_);
  if (shutting_down_) return;
  PollTrainers();
  PollTeachers();
  const int64_t now = clock_->NowMicros();
  for (auto& [id, t] : trainers_) {
    if (t.leaving && t.leave_deadline_us > 0 && now >= t.leave_deadline_us && t.kill_deadline_us == 0) {
      LOG(WARNING) << "leaving trainer " << id << " did not exit within --leave_grace_s; SIGTERM";
      TerminateTrainer(&t, now);
    }
    if (t.kill_deadline_us > 0 && now >= t.kill_deadline_us) {
      LOG(WARNING) << "trainer " << id << " ignored SIGTERM for --stop_grace_s; SIGKILL";
      t.proc->Kill();
      t.kill_deadline_us = INT64_MAX;
    }
    if (t.ever_connected && !t.leaving && now - t.last_heard_us > options_.trainer_timeout_ms * 1000) {
      LOG(ERROR) << "trainer " << id << " sent no heartbeat for " << options_.trainer_timeout_ms
                 << " ms (hung or stopped?); SIGKILL";
      t.proc->Kill();
      t.last_heard_us = INT64_MAX / 2;  // once
    } else if (t.ever_connected && !t.leaving && now - t.last_heard_us > kStoppedSilenceUs &&
               ProcessStopped(t.proc->pid())) {
      // Silent and stopped: it cannot be slow, it makes no progress at all, and every collective
      // of its job waits on it. No need to wait out --trainer_timeout_s.
      LOG(ERROR) << "trainer " << id << " (pid " << t.proc->pid() << ") is stopped (state T: SIGSTOP or a "
                 << "job-control stop) and silent for " << (now - t.last_heard_us) / 1000
                 << " ms; SIGKILL, its job re-forms without it";
      t.proc->Kill();
      t.last_heard_us = INT64_MAX / 2;  // once
    }
  }
  KeepSpares(now);
  if (done_ && options_.exit_when_done && trainers_.empty()) return Shutdown(0, "the job finished");
  tick_timer_.expires_after(milliseconds(options_.tick_ms));
  tick_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Tick();
  });
}

}  // namespace edl::jobclient
