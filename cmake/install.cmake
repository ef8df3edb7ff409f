# `make install PREFIX=...` (cmake --install) and `cpack -G DEB`. Included by the top-level
# CMakeLists.txt after every component. What is installed:
#   bin/edl                          every role; finds its libraries through an $ORIGIN-relative
#                                    RUNPATH, so the tree runs from wherever it is copied
#   lib/libedl.so, libedl_resnet50.so, and libedl_cuda.so (CUDA builds: the plugin is looked for
#                                    next to libedl.so, docs/GPU.md "The CUDA plugin")
#   include/edl/...                  the runtime's public headers (edl/CMakeLists.txt)
#   lib/cmake/edl/                   find_package(edl) -> edl::runtime, EDL_EXECUTABLE
#   lib/python3.<minor>/dist-packages/edl/   the Python package edl (edl.torch), where Debian's
#                                    python3 finds it under /usr and /usr/local alike
# (lib/ is CMAKE_INSTALL_LIBDIR: lib/<multiarch> when configured for the prefix /usr.)
include(CMakePackageConfigHelpers)
# cpack and `make install` in build/ install what is built and build nothing: the Makefile's
# install and package targets build first, and tests/install runs cpack beside other tests, where
# a second make in the same tree would race the first.
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY TRUE)

# bin/ -> lib/ as a relative path, e.g. "../lib", for the executable's RUNPATH.
file(RELATIVE_PATH EDL_BIN_TO_LIB ${CMAKE_INSTALL_FULL_BINDIR} ${CMAKE_INSTALL_FULL_LIBDIR})
set_target_properties(edl_bin PROPERTIES INSTALL_RPATH "$ORIGIN/${EDL_BIN_TO_LIB}")
# libedl.so needs only system libraries; libedl_resnet50.so finds libedl.so next to itself.
set_target_properties(edl_resnet50 PROPERTIES INSTALL_RPATH "$ORIGIN")

install(TARGETS edl EXPORT edlTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT edl)
install(TARGETS edl_resnet50 LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT edl)
install(TARGETS edl_bin RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT edl)
if(TARGET edl_cuda)
  # The CUDA libraries stay where the toolkit put them (or on LD_LIBRARY_PATH): they are not ours
  # to ship. Its own package, so a control node installs edl alone.
  set_target_properties(edl_cuda PROPERTIES INSTALL_RPATH "$ORIGIN;${CUDAToolkit_LIBRARY_DIR}")
  install(TARGETS edl_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT cuda)
endif()
if(TARGET edl_python)
  # The Python package edl (python/CMakeLists.txt): its module finds libedl.so relative to itself.
  file(RELATIVE_PATH EDL_PY_TO_LIB /p/${EDL_PYTHON_INSTALL_DIR}/edl /p/${CMAKE_INSTALL_LIBDIR})
  set_target_properties(edl_python PROPERTIES INSTALL_RPATH "$ORIGIN/${EDL_PY_TO_LIB}")
  install(TARGETS edl_python LIBRARY DESTINATION ${EDL_PYTHON_INSTALL_DIR}/edl COMPONENT edl)
  install(FILES python/edl/__init__.py python/edl/elastic.py python/edl/torch.py
          DESTINATION ${EDL_PYTHON_INSTALL_DIR}/edl COMPONENT edl)
  # Only for the Python package: a control node needs neither.
  set(CPACK_DEBIAN_EDL_PACKAGE_SUGGESTS
      "python3 (>= ${EDL_PYTHON_VERSION}), python3-torch")
endif()
foreach(h ${EDL_PUBLIC_HEADERS})
  get_filename_component(dir ${h} DIRECTORY)
  install(FILES edl/${h} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/edl/${dir} COMPONENT edl)
endforeach()

set(EDL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/edl)
install(EXPORT edlTargets NAMESPACE edl:: DESTINATION ${EDL_CMAKE_DIR} COMPONENT edl)
configure_package_config_file(cmake/edlConfig.cmake.in ${CMAKE_BINARY_DIR}/generated/edlConfig.cmake
                              INSTALL_DESTINATION ${EDL_CMAKE_DIR}
                              PATH_VARS CMAKE_INSTALL_BINDIR)
# 0.x: a minor release may change the runtime's API.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/generated/edlConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/generated/edlConfig.cmake
              ${CMAKE_BINARY_DIR}/generated/edlConfigVersion.cmake
        DESTINATION ${EDL_CMAKE_DIR} COMPONENT edl)

# ---- Debian packages: `cpack -G DEB --config build/CPackConfig.cmake` (or `make package`) writes
# edl_<version>_<arch>.deb, and edl-cuda_... in CUDA builds. Dependencies come from
# dpkg-shlibdeps (Debian 12's library packages), so the package installs with `apt install ./edl_...deb`.
set(CPACK_PACKAGE_NAME edl)
set(CPACK_PACKAGE_VENDOR "EDL")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Elastic data-parallel training for bare-metal clusters (edl server, client, train, launch)")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL edl)
if(TARGET edl_cuda)
  list(APPEND CPACK_COMPONENTS_ALL cuda)
endif()
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "EDL maintainers")
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_EDL_PACKAGE_NAME edl)
set(CPACK_DEBIAN_EDL_PACKAGE_SHLIBDEPS ON)
# libedl.so is in the package itself: dpkg-shlibdeps finds it in the build directory.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_BINARY_DIR})
set(CPACK_DEBIAN_CUDA_PACKAGE_NAME edl-cuda)
set(CPACK_DEBIAN_CUDA_PACKAGE_DEPENDS "edl (= ${PROJECT_VERSION})")
# The CUDA libraries come from NVIDIA's toolkit, not from a Debian package dpkg-shlibdeps knows.
set(CPACK_DEBIAN_CUDA_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_CUDA_DESCRIPTION "The CUDA plugin of edl (edl train --device cuda)")
include(CPack)
