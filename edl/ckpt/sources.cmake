# edl/ckpt: the checkpoint store (included by edl/CMakeLists.txt).
list(APPEND EDL_SOURCES
  ckpt/crc32c.cc
  ckpt/checkpoint_store.cc
  ckpt/memory_store.cc
  ckpt/rocksdb_store.cc
  ckpt/async_checkpointer.cc
)
list(APPEND EDL_LINK_LIBS PkgConfig::ROCKSDB)
