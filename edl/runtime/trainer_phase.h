// TrainerPhase: what an elastic trainer (ElasticTrainer::Impl, elastic_trainer_impl.h) is doing,
// as one closed set, and the transitions between its phases. The trainer changes phase in one
// place (Impl::Enter), which CHECKs the transition against IsLegalPhaseTransition() (an illegal
// one is a bug in the trainer, never the doing of a peer) and logs it at VLOG(1).
//
//   phase       what the trainer does                                  next phases
//   joining     waits for a generation that includes it (a joiner      resuming, evaluating,
//               warms up and reports ready first), then its first      left
//               re-form; holds no training state until that ends
//   resuming    re-formed: its first step in the generation, which     training, evaluating,
//               ends the re-form's stall (or is a joiner's first step) recovering, done
//   training    steps on the generation's communicator                 evaluating, switching,
//                                                                      recovering, done
//   evaluating  the sharded evaluation of the step it holds: an epoch  training, resuming,
//               end's, the epoch end a re-form landed on (then on to   recovering, done
//               resuming), or the last step's (then done)
//   switching   the members agreed on a switch step: agrees on the     reforming, recovering
//               target generation
//   recovering  a collective failed: aborts the communicator, reports  reforming
//               it, waits for a generation newer than the failed one
//   reforming   builds the target's communicator and syncs the state,  resuming, evaluating,
//               again on a newer generation while superseded or failed left
//   left        not a member of the target generation: Run() returns   (none)
//   done        the epoch/step budget is reached: Run() returns        (none)
//
// joining and reforming do the same re-form (ElasticTrainer::Impl::Reform); they differ in whether
// the trainer already holds training state (the sync's level). A re-form lands on evaluating when
// its synced step is an epoch end that no member completed the evaluation of, else on resuming;
// resuming and training differ only in that the first step after a re-form reports its stall.
// Run() returns an error from whichever phase it happened in.
//
// Thread-safety: immutable values and pure functions. The trainer's phase itself belongs to its
// training thread.
#pragma once

#include "edl/base/enum_names.h"

namespace edl::runtime {

enum class TrainerPhase {
  kJoining,
  kResuming,
  kTraining,
  kEvaluating,
  kSwitching,
  kRecovering,
  kReforming,
  kLeft,
  kDone,
};
static_assert(static_cast<int>(TrainerPhase::kDone) == 8, "kTrainerPhaseNames lists 9 phases");
inline constexpr EnumNames<TrainerPhase, 9> kTrainerPhaseNames({"joining", "resuming", "training",
                                                                "evaluating", "switching",
                                                                "recovering", "reforming", "left",
                                                                "done"});
inline const char* NameOf(TrainerPhase p) { return kTrainerPhaseNames.Name(p); }

// Whether a trainer in phase `from` may enter `to` (the table above). Staying in a phase is not a
// transition: false for from == to.
constexpr bool IsLegalPhaseTransition(TrainerPhase from, TrainerPhase to) {
  using P = TrainerPhase;
  switch (from) {
    case P::kJoining:
    case P::kReforming:
      return to == P::kResuming || to == P::kEvaluating || to == P::kLeft;
    case P::kResuming:
      return to == P::kTraining || to == P::kEvaluating || to == P::kRecovering || to == P::kDone;
    case P::kTraining:
      return to == P::kEvaluating || to == P::kSwitching || to == P::kRecovering || to == P::kDone;
    case P::kEvaluating:
      return to == P::kTraining || to == P::kResuming || to == P::kRecovering || to == P::kDone;
    case P::kSwitching:
      return to == P::kReforming || to == P::kRecovering;
    case P::kRecovering:
      return to == P::kReforming;
    case P::kLeft:
    case P::kDone:
      return false;
  }
  return false;
}

}  // namespace edl::runtime
