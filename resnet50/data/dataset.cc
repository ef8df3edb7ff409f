// IDX reader, Fashion-MNIST and synthetic datasets.
#include "resnet50/data/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "resnet50/data/image_transform.h"

namespace edl::resnet50 {

namespace {

constexpr uint32_t kIdxImagesMagic = 0x00000803;
constexpr uint32_t kIdxLabelsMagic = 0x00000801;
constexpr float kFashionMean = 0.2860f;
constexpr float kFashionStd = 0.3530f;

// Reads a whole (optionally gzip-compressed) file; zlib reads plain files transparently.
Status ReadMaybeGzip(const std::string& path, std::vector<uint8_t>* out) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return Status::NotFound(path +
                            ": no such file; install the Debian package "
                            "dataset-fashion-mnist or point --data_dir at the IDX files");
  }
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return PosixError(path, errno);
  out->clear();
  std::vector<uint8_t> chunk(1 << 20);
  while (true) {
    const int n = gzread(f, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      return Status::Corruption(path + ": cannot decompress (" + msg +
                                "); the file is damaged or truncated — re-download it");
    }
    if (n == 0) break;
    out->insert(out->end(), chunk.begin(), chunk.begin() + n);
  }
  gzclose(f);
  return Status::OK();
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

// ---------------------------------------------------------------------------------------------
class FashionMnist : public Dataset {
 public:
  FashionMnist(IdxImages images, std::vector<uint8_t> labels, int pad_to, bool train)
      : images_(std::move(images)), labels_(std::move(labels)), size_(pad_to), train_(train) {}

  int64_t size() const override { return images_.count; }
  int channels() const override { return 1; }
  int image_size() const override { return size_; }
  int num_classes() const override { return 10; }
  std::string name() const override {
    return std::string("fashion-mnist/") + (train_ ? "train" : "test");
  }

  Status FillBatch(const std::vector<int64_t>& indices, const Augment& aug, uint64_t aug_seed,
                   float* images, int32_t* labels) const override {
    const int s = size_, r = images_.rows, c = images_.cols;
    const int off = (s - r) / 2;  // centre the 28x28 image when padded to s
    const float zero = (0.f - kFashionMean) / kFashionStd;
    for (size_t i = 0; i < indices.size(); ++i) {
      const int64_t idx = indices[i];
      if (idx < 0 || idx >= images_.count) {
        return Status::InvalidArgument("sample index " + std::to_string(idx) + " outside " +
                                       name() + " of " + std::to_string(images_.count));
      }
      int dy = 0, dx = 0;
      bool flip = false;
      if (aug.random_crop || aug.flip) {
        std::mt19937_64 gen(MixSeed(aug_seed, static_cast<uint64_t>(idx)));
        if (aug.random_crop) {
          dy = static_cast<int>(gen() % (2 * aug.pad + 1)) - aug.pad;
          dx = static_cast<int>(gen() % (2 * aug.pad + 1)) - aug.pad;
        }
        if (aug.flip) flip = gen() & 1;
      }
      const uint8_t* src = images_.pixels.data() + idx * r * c;
      float* dst = images + i * s * s;
      for (int y = 0; y < s; ++y) {
        for (int x = 0; x < s; ++x) {
          const int sy = y + dy - off;
          const int sx0 = x + dx - off;
          const int sx = flip ? (c - 1 - sx0) : sx0;
          float v = zero;
          if (sy >= 0 && sy < r && sx0 >= 0 && sx0 < c) {
            v = (src[sy * c + sx] / 255.f - kFashionMean) / kFashionStd;
          }
          dst[y * s + x] = v;
        }
      }
      labels[i] = labels_[idx];
    }
    return Status::OK();
  }

 private:
  const IdxImages images_;
  const std::vector<uint8_t> labels_;
  const int size_;
  const bool train_;
};

class Synthetic : public Dataset {
 public:
  Synthetic(int64_t count, int channels, int size, int classes, uint64_t seed)
      : count_(count), channels_(channels), size_(size), classes_(classes), seed_(seed) {}
  int64_t size() const override { return count_; }
  int channels() const override { return channels_; }
  int image_size() const override { return size_; }
  int num_classes() const override { return classes_; }
  std::string name() const override { return "synthetic"; }

  Status FillBatch(const std::vector<int64_t>& indices, const Augment&, uint64_t, float* images,
                   int32_t* labels) const override {
    const int64_t per = static_cast<int64_t>(channels_) * size_ * size_;
    for (size_t i = 0; i < indices.size(); ++i) {
      const int64_t idx = indices[i];
      if (idx < 0 || idx >= count_) {
        return Status::InvalidArgument("sample index " + std::to_string(idx) +
                                       " outside the synthetic dataset of " +
                                       std::to_string(count_));
      }
      // xorshift64* stream seeded by (seed, index): uniform with unit variance.
      uint64_t state = (seed_ * 0x9E3779B97F4A7C15ull) ^ (idx + 1) * 0xBF58476D1CE4E5B9ull;
      if (state == 0) state = 1;
      float* dst = images + i * per;
      for (int64_t j = 0; j < per; ++j) {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        const uint64_t v = state * 0x2545F4914F6CDD1Dull;
        dst[j] = (static_cast<float>(v >> 40) * (1.f / 16777216.f) - 0.5f) * 3.4641f;
      }
      labels[i] = static_cast<int32_t>((idx * 2654435761ull + seed_) % classes_);
    }
    return Status::OK();
  }

 private:
  const int64_t count_;
  const int channels_, size_, classes_;
  const uint64_t seed_;
};

}  // namespace

Status ReadIdxImages(const std::string& path, IdxImages* out) {
  std::vector<uint8_t> bytes;
  EDL_RETURN_IF_ERROR(ReadMaybeGzip(path, &bytes));
  if (bytes.size() < 16) {
    return Status::Corruption(path + ": truncated IDX header (" + std::to_string(bytes.size()) +
                              " bytes); re-download the file");
  }
  const uint32_t magic = BigEndian32(bytes.data());
  if (magic != kIdxImagesMagic) {
    return Status::Corruption(path + ": bad IDX magic " + Hex(magic) + " (want " +
                              Hex(kIdxImagesMagic) + " for an idx3-ubyte image file)");
  }
  const uint32_t count = BigEndian32(bytes.data() + 4);
  const uint32_t rows = BigEndian32(bytes.data() + 8), cols = BigEndian32(bytes.data() + 12);
  if (rows == 0 || cols == 0 || rows > 4096 || cols > 4096) {
    return Status::Corruption(path + ": implausible image size " + std::to_string(rows) + "x" +
                              std::to_string(cols));
  }
  const uint64_t need = uint64_t{count} * rows * cols;
  if (bytes.size() - 16 != need) {
    return Status::Corruption(path + ": " + std::to_string(bytes.size() - 16) +
                              " payload bytes, header says " + std::to_string(count) +
                              " images of " + std::to_string(rows) + "x" + std::to_string(cols) +
                              " (" + std::to_string(need) + " bytes): truncated or damaged file");
  }
  out->count = count;
  out->rows = static_cast<int>(rows);
  out->cols = static_cast<int>(cols);
  out->pixels.assign(bytes.begin() + 16, bytes.end());
  return Status::OK();
}

Status ReadIdxLabels(const std::string& path, std::vector<uint8_t>* out) {
  std::vector<uint8_t> bytes;
  EDL_RETURN_IF_ERROR(ReadMaybeGzip(path, &bytes));
  if (bytes.size() < 8) {
    return Status::Corruption(path + ": truncated IDX header; re-download the file");
  }
  const uint32_t magic = BigEndian32(bytes.data());
  if (magic != kIdxLabelsMagic) {
    return Status::Corruption(path + ": bad IDX magic " + Hex(magic) + " (want " +
                              Hex(kIdxLabelsMagic) + " for an idx1-ubyte label file)");
  }
  const uint32_t count = BigEndian32(bytes.data() + 4);
  if (bytes.size() - 8 != count) {
    return Status::Corruption(path + ": " + std::to_string(bytes.size() - 8) +
                              " labels, header says " + std::to_string(count) +
                              ": truncated or damaged file");
  }
  out->assign(bytes.begin() + 8, bytes.end());
  return Status::OK();
}

StatusOr<std::unique_ptr<Dataset>> LoadFashionMnist(const std::string& dir, bool train,
                                                    int pad_to) {
  const std::string prefix = dir + "/" + (train ? "train" : "t10k");
  auto pick = [](const std::string& base) {
    std::error_code ec;
    return std::filesystem::exists(base + ".gz", ec) ? base + ".gz" : base;
  };
  const std::string images_path = pick(prefix + "-images-idx3-ubyte");
  const std::string labels_path = pick(prefix + "-labels-idx1-ubyte");
  IdxImages images;
  std::vector<uint8_t> labels;
  EDL_RETURN_IF_ERROR(ReadIdxImages(images_path, &images));
  EDL_RETURN_IF_ERROR(ReadIdxLabels(labels_path, &labels));
  if (static_cast<int64_t>(labels.size()) != images.count) {
    return Status::Corruption(labels_path + " holds " + std::to_string(labels.size()) +
                              " labels but " + images_path + " holds " +
                              std::to_string(images.count) + " images");
  }
  for (uint8_t l : labels) {
    if (l >= 10) {
      return Status::Corruption(labels_path + ": label " + std::to_string(l) + " outside [0, 10)");
    }
  }
  if (pad_to < images.rows || pad_to < images.cols) {
    return Status::InvalidArgument("--image_size " + std::to_string(pad_to) +
                                   " is smaller than the " + std::to_string(images.rows) +
                                   "px Fashion-MNIST images");
  }
  return std::unique_ptr<Dataset>(
      new FashionMnist(std::move(images), std::move(labels), pad_to, train));
}

std::unique_ptr<Dataset> MakeSyntheticDataset(int64_t count, int channels, int size, int classes,
                                              uint64_t seed) {
  return std::make_unique<Synthetic>(count, channels, size, classes, seed);
}

}  // namespace edl::resnet50
