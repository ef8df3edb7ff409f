// ServerDriver: a real jobserver::Server (one job, in memory, its events log in a scratch
// directory) with one node's client and one `edl ctl` attached over socket pairs instead of TCP
// and the handshake. A message text goes through the frame layer's DecodePayload and then
// Server::OnMessage, the path every frame of an authenticated peer takes (the decode, the
// dispatch, the Cluster, the metrics, the events log), without the safety net of the connection
// (an exception escapes to the caller). The node's client behaves as a real one in one respect:
// it answers every `prepare` with `ready` for each joiner, so the job has placed trainers to
// report about. A node the server closed (a rejected frame) attaches again with its session.
// For the structure-aware fuzz target (server_dispatch_fuzzer.cc) and its deterministic twin
// (tests/jobserver/server_dispatch_test.cc).
//
// Thread-safety: one thread; the server runs on the driver's own io_context, polled.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "edl/base/clock.h"
#include "edl/net/connection.h"
#include "edl/proto/frame.h"
#include "edl/proto/frames.h"
#include "edl/proto/messages.h"
#include "jobserver/server.h"
#include "jobserver/server_peer.h"

namespace edl::jobserver {

class ServerDriver {
 public:
  static constexpr char kNode[] = "n1";

  // `dir`: an existing directory for the events log. `initial_trainers` of the job's 4 slots.
  explicit ServerDriver(const std::string& dir, int initial_trainers = 2) {
    ServerOptions o;
    o.bind = "127.0.0.1";
    o.port = 0;
    o.id = "job";
    o.events_dir = dir;
    o.event_burst = 1e12;  // the dispatch, not the rate bound, is what is driven
    o.events_per_second = 1e12;
    MembershipOptions m;
    m.job_id = o.id;
    m.initial_trainers = initial_trainers;
    m.min_trainers = 1;
    o.cluster.one_job = m;
    server_ = std::make_unique<Server>(&io_, o, &clock_);
    start_ = server_->Start();
    if (!start_.ok()) return;
    AttachNode();
    AttachCtl();
    Pump();
  }
  ~ServerDriver() {
    for (auto* p : {&node_, &ctl_}) {
      if (*p && !(*p)->conn->closed()) (*p)->conn->Close(Status::Aborted("driver done"));
    }
    io_.poll();
  }
  ServerDriver(const ServerDriver&) = delete;
  ServerDriver& operator=(const ServerDriver&) = delete;

  const Status& start_status() const { return start_; }

  // Feeds `text` as a frame payload from the node's client (attaching it again first when the
  // server closed it). False when the frame layer refused the text (nothing reached the server).
  bool FromNode(const std::string& text) {
    if (node_->conn->closed()) AttachNode();
    return Feed(node_, text);
  }
  // The same from the ctl connection.
  bool FromCtl(const std::string& text) {
    if (ctl_->conn->closed()) AttachCtl();
    return Feed(ctl_, text);
  }

  // The trainers of the job's newest generation placed on the node.
  std::vector<std::string> NodeTrainers() const {
    std::vector<std::string> ids;
    const JobMembership* m = server_->cluster_.FindJob(server_->cluster_.own_job());
    if (m == nullptr) return ids;
    for (const proto::MemberInfo& mi : m->current().members) {
      if (mi.node == kNode) ids.push_back(mi.trainer_id);
    }
    return ids;
  }
  int64_t generation() const {
    const JobMembership* m = server_->cluster_.FindJob(server_->cluster_.own_job());
    return m == nullptr ? 0 : m->current().generation;
  }
  // The node's connection is open (a frame refused by the server closes it).
  bool node_connected() const { return node_ && !node_->conn->closed(); }
  // The server keeps serving (nothing shut it down).
  bool serving() const { return !server_->shutting_down_ && !io_.stopped(); }
  // The server's /metrics text.
  std::string Metrics() const { return server_->metrics_.Render(server_->StatusBody()); }
  // The ctl status body, as `edl ctl status` gets it.
  nlohmann::json StatusBody() const { return server_->StatusBody(); }
  // Frames the server sent the node since the last call (decoded).
  std::vector<nlohmann::json> TakeNodeFrames() { return std::move(node_frames_); }

 private:
  using Peer = Server::Peer;

  std::shared_ptr<Peer> NewPeer(const std::string& name,
                                boost::asio::local::stream_protocol::socket* other) {
    boost::asio::local::stream_protocol::socket ours(io_);
    *other = boost::asio::local::stream_protocol::socket(io_);
    boost::asio::local::connect_pair(ours, *other);
    other->non_blocking(true);
    auto peer = std::make_shared<Peer>();
    peer->conn = net::Connection::Create(net::ToGeneric(std::move(ours)), name);
    peer->id = server_->next_peer_id_++;
    server_->peers_[peer.get()] = peer;
    server_->metrics_.ConnectionOpened();
    std::weak_ptr<Peer> weak = peer;
    Server* s = server_.get();
    peer->conn->Start(
        [s, weak](const nlohmann::json& m) {
          if (auto p = weak.lock()) s->OnMessage(p, m);
        },
        [s, weak](const Status& why) {
          if (auto p = weak.lock()) s->OnClose(p, why);
        });
    return peer;
  }
  void AttachNode() {
    node_ = NewPeer("driver node", &node_other_);
    proto::Hello h;
    h.role = proto::Role::kClient;
    h.node = kNode;
    h.host = "127.0.0.1";
    h.slots = {0, 1, 2, 3};
    h.node_token = token_;
    if (Status s = server_->AttachNode(node_, h, &token_); s.ok()) {
      server_->SendJobsTo(node_);
    } else {
      node_->conn->Close(s);
    }
    server_->Dispatch();
    Pump();
  }
  void AttachCtl() {
    ctl_ = NewPeer("driver ctl", &ctl_other_);
    ctl_->state = Peer::State::kCtl;
  }
  bool Feed(const std::shared_ptr<Peer>& peer, const std::string& text) {
    nlohmann::json msg;
    if (!proto::DecodePayload(text.data(), text.size(), &msg).ok()) return false;
    // A frame arrived: the idle timer starts again, as the connection's read path does (a long
    // run of fed frames is a live peer, not a silent one).
    peer->conn->SetIdleTimeout(peer->conn->idle_timeout());
    server_->OnMessage(peer, msg);
    Pump();
    return true;
  }
  // Runs what the server queued (writes, closes) and reads what it sent; answers prepares.
  void Pump() {
    for (int round = 0; round < 8; ++round) {
      io_.poll();
      io_.restart();
      Drain(&ctl_other_, &ctl_buf_, nullptr);
      std::vector<nlohmann::json> got;
      Drain(&node_other_, &node_buf_, &got);
      bool answered = false;
      for (nlohmann::json& f : got) {
        if (proto::TypeOf(f) == proto::msg::kPrepare) answered |= AnswerPrepare(f);
        if (node_frames_.size() < 1024) node_frames_.push_back(std::move(f));
      }
      if (!answered) break;
    }
  }
  bool AnswerPrepare(const nlohmann::json& f) {
    proto::Prepare p;
    if (!p.DecodeFrom(f).ok() || node_->conn->closed()) return false;
    for (const proto::MemberInfo& j : p.joiners) {
      if (j.node != kNode) continue;
      proto::Ready r;
      r.trainer_id = j.trainer_id;
      r.generation = p.generation;
      server_->OnMessage(node_, r.Encoded());
    }
    return true;
  }
  void Drain(boost::asio::local::stream_protocol::socket* s, std::string* buf,
             std::vector<nlohmann::json>* frames) {
    char chunk[1 << 16];
    boost::system::error_code ec;
    while (s->is_open()) {
      const size_t n = s->read_some(boost::asio::buffer(chunk), ec);
      if (ec || n == 0) break;
      if (frames != nullptr) buf->append(chunk, n);
    }
    if (frames == nullptr) return;
    size_t consumed = 0;
    nlohmann::json msg;
    while (proto::DecodeFrame(*buf, &msg, &consumed).ok()) {
      frames->push_back(std::move(msg));
      buf->erase(0, consumed);
    }
    if (buf->size() > (8u << 20)) buf->clear();  // a frame the driver cannot read: drop it
  }

  boost::asio::io_context io_;
  ManualClock clock_;
  std::unique_ptr<Server> server_;
  Status start_;
  std::string token_;
  std::shared_ptr<Peer> node_, ctl_;
  boost::asio::local::stream_protocol::socket node_other_{io_}, ctl_other_{io_};
  std::string node_buf_, ctl_buf_;
  std::vector<nlohmann::json> node_frames_;
};

}  // namespace edl::jobserver
