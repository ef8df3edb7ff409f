// ImageFolder: an ImageNet-style directory of images, one subfolder per class, as torchvision's
// ImageFolder reads it:
//   DIR/train/<class>/**/*.{jpg,jpeg,png}   (any case; other files are ignored)
//   DIR/val/<class>/**/*.{jpg,jpeg,png}
// Class indices follow the sorted folder names; samples are ordered by class, then path.
//
// FillBatch decodes each sample (image_decode.h) and applies the reference transforms
// (image_transform.h): with Augment::random_crop, RandomResizedCrop(image_size) and, with
// Augment::flip, a random horizontal flip; otherwise Resize(resize) + CenterCrop(image_size).
// The random draws of sample i come from MixSeed(aug_seed, i) only, so a sample looks the same
// whatever batch, thread or trainer prepares it. Samples are spread over a DecodePool of
// `threads` threads. A file that cannot be decoded (or read) is skipped: its label is set to
// kSkippedLabel and its image to zeros, and one warning names it (once per file per process).
//
// Thread-safety: as Dataset (FillBatch may be called from several threads).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "edl/base/status.h"
#include "resnet50/data/dataset.h"
#include "resnet50/data/image_transform.h"

namespace edl::resnet50 {

struct ImageFolderOptions {
  int image_size = 224;  // side of the square images the model gets (crop size)
  int resize = 0;   // evaluation: shorter side before the centre crop; 0 = image_size * 256 / 224
  int threads = 1;  // decode threads per split (the calling thread is one of them)
  RandomCropParams crop;  // RandomResizedCrop's scale and ratio ranges
};

// Opens DIR/train and, when `with_val`, DIR/val (which must have the same class folders).
// InvalidArgument naming the folder: a missing split, no class folders, a class folder without
// images, or val classes that differ from train's.
Status LoadImageFolder(const std::string& dir, const ImageFolderOptions& options, bool with_val,
                       std::unique_ptr<Dataset>* train, std::unique_ptr<Dataset>* val);

// One split folder (DIR/train or DIR/val) on its own; the sorted class names go to *classes and,
// when `files` is given, each sample's path (by sample index) to *files.
StatusOr<std::unique_ptr<Dataset>> OpenImageFolderSplit(const std::string& split_dir,
                                                        const ImageFolderOptions& options,
                                                        std::vector<std::string>* classes,
                                                        std::vector<std::string>* files = nullptr);

}  // namespace edl::resnet50
