// The frames each end of a node's server connection receives once the handshake is over, as one
// std::variant per direction: DecodeClientFrame (what a node's client sends the server) and
// DecodeServerFrame (what the server sends a client), and DecodeTrainerFrame (what a trainer sends
// its node's client after its trainer_hello). Each reads the frame's type, decodes that message
// with its own decoder (messages.h, service_messages.h) and return it as the variant's
// alternative, which the receiver visits (std::visit with edl::Overloaded, edl/base/enum_names.h).
// These are where the server's and a node client's connections match a received type name to
// its message. Exchanges of one or two message types match them where they read (proto::TypeOf,
// frame.h): the handshakes (edl/net/handshake.cc), a trainer's side of its channel
// (edl/net/trainer_channel.cc), a spare's first frame (jobclient), `edl ctl`'s reply, and the
// teachers' connections (jobserver/services/service_registry.cc, edl/runtime/teacher_client.cc,
// teacher/teacher_server.cc).
//
// Thread-safety: pure functions.
#pragma once

#include <variant>

#include <nlohmann/json.hpp>

#include "edl/base/status.h"
#include "edl/proto/messages.h"
#include "edl/proto/service_messages.h"

namespace edl::proto {

// Client -> server. TeacherOrder: a teacher_exit only.
using ClientFrame = std::variant<Heartbeat, TrainerExit, Ready, Progress, Event, KvRequest,
                                 NodeStats, ServiceWatch, TeacherOrder>;
// Trainer -> its node's client (relayed to the server with the trainer's id and job filled in).
using TrainerFrame = std::variant<Heartbeat, Ready, Progress, Event, KvRequest, ServiceWatch>;
// Server -> client. GenerationUpdate: a generation (full or delta); TeacherOrder: a teacher_start
// or teacher_stop; ErrorMsg: an error the server sent before closing.
using ServerFrame = std::variant<Heartbeat, GenerationUpdate, Prepare, Kill, JobInfo, KvReply,
                                 TeacherOrder, ServiceMembers, Stop, Done, ErrorMsg>;

// InvalidArgument naming the type ("unexpected message 'X' from a client" / "... from a trainer" /
// "... from the server")
// for a frame whose type is not of the set; otherwise the message's decoder's status (Corruption
// naming the message and the field). On a decoder's refusal *out holds that type's alternative,
// default-valued, so a receiver can answer a bad frame by its type.
Status DecodeClientFrame(const nlohmann::json& j, ClientFrame* out);
Status DecodeTrainerFrame(const nlohmann::json& j, TrainerFrame* out);
Status DecodeServerFrame(const nlohmann::json& j, ServerFrame* out);

}  // namespace edl::proto
