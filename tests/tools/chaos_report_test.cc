// bench/chaos_report.py, the report of bench/chaos.sh, on hand-made run records: it names every
// gap and stall over 1 s of every run with its generation, its phases and the chaos actions
// around it, and gives each per-run figure as the worst run's with every run's listed.
#include <gtest/gtest.h>
#include <time.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/testutil.h"

namespace edl {
namespace {

constexpr int kTrainSamples = 1280;  // 10 steps per epoch at the report's batch of 128
constexpr double kStep = 0.1;        // the steady step, in seconds

double Clock(clockid_t id) {
  timespec t{};
  clock_gettime(id, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

class ChaosReportTest : public ::testing::Test {
 protected:
  // One run's records: `steps` steps, kStep apart from wall time `t0 + 1`, at world 4 in
  // generation 1; with `gap_s` > 0, the step after `gap_after` comes gap_s later, in generation
  // 2, after a trainer kill 0.5 s into the gap and a failure stall of gap_s (4/5 of it waiting for
  // the generation).
  void WriteRun(const std::string& name, double t0, int steps, int gap_after, double gap_s) {
    const std::string d = dir_.Join(name);
    std::filesystem::create_directories(d + "/events");
    // The sample log's times are the trainers' monotonic clock; the rest are wall clock.
    const double mono_offset = Clock(CLOCK_REALTIME) - Clock(CLOCK_MONOTONIC);
    std::ofstream samples(d + "/samples.jsonl");
    double t = t0 + 1;
    int generation = 1;
    for (int step = 1; step <= steps; ++step) {
      if (step == gap_after + 1 && gap_s > 0) {
        t += gap_s - kStep;
        generation = 2;
      }
      samples << "{\"step\": " << step << ", \"generation\": " << generation << ", \"world\": 4, "
              << "\"time\": " << Fixed(t - mono_offset) << "}\n";
      t += kStep;
    }
    const double end = t;
    std::ofstream actions(d + "/chaos.jsonl");
    actions << "{\"time\": " << Fixed(t0) << ", \"t\": 0, \"action\": \"start\", \"pid\": 0}\n";
    std::ofstream events(d + "/events/chaos.events.jsonl");
    if (gap_s > 0) {
      const double gap_start = t0 + 1 + (gap_after - 1) * kStep;
      actions << "{\"time\": " << Fixed(gap_start + 0.5)
              << ", \"t\": 1, \"action\": \"kill_trainer\", "
              << "\"pid\": 4242}\n";
      events << "{\"type\": \"trainer_event\", \"event\": \"stall\", \"trainer\": \"n1-s0-7\", "
             << "\"generation\": 2, \"world_before\": 4, \"world_after\": 4, \"failure\": true, "
             << "\"stall_s\": " << Fixed(gap_s)
             << ", \"lost_s\": 0.05, \"wait_generation_s\": " << Fixed(0.8 * gap_s)
             << ", \"agree_s\": 0.01, \"reform_s\": 0.3, \"sync_s\": 0.02, "
             << "\"eval_s\": 0, \"first_step_s\": 0.1, \"time\": " << Fixed(gap_start + gap_s)
             << "}\n";
    }
    actions << "{\"time\": " << Fixed(end) << ", \"t\": 9, \"action\": \"end\", \"pid\": 0}\n";
    std::ofstream(d + "/check.json") << "{\"samples\": " << steps * 128 << ", \"steps\": " << steps
                                     << ", \"data_error\": \"\", \"state_error\": \"\"}\n";
  }

  static std::string Fixed(double v) {
    char b[64];
    std::snprintf(b, sizeof b, "%.6f", v);
    return b;
  }

  // Runs the report over the records written; its output, and its exit status in *rc.
  std::string Report(int pairs, int* rc) {
    const std::string out = dir_.Join("report.txt");
    const std::string cmd = "/usr/bin/python3 " + test::SourceDir() + "/bench/chaos_report.py " +
                            dir_.path() + " 60 " + std::to_string(kTrainSamples) +
                            " '0.1 0.1 0.1' 4 " + std::to_string(pairs) + " >" + out + " 2>&1";
    *rc = WEXITSTATUS(std::system(cmd.c_str()));
    std::ifstream f(out);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }

  test::ScratchDir dir_{"chaos-report"};
};

TEST_F(ChaosReportTest, EveryGapAndStallOverASecondIsNamedWithItsGenerationPhasesAndActions) {
  const double now = Clock(CLOCK_REALTIME) - 100;
  WriteRun("chaos", now, 40, 20, 5.0);
  WriteRun("ref", now + 10, 40, 0, 0);
  int rc = 0;
  const std::string out = Report(1, &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("# chaos: 2 gaps or stalls over 1 s:"), std::string::npos) << out;
  EXPECT_NE(out.find("gap 5.00 s (50.0 steady steps) from step 20 to 21"), std::string::npos)
      << out;
  EXPECT_NE(out.find("generation 2 at world 4; stall 5.00 s of n1-s0-7: lost 0.05, wait_generation "
                     "4.00, agree 0.01, reform 0.30, sync 0.02, eval 0.00, first_step 0.10; "
                     "kill_trainer at 3.4 s"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("failure stall 5.00 s less evaluation (50.0 steady steps), generation 2 "
                     "(world 4 -> 4)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("RESULT chaos_failure_stall_max ours=5.00s ref=0.10s ratio=0.020"),
            std::string::npos)
      << out;
}

TEST_F(ChaosReportTest, PerRunFiguresAreTheWorstRunsWithEveryRunsListed) {
  const double now = Clock(CLOCK_REALTIME) - 200;
  WriteRun("chaos", now, 40, 20, 2.0);
  WriteRun("ref", now + 10, 40, 0, 0);
  WriteRun("chaos2", now + 20, 40, 25, 6.0);
  WriteRun("ref2", now + 30, 40, 0, 0);
  int rc = 0;
  const std::string out = Report(2, &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("RESULT chaos_failure_stall_max ours=6.00s ref=0.10s ratio=0.017 (1 failure "
                     "re-forms in chaos2; worst of 2 runs: chaos 2.00, chaos2 6.00)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("# chaos2: 2 gaps or stalls over 1 s:"), std::string::npos) << out;
  EXPECT_NE(out.find("from step 25 to 26"), std::string::npos) << out;
  EXPECT_NE(out.find("# the 2 pairs' ratios: mean"), std::string::npos) << out;
}

}  // namespace
}  // namespace edl
