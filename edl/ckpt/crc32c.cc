#include "edl/ckpt/crc32c.h"

#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace edl::ckpt {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

struct Table {
  uint32_t t[256];
  Table() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[i] = c;
    }
  }
};

uint32_t SoftwareExtend(uint32_t crc, const uint8_t* p, size_t n) {
  static const Table table;
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) c = table.t[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

#if defined(__x86_64__)
// crc(A || B) from crc(A), crc(B) via the GF(2) "multiply by x^(8*len)" operator; used to join the
// three interleaved streams. Shift by `bytes` zero bytes of the raw (non-inverted) register.
uint32_t GfMultiply(uint32_t a, uint32_t b) {  // a * b mod P, reflected
  uint32_t r = 0;
  for (int i = 0; i < 32; ++i) {
    if (b & 0x80000000u) r ^= a;
    b <<= 1;
    a = (a & 1) ? (a >> 1) ^ kPoly : a >> 1;
  }
  return r;
}

// x^(8*bytes) mod P in reflected form, by repeated squaring of x^8.
uint32_t ShiftOperator(size_t bytes) {
  uint32_t result = 0x80000000u;  // x^0
  uint32_t power = 0x00800000u;   // x^8
  while (bytes) {
    if (bytes & 1) result = GfMultiply(result, power);
    power = GfMultiply(power, power);
    bytes >>= 1;
  }
  return result;
}

constexpr size_t kStripe = 8192;  // bytes per stream per round (3 streams)

__attribute__((target("sse4.2"))) uint32_t HardwareExtend(uint32_t crc, const uint8_t* p,
                                                          size_t n) {
  static const uint32_t shift = ShiftOperator(kStripe);
  uint64_t c0 = ~crc;
  while (n >= 3 * kStripe) {
    uint64_t c1 = 0, c2 = 0;
    const uint8_t* p1 = p + kStripe;
    const uint8_t* p2 = p + 2 * kStripe;
    for (size_t i = 0; i < kStripe; i += 8) {
      uint64_t v0, v1, v2;
      std::memcpy(&v0, p + i, 8);
      std::memcpy(&v1, p1 + i, 8);
      std::memcpy(&v2, p2 + i, 8);
      c0 = _mm_crc32_u64(c0, v0);
      c1 = _mm_crc32_u64(c1, v1);
      c2 = _mm_crc32_u64(c2, v2);
    }
    // Raw registers combine linearly: reg(A||B) = reg(A) * x^(8|B|) xor reg_from_zero(B).
    c0 = GfMultiply(static_cast<uint32_t>(c0), shift) ^ c1;
    c0 = GfMultiply(static_cast<uint32_t>(c0), shift) ^ c2;
    p += 3 * kStripe;
    n -= 3 * kStripe;
  }
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c0 = _mm_crc32_u64(c0, v);
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c0 = _mm_crc32_u8(static_cast<uint32_t>(c0), *p++);
    --n;
  }
  return ~static_cast<uint32_t>(c0);
}
#endif

}  // namespace

bool Crc32cHardware() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
#else
  return false;
#endif
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
  if (Crc32cHardware()) return HardwareExtend(crc, p, n);
#endif
  return SoftwareExtend(crc, p, n);
}

}  // namespace edl::ckpt
