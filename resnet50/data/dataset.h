// Datasets for the trainer: an interface that fills a batch of normalised fp32 images and int32
// labels for a list of sample indices; fixed-seed synthetic tensors (speed runs); Fashion-MNIST
// from IDX files, gzip-compressed or plain (the Debian package dataset-fashion-mnist installs them
// at /usr/share/datasets/fashion-mnist). Folders of JPEG/PNG files: image_folder.h.
//
// Thread-safety: FillBatch is const and safe to call from several threads at once (the prefetch
// thread and the training thread); a dataset is immutable after loading.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "edl/base/status.h"

namespace edl::resnet50 {

// The label of a sample that could not be loaded (see Dataset::FillBatch): the trainer leaves it
// out of the batch.
constexpr int32_t kSkippedLabel = -1;

struct Augment {
  bool random_crop = false;  // pad by `pad` pixels (zeros) and crop back at a random offset
  int pad = 4;
  bool flip = false;  // random horizontal flip
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int channels() const = 0;
  virtual int image_size() const = 0;  // square images
  virtual int num_classes() const = 0;
  virtual std::string name() const = 0;
  // Writes images [n, C, S, S] (row-major, normalised) and labels [n] for the n = indices.size()
  // samples. `aug_seed` seeds the random augmentation (ignored when `aug` is all off): sample i's
  // draws depend only on (aug_seed, i), not on the rest of the batch. A sample the dataset cannot
  // load (an undecodable image file) gets label kSkippedLabel and a zero image. InvalidArgument
  // when an index is out of range.
  virtual Status FillBatch(const std::vector<int64_t>& indices, const Augment& aug,
                           uint64_t aug_seed, float* images, int32_t* labels) const = 0;
};

// ---- IDX files (the MNIST / Fashion-MNIST format), gzip or plain.
struct IdxImages {
  int64_t count = 0;
  int rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  // [count, rows, cols]
};
// Reads an idx3-ubyte image file (magic 0x00000803). NotFound for a missing file; Corruption
// naming the file for a bad magic, bad dimensions or a truncated payload.
Status ReadIdxImages(const std::string& path, IdxImages* out);
// Reads an idx1-ubyte label file (magic 0x00000801).
Status ReadIdxLabels(const std::string& path, std::vector<uint8_t>* out);

// Fashion-MNIST split "train" or "test" from `dir`: tries <prefix>-images-idx3-ubyte.gz then
// without .gz (prefix "train" or "t10k"). Images are normalised with the training set's mean and
// std (0.2860, 0.3530). `pad_to` > 28 zero-pads each image to pad_to x pad_to (e.g. 32).
StatusOr<std::unique_ptr<Dataset>> LoadFashionMnist(const std::string& dir, bool train,
                                                    int pad_to = 28);

// Synthetic data: `count` images of `channels` x size x size drawn from N(0,1) with a fixed seed,
// labels uniform in [0, classes). Images are generated on the fly from (seed, index), so any size
// costs no memory.
std::unique_ptr<Dataset> MakeSyntheticDataset(int64_t count, int channels, int size, int classes,
                                              uint64_t seed);

}  // namespace edl::resnet50
