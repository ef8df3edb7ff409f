#include "edl/proto/trainer_events.h"

#include <limits>

#include "edl/proto/fields.h"
#include "edl/proto/names.h"

namespace edl::proto {

using nlohmann::json;

namespace {

constexpr int64_t kMaxI64 = std::numeric_limits<int64_t>::max();

template <typename T>
TrainerEventBody Checked(Fields& f, T body, const std::string& kind) {
  if (!f.ok()) return ev::Malformed{kind, f.status()};
  return body;
}

TrainerEventBody DecodeKind(TrainerEventKind k, const json& e, const std::string& kind) {
  Fields f(e, "trainer event '" + kind + "'", std::string());
  switch (k) {
    case TrainerEventKind::kConfig: {
      ev::Config b;
      f.Str("fingerprint", &b.fingerprint, kMaxFingerprintBytes);
      if (f.ok() && b.fingerprint.empty()) f.Fail("fingerprint", "is empty");
      return Checked(f, std::move(b), kind);
    }
    case TrainerEventKind::kJoinerFirstStep: {
      ev::JoinerFirstStep b;
      f.Int("generation", &b.generation, 0, kMaxI64, /*required=*/false);
      return Checked(f, b, kind);
    }
    case TrainerEventKind::kReformFailed: {
      ev::ReformFailed b;
      f.Int("generation", &b.generation, 0, kMaxI64)
          .Str("error", &b.error, kMaxEventErrorBytes, /*required=*/false);
      return Checked(f, std::move(b), kind);
    }
    case TrainerEventKind::kCommFailed: {
      ev::CommFailed b;
      f.Int("generation", &b.generation, 0, kMaxI64);
      return Checked(f, b, kind);
    }
    case TrainerEventKind::kCheckpointSaved: {
      ev::CheckpointSaved b;
      f.Bool("ok", &b.ok)
          .Int("saves", &b.saves, 0, kMaxI64, /*required=*/false)
          .Num("seconds", &b.seconds, /*required=*/false);
      return Checked(f, b, kind);
    }
    case TrainerEventKind::kCheckpointFailed: {
      ev::CheckpointFailed b;
      f.Int("step", &b.step, -1, kMaxI64, /*required=*/false)
          .Bool("refused", &b.refused, /*required=*/false)
          .Str("error", &b.error, kMaxEventErrorBytes, /*required=*/false);
      return Checked(f, std::move(b), kind);
    }
    case TrainerEventKind::kStopCheckpoint: {
      ev::StopCheckpoint b;
      f.Int("generation", &b.generation, 0, kMaxI64, /*required=*/false)
          .Int("step", &b.step, 0, kMaxI64, /*required=*/false)
          .Bool("ok", &b.ok)
          .Str("error", &b.error, kMaxEventErrorBytes, /*required=*/false);
      return Checked(f, std::move(b), kind);
    }
    case TrainerEventKind::kStall: {
      ev::Stall b;
      f.Int("generation", &b.generation, 0, kMaxI64, /*required=*/false)
          .Int("world_before", &b.world_before, 0, kMaxEventWorldSize)
          .Int("world_after", &b.world_after, 0, kMaxEventWorldSize)
          .Bool("failure", &b.failure, /*required=*/false)
          .Num("stall_s", &b.stall_s);
      if (f.ok() && b.stall_s < 0) f.Fail("stall_s", "is negative");
      ev::StallPhases& p = b.phases;
      for (auto [key, out] : {std::pair<const char*, double*>{"lost_s", &p.lost},
                              {"wait_generation_s", &p.wait_generation},
                              {"agree_s", &p.agree},
                              {"reform_s", &p.reform},
                              {"sync_s", &p.sync},
                              {"eval_s", &p.eval},
                              {"first_step_s", &p.first_step}}) {
        f.Num(key, out, /*required=*/false);
        if (f.ok() && FieldOf(e, key).is_number() && *out < 0) f.Fail(key, "is negative");
      }
      return Checked(f, b, kind);
    }
  }
  return ev::Malformed{kind, Status::Corruption("trainer event '" + kind + "' has no decoder")};
}

}  // namespace

TrainerEventBody DecodeTrainerEvent(const json& e) {
  std::string kind;
  Fields f(e, "trainer event", std::string());
  f.Str("event", &kind);
  if (!f.ok()) return ev::Malformed{"", f.status()};
  if (TrainerEventKind k; kTrainerEventKindNames.Parse(kind, &k)) return DecodeKind(k, e, kind);
  if (!IsValidName(kind)) {
    return ev::Malformed{"", Status::Corruption("trainer event field 'event' " + Quote(kind, 48) +
                                                " is not a valid name (use letters, digits, '.', "
                                                "'_', '-')")};
  }
  return ev::Other{kind};
}

}  // namespace edl::proto
