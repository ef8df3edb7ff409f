// The torchvision reference transforms for ImageNet-style training, on 8-bit RGB images:
//   training   RandomResizedCrop(size, scale (0.08, 1), ratio (3/4, 4/3)) + RandomHorizontalFlip
//   evaluation Resize(size * 256 / 224, shorter side) + CenterCrop(size)
// each followed by ToTensor + Normalize(ImageNet mean, std) into CHW floats.
//
// Numerics: resampling is PIL's antialiased bilinear filter (a triangle widened by the scale
// factor when shrinking), computed in float for both passes (PIL rounds to 8 bits in between, so
// results differ from PIL by about one grey level). A crop is resampled straight from its box in
// the source image, which gives the same weights as PIL's crop-then-resize, and lets the box be
// fractional when the source was decoded at a reduced scale (see image_decode.h).
//
// Random draws come from a SampleRng seeded per sample, so a sample's crop and flip depend only on
// that seed, never on the thread or the batch it is prepared in.
//
// Thread-safety: free functions without shared state.
#pragma once

#include <cmath>
#include <cstdint>

#include "resnet50/data/image_decode.h"

namespace edl::resnet50 {

// splitmix64 finaliser of (a, b): the seed of one sample is MixSeed(epoch seed, index).
uint64_t MixSeed(uint64_t a, uint64_t b);

// A small deterministic generator (splitmix64 stream).
class SampleRng {
 public:
  explicit SampleRng(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [lo, hi).
  double Uniform(double lo, double hi);
  // Uniform integer in [lo, hi] (REQUIRES: lo <= hi).
  int64_t Int(int64_t lo, int64_t hi);

 private:
  uint64_t state_;
};

// A region of the source image in pixel units: [x0, x1) x [y0, y1), possibly fractional.
struct CropBox {
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  double width() const { return x1 - x0; }
  double height() const { return y1 - y0; }
};

struct RandomCropParams {
  double min_scale = 0.08, max_scale = 1.0;         // fraction of the image area
  double min_ratio = 3.0 / 4, max_ratio = 4.0 / 3;  // width / height
};

// torchvision RandomResizedCrop.get_params for a width x height image: up to 10 draws of an area
// fraction and a log-uniform aspect ratio, else the centre crop clamped to the ratio range.
CropBox RandomResizedCropBox(int width, int height, const RandomCropParams& p, SampleRng* rng);

// Resize(resize, shorter side) followed by CenterCrop(crop), as a box in the source image.
// REQUIRES: resize >= crop.
CropBox CenterCropBox(int width, int height, int resize, int crop);

// The ImageNet statistics ToTensor + Normalize uses (RGB, on [0, 1] values).
constexpr float kImageNetMean[3] = {0.485f, 0.456f, 0.406f};
constexpr float kImageNetStd[3] = {0.229f, 0.224f, 0.225f};

// Resamples `box` of `src` (in src pixel units) to size x size with antialiased bilinear
// weights, mirrors it left-right when `flip`, normalises with the ImageNet mean/std and writes
// dst [3, size, size].
void ResampleNormalize(const RgbImage& src, const CropBox& box, int size, bool flip, float* dst);

}  // namespace edl::resnet50
