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

#include "edl/runtime/trainable.h"

namespace edl::test {

struct LoggedStep {
  int64_t generation = 0;
  int64_t epoch = 0;
  std::vector<int64_t> idx;
  double loss = 0;  // NaN-free: steps logged without a loss keep the first logged one
  bool has_loss = false;
  int64_t world = 0;
  // What each rank of `generation` that applied the step itself fed its model: its slice
  // ("fed_idx") and the hash of the labels it read from the batch it fed ("label_hash", "" when
  // the Trainable computes none).
  std::map<int64_t, std::vector<int64_t>> fed;
  std::map<int64_t, std::string> label_hash;
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
      if (j.is_discarded() || !j.contains("step"))
        return "unparsable line in " + path + ": " + line;
      const int64_t step = j["step"].get<int64_t>();
      LoggedStep s;
      s.generation = j["generation"].get<int64_t>();
      s.epoch = j["epoch"].get<int64_t>();
      s.idx = j["idx"].get<std::vector<int64_t>>();
      s.has_loss = j["loss"].is_number();
      if (s.has_loss) s.loss = j["loss"].get<double>();
      s.world = j.value("world", int64_t{0});
      const int64_t rank = j.value("rank", int64_t{-1});
      const bool fed = j.contains("fed_idx");
      const std::vector<int64_t> fed_idx =
          fed ? j["fed_idx"].get<std::vector<int64_t>>() : std::vector<int64_t>();
      const std::string label_hash = j.value("label_hash", std::string());
      auto it = steps->find(step);
      if (it == steps->end() || s.generation > it->second.generation) {
        // A newer generation that re-did the step after a rollback to a checkpoint wins (the
        // older one was lost with every trainer that held it); within one generation all agree.
        it = steps->insert_or_assign(step, s).first;
      } else if (s.generation < it->second.generation) {
        continue;
      } else if (it->second.epoch != s.epoch || it->second.idx != s.idx) {
        return "step " + std::to_string(step) + " logged with different samples in " + path;
      } else if (!it->second.has_loss && s.has_loss) {
        it->second.loss = s.loss;
        it->second.has_loss = true;
      }
      if (fed) {
        if (it->second.fed.count(rank)) {
          return "step " + std::to_string(step) + " of generation " + std::to_string(s.generation) +
                 " logged twice by rank " + std::to_string(rank) + " in " + path;
        }
        it->second.fed[rank] = fed_idx;
        it->second.label_hash[rank] = label_hash;
      }
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
      if (list[i] != i)
        return "epoch " + std::to_string(e) + ": sample " + std::to_string(i) +
               " missing or repeated";
    }
  }
  return "";
}

// What the ranks fed their models, against the plan: every logged slice is part of its step's
// global indices, the slices of one step are disjoint, each logged label hash equals the hash of
// the labels of its slice (`labels_of(sample index)`, from the dataset), and a step every rank of
// its generation logged was fed exactly its global indices. *unconfirmed counts the steps not
// every rank logged (a rank that died, or that took the step's result from a re-form instead of
// applying it). Returns "" or the first violation.
template <typename LabelsOf>
std::string CheckFedBatches(const std::map<int64_t, LoggedStep>& steps, LabelsOf labels_of,
                            int64_t* unconfirmed, bool need_label_hash = true) {
  *unconfirmed = 0;
  for (const auto& [step, s] : steps) {
    const std::string at =
        "step " + std::to_string(step) + " (generation " + std::to_string(s.generation) + ")";
    std::vector<int64_t> planned = s.idx, all_fed;
    std::sort(planned.begin(), planned.end());
    for (const auto& [rank, fed] : s.fed) {
      std::vector<int32_t> labels;
      for (int64_t i : fed) {
        if (!std::binary_search(planned.begin(), planned.end(), i)) {
          return at + ": rank " + std::to_string(rank) + " fed sample " + std::to_string(i) +
                 ", which the step did not plan";
        }
        labels.push_back(labels_of(i));
      }
      all_fed.insert(all_fed.end(), fed.begin(), fed.end());
      const std::string& h = s.label_hash.at(rank);
      if (h.empty() && need_label_hash && !fed.empty()) {
        return at + ": rank " + std::to_string(rank) + " logged no label hash";
      }
      if (!h.empty() && h != std::to_string(runtime::LabelHash(labels.data(), labels.size()))) {
        return at + ": rank " + std::to_string(rank) +
               " fed its model labels that are not those of its planned samples";
      }
    }
    std::sort(all_fed.begin(), all_fed.end());
    if (std::adjacent_find(all_fed.begin(), all_fed.end()) != all_fed.end()) {
      return at + ": two ranks fed the same sample";
    }
    if (static_cast<int64_t>(s.fed.size()) < s.world || s.world == 0) {
      ++*unconfirmed;
      continue;
    }
    if (all_fed != planned) return at + ": the ranks together did not feed the planned samples";
  }
  return "";
}

}  // namespace edl::test
