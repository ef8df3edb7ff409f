// edl_chaos_check: the after-the-fact checks of bench/chaos.sh on a job's own records, with the
// same code the integration tests use (tests/edl/runtime/sample_log_check.h):
//  - data: the trainers' sample logs (--sample_log) give every committed step's global indices
//    and what each rank fed its model; every completed epoch must have consumed each of the N
//    samples exactly once, steps contiguous from 1, and every rank's fed slice must be part of its
//    step with the labels of exactly its planned samples (docs/ARCHITECTURE.md, "Data plan and the
//    exactly-once cursor");
//  - state: every trainer that synced in a generation reports the hash of its state (the `sync`
//    trainer events in the job's events log); all members of one generation must agree.
// Prints one JSON object (steps, committed samples, complete epochs, unconfirmed steps, re-forms
// checked, and "data_error" / "state_error", empty when the check passed) and exits 0 when both
// passed, 1 when a check failed, 2 on bad flags or unreadable input.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "edl/base/flags.h"
#include "edl/proto/fields.h"
#include "resnet50/data/dataset.h"
#include "tests/edl/runtime/sample_log_check.h"

namespace {

constexpr char kUsage[] =
    "usage: edl_chaos_check --sample_log FILE [--sample_log FILE ...] --events FILE\n"
    "                       --labels TRAIN_LABELS_IDX --train_samples N\n"
    "Checks exactly-once data per completed epoch and identical state per generation on a job's\n"
    "sample logs and events log (bench/chaos.sh).";

// Lines of the events log that parse as JSON objects (a line cut by a SIGKILLed writer does not).
std::vector<nlohmann::json> ReadEvents(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

// "" when every trainer that synced in a generation reported one state hash; else the first
// generation with differing ones. *checked counts the generations with at least two members synced.
std::string CheckIdenticalState(const std::vector<nlohmann::json>& events, int64_t* checked) {
  std::map<int64_t, std::map<std::string, std::string>> hashes;  // generation -> trainer -> hash
  for (const nlohmann::json& e : events) {
    using edl::proto::FieldOr;
    using edl::proto::StrOr;
    if (StrOr(e, "type") != "trainer_event" || StrOr(e, "event") != "sync") continue;
    const int64_t generation = FieldOr<int64_t>(e, "generation", -1);
    if (generation < 0) continue;
    hashes[generation][StrOr(e, "trainer")] = StrOr(e, "state_hash");
  }
  *checked = 0;
  for (const auto& [gen, by_trainer] : hashes) {
    std::set<std::string> distinct;
    for (const auto& [trainer, h] : by_trainer) distinct.insert(h);
    if (by_trainer.size() >= 2) ++*checked;
    if (distinct.size() != 1) {
      std::string which;
      for (const auto& [trainer, h] : by_trainer) which += " " + trainer + "=" + h;
      return "generation " + std::to_string(gen) + " synced differing states:" + which;
    }
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> sample_logs;
  std::string events_path, labels_path;
  int64_t n = 0;
  edl::po::options_description d("edl_chaos_check flags");
  d.add_options()("sample_log", edl::po::value(&sample_logs)->composing(),
                  "a trainers' --sample_log file (repeatable)")(
      "events", edl::po::value(&events_path),
      "the job's events log (<events_dir>/<job>.events.jsonl)")(
      "labels", edl::po::value(&labels_path), "the training split's IDX label file (.gz or plain)")(
      "train_samples", edl::po::value(&n),
      "the job's --train_samples (the first N samples are the epoch)");
  edl::ParsedFlags pf;
  edl::Status s = edl::ParseFlags("chaos_check", kUsage, d, argc, argv, &pf);
  if (!s.ok()) {
    std::cerr << "edl_chaos_check: " << s.ToString() << "\n";
    return 2;
  }
  if (pf.help) return 0;
  if (sample_logs.empty() || events_path.empty() || labels_path.empty() || n <= 0) {
    std::cerr << "edl_chaos_check: give --sample_log, --events, --labels and --train_samples > 0\n";
    return 2;
  }
  std::vector<uint8_t> labels;
  s = edl::resnet50::ReadIdxLabels(labels_path, &labels);
  if (!s.ok() || static_cast<int64_t>(labels.size()) < n) {
    std::cerr << "edl_chaos_check: --labels " << labels_path << ": "
              << (s.ok() ? "fewer than --train_samples labels" : s.ToString()) << "\n";
    return 2;
  }

  nlohmann::json out;
  std::map<int64_t, edl::test::LoggedStep> steps;
  std::string data_error = edl::test::ReadSampleLogs(sample_logs, &steps);
  int64_t samples = 0, complete_epochs = 0, unconfirmed = 0;
  if (data_error.empty() && steps.empty()) data_error = "no step in the sample logs";
  if (data_error.empty()) {
    // Epochs before the last step's are complete; so is the last step's when it holds all n.
    std::map<int64_t, int64_t> per_epoch;
    for (const auto& [step, st] : steps) {
      samples += static_cast<int64_t>(st.idx.size());
      per_epoch[st.epoch] += static_cast<int64_t>(st.idx.size());
    }
    const int64_t last = steps.rbegin()->second.epoch;
    complete_epochs = per_epoch[last] == n ? last + 1 : last;
    data_error = edl::test::CheckExactlyOnce(steps, n, complete_epochs);
  }
  if (data_error.empty()) {
    data_error = edl::test::CheckFedBatches(
        steps, [&](int64_t i) { return static_cast<int32_t>(labels.at(i)); }, &unconfirmed);
  }
  int64_t reforms_checked = 0;
  const std::string state_error = CheckIdenticalState(ReadEvents(events_path), &reforms_checked);
  out["steps"] = steps.size();
  out["samples"] = samples;
  out["complete_epochs"] = complete_epochs;
  out["unconfirmed_steps"] = unconfirmed;
  out["generations_checked"] = reforms_checked;
  out["data_error"] = data_error;
  out["state_error"] = state_error;
  std::cout << out.dump() << std::endl;
  return data_error.empty() && state_error.empty() ? 0 : 1;
}
