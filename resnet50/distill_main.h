// Distillation for `edl train` and `edl teacher` (docs/DISTILLATION.md): the student's flags
// (--distill SERVICE, --distill_temperature, --distill_alpha, where the teachers are, the window
// and the bounds), the teacher model loaded from a checkpoint store, and the teacher source a
// student trains against: remote teachers (runtime::TeacherClient) or, for the benchmark's
// baseline, a teacher model run in the student's own process (--distill_local).
//
// Thread-safety: setup functions are called from main's thread.
#pragma once

#include <memory>
#include <string>

#include "edl/base/flags.h"
#include "edl/base/status.h"
#include "edl/runtime/membership.h"
#include "edl/runtime/teacher_source.h"
#include "resnet50/data/data_flags.h"
#include "resnet50/distill_loss.h"
#include "resnet50/trainer.h"

namespace edl::resnet50 {

struct DistillFlags {
  std::string service;           // --distill: the teacher service; empty: no distillation
  DistillLossParams loss;        // --distill_temperature, --distill_alpha
  std::string server;            // --distill_server HOST:PORT (the edl server of the teachers;
                                 // unset under `edl client`: it relays the teacher list)
  std::string teachers;          // --distill_teachers HOST:PORT,... (no server)
  std::string secret_file;       // --secret_file
  int top_k = 0;                 // --distill_top_k
  int window = 8;                // --distill_window: steps asked ahead
  double answer_wait_s = 2;      // --distill_wait_s: longest wait of a step for its answers
  double resend_after_s = 1;     // --distill_resend_s
  double discovery_wait_s = 30;  // --distill_discovery_s
  std::string local_checkpoint;  // --distill_local DIR: teacher in this process (baseline)
  std::string local_model = "resnet56";  // --distill_local_model
};

void AddDistillFlags(po::options_description* desc, DistillFlags* d);
Status ValidateDistillFlags(const DistillFlags& d);

// Options of a teacher model: its architecture, the data it must match, where its weights are.
struct TeacherModelOptions {
  std::string model = "resnet56";
  DataFlags data;
  uint64_t seed = 1;           // synthetic data content (the students' --seed)
  int64_t batch = 128;         // synthetic default sizes (the students' --batch_size)
  std::string checkpoint_dir;  // RocksDB store written by `edl train --checkpoint_dir`
  std::string device = "cpu";
  int threads = 0;
};

// Loads the training data and the newest verified checkpoint of `checkpoint_dir` into a trainer
// of `model`. FailedPrecondition naming both when the checkpoint's model, image shape or class
// count differs from the model and data given (e.g. a teacher trained on another dataset);
// NotFound for an empty or missing store.
StatusOr<std::unique_ptr<Trainer>> LoadTeacherModel(const TeacherModelOptions& o);

// The source a student trains against, or nullptr when --distill and --distill_local are unset;
// the student's trainer is then set up to use it (Trainer::SetTeacher). `data`, `seed`, `batch`
// describe the student's data (the local teacher loads the same). `feed`: the teacher lists the
// node's client relays (null outside a client), used unless --distill_server or
// --distill_teachers is given; must outlive the returned source.
StatusOr<std::unique_ptr<runtime::TeacherSource>> SetUpDistillation(const DistillFlags& d,
                                                                    const DataFlags& data,
                                                                    uint64_t seed, int64_t batch,
                                                                    Trainer* student,
                                                                    runtime::ServiceFeed* feed);

}  // namespace edl::resnet50
