// A stand-in for libedl_cuda.so from another edl build: exports edl_cuda_plugin_abi() with a tag
// this build does not accept (cuda_plugin_test checks the loader refuses it).
extern "C" __attribute__((visibility("default"))) const char* edl_cuda_plugin_abi() {
  return "edl-cuda-plugin/0 edl/0.0.0-other";
}
