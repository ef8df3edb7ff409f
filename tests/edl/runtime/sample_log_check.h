// Reads ElasticOptions::sample_log_path files (JSON lines, one per committed step per trainer,
// holding the GLOBAL step's indices) and checks exactly-once consumption per epoch. Shared by the
// in-process runtime tests and the multi-process integration tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace edl::test {

struct LoggedStep {
  int64_t generation = 0;
  int64_t epoch = 0;
  std::vector<int64_t> idx;
  double loss = 0;  // NaN-free: steps logged without a loss keep the first logged one
  bool has_loss = false;
};

// Union by step number over every file; a step re-done by a newer generation (after a cold start
// from a checkpoint) replaces the older record. Returns "" or the first inconsistency (two
// trainers of one generation logging different indices for one step).
inline std::string ReadSampleLogs(const std::vector<std::string>& paths,
                                  std::map<int64_t, LoggedStep>* steps) {
  for (const std::string& path : paths) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("step")) return "unparsable line in " + path + ": " + line;
      const int64_t step = j["step"].get<int64_t>();
      LoggedStep s;
      s.generation = j["generation"].get<int64_t>();
      s.epoch = j["epoch"].get<int64_t>();
      s.idx = j["idx"].get<std::vector<int64_t>>();
      s.has_loss = j["loss"].is_number();
      if (s.has_loss) s.loss = j["loss"].get<double>();
      auto it = steps->find(step);
      if (it == steps->end()) {
        (*steps)[step] = s;
        continue;
      }
      // A newer generation that re-did the step after a rollback to a checkpoint wins (the
      // older one was lost with every trainer that held it); within one generation all agree.
      if (s.generation > it->second.generation) {
        it->second = s;
        continue;
      }
      if (s.generation < it->second.generation) continue;
      if (it->second.epoch != s.epoch || it->second.idx != s.idx) {
        return "step " + std::to_string(step) + " logged with different samples in " + path;
      }
      if (!it->second.has_loss && s.has_loss) it->second = s;
    }
  }
  return "";
}

// Every epoch < `complete_epochs` consumed each of the n samples exactly once; steps are
// contiguous from 1. Returns "" or the first violation.
inline std::string CheckExactlyOnce(const std::map<int64_t, LoggedStep>& steps, int64_t n,
                                    int64_t complete_epochs) {
  std::map<int64_t, std::vector<int64_t>> seen;
  int64_t expect = 1;
  for (const auto& [step, s] : steps) {
    if (step != expect) return "step " + std::to_string(expect) + " missing from every log";
    ++expect;
    seen[s.epoch].insert(seen[s.epoch].end(), s.idx.begin(), s.idx.end());
  }
  for (int64_t e = 0; e < complete_epochs; ++e) {
    std::vector<int64_t> list = seen[e];
    std::sort(list.begin(), list.end());
    if (static_cast<int64_t>(list.size()) != n) {
      return "epoch " + std::to_string(e) + " consumed " + std::to_string(list.size()) +
             " samples, want " + std::to_string(n);
    }
    for (int64_t i = 0; i < n; ++i) {
      if (list[i] != i) return "epoch " + std::to_string(e) + ": sample " + std::to_string(i) +
                               " missing or repeated";
    }
  }
  return "";
}

}  // namespace edl::test
