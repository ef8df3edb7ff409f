// edl_sim_clients: N lightweight simulated `edl client`s in one process, for
// bench/control_plane.sh. Each one authenticates like a real client, registers a node with --slots
// slots, heartbeats, reports every prepared joiner ready at once (as a fast trainer would) and
// tracks the generation number it holds. Once all are registered and agree on a generation, it
// prints
//   READY <generation>
// and then, for every later generation that every client holds, one line
//   ALL <generation> <unix time in ns when the last client got it>
// Usage: edl_sim_clients --server HOST:PORT --secret_file F --clients N --slots S
#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <glog/logging.h>
#include <boost/asio.hpp>

#include "edl/net/auth.h"
#include "edl/net/connection.h"
#include "edl/net/framed_socket.h"
#include "edl/net/handshake.h"
#include "edl/proto/fields.h"
#include "edl/proto/frame.h"
#include "edl/proto/messages.h"

namespace {

namespace asio = boost::asio;
using nlohmann::json;

struct Sim {
  asio::io_context io;
  std::string host, secret;
  int port = 0, clients = 0, slots = 8;
  std::vector<int64_t> held;       // generation held by client i
  std::map<int64_t, int> holders;  // generation -> clients holding it (or newer)
  int registered = 0;
  bool announced = false;
  int64_t base_generation = -1;

  void Start(int i) {
    auto sock = std::make_shared<asio::ip::tcp::socket>(io);
    asio::ip::tcp::endpoint ep(asio::ip::make_address(host), static_cast<uint16_t>(port));
    sock->async_connect(ep, [this, i, sock](const boost::system::error_code& ec) {
      if (ec) {
        std::cerr << "sim client " << i << ": connect: " << ec.message() << "\n";
        return;
      }
      sock->set_option(asio::ip::tcp::no_delay(true));
      auto conn = edl::net::Connection::Create(edl::net::ToGeneric(std::move(*sock)), "server");
      std::weak_ptr<edl::net::Connection> weak = conn;
      conn->Start([this, i, weak](const json& m) { OnMessage(i, weak.lock(), m); },
                  [i](const edl::Status& s) {
                    std::cerr << "sim client " << i << " closed: " << s.ToString() << "\n";
                  });
      conns.push_back(conn);
    });
  }

  void OnMessage(int i, const std::shared_ptr<edl::net::Connection>& conn, const json& m) {
    if (!conn) return;
    const std::string type = edl::proto::TypeOf(m);
    if (type == "challenge") {
      edl::proto::Hello h;
      h.role = edl::proto::Role::kClient;
      h.node = "sim" + std::to_string(i);
      h.host = "127.0.0.1";
      h.mode = edl::proto::NodeMode::kInplace;
      for (int s = 0; s < slots; ++s) h.slots.push_back(s);
      auto& hs = handshakes[i] = std::make_unique<edl::net::PeerHandshake>(secret, std::move(h));
      json hello;
      if (edl::Status s = hs->OnChallenge(m, "server", &hello); !s.ok()) {
        std::cerr << "sim client " << i << ": " << s.ToString() << "\n";
        return;
      }
      conn->Send(hello);
    } else if (type == "welcome") {
      // Frames after the welcome are sealed (PROTOCOL.md); the handshake checks the server's proof.
      edl::proto::Welcome w;
      bool proven = false;
      if (edl::Status s = handshakes[i]->OnReply(m, "server", &w, &proven); !s.ok()) {
        std::cerr << "sim client " << i << ": " << s.ToString() << "\n";
        return;
      }
      conn->StartSession(handshakes[i]->TakeSession(), edl::proto::kMaxFrameBytes);
      handshakes.erase(i);
      ++registered;
      // The server admits a bounded number of unauthenticated connections per address: keep
      // the handshakes in flight below it.
      if (next_start < clients) Start(next_start++);
      Heartbeat(conn, w.heartbeat_ms);
    } else if (type == "prepare") {
      edl::proto::Prepare p;
      if (!p.DecodeFrom(m).ok()) return;
      for (const auto& j : p.joiners) {
        edl::proto::Ready r;
        r.trainer_id = j.trainer_id;
        r.generation = p.generation;
        json rj;
        r.EncodeTo(&rj);
        conn->Send(rj);
      }
    } else if (type == "generation") {
      if (i == 0) DecodeAsAClientDoes(m);
      const int64_t g = edl::proto::FieldOr<int64_t>(m, "generation", 0);
      if (g <= held[i]) return;
      for (int64_t k = held[i] + 1; k <= g; ++k) {
        if (++holders[k] == clients) Report(k);
      }
      held[i] = g;
    }
  }

  // Client 0 also decodes and applies every update as a real client does (GenerationUpdate), and
  // logs what that cost: the other clients only authenticate and parse their frames, because a
  // real cluster's clients decode in parallel, each on its own machine, not one after another
  // on this one.
  void DecodeAsAClientDoes(const json& m) {
    const auto t0 = std::chrono::steady_clock::now();
    edl::proto::GenerationUpdate u;
    edl::Status s = u.DecodeFrom(m);
    if (s.ok()) s = u.ApplyTo(&client0_generation);
    const auto us =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    if (!s.ok()) {
      std::cerr << "sim client 0: generation update rejected: " << s.ToString() << "\n";
      return;
    }
    std::cerr << "DECODE generation " << client0_generation.generation << " members "
              << client0_generation.members.size() << " in " << us << " us\n";
  }

  void Report(int64_t g) {
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
    if (!announced) return;
    if (g > base_generation) std::cout << "ALL " << g << " " << ns << std::endl;
  }

  void Heartbeat(std::shared_ptr<edl::net::Connection> conn, int ms) {
    auto t = std::make_shared<asio::steady_timer>(io, std::chrono::milliseconds(ms));
    std::weak_ptr<edl::net::Connection> weak = conn;
    t->async_wait([this, t, weak, ms](const boost::system::error_code&) {
      auto c = weak.lock();
      if (!c || c->closed()) return;
      c->Send(json{{"type", "heartbeat"}});
      Heartbeat(c, ms);
    });
  }

  void Watch() {
    auto t = std::make_shared<asio::steady_timer>(io, std::chrono::milliseconds(100));
    t->async_wait([this, t](const boost::system::error_code&) {
      if (!announced && registered == clients) {
        int64_t lo = INT64_MAX, hi = 0;
        for (int64_t g : held) {
          lo = std::min(lo, g);
          hi = std::max(hi, g);
        }
        if (lo == hi && lo > 0) {
          announced = true;
          base_generation = lo;
          std::cout << "READY " << lo << std::endl;
        }
      }
      Watch();
    });
  }

  std::vector<std::shared_ptr<edl::net::Connection>> conns;
  std::map<int, std::unique_ptr<edl::net::PeerHandshake>>
      handshakes;  // client -> its handshake, until welcomed
  int next_start = 0;
  edl::proto::GenerationInfo client0_generation;  // what client 0 holds (DecodeAsAClientDoes)
};

}  // namespace

int main(int argc, char** argv) {
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  Sim sim;
  std::string server, secret_file;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--server")
      server = v;
    else if (k == "--secret_file")
      secret_file = v;
    else if (k == "--clients")
      sim.clients = std::stoi(v);
    else if (k == "--slots")
      sim.slots = std::stoi(v);
    else {
      std::cerr << "unknown flag " << k << "\n";
      return 2;
    }
  }
  edl::Status s = edl::net::ParseHostPort(server, "--server", &sim.host, &sim.port);
  if (s.ok()) s = edl::net::ReadSecretFile(secret_file, &sim.secret);
  if (!s.ok() || sim.clients < 1) {
    std::cerr << "edl_sim_clients: " << (s.ok() ? "--clients must be >= 1" : s.ToString()) << "\n";
    return 2;
  }
  sim.held.assign(static_cast<size_t>(sim.clients), 0);
  for (sim.next_start = 0; sim.next_start < std::min(sim.clients, 4); ++sim.next_start) {
    sim.Start(sim.next_start);
  }
  sim.Watch();
  sim.io.run();
  return 0;
}
