# resnet50/cuda: the CUDA backend (cuDNN, cuBLAS, own kernels). Included by the top-level
# CMakeLists.txt into the CUDA plugin libedl_cuda.so only when it found CUDA and cuDNN
# (EDL_HAVE_CUDA); appends to its lists. resnet50/backend.cc's CreateCudaBackend loads the plugin.
# Few translation units on purpose: one .cu (all own kernels, 3 element types) and the cuDNN code
# in its own .cc, so nvcc stays quick on CI's 2 cores.
list(APPEND EDL_CUDA_PLUGIN_SOURCES
  ${CMAKE_SOURCE_DIR}/resnet50/cuda/cuda_backend.cc
  ${CMAKE_SOURCE_DIR}/resnet50/cuda/cudnn_ops.cc
  ${CMAKE_SOURCE_DIR}/resnet50/cuda/cuda_kernels.cu
)
list(APPEND EDL_CUDA_PLUGIN_LIBS edl_resnet50 CUDA::cudart CUDA::cublas CUDA::cublasLt ${CUDNN_LIBRARY})
# cudnn.h sits next to the toolkit's headers here; say so explicitly for installs where it does not.
list(APPEND EDL_CUDA_PLUGIN_INCLUDES ${CUDNN_INCLUDE_DIR})
