// The server's per-connection state, shared by the server's files (server.cc, server_ctl.cc,
// server_services.cc). Internal to the server: include it from those files only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "edl/net/admission.h"
#include "edl/net/connection.h"
#include "edl/net/handshake.h"
#include "jobserver/server.h"

namespace edl::jobserver {

struct Server::Peer {
  enum class State { kAuth, kClient, kCtl, kService };  // kService: a teacher or a student
  std::shared_ptr<net::Connection> conn;
  State state = State::kAuth;
  std::unique_ptr<net::ServerHandshake> handshake;  // from accept to the welcome or refusal
  std::string node;                                 // kClient
  // The jobs this client holds (the one job from its welcome, others told by job_info), each
  // with the newest generation it holds (0: none yet), for deltas.
  std::map<std::string, int64_t> job_generation;
  bool watch = false;           // kCtl after `watch`
  uint64_t id = 0;              // owner of its KV waits
  int64_t refused = 0;          // frames refused as not its node's (for rate-limited logging)
  double event_tokens = -1;     // trainer-event token bucket (-1: full, not yet used)
  int64_t event_tokens_us = 0;  // when event_tokens was last refilled
};

using net::LogThis;

}  // namespace edl::jobserver
