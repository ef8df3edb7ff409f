# resnet50/cuda: the CUDA backend (cuDNN, cuBLAS, own kernels). Included by resnet50/CMakeLists.txt
# only when the top-level CMake found CUDA and cuDNN (EDL_HAVE_CUDA); appends to its lists.
# Few translation units on purpose: one .cu (all own kernels, 3 element types) and the cuDNN code
# in its own .cc, so nvcc stays quick on CI's 2 cores.
list(APPEND EDL_RESNET50_SOURCES
  cuda/cuda_backend.cc
  cuda/cudnn_ops.cc
  cuda/cuda_kernels.cu
)
list(APPEND EDL_RESNET50_LINK_LIBS CUDA::cudart CUDA::cublas CUDA::cublasLt ${CUDNN_LIBRARY})
# cudnn.h sits next to the toolkit's headers here; say so explicitly for installs where it does not.
include_directories(${CUDNN_INCLUDE_DIR})
