#include "resnet50/data/image_transform.h"

#include <algorithm>
#include <vector>

namespace edl::resnet50 {

namespace {

// Python's round() (half to even), which torchvision's crop arithmetic uses.
int RoundHalfEven(double v) { return static_cast<int>(std::nearbyint(v)); }

// Resampling weights of one axis (PIL's precompute_coeffs with the bilinear filter): output
// pixel i reads `count[i]` source pixels from `start[i]` with weights w[i * ksize ...].
struct AxisWeights {
  int ksize = 0;
  std::vector<int> start, count;
  std::vector<float> w;
};

AxisWeights Weights(double in0, double in1, int in_size, int out_size) {
  AxisWeights a;
  const double scale = (in1 - in0) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = filterscale;  // bilinear support 1, widened when shrinking
  a.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  a.start.resize(out_size);
  a.count.resize(out_size);
  a.w.assign(static_cast<size_t>(out_size) * a.ksize, 0.f);
  for (int i = 0; i < out_size; ++i) {
    const double center = in0 + (i + 0.5) * scale;
    int lo = static_cast<int>(center - support + 0.5);
    int hi = static_cast<int>(center + support + 0.5);
    lo = std::clamp(lo, 0, in_size - 1);
    hi = std::clamp(hi, lo + 1, in_size);
    hi = std::min(hi, lo + a.ksize);
    double total = 0;
    float* w = &a.w[static_cast<size_t>(i) * a.ksize];
    for (int x = lo; x < hi; ++x) {
      const double t = std::abs((x - center + 0.5) / filterscale);
      const double v = t < 1.0 ? 1.0 - t : 0.0;
      w[x - lo] = static_cast<float>(v);
      total += v;
    }
    if (total <= 0) {  // a box thinner than a pixel at the edge: take the nearest pixel
      w[0] = 1.f;
      total = 1;
      hi = lo + 1;
    }
    for (int x = lo; x < hi; ++x) w[x - lo] = static_cast<float>(w[x - lo] / total);
    a.start[i] = lo;
    a.count[i] = hi - lo;
  }
  return a;
}

}  // namespace

uint64_t MixSeed(uint64_t a, uint64_t b) {
  uint64_t z = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t SampleRng::Next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double SampleRng::Uniform(double lo, double hi) {
  return lo + (hi - lo) * (static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0));
}

int64_t SampleRng::Int(int64_t lo, int64_t hi) {
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  return lo + static_cast<int64_t>(Next() % span);
}

CropBox RandomResizedCropBox(int width, int height, const RandomCropParams& p, SampleRng* rng) {
  const double area = static_cast<double>(width) * height;
  const double log_lo = std::log(p.min_ratio), log_hi = std::log(p.max_ratio);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * rng->Uniform(p.min_scale, p.max_scale);
    const double ratio = std::exp(rng->Uniform(log_lo, log_hi));
    const int w = RoundHalfEven(std::sqrt(target * ratio));
    const int h = RoundHalfEven(std::sqrt(target / ratio));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int64_t top = rng->Int(0, height - h);
      const int64_t left = rng->Int(0, width - w);
      return {static_cast<double>(left), static_cast<double>(top), static_cast<double>(left + w),
              static_cast<double>(top + h)};
    }
  }
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < p.min_ratio) {
    h = RoundHalfEven(w / p.min_ratio);
  } else if (in_ratio > p.max_ratio) {
    w = RoundHalfEven(h * p.max_ratio);
  }
  const int top = (height - h) / 2, left = (width - w) / 2;
  return {static_cast<double>(left), static_cast<double>(top), static_cast<double>(left + w),
          static_cast<double>(top + h)};
}

CropBox CenterCropBox(int width, int height, int resize, int crop) {
  // torchvision Resize(int): the shorter side becomes `resize`, the longer int(resize * l / s).
  int rw = resize, rh = resize;
  if (width <= height) {
    rh = static_cast<int>(static_cast<int64_t>(resize) * height / width);
  } else {
    rw = static_cast<int>(static_cast<int64_t>(resize) * width / height);
  }
  const int top = RoundHalfEven((rh - crop) / 2.0), left = RoundHalfEven((rw - crop) / 2.0);
  const double sx = static_cast<double>(width) / rw, sy = static_cast<double>(height) / rh;
  return {left * sx, top * sy, (left + crop) * sx, (top + crop) * sy};
}

void ResampleNormalize(const RgbImage& src, const CropBox& box, int size, bool flip, float* dst) {
  const AxisWeights ax = Weights(box.x0, box.x1, src.width, size);
  const AxisWeights ay = Weights(box.y0, box.y1, src.height, size);
  // Source rows the vertical pass reads.
  int y_lo = src.height, y_hi = 0;
  for (int i = 0; i < size; ++i) {
    y_lo = std::min(y_lo, ay.start[i]);
    y_hi = std::max(y_hi, ay.start[i] + ay.count[i]);
  }
  // Horizontal pass: tmp [y_hi - y_lo, size, 3].
  std::vector<float> tmp(static_cast<size_t>(y_hi - y_lo) * size * 3);
  const size_t stride = static_cast<size_t>(src.width) * 3;
  for (int y = y_lo; y < y_hi; ++y) {
    const uint8_t* row = src.pixels.data() + y * stride;
    float* out = &tmp[static_cast<size_t>(y - y_lo) * size * 3];
    for (int x = 0; x < size; ++x) {
      const float* w = &ax.w[static_cast<size_t>(x) * ax.ksize];
      const uint8_t* p = row + static_cast<size_t>(ax.start[x]) * 3;
      float r = 0, g = 0, b = 0;
      for (int k = 0; k < ax.count[x]; ++k) {
        r += w[k] * p[3 * k];
        g += w[k] * p[3 * k + 1];
        b += w[k] * p[3 * k + 2];
      }
      out[3 * x] = r;
      out[3 * x + 1] = g;
      out[3 * x + 2] = b;
    }
  }
  // Vertical pass, normalisation and the flip: dst [3, size, size].
  const size_t plane = static_cast<size_t>(size) * size;
  float scale[3], shift[3];
  for (int c = 0; c < 3; ++c) {
    scale[c] = 1.f / (255.f * kImageNetStd[c]);
    shift[c] = -kImageNetMean[c] / kImageNetStd[c];
  }
  std::vector<float> acc(static_cast<size_t>(size) * 3);
  for (int y = 0; y < size; ++y) {
    std::fill(acc.begin(), acc.end(), 0.f);
    const float* w = &ay.w[static_cast<size_t>(y) * ay.ksize];
    for (int k = 0; k < ay.count[y]; ++k) {
      const float* in = &tmp[static_cast<size_t>(ay.start[y] + k - y_lo) * size * 3];
      const float wk = w[k];
      for (int j = 0; j < size * 3; ++j) acc[j] += wk * in[j];
    }
    for (int x = 0; x < size; ++x) {
      const int ox = flip ? size - 1 - x : x;
      for (int c = 0; c < 3; ++c) {
        const float v = std::clamp(acc[3 * x + c], 0.f, 255.f);
        dst[c * plane + static_cast<size_t>(y) * size + ox] = v * scale[c] + shift[c];
      }
    }
  }
}

}  // namespace edl::resnet50
