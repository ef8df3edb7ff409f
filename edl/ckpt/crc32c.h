// CRC-32C (Castagnoli), the per-tensor checksum of a checkpoint. Uses the SSE4.2 crc32
// instruction (three interleaved streams, ~10 GB/s) when the CPU has it, a table otherwise; both
// give the same value (the iSCSI / RocksDB / ext4 CRC-32C, initial value 0, final xor ~0).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace edl::ckpt {

// Returns the CRC-32C of data[0, n) continued from `crc` (the value of the preceding bytes;
// 0 for the first block), so Extend(Extend(0, a), b) == Extend(0, a + b).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

// True when the hardware path is in use (for benchmarks and logs).
bool Crc32cHardware();

}  // namespace edl::ckpt
