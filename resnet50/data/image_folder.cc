#include "resnet50/data/image_folder.h"

#include <glog/logging.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <unordered_set>

#include "edl/base/thread_annotations.h"
#include "resnet50/data/decode_pool.h"
#include "resnet50/data/image_decode.h"

namespace edl::resnet50 {

namespace {

namespace fs = std::filesystem;

bool IsImageFile(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// Reads a whole file, refusing one over the decoder's size limit before reading it.
Status ReadImageFile(const std::string& path, std::vector<uint8_t>* out) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return Status::NotFound(path + ": cannot stat (" + ec.message() + ")");
  if (size > image_limits::kMaxFileBytes) {
    return Status::Corruption(path + ": " + std::to_string(size) + " bytes, over the " +
                              std::to_string(image_limits::kMaxFileBytes) + "-byte limit");
  }
  std::ifstream in(path, std::ios::binary);
  out->resize(static_cast<size_t>(size));
  if (!in || !in.read(reinterpret_cast<char*>(out->data()), static_cast<std::streamsize>(size))) {
    return Status::NotFound(path + ": cannot read");
  }
  return Status::OK();
}

class ImageFolder : public Dataset {
 public:
  ImageFolder(std::string dir, const ImageFolderOptions& o, std::vector<std::string> files,
              std::vector<int32_t> labels, int classes)
      : dir_(std::move(dir)),
        o_(o),
        resize_(o.resize > 0 ? o.resize : o.image_size * 256 / 224),
        files_(std::move(files)),
        labels_(std::move(labels)),
        classes_(classes),
        pool_(std::max(o.threads, 1)),
        decoders_(static_cast<size_t>(pool_.threads())) {
    for (auto& d : decoders_) d = std::make_unique<ImageDecoder>();
  }

  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  int channels() const override { return 3; }
  int image_size() const override { return o_.image_size; }
  int num_classes() const override { return classes_; }
  std::string name() const override { return "imagefolder " + dir_; }

  Status FillBatch(const std::vector<int64_t>& indices, const Augment& aug, uint64_t aug_seed,
                   float* images, int32_t* labels) const override {
    for (int64_t idx : indices) {
      if (idx < 0 || idx >= size()) {
        return Status::InvalidArgument("sample index " + std::to_string(idx) + " outside " +
                                       name() + " of " + std::to_string(size()));
      }
    }
    const size_t per = static_cast<size_t>(3) * o_.image_size * o_.image_size;
    pool_.ParallelFor(static_cast<int64_t>(indices.size()), [&](int64_t i, int worker) {
      const int64_t idx = indices[i];
      float* dst = images + i * per;
      Status s = FillOne(idx, aug, MixSeed(aug_seed, static_cast<uint64_t>(idx)), worker, dst);
      if (s.ok()) {
        labels[i] = labels_[idx];
      } else {
        labels[i] = kSkippedLabel;
        std::fill(dst, dst + per, 0.f);
        WarnOnce(idx, "skipping sample " + std::to_string(idx) + ": " + s.ToString());
      }
    });
    return Status::OK();
  }

 private:
  // Decodes and transforms sample `idx` into dst [3, S, S] with decoder `worker`.
  Status FillOne(int64_t idx, const Augment& aug, uint64_t seed, int worker, float* dst) const {
    const std::string& path = files_[idx];
    std::vector<uint8_t> bytes;
    EDL_RETURN_IF_ERROR(ReadImageFile(path, &bytes));
    ImageDecoder* dec = decoders_[worker].get();
    ImageFormat format;
    int w = 0, h = 0;
    EDL_RETURN_IF_ERROR(dec->ReadHeader(bytes.data(), bytes.size(), path, &format, &w, &h));
    SampleRng rng(seed);
    const CropBox box = aug.random_crop ? RandomResizedCropBox(w, h, o_.crop, &rng)
                                        : CenterCropBox(w, h, resize_, o_.image_size);
    const bool flip = aug.flip && (rng.Next() >> 63) != 0;
    const int denom = JpegScaleDenominator(box.width(), box.height(), o_.image_size);
    // Decode only the box, plus the pixels the resampling filter reaches beyond it: up to
    // ceil(max(scale, 1)) decoded pixels, scale = decoded box side / image_size. The result then
    // equals resampling the whole decoded image.
    const double scale = std::max(box.width(), box.height()) / denom / o_.image_size;
    const int margin = static_cast<int>(std::ceil(std::max(scale, 1.0))) + 1;
    const SourceRegion region{box.x0, box.y0, box.x1, box.y1};
    RgbImage img;
    bool damaged = false;
    EDL_RETURN_IF_ERROR(
        dec->Decode(bytes.data(), bytes.size(), path, denom, &img, &damaged, &region, margin));
    if (damaged) {
      WarnOnce(idx, path + ": damaged JPEG data, decoded what was readable (the rest is grey)");
    }
    // The box in the decoded region's pixels (the decoded image is ceil(side / denom) px).
    const double sx = static_cast<double>(img.full_width) / w;
    const double sy = static_cast<double>(img.full_height) / h;
    const CropBox in_region{box.x0 * sx - img.x0, box.y0 * sy - img.y0, box.x1 * sx - img.x0,
                            box.y1 * sy - img.y0};
    ResampleNormalize(img, in_region, o_.image_size, flip, dst);
    return Status::OK();
  }

  // Logs `message` (which names the file) the first time sample `idx` has a problem.
  void WarnOnce(int64_t idx, const std::string& message) const {
    MutexLock lock(&warned_mu_);
    if (warned_.insert(idx).second) LOG(WARNING) << message;
  }

  const std::string dir_;
  const ImageFolderOptions o_;
  const int resize_;
  const std::vector<std::string> files_;  // full paths, by sample index
  const std::vector<int32_t> labels_;     // class index, by sample index
  const int classes_;
  mutable DecodePool pool_;
  // One decoder per pool thread (ParallelFor calls run one at a time, so worker w is one thread).
  std::vector<std::unique_ptr<ImageDecoder>> decoders_;

  mutable Mutex warned_mu_;
  mutable std::unordered_set<int64_t> warned_ GUARDED_BY(warned_mu_);
};

// Sorted names of the subfolders of `dir`.
Status ListClasses(const std::string& dir, std::vector<std::string>* classes) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Status::InvalidArgument(
        dir +
        ": no such directory; --data imagefolder wants "
        "DIR/train/<class>/*.jpg (and DIR/val/<class>/*.jpg for --eval)");
  }
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_directory(ec)) classes->push_back(it->path().filename().string());
  }
  if (ec) return Status::InvalidArgument(dir + ": cannot list (" + ec.message() + ")");
  std::sort(classes->begin(), classes->end());
  if (classes->empty()) {
    return Status::InvalidArgument(dir +
                                   ": no class folders; put each class's images in "
                                   "their own subfolder (" +
                                   dir + "/<class>/*.jpg)");
  }
  return Status::OK();
}

}  // namespace

StatusOr<std::unique_ptr<Dataset>> OpenImageFolderSplit(const std::string& split_dir,
                                                        const ImageFolderOptions& o,
                                                        std::vector<std::string>* classes,
                                                        std::vector<std::string>* files_out) {
  if (o.image_size < 1 || o.image_size > 4096) {
    return Status::InvalidArgument("--image_size " + std::to_string(o.image_size) +
                                   " is outside 1..4096 for imagefolder");
  }
  if (o.resize != 0 && o.resize < o.image_size) {
    return Status::InvalidArgument("the evaluation resize " + std::to_string(o.resize) +
                                   " is smaller than the crop " + std::to_string(o.image_size));
  }
  classes->clear();
  EDL_RETURN_IF_ERROR(ListClasses(split_dir, classes));
  std::vector<std::string> files;
  std::vector<int32_t> labels;
  for (size_t c = 0; c < classes->size(); ++c) {
    const std::string class_dir = split_dir + "/" + (*classes)[c];
    std::vector<std::string> found;
    std::error_code ec;
    for (fs::recursive_directory_iterator it(class_dir, ec), end; !ec && it != end;
         it.increment(ec)) {
      if (IsImageFile(it->path()) && !it->is_directory(ec)) found.push_back(it->path().string());
    }
    if (ec) return Status::InvalidArgument(class_dir + ": cannot list (" + ec.message() + ")");
    if (found.empty()) {
      return Status::InvalidArgument(class_dir +
                                     ": class folder holds no .jpg/.jpeg/.png "
                                     "files; add images or remove the folder");
    }
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
    labels.insert(labels.end(), found.size(), static_cast<int32_t>(c));
  }
  if (files_out != nullptr) *files_out = files;
  return std::unique_ptr<Dataset>(new ImageFolder(split_dir, o, std::move(files), std::move(labels),
                                                  static_cast<int>(classes->size())));
}

Status LoadImageFolder(const std::string& dir, const ImageFolderOptions& o, bool with_val,
                       std::unique_ptr<Dataset>* train, std::unique_ptr<Dataset>* val) {
  std::vector<std::string> train_classes, val_classes;
  auto tr = OpenImageFolderSplit(dir + "/train", o, &train_classes);
  EDL_RETURN_IF_ERROR(tr.status());
  *train = std::move(tr.value());
  if (!with_val) return Status::OK();
  auto va = OpenImageFolderSplit(dir + "/val", o, &val_classes);
  EDL_RETURN_IF_ERROR(va.status());
  if (val_classes != train_classes) {
    std::vector<std::string> only_train, only_val;
    std::set_difference(train_classes.begin(), train_classes.end(), val_classes.begin(),
                        val_classes.end(), std::back_inserter(only_train));
    std::set_difference(val_classes.begin(), val_classes.end(), train_classes.begin(),
                        train_classes.end(), std::back_inserter(only_val));
    auto list = [](const std::vector<std::string>& v) {
      std::string s;
      for (size_t i = 0; i < v.size() && i < 5; ++i) s += (i ? ", '" : "'") + v[i] + "'";
      if (v.size() > 5) s += " and " + std::to_string(v.size() - 5) + " more";
      return s.empty() ? std::string("none") : s;
    };
    return Status::InvalidArgument(
        dir + "/val has other classes than " + dir + "/train (only in train: " + list(only_train) +
        "; only in val: " + list(only_val) +
        "): the class indices would not match; give both splits the same class folders");
  }
  *val = std::move(va.value());
  return Status::OK();
}

}  // namespace edl::resnet50
