// Check macros of the CUDA backend (llm.c cudaCheck, but returning Status): every CUDA, cuDNN and
// cuBLAS call goes through one of these, so a failure names the call, file:line, the library's
// error and a hint on what to do. Expected failures (out of memory, a lost device, an unsupported
// shape) come back as Status; programmer errors use glog CHECK at the call site instead.
//
// Thread-safety: stateless.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstring>
#include <string>

#include "edl/base/status.h"

namespace edl::resnet50::cuda {

inline std::string Where(const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return std::string(base ? base + 1 : file) + ":" + std::to_string(line);
}

inline Status CudaError(cudaError_t e, const char* expr, const char* file, int line) {
  std::string hint;
  switch (e) {
    case cudaErrorMemoryAllocation:
      hint = "out of GPU memory: lower --batch_size or use --precision bf16";
      break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      hint = "no usable GPU: check nvidia-smi, the driver and CUDA_VISIBLE_DEVICES";
      break;
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
      hint =
          "the device context is lost (a kernel fault); restart the trainer, run "
          "compute-sanitizer to find the kernel";
      break;
    default:
      hint = "check nvidia-smi; rerun with CUDA_LAUNCH_BLOCKING=1 to pin the failing call";
  }
  return Status::Internal(std::string(expr) + " failed at " + Where(file, line) + ": " +
                          cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + "); " + hint);
}

inline Status CudnnError(cudnnStatus_t s, const char* expr, const char* file, int line) {
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof(last));
  std::string msg =
      std::string(expr) + " failed at " + Where(file, line) + ": " + cudnnGetErrorString(s);
  if (last[0] != '\0') msg += " (" + std::string(last) + ")";
  if (s == CUDNN_STATUS_NOT_SUPPORTED) {
    return Status::InvalidArgument(msg + "; this shape/precision is not supported by cuDNN " +
                                   std::to_string(CUDNN_VERSION) + ": try --precision fp32");
  }
  if (s == CUDNN_STATUS_ALLOC_FAILED) {
    return Status::Internal(msg + "; out of GPU memory: lower --batch_size");
  }
  return Status::Internal(msg + "; rerun with CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr");
}

inline const char* CublasName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "cuBLAS error";
  }
}

inline Status CublasError(cublasStatus_t s, const char* expr, const char* file, int line) {
  return Status::Internal(std::string(expr) + " failed at " + Where(file, line) + ": " +
                          CublasName(s) + " (" + std::to_string(static_cast<int>(s)) +
                          "); rerun with CUBLAS_LOGINFO_DBG=1 CUBLAS_LOGDEST_DBG=stderr");
}

}  // namespace edl::resnet50::cuda

#define EDL_CUDA_RETURN_IF_ERROR(expr)                                            \
  do {                                                                            \
    const cudaError_t _edl_e = (expr);                                            \
    if (_edl_e != cudaSuccess) {                                                  \
      return ::edl::resnet50::cuda::CudaError(_edl_e, #expr, __FILE__, __LINE__); \
    }                                                                             \
  } while (0)
#define EDL_CUDNN_RETURN_IF_ERROR(expr)                                            \
  do {                                                                             \
    const cudnnStatus_t _edl_s = (expr);                                           \
    if (_edl_s != CUDNN_STATUS_SUCCESS) {                                          \
      return ::edl::resnet50::cuda::CudnnError(_edl_s, #expr, __FILE__, __LINE__); \
    }                                                                              \
  } while (0)
#define EDL_CUBLAS_RETURN_IF_ERROR(expr)                                            \
  do {                                                                              \
    const cublasStatus_t _edl_s = (expr);                                           \
    if (_edl_s != CUBLAS_STATUS_SUCCESS) {                                          \
      return ::edl::resnet50::cuda::CublasError(_edl_s, #expr, __FILE__, __LINE__); \
    }                                                                               \
  } while (0)
