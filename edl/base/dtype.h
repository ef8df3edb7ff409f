// Element types of tensors, shared by the communicators (edl/runtime/comm) and the checkpoint store
// (edl/ckpt): it lives here, below both, so neither layer reaches sideways for it.
//
// Thread-safety: plain values.
#pragma once

#include <cstddef>

namespace edl {

enum class DataType { kFloat32, kFloat64, kInt64, kInt32, kBFloat16, kFloat16, kUInt8 };

// Size in bytes of one element of `t`.
size_t DataTypeSize(DataType t);

}  // namespace edl
