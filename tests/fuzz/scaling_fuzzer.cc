// Scaling-script parser (jobserver/policy/scaling.h): a script file as an operator wrote it. Parse
// returns a Status whatever the text; an accepted script's events are in time order, and polling it
// returns due events only, in order, never a `repeat`, and stays bounded while it repeats; step
// lines fire only once their step was observed, each line at most once. A `teachers` event names a
// valid service with a count within the service limit.
#include <algorithm>
#include <limits>
#include <string>

#include "edl/proto/messages.h"
#include "edl/proto/service_messages.h"
#include "jobserver/policy/scaling.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using edl::jobserver::ScaleEvent;
  using edl::jobserver::ScalingScript;
  ScalingScript script;
  if (!ScalingScript::Parse(std::string(reinterpret_cast<const char*>(data), size), "fuzz.script",
                            &script)
           .ok()) {
    return 0;
  }
  const auto& events = script.events();
  FUZZ_CHECK(events.size() <= size);  // at least one byte per event line
  int64_t last_at = 0;
  for (const ScaleEvent& e : events) {
    FUZZ_CHECK(e.at_us >= last_at);
    last_at = e.at_us;
    if (e.op == ScaleEvent::Op::kTeachers) {
      FUZZ_CHECK(edl::proto::IsValidName(e.service));
      FUZZ_CHECK(e.n >= 0 && static_cast<size_t>(e.n) <= edl::proto::kMaxServiceMembers);
    } else {
      FUZZ_CHECK(e.service.empty());
    }
    (void)e.ToString();
  }
  // Up to three passes through a repeating script; each Poll returns due events in time order.
  // The job's step advances between polls (a script with step lines never repeats).
  const int64_t span = std::min<int64_t>(last_at, std::numeric_limits<int64_t>::max() / 4);
  const int64_t polls[] = {0,           span / 2, span, 2 * span + 1, 3 * span + 2, 3 * span + 2,
                           3 * span + 2};
  const int64_t steps[] = {-1, 0, 10, 1000, 1'000'000, 1'000'000'000'000LL, 1'000'000'000'000LL};
  int64_t prev_poll = -1;
  int64_t prev_at = -1;
  size_t returned = 0;
  for (size_t i = 0; i < sizeof(polls) / sizeof(polls[0]); ++i) {
    const int64_t t = polls[i];
    if (t < prev_poll) continue;
    prev_poll = t;
    if (steps[i] >= 0) script.ObserveStep(steps[i]);
    for (const ScaleEvent& e : script.Poll(t)) {
      FUZZ_CHECK(e.at_step < 0 || e.at_step <= steps[i] || e.step_relative);
      FUZZ_CHECK(e.op != ScaleEvent::Op::kRepeat);
      FUZZ_CHECK(e.at_us <= t);
      FUZZ_CHECK(e.at_us >= prev_at);
      prev_at = e.at_us;
      ++returned;
    }
    FUZZ_CHECK(returned <= 4 * events.size() + 4);
  }
  return 0;
}
