// Trainer events, typed: what a trainer says about itself in message 'event' (messages.h Event),
// relayed by its node's client to the server. The body of every kind the server or its metrics
// act on is a struct here; TrainerEventBody is their std::variant, decoded once, at the edge
// (Event::DecodeFrom, with the one field reader, fields.h), with strict types and bounded strings.
// Two alternatives carry no typed body:
//   ev::Other      a kind nobody acts on (sync, eval, leave, ...): the raw object is kept in the
//                  events log for people and tools, and read by no part of the server;
//   ev::Malformed  an object that is not a valid event (no string "event", or a known kind with a
//                  field of the wrong type, out of range, too long or missing): it is dropped,
//                  with one warning naming the node, the trainer and the field, and counted.
// A malformed event never fails its frame: the trainer and its node carry on. PROTOCOL.md
// ("Trainer events") lists the kinds and their fields.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "edl/base/enum_names.h"
#include "edl/base/status.h"

namespace edl::proto {

// The kinds the server acts on, by their "event" names.
enum class TrainerEventKind {
  kConfig,
  kJoinerFirstStep,
  kReformFailed,
  kCommFailed,
  kCheckpointSaved,
  kCheckpointFailed,
  kStopCheckpoint,
  kStall,
};
inline constexpr EnumNames<TrainerEventKind, 8> kTrainerEventKindNames(
    {"config", "joiner_first_step", "reform_failed", "comm_failed", "checkpoint_saved",
     "checkpoint_failed", "stop_checkpoint", "stall"});
inline const char* NameOf(TrainerEventKind k) { return kTrainerEventKindNames.Name(k); }

// Bounds of an event's strings: a configuration fingerprint, an error quoted to the user.
constexpr size_t kMaxFingerprintBytes = 2048;
constexpr size_t kMaxEventErrorBytes = 2048;
// Largest world size an event may name (far above any job; a bound, not a limit of EDL's).
constexpr int64_t kMaxEventWorldSize = 1'000'000;

namespace ev {

// The trainer's configuration fingerprint (the data, batch and model it was started with):
// the job's, or a joiner's to compare with it.
struct Config {
  std::string fingerprint;  // 1..kMaxFingerprintBytes
};
// A joiner finished its first step in the job: it trains in lockstep from now on.
struct JoinerFirstStep {
  int64_t generation = 0;  // optional
};
// The trainer could not re-form generation `generation` and nothing newer is known.
struct ReformFailed {
  int64_t generation = 0;
  std::string error;  // <= kMaxEventErrorBytes; may be empty
};
// The trainer's communicator failed in generation `generation` (a peer died or hung).
struct CommFailed {
  int64_t generation = 0;
};
// Periodic checkpoints completed since the last report.
struct CheckpointSaved {
  bool ok = true;
  int64_t saves = 1;    // >= 0
  double seconds = -1;  // the last save's snapshot + write time; -1: not reported
};
// A periodic checkpoint failed (refused: the store's generation fence said no).
struct CheckpointFailed {
  int64_t step = -1;     // the step whose save failed; -1: unknown (optional)
  bool refused = false;  // optional
  std::string error;     // <= kMaxEventErrorBytes (optional)
};
// Rank 0's final checkpoint at `edl ctl stop`.
struct StopCheckpoint {
  int64_t generation = 0;  // optional
  int64_t step = 0;        // optional
  bool ok = true;
  std::string error;  // <= kMaxEventErrorBytes; set when !ok
};
// A survivor's stall across a re-form (docs/ARCHITECTURE.md, "The stall and its phases"): from
// the end of its last step in the old generation to the end of its first in the new one, and the
// phases that add up to it (each >= 0; -1: not reported by an older trainer).
struct StallPhases {
  double lost = -1;             // lost_s: the step in flight when a failure cut it
  double wait_generation = -1;  // wait_generation_s: until the server's next generation arrived
  double agree = -1;            // agree_s: agreeing on the switch step
  double reform = -1;           // reform_s: building the new communicator
  double sync = -1;             // sync_s: syncing the state to joiners
  double eval = -1;        // eval_s: evaluation work inside the stall (the fixed run does it too)
  double first_step = -1;  // first_step_s: the first step in the new generation
};
struct Stall {
  int64_t generation = 0;
  int64_t world_before = 0, world_after = 0;
  bool failure = false;
  double stall_s = 0;  // >= 0
  StallPhases phases;
  // The training time the re-form cost: the stall less the evaluation work inside it.
  double cost_s() const { return phases.eval > 0 ? std::max(0.0, stall_s - phases.eval) : stall_s; }
};
// A kind no part of the server acts on.
struct Other {
  std::string kind;  // the "event" name, a valid name (names.h)
};
// Not a valid event: dropped and counted.
struct Malformed {
  std::string kind;  // the "event" name when it was a short string, else ""
  Status why;        // Corruption naming the field and the problem
};

}  // namespace ev

// Default-constructed: ev::Other with no kind (an event nobody decoded reads as nothing).
using TrainerEventBody = std::variant<ev::Other, ev::Config, ev::JoinerFirstStep, ev::ReformFailed,
                                      ev::CommFailed, ev::CheckpointSaved, ev::CheckpointFailed,
                                      ev::StopCheckpoint, ev::Stall, ev::Malformed>;

// The typed body of event object `e` (any JSON value): never fails; a value that is not a valid
// event becomes ev::Malformed with the reason.
TrainerEventBody DecodeTrainerEvent(const nlohmann::json& e);

}  // namespace edl::proto
