#include "jobclient/client.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <thread>

#include <glog/logging.h>

#include "edl/base/enum_names.h"
#include "edl/net/auth.h"
#include "edl/net/trainer_channel.h"
#include "edl/proto/frame.h"
#include "edl/proto/frames.h"

namespace edl::jobclient {

namespace asio = boost::asio;
using nlohmann::json;
using std::chrono::milliseconds;

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
  const size_t first = start == std::string::npos ? 0 : start + 1;
  std::string line = tail.substr(first, end + 1 - first);
  if (line.size() > max) line = line.substr(line.size() - max);
  for (char& c : line) {
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  return line;
}

namespace {

// Waits for a signalled process to exit until `deadline`, then SIGKILLs it; how it ended.
launcher::ExitInfo AwaitExit(launcher::TrainerProcess* p,
                             std::chrono::steady_clock::time_point deadline) {
  launcher::ExitInfo info;
  while (!p->Poll(&info) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  if (!p->Poll(&info)) info = p->Stop(milliseconds(0));
  return info;
}

// True when /proc says `pid` is stopped (state T: SIGSTOP, SIGTSTP; not a tracer's stop).
bool ProcessStopped(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  const size_t paren = stat.rfind(')');  // the name may hold spaces and parentheses
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'T';
}

NodeAgentOptions AgentOptionsOf(const ClientOptions& o) {
  NodeAgentOptions a;
  a.node_name = o.node_name;
  a.slots = o.slots;
  a.gpu_slots = o.gpu_slots;
  a.restart_mode = o.restart_mode;
  a.socket_path = o.socket_path;
  a.log_dir = o.log_dir;
  a.stop_grace_ms = o.stop_grace_ms;
  a.leave_grace_ms = o.leave_grace_ms;
  a.trainer_timeout_ms = o.trainer_timeout_ms;
  // A trainer this long silent (2 channel heartbeats) is checked for being stopped: a stopped
  // process (state T) is the proof, the silence only rules out one caught between beats.
  a.stopped_silence_ms = 2 * net::kTrainerHeartbeat.count();
  a.trainer_argv = o.trainer_argv;
  a.job_types = o.job_types;
  a.checkpoint_root = o.checkpoint_root;
  a.exit_when_done = o.exit_when_done;
  a.spares = o.spares;
  return a;
}

std::vector<std::pair<std::string, int>> ServersOf(const ClientOptions& o) {
  if (!o.servers.empty()) return o.servers;
  return {{o.server_host, o.server_port}};
}

// The first reconnect delay after a lost or refused connection: short, since a standby on the
// same state directory listens within tens of ms of the leader's exit (STATE.md).
constexpr int64_t kFirstReconnectMs = 50;
// The cap is short: a server restart costs the job whatever passes between the server's return
// and the clients' next try (a trainer that died meanwhile is handled only then), and a refused
// connect costs the server nothing.
constexpr int64_t kMaxReconnectMs = 1000;

}  // namespace

// ---- Dialer

Client::Dialer::Dialer(std::vector<std::pair<std::string, int>> servers)
    : servers_(std::move(servers)),
      backoff_ms_(kFirstReconnectMs),
      jitter_(static_cast<uint32_t>(::getpid())) {}

std::string Client::Dialer::addr() const {
  return servers_[index_].first + ":" + std::to_string(servers_[index_].second);
}

int64_t Client::Dialer::Next(std::string* hint) {
  // With several servers (a leader and standbys) the next one is tried; the delay grows once per
  // round over all of them. The jitter (+-20 %) keeps many clients from trying in step.
  index_ = (index_ + 1) % servers_.size();
  const int64_t delay_ms =
      backoff_ms_ * 4 / 5 + static_cast<int64_t>(jitter_() % (backoff_ms_ * 2 / 5 + 1));
  // A client that never got in says how to fix what it cannot: every few tries while it fails.
  *hint = !ever_welcomed_ && ++failed_connects_ % 10 == 1
              ? " (no server answered yet: check that `edl server` runs there and that --server "
                "names its --server_port, default 8180; the scripts' EDL_SERVER_PORT)"
              : "";
  if (index_ == 0) backoff_ms_ = std::min<int64_t>(backoff_ms_ * 2, kMaxReconnectMs);
  return delay_ms;
}

void Client::Dialer::Welcomed() {
  ever_welcomed_ = true;
  unproven_refusals_ = 0;
  backoff_ms_ = kFirstReconnectMs;
}

// ---- the client

Client::Client(asio::io_context* io, ClientOptions options,
               std::unique_ptr<launcher::ProcessLauncher> launcher, Clock* clock)
    : io_(io),
      options_(std::move(options)),
      launcher_(std::move(launcher)),
      clock_(clock),
      agent_(AgentOptionsOf(options_), clock),
      trainer_socket_(io),
      sigchld_(*io, SIGCHLD),
      tick_timer_(*io),
      heartbeat_timer_(*io),
      reconnect_timer_(*io),
      dialer_(ServersOf(options_)) {}

Client::~Client() = default;

Status Client::Start() {
  session_.Open(options_.session_path, options_.node_name);
  EDL_RETURN_IF_ERROR(trainer_socket_.Listen(
      options_.socket_path,
      [this](uint64_t ch, const json& m) {
        EDL_DCHECK_OWNING_THREAD(io_thread_);
        agent_.OnChannelFrame(ch, m);
        RunAgent();
      },
      [this](uint64_t ch, const Status& s) {
        agent_.OnChannelClosed(ch, s);
        RunAgent();
      }));
  struct Rearm {
    Client* c;
    void operator()(const boost::system::error_code& e, int) const {
      if (e || c->exit_code_) return;
      c->PollProcesses();
      c->sigchld_.async_wait(*this);
    }
  };
  sigchld_.async_wait(Rearm{this});
  LOG(INFO) << "edl client node " << options_.node_name << ": " << options_.slots.size()
            << " slots, " << proto::NameOf(proto::NodeModeOf(options_.restart_mode))
            << " mode, trainers on " << options_.socket_path << ", server " << dialer_.addr()
            << (dialer_.size() > 1 ? " (first of " + std::to_string(dialer_.size()) + ")" : "");
  {  // every node reports its utilisation (node_stats): the dashboard's and /metrics' CPU and GPU
    Status g = stats_.OpenGpus(options_.gpu_slots ? options_.slots : std::vector<int>{});
    if (g.ok()) {
      LOG(INFO) << "GPU utilisation of " << stats_.gpu_devices() << " GPU(s) through NVML";
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
  if (exit_code_) return;
  exit_code_ = exit_code;
  LOG(INFO) << "edl client " << options_.node_name << ": shutting down: " << why;
  agent_.Shutdown();  // spares released, every trainer sent SIGTERM
  RunAgent();
  const auto deadline = std::chrono::steady_clock::now() + milliseconds(options_.stop_grace_ms);
  std::vector<ProcessExit> stopped;
  for (auto& [id, proc] : procs_) {
    ProcessExit e;
    e.id = id;
    e.info = AwaitExit(proc.get(), deadline);
    stopped.push_back(std::move(e));
  }
  procs_.clear();
  agent_.OnProcessesExited(stopped);  // logged, and each trainer's end sent as it is
  RunAgent();
  if (teacher_runner_) teacher_runner_->StopAll(milliseconds(options_.stop_grace_ms));
  trainer_socket_.Stop();
  boost::system::error_code ec;
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

void Client::Connect() {
  if (exit_code_) return;
  auto resolver = std::make_shared<asio::ip::tcp::resolver>(*io_);
  auto socket = std::make_shared<asio::ip::tcp::socket>(*io_);
  const auto& [host, port] = dialer_.server();
  auto timer = std::make_shared<asio::steady_timer>(*io_, milliseconds(5000));
  timer->async_wait([socket](const boost::system::error_code& ec) {
    if (!ec) {
      boost::system::error_code ignored;
      socket->close(ignored);
    }
  });
  auto on_connect = [this, socket, timer](const boost::system::error_code& ec,
                                          const asio::ip::tcp::endpoint&) {
    timer->cancel();
    if (exit_code_) return;
    if (ec) return ScheduleReconnect("connect to " + dialer_.addr() + ": " + ec.message());
    boost::system::error_code ignored;
    socket->set_option(asio::ip::tcp::no_delay(true), ignored);
    net::ConnectionOptions o;
    o.idle_timeout = milliseconds(10000);
    o.max_frame_bytes = proto::kMaxPreAuthFrameBytes;  // until welcomed
    server_ = net::Connection::Create(net::ToGeneric(std::move(*socket)), dialer_.addr(), o);
    handshake_.reset();  // an error before our hello proves nothing
    auto conn = server_;
    server_->Start([this](const json& m) { OnServerMessage(m); },
                   [this, conn](const Status& s) {
                     if (server_ != conn) return;
                     server_.reset();
                     agent_.OnServerDown(s);  // KV requests in flight: Unavailable
                     RunAgent();
                     ScheduleReconnect(s.ToString());
                   });
  };
  resolver->async_resolve(
      host, std::to_string(port),
      [this, resolver, socket, timer, on_connect](const boost::system::error_code& ec,
                                                  asio::ip::tcp::resolver::results_type results) {
        if (ec) {
          timer->cancel();
          return ScheduleReconnect("cannot resolve " + dialer_.addr() + ": " + ec.message());
        }
        asio::async_connect(*socket, results, on_connect);
      });
}

void Client::ScheduleReconnect(const std::string& why) {
  if (exit_code_) return;
  std::string hint;
  const int64_t delay_ms = dialer_.Next(&hint);
  LOG(WARNING) << "edl client " << options_.node_name << ": server connection: " << why
               << "; trying " << dialer_.addr() << " in " << delay_ms << " ms" << hint;
  reconnect_timer_.expires_after(milliseconds(delay_ms));
  reconnect_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Connect();
  });
}

void Client::OnServerMessage(const json& msg) {
  EDL_DCHECK_OWNING_THREAD(io_thread_);
  if (!agent_.connected()) return OnHandshakeFrame(msg);
  proto::ServerFrame frame;
  if (Status s = proto::DecodeServerFrame(msg, &frame); !s.ok()) {
    if (s.code() == Status::Code::kInvalidArgument) {  // a type not of the set
      LOG(WARNING) << "ignoring unexpected '" << proto::TypeOf(msg) << "' from the server";
      return;
    }
    // After the welcome every frame is sealed, so an error then is the server's.
    if (std::holds_alternative<proto::ErrorMsg>(frame)) return OnRefused(s, /*proven=*/true);
    if (std::holds_alternative<proto::GenerationUpdate>(frame)) {
      LOG(ERROR) << "bad generation from the server: " << s.ToString()
                 << "; reconnecting for a full one";
    }
    return server_->Close(s);
  }
  std::visit(Overloaded{
                 [&](const proto::ErrorMsg& e) { OnRefused(e.ToStatus(), /*proven=*/true); },
                 [&](const proto::Heartbeat&) {},
                 [&](const proto::GenerationUpdate& u) { agent_.OnGeneration(u); },
                 [&](const proto::Prepare& p) { agent_.OnPrepare(p); },
                 [&](const proto::Kill& k) {
                   agent_.OnKill(k);
                   RunAgent();
                   PollProcesses();  // report the kills at once
                 },
                 [&](const proto::JobInfo& info) { agent_.OnJobInfo(info); },
                 [&](proto::KvReply& r) { agent_.OnKvReply(std::move(r)); },
                 [&](const proto::TeacherOrder& o) { OnTeacherOrder(o); },
                 [&](const proto::ServiceMembers& m) { agent_.OnServiceMembers(m); },
                 [&](const proto::Stop&) { agent_.OnStop(); },
                 [&](const proto::Done&) { agent_.OnDone(); },
             },
             frame);
  RunAgent();
}

void Client::OnRefused(const Status& s, bool proven) {
  if (!proven) {
    // Anyone can send an unproven error (a process that took the port of a dead server): log it
    // and retry, never stop for it.
    const int refusals = dialer_.Refused();
    LOG(ERROR) << "edl client " << options_.node_name << ": " << s.ToString();
    // A client that never got in and runs nothing has nothing to protect: after a few refusals of
    // its secret it exits with the reason instead of retrying forever.
    if (!dialer_.ever_welcomed() && !agent_.has_trainers() && refusals >= 3 &&
        s.code() == Status::Code::kUnauthenticated) {
      return Shutdown(2, s.ToString() + " (3 times; check --secret_file on both sides)");
    }
    return server_->Close(s);  // reconnects with backoff
  }
  LOG(ERROR) << "edl client " << options_.node_name << ": server refused us: " << s.ToString();
  // Retrying cannot help a name taken by a connected client, a secret the server refuses, or a
  // field of ours it refuses (e.g. --advertise_addr not a host): the same hello would be refused
  // again.
  if (s.code() == Status::Code::kAlreadyExists || s.code() == Status::Code::kUnauthenticated ||
      s.code() == Status::Code::kInvalidArgument || s.code() == Status::Code::kCorruption) {
    Shutdown(2, s.ToString());
  }
}

void Client::OnHandshakeFrame(const json& msg) {
  if (handshake_ == nullptr) {  // the server's first frame: the challenge
    handshake_ = std::make_unique<net::PeerHandshake>(options_.secret, OurHello());
    json hello;
    if (Status s = handshake_->OnChallenge(msg, server_->peer(), &hello); !s.ok()) {
      return OnRefused(s, false);
    }
    server_->Send(hello);
    return;
  }
  proto::Welcome w;
  bool proven = false;
  if (Status s = handshake_->OnReply(msg, server_->peer(), &w, &proven); !s.ok()) {
    return OnRefused(s, proven);
  }
  OnWelcome(w);
}

proto::Hello Client::OurHello() {
  proto::Hello h;
  h.role = proto::Role::kClient;
  h.node = options_.node_name;
  h.host = options_.advertise_addr;
  h.mode = options_.restart_mode ? proto::NodeMode::kRestart : proto::NodeMode::kInplace;
  h.slots = options_.slots;
  h.node_token = session_.token();
  for (const auto& [name, type] : options_.job_types) h.job_types.push_back({name, type.settable});
  if (TeacherRunner* r = Teachers()) {
    h.services = r->Services();
    h.teacher_slots = r->slots();
    h.teachers = r->Running();
  }
  agent_.FillHello(&h);
  return h;
}

void Client::OnWelcome(const proto::Welcome& w) {
  // welcome is the server's last unsealed frame and our hello was our last one.
  server_->StartSession(handshake_->TakeSession(), proto::kMaxFrameBytes);
  handshake_.reset();
  dialer_.Welcomed();
  session_.Keep(w.node_token);
  heartbeat_ms_ = w.heartbeat_ms;
  server_->SetIdleTimeout(milliseconds(std::max(10000, 10 * heartbeat_ms_)));
  agent_.OnServerUp(w);  // the outbox and the service watches follow
  RunAgent();
  Heartbeat();
}

void Client::SendIfConnected(const json& msg) {
  if (server_ && agent_.connected()) server_->Send(msg);
}

void Client::Heartbeat() {
  heartbeat_timer_.expires_after(milliseconds(heartbeat_ms_));
  heartbeat_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || exit_code_) return;
    SendIfConnected(proto::Heartbeat().Encoded());
    if (server_ && agent_.connected()) SendNodeStats();
    Heartbeat();
  });
}

void Client::SendNodeStats() {
  proto::NodeStats st;
  if (stats_.Sample(&st)) server_->Send(st.Encoded());
}

// ---- the agent's actions and the processes

void Client::RunAgent() {
  for (const AgentAction& a : agent_.TakeActions()) Execute(a);
}

void Client::Execute(const AgentAction& a) {
  using Kind = AgentAction::Kind;
  auto proc = procs_.find(a.id);
  switch (a.kind) {
    case Kind::kStartTrainer:
    case Kind::kStartSpare:
      return StartProcess(a);
    case Kind::kHandOverSpare:
      return HandOverSpare(a);
    case Kind::kTerminate:
      if (proc != procs_.end()) proc->second->Terminate();
      return;
    case Kind::kKill:
      if (proc != procs_.end()) proc->second->Kill();
      return;
    case Kind::kProbeStopped:
      if (proc != procs_.end() && ProcessStopped(proc->second->pid())) {
        agent_.OnProcessStopped(a.id);
        RunAgent();
      }
      return;
    case Kind::kSendServer:
      if (server_) server_->Send(a.frame);
      return;
    case Kind::kCloseServer:
      if (server_) server_->Close(a.status);
      return;
    case Kind::kSendChannel:
      return trainer_socket_.Send(a.channel, a.frame);
    case Kind::kSendAndCloseChannel:
      return trainer_socket_.SendAndClose(a.channel, a.frame, a.status);
    case Kind::kCloseChannel:
      return trainer_socket_.Close(a.channel, a.status);
    case Kind::kSetChannelIdle:
      return trainer_socket_.SetIdleTimeout(a.channel, milliseconds(a.idle_ms));
    case Kind::kShutdown:
      return Shutdown(a.code, a.why);
  }
}

void Client::StartProcess(const AgentAction& a) {
  if (exit_code_) return;  // nothing starts once the client stops
  StatusOr<std::unique_ptr<launcher::TrainerProcess>> p =
      procs_.count(a.id) ? StatusOr<std::unique_ptr<launcher::TrainerProcess>>(
                               Status::AlreadyExists("a process of id " + a.id + " runs here"))
                         : launcher_->Start(a.spec);
  if (!p.ok()) {
    agent_.OnProcessStartFailed(a.id, p.status());
  } else {
    const int pid = p.value()->pid();
    procs_.emplace(a.id, std::move(p.value()));
    agent_.OnProcessStarted(a.id, pid);
  }
  RunAgent();
}

void Client::HandOverSpare(const AgentAction& a) {
  trainer_socket_.SendAndClose(a.channel, a.frame, Status::OK());
  // The log continues under the trainer's name (the open file is the same).
  if (std::rename(a.from_log.c_str(), a.to_log.c_str()) != 0) {
    PLOG(WARNING) << "spare " << a.id << ": cannot rename its log " << a.from_log << " to "
                  << a.to_log;
  }
  auto spare = procs_.find(a.id);
  if (spare == procs_.end() || procs_.count(a.to_id)) {
    agent_.OnProcessStartFailed(a.to_id,
                                Status::Internal("spare " + a.id + " has no process to hand over"));
    return RunAgent();
  }
  std::unique_ptr<launcher::TrainerProcess> p = std::move(spare->second);
  procs_.erase(spare);
  procs_.emplace(a.to_id, std::move(p));
}

void Client::PollProcesses() {
  std::vector<ProcessExit> exits;
  for (auto& [id, p] : procs_) {
    ProcessExit e;
    if (!p->Poll(&e.info)) continue;
    e.id = id;
    e.last_log_line = LastLogLine(options_.log_dir + "/" + id + ".log", proto::kMaxErrorLineBytes);
    exits.push_back(std::move(e));
  }
  if (exits.empty()) return;
  for (const ProcessExit& e : exits) procs_.erase(e.id);
  agent_.OnProcessesExited(exits);
  RunAgent();
}

void Client::Tick() {
  EDL_DCHECK_OWNING_THREAD(io_thread_);
  if (exit_code_) return;
  PollProcesses();
  PollTeachers();
  agent_.Tick(clock_->NowMicros());
  RunAgent();
  if (exit_code_) return;  // the agent shut the client down (the job finished)
  tick_timer_.expires_after(milliseconds(options_.tick_ms));
  tick_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Tick();
  });
}

}  // namespace edl::jobclient
