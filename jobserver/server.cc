#include "jobserver/server.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>

#include <glog/logging.h>

#include "edl/base/enum_names.h"
#include "edl/ckpt/checkpoint_store.h"
#include "edl/net/auth.h"
#include "edl/proto/fields.h"
#include "edl/proto/frame.h"
#include "edl/proto/frames.h"
#include "edl/proto/messages.h"
#include "jobserver/events/events.h"
#include "jobserver/server_peer.h"
#include "jobserver/state/etcd_state.h"

namespace edl::jobserver {

namespace asio = boost::asio;
using asio::ip::tcp;
using nlohmann::json;
using std::chrono::milliseconds;

namespace {

// How long a shutdown waits for the farewell frames (Stop, Done) to reach the clients.
constexpr milliseconds kFarewellDrain{2000};
// True for an address of this machine only: 127.0.0.0/8, ::1 (also IPv4-mapped), "localhost".
bool IsLoopback(const std::string& host) {
  boost::system::error_code ec;
  const asio::ip::address a = asio::ip::make_address(host, ec);
  if (ec) return host == "localhost";
  if (a.is_v6() && a.to_v6().is_v4_mapped()) {
    return asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6()).is_loopback();
  }
  return a.is_loopback();
}

// A client on another machine that advertises a loopback address would have every other node's
// trainers dial themselves and the job hang in rendezvous (docs/SSH.md, "Without ssh"):
// refused, naming the fix. `peer` is the connection's "address:port".
Status CheckAdvertisedHost(const std::string& node, const std::string& host,
                           const std::string& peer) {
  const std::string source = peer.substr(0, peer.rfind(':'));
  if (!IsLoopback(host) || IsLoopback(source)) return Status::OK();
  return Status::InvalidArgument(
      "node " + node + " advertises the loopback address " + host + " but connects from " + source +
      ": trainers on other nodes could not reach its trainers; start its client with "
      "--advertise_addr set to the node's address that the other nodes reach (EDL_ADVERTISE_ADDR "
      "for scripts/start_job_client.sh)");
}
}  // namespace

Server::Server(asio::io_context* io, ServerOptions options, Clock* clock)
    : io_(io),
      options_(std::move(options)),
      clock_(clock),
      acceptor_(*io),
      tick_timer_(*io),
      cluster_(options_.cluster, clock),
      services_(clock,
                [this](uint64_t id, const json& m) {
                  for (auto& [p, peer] : peers_) {
                    if (peer->id == id) peer->conn->Send(m);
                  }
                }),
      kv_(options_.kv) {}

Server::~Server() = default;

Status Server::Start() {
  EDL_DCHECK_OWNING_THREAD(io_thread_);
  if (!options_.scale_script.empty()) {
    ScalingScript s;
    EDL_RETURN_IF_ERROR(ScalingScript::Load(options_.scale_script, &s));
    script_ = std::move(s);
  }
  if (options_.demo_policy) {
    demo_.emplace(options_.demo);
    cluster_.SetDesired(demo_->initial_size(), "policy");
  }
  EDL_RETURN_IF_ERROR(events_.Open(options_.events_dir, options_.id, clock_, &metrics_));
  EDL_RETURN_IF_ERROR(OpenState());
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(options_.bind, ec);
  if (ec) return Status::InvalidArgument("--bind " + options_.bind + " is not an IP address");
  const tcp::endpoint ep(addr, static_cast<uint16_t>(options_.port));
  const std::string what = options_.bind + ":" + std::to_string(options_.port);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return FromErrorCode("listen on " + what, ec)
        .WithContext("is another edl server running? pick another --server_port");
  }
  port_ = acceptor_.local_endpoint().port();
  if (!options_.http.addr
           .empty()) {  // the read-only HTTP endpoint, up before the port file says the server is
    http_ = std::make_unique<HttpEndpoint>(io_, options_.http, &metrics_,
                                           [this] { return StatusBody(); });
    EDL_RETURN_IF_ERROR(http_->Start());
  }
  LOG(INFO) << "edl server " << options_.id
            << (cluster_.own_job().empty() ? " (a cluster of submitted jobs)" : "")
            << " listening on " << options_.bind << ":" << port_ << "; events in "
            << events_.path();
  if (!options_.port_file.empty()) {
    const std::string tmp = options_.port_file + ".tmp";
    std::ofstream(tmp) << port_ << "\n";
    if (std::rename(tmp.c_str(), options_.port_file.c_str()) != 0) {
      return PosixError("--port_file " + options_.port_file, errno);
    }
  }
  Record("", events::ServerStarted{port_});
  Accept();
  Tick();
  return Status::OK();
}

Status Server::OpenState() {
  if (!options_.checkpoint_dir.empty()) {
    ckpt::RocksDbStoreOptions co;
    co.dir = options_.checkpoint_dir;
    std::vector<ckpt::CheckpointMeta> metas;
    Status s = ckpt::OpenRocksDbStore(co)->List(&metas);
    if (s.ok() && !metas.empty()) {
      int64_t newest = 0;
      for (const auto& m : metas) newest = std::max(newest, m.generation);
      cluster_.RaiseGenerationFloor(newest);
      LOG(INFO) << "checkpoint store " << options_.checkpoint_dir << " holds generations up to "
                << newest
                << ": new generations are numbered above it (its fence then accepts their saves)";
    } else if (!s.ok() && !s.IsNotFound()) {
      return s.WithContext(
          "--checkpoint_dir (read at start to number generations above its newest)");
    }
  }
  if (options_.state_dir.empty() && options_.state_store.empty()) {
    LOG(WARNING)
        << "no --state_dir: the state is kept in memory only; a restarted server starts anew and "
           "ignores the running trainers";
    return Status::OK();
  }
  state_ = std::make_unique<StateStore>();
  bool created = false;
  if (options_.state_store.empty()) {
    EDL_RETURN_IF_ERROR(OpenStateDir(&created));
  } else {
    // A standby waits here, not listening, until it leads (STATE.md "Standby servers").
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    EtcdStateOptions eo{options_.state_store, options_.id, options_.lease_ttl_s,
                        std::string(host) + " " + options_.bind + ":" +
                            std::to_string(options_.port) + " pid " + std::to_string(::getpid()),
                        options_.stop_requested};
    std::unique_ptr<StateBackend> backend;
    EDL_RETURN_IF_ERROR(BecomeEtcdLeader(
        eo,
        [this](const Status& why) {
          asio::post(*io_, [this, why] {
            LOG(ERROR) << "edl server: lost the leadership of "
                       << (cluster_.own_job().empty() ? "the cluster " : "job ") << options_.id
                       << ": " << why.ToString()
                       << "; stopping (fail-stop; the trainers keep running and the new leader "
                          "adopts them)";
            failed_ = true;
            Shutdown(/*stop_clients=*/false);
          });
        },
        &backend));
    state_->Open(std::move(backend));
  }
  state_writer_ = std::make_unique<ClusterStateWriter>(state_.get());
  ClusterState st;
  bool found = false, migrated = false;
  EDL_RETURN_IF_ERROR(state_writer_->Load(cluster_.own_job(), &st, &found, &migrated));
  const std::string& own = cluster_.own_job();
  const std::string what = own.empty() ? "the cluster" : "job " + own;
  if (!found) {
    LOG(INFO) << "no state for " << what << " in " << state_->dir()
              << (created ? " (a new state directory)" : "") << ": "
              << (own.empty() ? "starting with no jobs" : "starting a new job");
    if (own.empty()) {
      Record("", events::NewCluster{options_.state_dir, options_.state_store});
    } else {
      Record("", events::NewJob{options_.state_dir, options_.state_store});
    }
  } else {
    LOG(INFO) << "resuming " << what << " from " << state_->dir() << ": " << st.jobs.size()
              << " live job(s), " << st.nodes.size() << " node(s), " << st.ended.size()
              << " ended job(s)"
              << (migrated ? "; the state was in the old one-job layout: read once, rewritten in "
                             "the current one"
                           : "");
    if (migrated) Record("", events::StateMigrated{state_->dir()});
    EDL_RETURN_IF_ERROR(cluster_.Restore(st));
    if (auto j = st.jobs.find(own);
        j != st.jobs.end()) {  // the one job's scaling sources and their clock
      const JobState& js = j->second.sched;
      if (script_) script_->Resume(js.script_next, js.script_offset_us);
      if (demo_) demo_->Resume(js.demo_size, js.demo_steps);
      if (js.clock_started) first_generation_us_ = clock_->NowMicros() - js.scale_elapsed_us;
    }
  }
  RestoreServices(st.services);
  return Persist() ? Status::OK() : Status::IOError("cannot write the state to " + state_->dir());
}

Status Server::OpenStateDir(bool* created) {
  const std::string& dir = options_.state_dir;
  const std::string what = (cluster_.own_job().empty() ? "the cluster " : "job ") + options_.id;
  // How often a standby looks at the lock: a takeover starts within this of the leader's exit.
  constexpr auto kStandbyPoll = std::chrono::milliseconds(20);
  int64_t seen_leader = -1;
  const auto waited_since = std::chrono::steady_clock::now();
  for (;;) {
    const int64_t holder = options_.standby ? StateDirHolder(dir) : -1;
    if (holder < 0) {
      const Status s = state_->Open(dir, created);
      // Another standby may have taken the directory between the look and the open: wait for it.
      if (s.ok() || !options_.standby || StateDirHolder(dir) < 0) {
        if (s.ok() && seen_leader >= 0) {
          LOG(INFO) << "edl server: standby for " << what << " takes over --state_dir " << dir
                    << " "
                    << std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::steady_clock::now() - waited_since)
                           .count()
                    << " ms after it started waiting (the leader, pid " << seen_leader
                    << ", is gone)";
        }
        return s;
      }
      continue;
    }
    if (holder != seen_leader) {
      seen_leader = holder;
      LOG(INFO)
          << "standby for " << what << ": the leader is pid " << holder
          << (holder == 0 ? " (on another host)" : "") << ", which holds --state_dir " << dir
          << "; this server takes over the moment that process ends. Not listening until then";
    }
    if (options_.stop_requested && options_.stop_requested()) {
      return Status::Aborted("stopped while a standby for " + what);
    }
    std::this_thread::sleep_for(kStandbyPoll);
  }
}

bool Server::Persist() {
  if (!state_) return true;
  const int64_t now = clock_->NowMicros();
  ClusterState st;
  cluster_.Snapshot(&st);
  placer_.Snapshot(&st.services);
  if (auto j = st.jobs.find(cluster_.own_job()); j != st.jobs.end()) {
    JobState& js = j->second.sched;
    js.clock_started = first_generation_us_ >= 0;
    js.scale_elapsed_us =
        js.clock_started ? std::max<int64_t>(0, now - first_generation_us_ - paused_us_) : 0;
    if (script_) {
      js.script_next = script_->position();
      js.script_offset_us = script_->offset_us();
    }
    if (demo_) {
      js.demo_size = demo_->size();
      js.demo_steps = demo_->steps_done();
    }
  }
  const Status s = state_writer_->Save(st);
  last_persist_us_ = now;
  if (s.ok()) return true;
  LOG(ERROR)
      << "edl server: " << s.ToString()
      << "; stopping without sending the change (the trainers keep running; restart the server "
         "once "
      << state_->dir() << " is writable and it resumes from the last state kept)";
  failed_ = true;
  Shutdown(/*stop_clients=*/false);
  return false;
}

void Server::Shutdown(bool stop_clients) {
  if (!stop_clients) return ShutdownWith(nullptr);
  const nlohmann::json stop = proto::Stop().Encoded();
  ShutdownWith(&stop);
}

void Server::ShutdownWith(const nlohmann::json* farewell) {
  EDL_DCHECK_OWNING_THREAD(io_thread_);
  if (shutting_down_) return;
  shutting_down_ = true;
  boost::system::error_code ec;
  acceptor_.close(ec);
  if (http_) http_->Stop();
  tick_timer_.cancel();
  auto peers = peers_;
  auto draining = std::make_shared<std::vector<std::shared_ptr<net::Connection>>>();
  for (auto& [raw, peer] : peers) {
    if (farewell != nullptr && peer->state == Peer::State::kClient) {
      // Close() would drop a frame still queued: the client would never learn it (a client of a
      // finished job then retried a vanished server for ever).
      peer->conn->SendAndClose(*farewell, Status::Aborted("server shutting down"));
      draining->push_back(peer->conn);
    } else {
      peer->conn->Close(Status::Aborted("server shutting down"));
    }
  }
  // Stop the loop once every farewell is written (SendAndClose bounds each at 1 s), polling.
  auto timer = std::make_shared<asio::steady_timer>(*io_);
  const auto give_up = std::chrono::steady_clock::now() + kFarewellDrain;
  timer->expires_after(milliseconds(farewell != nullptr ? 10 : 50));
  timer->async_wait([this, timer, draining, give_up](const boost::system::error_code&) {
    StopWhenDrained(timer, draining, give_up);
  });
}

void Server::StopWhenDrained(
    std::shared_ptr<asio::steady_timer> timer,
    std::shared_ptr<std::vector<std::shared_ptr<net::Connection>>> draining,
    std::chrono::steady_clock::time_point give_up) {
  const bool drained =
      std::all_of(draining->begin(), draining->end(), [](const auto& c) { return c->closed(); });
  if (drained || std::chrono::steady_clock::now() >= give_up) {
    io_->stop();
    return;
  }
  timer->expires_after(milliseconds(10));
  timer->async_wait([this, timer, draining, give_up](const boost::system::error_code&) {
    StopWhenDrained(timer, draining, give_up);
  });
}

// ---- connections

void Server::Accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
    if (shutting_down_) return;
    if (ec) {
      LOG(WARNING) << "accept: " << ec.message();
      if (ec == asio::error::no_descriptors) {
        // Out of file descriptors: back off instead of spinning; existing peers keep working.
        auto t = std::make_shared<asio::steady_timer>(*io_, milliseconds(100));
        t->async_wait([this, t](const boost::system::error_code&) { Accept(); });
        return;
      }
    } else {
      OnAccepted(std::move(socket));
    }
    Accept();
  });
}

void Server::OnAccepted(tcp::socket socket) {
  EDL_DCHECK_OWNING_THREAD(io_thread_);
  boost::system::error_code ec;
  const auto remote = socket.remote_endpoint(ec);
  const std::string source = ec ? "unknown" : remote.address().to_string();
  const std::string name = ec ? "unknown peer" : source + ":" + std::to_string(remote.port());
  socket.set_option(tcp::no_delay(true), ec);
  net::ConnectionOptions o;
  o.idle_timeout = milliseconds(options_.handshake_timeout_ms);  // until authenticated
  o.max_frame_bytes = proto::kMaxPreAuthFrameBytes;              // a hello is small
  auto peer = std::make_shared<Peer>();
  peer->conn = net::Connection::Create(net::ToGeneric(std::move(socket)), name, o);
  peer->handshake = std::make_unique<net::ServerHandshake>(options_.secret);
  // Room for this one among the pre-auth connections: the oldest pending one may have to go.
  const uint64_t evict = admission_.Admit(reinterpret_cast<uintptr_t>(peer.get()), source);
  if (evict != 0) {
    metrics_.FrameRefused(FrameRefusal::kEvicted);
    auto it = peers_.find(reinterpret_cast<Peer*>(evict));
    if (it != peers_.end()) {
      auto old = it->second;  // Close() runs OnClose, which erases the map entry
      old->conn->Close(Status::Unavailable(
          "too many unauthenticated connections (" + std::to_string(admission_.limits().max_total) +
          " in all, " + std::to_string(admission_.limits().max_per_source) +
          " per address): dropped the oldest to admit a new one"));
    }
  }
  peer->id = next_peer_id_++;
  peers_[peer.get()] = peer;
  metrics_.ConnectionOpened();
  std::weak_ptr<Peer> weak = peer;
  peer->conn->Start(
      [this, weak](const json& m) {
        if (auto p = weak.lock()) OnMessage(p, m);
      },
      [this, weak](const Status& s) {
        if (auto p = weak.lock()) OnClose(p, s);
      });
  peer->conn->Send(peer->handshake->Challenge());
}

void Server::OnClose(const std::shared_ptr<Peer>& peer, const Status& why) {
  EDL_DCHECK_OWNING_THREAD(io_thread_);
  if (peer->conn->handler_failed())
    metrics_.FrameRefused(FrameRefusal::kHandlerError);  // logged there
  if (peer->state == Peer::State::kClient) {
    LOG(WARNING) << "client of node " << peer->node << " (" << peer->conn->peer()
                 << ") disconnected: " << why.ToString();
    auto it = nodes_.find(peer->node);
    if (it != nodes_.end() && it->second == peer) {
      nodes_.erase(it);
      placer_.NodeDown(peer->node);
      cluster_.NodeDisconnected(peer->node);
      Record("", events::NodeDisconnected{peer->node, why.ToString()});
      // Stopping: a node that went away takes its trainers with it.
      for (auto w = stop_waiting_.begin(); w != stop_waiting_.end();) {
        w = w->second == peer->node ? stop_waiting_.erase(w) : std::next(w);
      }
      MaybeEndStop();
    }
  } else if (peer->state == Peer::State::kAuth && !why.IsAborted()) {
    LogUnauthenticated("dropped unauthenticated connection from " + peer->conn->peer() + ": " +
                       why.ToString());
  } else if (!why.IsAborted() && why.code() != Status::Code::kUnavailable) {
    // A ctl, teacher or student connection closed for a reason of its own (a frame that failed
    // its session MAC, a bad frame, a read error), not because the peer left (Unavailable) or we
    // closed it (Aborted): say why, as for a client.
    LOG(WARNING) << (peer->state == Peer::State::kCtl ? "ctl" : "service peer")
                 << " connection from " << peer->conn->peer() << " closed: " << why.ToString();
  }
  admission_.Remove(reinterpret_cast<uintptr_t>(peer.get()));
  services_.Remove(peer->id);
  const size_t waits = kv_.CancelOwner(peer->id);  // nobody left to answer
  if (waits > 0) VLOG(1) << "dropped " << waits << " kv waits of " << peer->conn->peer();
  peers_.erase(peer.get());
  metrics_.ConnectionClosed();
  Dispatch();
}

void Server::Reject(const std::shared_ptr<Peer>& peer, const Status& why) {
  const std::string line = "rejecting " + peer->conn->peer() + ": " + why.ToString();
  metrics_.FrameRefused(peer->state == Peer::State::kAuth ? FrameRefusal::kUnauthenticated
                                                          : FrameRefusal::kInvalid);
  if (peer->state == Peer::State::kAuth) {
    LogUnauthenticated(line);
  } else {
    LOG(WARNING) << line;
  }
  json j;
  proto::ErrorMsg::From(why).EncodeTo(&j);
  peer->conn->SendAndClose(j, why);
}

void Server::LogUnauthenticated(const std::string& line) {
  size_t suppressed = 0;
  if (!unauth_log_.Allow(std::chrono::steady_clock::now(), &suppressed)) return;
  LOG(WARNING) << line
               << (suppressed == 0 ? ""
                                   : " (" + std::to_string(suppressed) +
                                         " similar lines about unauthenticated peers suppressed)");
}

void Server::OnMessage(const std::shared_ptr<Peer>& peer, const json& msg) {
  EDL_DCHECK_OWNING_THREAD(io_thread_);
  const std::string& type = proto::TypeOf(msg);
  switch (peer->state) {
    case Peer::State::kAuth:
      OnHello(peer, msg);
      break;
    case Peer::State::kClient:
      OnClientMessage(peer, msg);
      break;
    case Peer::State::kService:
      if (Status s = services_.OnMessage(peer->id, type, msg); !s.ok()) return Reject(peer, s);
      break;
    case Peer::State::kCtl:
      if (type != proto::msg::kCtl) {
        Reject(peer, Status::InvalidArgument("ctl connections send only 'ctl' messages, got '" +
                                             type + "'"));
        return;
      }
      OnCtl(peer, msg);
      break;
  }
  Dispatch();
}

void Server::OnHello(const std::shared_ptr<Peer>& peer, const json& msg) {
  net::ServerHandshake& hs = *peer->handshake;
  proto::Hello hello;
  Status s = hs.OnHello(msg, peer->conn->peer(), &hello);
  // A refusal after the hello's MAC verified carries our proof, so the peer can trust it; before
  // that the peer gets no further, whatever else it sent.
  auto refuse = [&](const Status& why) {
    if (hs.proven()) {
      LOG(WARNING) << "refusing " << peer->conn->peer() << ": " << why.ToString();
    } else {
      LogUnauthenticated("rejecting " + peer->conn->peer() + ": " + why.ToString());
    }
    peer->conn->SendAndClose(hs.Refusal(why), why);
  };
  if (!s.ok()) return refuse(s);
  admission_.Remove(reinterpret_cast<uintptr_t>(peer.get()));
  proto::Welcome w;
  w.job_id = options_.id;
  w.heartbeat_ms = static_cast<int>(std::max<int64_t>(50, heartbeat_timeout_ms() / 5));
  // The welcome is our last unsealed frame (the hello was the peer's): seal everything after it.
  auto welcome = [&] {
    peer->conn->Send(hs.Welcome(w));
    peer->conn->StartSession(hs.TakeSession(), proto::kMaxFrameBytes);
    peer->handshake.reset();
  };
  if (hello.role == proto::Role::kTeacher ||
      hello.role == proto::Role::kStudent) {  // service_registry.h
    uint64_t replaced = 0;
    if (s = services_.Attach(peer->id, hello, &replaced); !s.ok()) return refuse(s);
    peer->state = Peer::State::kService;
    peer->conn->SetIdleTimeout(
        milliseconds(hello.role == proto::Role::kTeacher ? heartbeat_timeout_ms() : 0));
    welcome();
    services_.Welcomed(peer->id);
    std::shared_ptr<Peer> old;  // a re-registered teacher's previous connection
    for (auto& [p, other] : peers_) {
      if (replaced != 0 && other->id == replaced) old = other;
    }
    if (old) old->conn->Close(Status::Aborted("replaced by a new registration of the teacher"));
    return;
  }
  if (hello.role == proto::Role::kCtl) {
    peer->state = Peer::State::kCtl;
    peer->conn->SetIdleTimeout(milliseconds(0));
    welcome();
    return;
  }
  s = CheckAdvertisedHost(hello.node, hello.host, peer->conn->peer());
  // A session token for a node the cluster does not know: the node was dropped (lost past the
  // heartbeat timeout, e.g. its client was stopped) or the server started anew. The welcome says
  // so.
  w.dropped = !hello.node_token.empty() && cluster_.registry().SessionOf(hello.node).empty();
  if (s.ok()) s = AttachNode(peer, hello, &w.node_token);
  if (s.ok() && w.dropped) {
    Record("", events::NodeDroppedRejoins{hello.node, hello.trainers.size()});
  }
  if (!s.ok()) {
    refuse(s);
    return;
  }
  welcome();
  placer_.NodeUp(hello.node, hello.services, hello.teacher_slots, hello.teachers,
                 clock_->NowMicros());
  LOG(INFO) << "node " << hello.node << " registered from " << peer->conn->peer() << " ("
            << hello.slots.size() << " slots, " << proto::NameOf(hello.mode) << " mode, host "
            << hello.host << ")";
  SendJobsTo(peer);
}

Status Server::AttachNode(const std::shared_ptr<Peer>& peer, const proto::Hello& hello,
                          std::string* session) {
  EDL_RETURN_IF_ERROR(cluster_.CheckAdmission(hello.node, hello.node_token));
  auto old = nodes_.find(hello.node);
  if (old != nodes_.end()) {
    // The node's own client proved its session from a new connection: the old one is stale (a
    // half-dead TCP connection, or the client restarted). The new one replaces it.
    std::shared_ptr<Peer> prev = old->second;
    nodes_.erase(old);
    cluster_.NodeDisconnected(hello.node);
    LOG(WARNING) << "node " << hello.node << " re-attached from " << peer->conn->peer()
                 << "; closing its old connection from " << prev->conn->peer();
    prev->conn->Close(Status::Aborted("replaced by a new connection of node " + hello.node));
  }
  ClusterNode n;
  n.name = hello.node;
  n.host = hello.host;
  n.restart_mode = hello.mode == proto::NodeMode::kRestart;
  n.slots = hello.slots;
  for (const proto::JobTypeDecl& t : hello.job_types) {
    n.types.push_back({t.name, std::set<std::string>(t.settable.begin(), t.settable.end())});
  }
  bool known = false;
  EDL_RETURN_IF_ERROR(
      cluster_.AddNode(n, hello.trainers, hello.trainer_generations, session, &known));
  peer->state = Peer::State::kClient;
  peer->node = hello.node;
  peer->conn->SetIdleTimeout(milliseconds(heartbeat_timeout_ms()));
  nodes_[hello.node] = peer;
  return Status::OK();
}

void Server::SendJobsTo(const std::shared_ptr<Peer>& peer) {
  for (const std::string& job : cluster_.JobsFor(peer->node)) {
    const JobMembership* m = cluster_.FindJob(job);
    if (m == nullptr || m->current().generation == 0) continue;
    // A finished job sends `done` only: its last generation lists members that exited, which a
    // client would start again (a restarted client, or any client of a restarted server).
    if (m->done()) {
      if (job == cluster_.own_job()) peer->conn->Send(proto::Done().Encoded());
      continue;
    }
    // The newest generation, in full, unless a commit queued by AddNode is about to carry it.
    TellJob(peer, job);
    json j;
    proto::GenerationUpdate::Full(m->current()).EncodeTo(&j);
    peer->conn->Send(j);
    peer->job_generation[job] = m->current().generation;
  }
}

void Server::TellJob(const std::shared_ptr<Peer>& peer, const std::string& job) {
  if (peer->job_generation.count(job)) return;
  const JobSpec* spec = cluster_.FindSpec(job);
  if (spec != nullptr) {  // the one job has none: its welcome named it
    proto::JobInfo info;
    info.job_id = job;
    info.job_type = spec->job.type;
    info.flags = spec->flags;
    json j;
    info.EncodeTo(&j);
    peer->conn->Send(j);
  }
  peer->job_generation[job] = 0;
}

bool Server::Authorized(const std::shared_ptr<Peer>& peer, const char* what,
                        const std::string& trainer_id, std::string* job) {
  if (cluster_.Authorized(trainer_id, peer->node, job)) return true;
  metrics_.FrameRefused(FrameRefusal::kNotPlaced);
  // Not closed: an honest client may still hold a report queued across a server restart (ids of
  // the previous server); dropping the frame costs nothing, closing would make it reconnect.
  if (LogThis(++peer->refused)) {
    LOG(WARNING) << "refused '" << what << "' from node " << peer->node << " ("
                 << peer->conn->peer() << ") about trainer " << trainer_id
                 << ": not placed on that node; a node reports only its own "
                 << "trainers (" << peer->refused << " refused so far)";
  }
  return false;
}

void Server::OnEvent(const std::shared_ptr<Peer>& peer, const proto::Event& e,
                     const std::string& job) {
  // Nodes write trainer events only: no other record type, a bounded payload, a bounded rate.
  std::string why;
  const auto t = e.event.find("type");
  if (t != e.event.end() && *t != events::NameOf(events::Type::kTrainerEvent)) {
    why = "sets record type " +
          t->dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 64) +
          "; nodes write only 'trainer_event'";
  } else if (const size_t n = e.event.dump(-1, ' ', false, json::error_handler_t::replace).size();
             n > options_.max_event_bytes) {
    why = "is " + std::to_string(n) + " bytes; the limit is " +
          std::to_string(options_.max_event_bytes);
  } else {
    const int64_t now = clock_->NowMicros();
    double& tokens = peer->event_tokens;
    tokens = tokens < 0 ? options_.event_burst
                        : std::min(options_.event_burst,
                                   tokens + MicrosToSeconds(now - peer->event_tokens_us) *
                                                options_.events_per_second);
    peer->event_tokens_us = now;
    if (tokens < 1) {
      why = "passes the rate of " + std::to_string(static_cast<int>(options_.events_per_second)) +
            " events a second (bursts of " +
            std::to_string(static_cast<int>(options_.event_burst)) + ")";
    } else {
      tokens -= 1;
    }
  }
  const auto* malformed = std::get_if<proto::ev::Malformed>(&e.body);
  if (why.empty() && malformed != nullptr)
    why = "is not a valid event: " + malformed->why.message();
  if (!why.empty()) {
    metrics_.FrameRefused(malformed != nullptr ? FrameRefusal::kMalformedEvent
                                               : FrameRefusal::kEventLimit);
    if (LogThis(++peer->refused)) {
      LOG(WARNING) << "dropped an event of trainer " << e.trainer_id << " from node " << peer->node
                   << ": it " << why << " (" << peer->refused << " refused so far)";
    }
    return;
  }
  cluster_.TrainerEvent(job, e.trainer_id, peer->node, e.body);  // what ctl status shows of it
  metrics_.TrainerEvent(job, e.body);
  AppendRecord(job, events::TrainerEvent{e.event, e.trainer_id, peer->node}.ToJson());
}

void Server::OnClientMessage(const std::shared_ptr<Peer>& peer, const json& msg) {
  cluster_.Heartbeat(peer->node);  // any frame proves the node alive
  metrics_.NodeHeard(peer->node);
  proto::ClientFrame frame;
  if (Status s = proto::DecodeClientFrame(msg, &frame); !s.ok()) return Reject(peer, s);
  // A report about one trainer is acted on only when authorised: its job placed it on this node.
  std::string job;  // the trainer's job
  std::visit(Overloaded{
                 [&](const proto::Heartbeat&) {
                   peer->conn->Send(proto::Heartbeat().Encoded());  // proves the server alive
                 },
                 [&](const proto::TeacherOrder& exit) { OnTeacherExit(peer, exit); },
                 [&](const proto::ServiceWatch& w) {  // for the node's distilling trainers
                   if (Status s = services_.Watch(peer->id, w.service);
                       !s.ok() && LogThis(++peer->refused)) {
                     LOG(WARNING) << "service_watch from node " << peer->node
                                  << " refused: " << s.ToString();
                   }
                 },
                 [&](const proto::KvRequest& r) { OnKv(peer, r); },
                 [&](const proto::NodeStats& st) {
                   metrics_.NodeStatsReported(peer->node, st);
                   cluster_.SetNodeStats(peer->node, st);
                 },
                 [&](const proto::TrainerExit& exit) {
                   if (!Authorized(peer, proto::msg::kTrainerExit, exit.trainer_id, &job)) return;
                   const std::string how = exit.exited ? "exit " + std::to_string(exit.code)
                                                       : "signal " + std::to_string(exit.signal);
                   cluster_.TrainerExited(exit.trainer_id, peer->node, exit.success(), how,
                                          exit.error);
                   status_dirty_ = true;
                   if (stop_waiting_.erase(exit.trainer_id) > 0) MaybeEndStop();
                 },
                 [&](const proto::Ready& ready) {
                   if (!Authorized(peer, proto::msg::kReady, ready.trainer_id, &job)) return;
                   cluster_.TrainerReady(ready.trainer_id, peer->node, ready.generation);
                 },
                 [&](const proto::Progress& progress) {
                   if (!Authorized(peer, proto::msg::kProgress, progress.trainer_id, &job)) return;
                   cluster_.Progress(job, progress.trainer_id,
                                     progress.report);  // kept for live trainers only
                   if (script_ && job == options_.id)
                     script_->ObserveStep(progress.report.step);  // `step N` lines (scaling.h)
                   status_dirty_ = true;
                 },
                 [&](const proto::Event& event) {
                   if (!Authorized(peer, proto::msg::kEvent, event.trainer_id, &job)) return;
                   OnEvent(peer, event, job);
                 },
             },
             frame);
}

void Server::OnKv(const std::shared_ptr<Peer>& peer, const proto::KvRequest& r) {
  std::weak_ptr<net::Connection> weak = peer->conn;
  const uint64_t req_id = r.req_id;
  auto reply = [weak, req_id](const Status& st, const std::string& value) {
    auto conn = weak.lock();
    if (!conn) return;
    proto::KvReply rep;
    rep.req_id = req_id;
    rep.status = st;
    rep.value = value;
    json j;
    rep.EncodeTo(&j);
    conn->Send(j);
  };
  // Keys are scoped by the trainer's job, which must hold a slot on this node (the job the welcome
  // named when the request names none).
  const std::string scope = r.job.empty() ? options_.id : r.job;
  if (!cluster_.Hosts(peer->node, scope)) {
    if (LogThis(++peer->refused)) {
      LOG(WARNING) << "kv " << proto::NameOf(r.op) << " from node " << peer->node
                   << " refused: job '" << r.job << "' has no slot on that node";
    }
    return reply(
        Status::FailedPrecondition("kv: job '" + r.job + "' has no slot on node " + peer->node),
        "");
  }
  const std::string key = scope + "/" + r.key;
  Status st;
  switch (r.op) {
    case proto::KvOp::kSet:
      st = kv_.Set(key, r.value);
      reply(st, "");
      break;
    case proto::KvOp::kGet: {
      std::string v;
      st = kv_.Get(key, &v);
      reply(st.ok() ? st : Status::NotFound("kv key '" + r.key + "' is not set"), v);
      st = Status::OK();
      break;
    }
    case proto::KvOp::kWait:
      st = kv_.Wait(key, clock_->NowMicros() + r.timeout_ms * 1000, peer->id, reply);
      if (!st.ok()) reply(st, "");
      break;
  }
  if (!st.ok() && LogThis(++peer->refused)) {
    LOG(WARNING) << "kv " << proto::NameOf(r.op) << " from node " << peer->node
                 << " refused: " << st.ToString();
  }
}

// ---- time and actions

void Server::Tick() {
  EDL_DCHECK_OWNING_THREAD(io_thread_);
  if (shutting_down_) return;
  const int64_t now = clock_->NowMicros();
  // The one job's scaling sources run on their own clock: from its first generation, paused while
  // a grow is being prepared.
  if (const JobMembership* own = cluster_.FindJob(cluster_.own_job());
      own != nullptr && (script_ || demo_)) {
    if (first_generation_us_ < 0 && own->current().generation > 0) first_generation_us_ = now;
    if (own->has_pending() && last_tick_us_ >= 0) paused_us_ += now - last_tick_us_;
    if (first_generation_us_ >= 0 && !own->done() && !own->has_pending()) {
      const int64_t elapsed = now - first_generation_us_ - paused_us_;
      if (script_) ApplyScaleEvents(script_->Poll(elapsed), "script");
      if (demo_) ApplyScaleEvents(demo_->Poll(elapsed), "policy");
    }
  }
  last_tick_us_ = now;
  cluster_.Tick();
  MaybeEndStop();
  if (shutting_down_) return;
  kv_.Expire(now);
  Dispatch();
  // The scaling clock moves between changes too: keep it about once a second.
  if ((script_ || demo_) && first_generation_us_ >= 0 && now - last_persist_us_ >= 1'000'000 &&
      !Persist()) {
    return;
  }
  // At most once a second: the progress records for the events logs (the timeline picture needs
  // them whether or not anybody watches), and the status line for watchers.
  if (status_dirty_ && now - last_watch_push_us_ >= 1'000'000) {
    status_dirty_ = false;
    last_watch_push_us_ = now;
    if (HasWatchers()) NotifyWatchers(json{{"status", StatusBody()}});
    RecordProgress();
  }
  tick_timer_.expires_after(milliseconds(options_.tick_ms));
  tick_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Tick();
  });
}

void Server::ApplyScaleEvents(const std::vector<ScaleEvent>& events, const std::string& reason) {
  for (const ScaleEvent& e : events) {
    LOG(INFO) << reason << " event: " << e.ToString();
    switch (e.op) {
      case ScaleEvent::Op::kSet:
        cluster_.SetDesired(e.n, reason);
        break;
      case ScaleEvent::Op::kAdd:
        cluster_.AddDesired(e.n, reason);
        break;
      case ScaleEvent::Op::kRemove:
        cluster_.AddDesired(-e.n, reason);
        break;
      case ScaleEvent::Op::kKill:
        cluster_.KillTrainers(e.n);
        break;
      case ScaleEvent::Op::kKillAll:
        cluster_.KillAllTrainers();
        break;
      case ScaleEvent::Op::kTeachers:
        // As `edl ctl scale --service SERVICE N`; a client offering the service may connect later.
        if (Status st = placer_.SetDesired(e.service, e.n, /*require_offer=*/false); !st.ok()) {
          LOG(WARNING) << reason << " event '" << e.ToString() << "' refused: " << st.ToString();
        }
        break;
      case ScaleEvent::Op::kRepeat:
        break;
    }
  }
}

void Server::Dispatch() {
  if (shutting_down_) return;
  // Where jobs share the nodes, teachers run only in the slots no job holds (cluster_policy.h,
  // step 5); a one-job server's teachers run in their clients' own teacher slots.
  if (auto capacity = cluster_.TeacherCapacity()) placer_.SetCapacity(*capacity);
  PlaceTeachers();
  std::vector<JobAction> actions = cluster_.TakeActions();
  if (actions.empty()) return;
  // Kept (synced) before any of it reaches a client: a restarted server resumes from here.
  if (!Persist()) return;
  for (JobAction& ja : actions) {
    Action& a = ja.action;
    switch (a.kind) {
      case Action::Kind::kPrepare: {
        auto node = nodes_.find(a.node);
        if (node == nodes_.end()) {
          LOG(WARNING) << "cannot send a prepare of job " << ja.job << " to node " << a.node
                       << ": not connected";
          break;
        }
        TellJob(node->second, ja.job);
        json j;
        a.prepare.EncodeTo(&j);
        node->second->conn->Send(j);
        break;
      }
      case Action::Kind::kCommit:
        PushGeneration(ja.job, a);
        kv_.CollectGarbage(a.next.generation, ja.job);
        status_dirty_ = true;
        if (HasWatchers()) NotifyWatchers(json{{"status", StatusBody()}});
        break;
      case Action::Kind::kKill:
        SendKill(a);
        break;
      case Action::Kind::kDone:
        LOG(INFO) << "job " << ja.job << " finished: every member exited 0";
        if (ja.job != cluster_.own_job()) break;  // a submitted job ends by job_finished (below)
        if (options_.exit_when_done) {
          const nlohmann::json done = proto::Done().Encoded();
          ShutdownWith(&done);
          break;
        }
        for (auto& [name, peer] : nodes_) peer->conn->Send(proto::Done().Encoded());
        break;
      case Action::Kind::kEvent:
        if (events::Type type;
            ja.job.empty() && events::TypeOf(a.event, &type) &&
            (type == events::Type::kJobFinished || type == events::Type::kJobCancelled)) {
          const std::string name = proto::StrOr(a.event, "job_name");  // the cluster's own record
          job_events_.erase(name);
          for (auto& [n, peer] : nodes_) peer->job_generation.erase(name);
        }
        AppendRecord(ja.job, std::move(a.event));
        break;
    }
  }
}

void Server::SendKill(const Action& a) {
  proto::Kill k;
  k.trainer_ids = a.trainer_ids;
  json j;
  k.EncodeTo(&j);
  SendToNode(a.node, j);
}

void Server::PushGeneration(const std::string& job, const Action& a) {
  std::set<std::string> targets;  // the nodes of the old and new members, those holding the job
  for (const proto::MemberInfo& m : a.prev.members) targets.insert(m.node);
  for (const proto::MemberInfo& m : a.next.members) targets.insert(m.node);
  for (auto& [name, peer] : nodes_) {
    if (peer->job_generation.count(job) || cluster_.Hosts(name, job)) targets.insert(name);
  }
  std::shared_ptr<const std::string> delta, full;
  for (const std::string& name : targets) {
    auto it = nodes_.find(name);
    if (it == nodes_.end()) continue;
    // A node the cluster has lost gets nothing more on its old connection (still open for the
    // moment until its idle timeout): it learns the state in full when it registers again, and
    // its trainers are then found stale and killed. A generation without them, slipped in before
    // the connection closed, made them leave on their own instead (cluster_restart_test, once).
    if (!cluster_.registry().IsConnected(name)) continue;
    const std::shared_ptr<Peer>& peer = it->second;
    TellJob(peer, job);
    int64_t& held = peer->job_generation[job];
    if (held >= a.next.generation) continue;  // got it in full on registering
    if (held == a.prev.generation && held > 0) {
      if (!delta) {
        json j;
        proto::GenerationUpdate::Between(a.prev, a.next).EncodeTo(&j);
        delta = std::make_shared<const std::string>(proto::EncodeFrame(j));
      }
      peer->conn->SendFrame(delta);
    } else {
      if (!full) {
        json j;
        proto::GenerationUpdate::Full(a.next).EncodeTo(&j);
        full = std::make_shared<const std::string>(proto::EncodeFrame(j));
      }
      peer->conn->SendFrame(full);
    }
    held = a.next.generation;
  }
}

void Server::SendToNode(const std::string& node, const json& msg) {
  auto it = nodes_.find(node);
  if (it == nodes_.end()) {
    LOG(WARNING) << "cannot send '" << proto::TypeOf(msg) << "' to node " << node
                 << ": not connected";
    return;
  }
  it->second->conn->Send(msg);
}

EventsLog* Server::LogOf(const std::string& job) {
  if (job.empty() || job == options_.id) return &events_;
  auto it = job_events_.find(job);
  if (it == job_events_.end()) {
    auto opened = std::make_unique<EventsLog>();
    // Opened per record, not held open: a job's log costs no file descriptor while it waits.
    if (Status s = opened->Open(options_.events_dir, job, clock_, &metrics_, /*keep_open=*/false);
        !s.ok()) {
      LOG(ERROR) << "events log of job " << job << ": " << s.ToString();
      return nullptr;
    }
    it = job_events_.emplace(job, std::move(opened)).first;
  }
  return it->second.get();
}

void Server::AppendRecord(const std::string& job, json event) {
  if (EventsLog* log = LogOf(job)) NotifyWatchers(json{{"event", log->Append(std::move(event))}});
}

void Server::RecordProgress() {
  for (const std::string& job : cluster_.JobNames()) {
    const events::Progress rec = cluster_.ProgressOf(job);
    if (rec.reporting == 0) continue;
    // Not sent to watchers as an event: they already got the status this record is made from.
    if (EventsLog* log = LogOf(job)) log->Append(rec.ToJson());
  }
}

}  // namespace edl::jobserver
