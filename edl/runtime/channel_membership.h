// ChannelMembership: the production MembershipSource, a thin adapter over net::TrainerChannel (the
// trainer's connection to its node's `edl client` over EDL_CLIENT_SOCKET). Committed generations
// (proto::GenerationInfo) become runtime::Generation; the rendezvous KvStore is the server's KV
// reached through the channel; readiness, progress and events pass straight through to the server
// (events land in the job's JSONL events log next to its generation records).
//
// Thread-safety: as MembershipSource (thread-safe); TrainerChannel is thread-safe itself.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "edl/base/status.h"
#include "edl/runtime/membership.h"

namespace edl::net {
class TrainerChannel;
}
namespace edl::proto {
struct GenerationInfo;
}

namespace edl::runtime {

// Projection of the wire message: number, member ids by rank, failure flag and reason.
Generation ToGeneration(const proto::GenerationInfo& info);

// Wraps an already connected channel (ownership taken). `trainer_id` must be the id the channel
// introduced itself with.
std::unique_ptr<MembershipSource> NewChannelMembership(std::unique_ptr<net::TrainerChannel> channel,
                                                       std::string trainer_id);

// Connects to the client's Unix socket `socket` as `trainer_id` (EDL_CLIENT_SOCKET and
// EDL_TRAINER_ID of the env contract; edl/runtime/run_mode.h picks this source) within `timeout`.
// Unavailable/Timeout when the client does not answer.
StatusOr<std::unique_ptr<MembershipSource>> ConnectChannelMembership(
    const std::string& socket, const std::string& trainer_id,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));

}  // namespace edl::runtime
