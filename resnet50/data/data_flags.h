// The data flags shared by `edl train` and `edl teacher` (a teacher must read the very dataset its
// students train on, so both take the same flags) and the loader they select.
//
// Thread-safety: plain values and a reentrant function.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "edl/base/flags.h"
#include "edl/base/status.h"
#include "resnet50/data/dataset.h"

namespace edl::resnet50 {

struct DataFlags {
  std::string data = "fashion-mnist";  // fashion-mnist | synthetic | imagefolder
  std::string data_dir;                // Fashion-MNIST IDX directory, or train/ + val/ folders
  int image_size = 0;                  // 0: 28 (fashion-mnist), 32 / 224 (others, by model)
  int data_threads = 1;                // imagefolder: decode + augmentation threads per split
  int channels = 3;                    // synthetic only
  int64_t synthetic_train = 0, synthetic_test = 0;  // 0: 100 / 4 batches
  int64_t train_samples = 0;                        // the first N training samples; 0 = all
};

// Adds --data, --data_dir, --data_threads, --image_size, --channels, --synthetic_train,
// --synthetic_test and
// --train_samples, bound to *d.
void AddDataFlags(po::options_description* desc, DataFlags* d);

// InvalidArgument naming the flag for a negative size or count.
Status ValidateDataFlags(const DataFlags& d);

// Loads the training split (and the test split when `load_test`). `model` picks the synthetic
// image size, `batch` the synthetic default sizes, `seed` the synthetic content.
Status LoadData(const DataFlags& d, const std::string& model, int64_t batch, uint64_t seed,
                bool load_test, std::unique_ptr<Dataset>* train, std::unique_ptr<Dataset>* test);

// resnet20 / resnet56: the CIFAR-style models of 28-32 px images.
bool IsCifarModel(const std::string& model);

}  // namespace edl::resnet50
