// The elastic trainer's phase table (edl/runtime/trainer_phase.h): every transition the trainer
// makes is accepted, every other one refused, and the names are the table's.
#include "edl/runtime/trainer_phase.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

namespace edl::runtime {
namespace {

constexpr int kPhases = 9;

std::vector<TrainerPhase> AllPhases() {
  std::vector<TrainerPhase> all;
  for (int i = 0; i < kPhases; ++i) all.push_back(static_cast<TrainerPhase>(i));
  return all;
}

// The transitions ElasticTrainer::Impl makes, written out apart from the header's switch: each
// phase and the phases it may enter.
const std::map<std::string, std::set<std::string>>& Legal() {
  static const auto* legal = new std::map<std::string, std::set<std::string>>{
      {"joining", {"resuming", "evaluating", "left"}},    // the first re-form
      {"reforming", {"resuming", "evaluating", "left"}},  // every later one
      {"resuming", {"training", "recovering", "evaluating", "done"}},
      {"training", {"evaluating", "switching", "recovering", "done"}},
      {"evaluating", {"training", "resuming", "recovering", "done"}},
      {"switching", {"reforming", "recovering"}},
      {"recovering", {"reforming"}},
      {"left", {}},
      {"done", {}},
  };
  return *legal;
}

TEST(TrainerPhaseTest, EveryTransitionOfTheTableIsAcceptedAndNoOther) {
  ASSERT_EQ(Legal().size(), static_cast<size_t>(kPhases));
  for (TrainerPhase from : AllPhases()) {
    const std::set<std::string>& next = Legal().at(NameOf(from));
    for (TrainerPhase to : AllPhases()) {
      EXPECT_EQ(IsLegalPhaseTransition(from, to), next.count(NameOf(to)) > 0)
          << NameOf(from) << " -> " << NameOf(to);
    }
  }
}

TEST(TrainerPhaseTest, StayingIsNoTransitionAndTheEndsAreFinal) {
  for (TrainerPhase p : AllPhases()) EXPECT_FALSE(IsLegalPhaseTransition(p, p)) << NameOf(p);
  for (TrainerPhase to : AllPhases()) {
    EXPECT_FALSE(IsLegalPhaseTransition(TrainerPhase::kLeft, to)) << NameOf(to);
    EXPECT_FALSE(IsLegalPhaseTransition(TrainerPhase::kDone, to)) << NameOf(to);
    // Every trainer starts by joining; nothing returns to it.
    EXPECT_FALSE(IsLegalPhaseTransition(to, TrainerPhase::kJoining)) << NameOf(to);
  }
}

// From joining, every phase is reachable, and from every phase an end (left or done) is.
TEST(TrainerPhaseTest, EveryPhaseIsReachableAndLeadsToAnEnd) {
  std::set<TrainerPhase> reached = {TrainerPhase::kJoining};
  for (bool grew = true; grew;) {
    grew = false;
    for (TrainerPhase from : std::set<TrainerPhase>(reached)) {
      for (TrainerPhase to : AllPhases()) {
        if (IsLegalPhaseTransition(from, to)) grew |= reached.insert(to).second;
      }
    }
  }
  EXPECT_EQ(reached.size(), static_cast<size_t>(kPhases));
  std::set<TrainerPhase> ends = {TrainerPhase::kLeft, TrainerPhase::kDone};
  for (bool grew = true; grew;) {
    grew = false;
    for (TrainerPhase from : AllPhases()) {
      for (TrainerPhase to : std::set<TrainerPhase>(ends)) {
        if (IsLegalPhaseTransition(from, to)) grew |= ends.insert(from).second;
      }
    }
  }
  EXPECT_EQ(ends.size(), static_cast<size_t>(kPhases));
}

TEST(TrainerPhaseTest, NamesAreDistinctAndParseBack) {
  std::set<std::string> names;
  for (TrainerPhase p : AllPhases()) {
    names.insert(NameOf(p));
    TrainerPhase parsed = TrainerPhase::kDone;
    ASSERT_TRUE(kTrainerPhaseNames.Parse(NameOf(p), &parsed)) << NameOf(p);
    EXPECT_EQ(parsed, p);
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kPhases));
  EXPECT_EQ(std::string(NameOf(TrainerPhase::kJoining)), "joining");
  EXPECT_EQ(std::string(NameOf(TrainerPhase::kDone)), "done");
}

}  // namespace
}  // namespace edl::runtime
