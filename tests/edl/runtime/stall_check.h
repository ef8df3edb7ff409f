// Checks a `stall` event's breakdown (docs/ARCHITECTURE.md, "The stall and its phases"): every
// additive phase is present and non-negative, and the phases cover the stall exactly: each starts
// at the clock reading that ended the one before (the runtime's Phases::mark_us), so they add up
// to the stall however long a preemption between two of them lasted, on any machine. Shared by
// the in-process runtime test and the multi-process one.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

namespace edl::test {

inline constexpr const char* kStallPhases[] = {"lost_s",   "eval_s", "wait_generation_s", "agree_s",
                                               "reform_s", "sync_s", "first_step_s"};

// "" when `e` is a well-formed stall breakdown, else what is wrong with it.
inline std::string CheckStallBreakdown(const nlohmann::json& e) {
  if (!e.contains("stall_s") || !e["stall_s"].is_number()) return "no stall_s in " + e.dump();
  const double stall = e["stall_s"].get<double>();
  double sum = 0;
  for (const char* f : kStallPhases) {
    if (!e.contains(f) || !e[f].is_number()) return std::string("no ") + f + " in " + e.dump();
    const double v = e[f].get<double>();
    if (v < 0) return std::string(f) + " < 0 in " + e.dump();
    sum += v;
  }
  const bool failure = e.value("failure", false);
  if (failure && e["agree_s"].get<double>() != 0) return "agree_s of a failure in " + e.dump();
  if (!failure && e["lost_s"].get<double>() != 0)
    return "lost_s of a planned change in " + e.dump();
  if (e["reform_s"].get<double>() <= 0 || e["first_step_s"].get<double>() <= 0) {
    return "a re-form without reform_s or first_step_s in " + e.dump();
  }
  for (const char* f : {"seen_time", "wait_switch_s", "attempts"}) {
    if (!e.contains(f) || !e[f].is_number()) return std::string("no ") + f + " in " + e.dump();
  }
  if (e["attempts"].get<int>() < 1) return "attempts < 1 in " + e.dump();
  constexpr double kRounding = 1e-6;  // eight whole microseconds, each as a double in seconds
  if (std::abs(sum - stall) > kRounding) {
    return "phases add up to " + std::to_string(sum) + " s, not the stall's " +
           std::to_string(stall) + " s: " + e.dump();
  }
  return "";
}

}  // namespace edl::test
