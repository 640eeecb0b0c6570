# Installation, included last by the top-level CMakeLists.txt (every module is defined by then).
#
#   cmake --install build --prefix P    the public headers (P/include/troupe/<module>/), the static
#                                       libraries and the CMake package (P/lib/cmake/troupe/),
#                                       troupe.pc (P/lib/pkgconfig/) and the `troupe` command
#   make package                        the same as two Debian packages (CPack): libtroupe-dev
#                                       (component dev) and troupe (component cli)
#
# The libraries are static (cmake/README.md says why): the CMake package therefore also finds
# what they link, for the components asked for, and troupe.pc lists it for `pkg-config --static`.

include(CMakePackageConfigHelpers)

set(TROUPE_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/troupe CACHE STRING
    "Where the CMake package goes, relative to the prefix")
get_property(_troupe_modules GLOBAL PROPERTY TROUPE_MODULES)
get_property(_troupe_include_dirs GLOBAL PROPERTY TROUPE_PUBLIC_INCLUDE_DIRS)
get_property(_troupe_pkg_config_deps GLOBAL PROPERTY TROUPE_PKG_CONFIG_DEPS)

# ---- libraries, headers, the command ------------------------------------------------------
set(_troupe_library_targets "")
foreach(module IN LISTS _troupe_modules)
  list(APPEND _troupe_library_targets troupe_${module})
endforeach()
# troupe_wire (the envelope codec, private to actors) is installed as an archive only: the static
# troupe_actors needs its objects at link time, never its headers.
install(TARGETS ${_troupe_library_targets} troupe_wire
  EXPORT troupeTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
# Only the modules' include/ trees: the private headers in src/ and the generated Cap'n Proto
# headers stay out (tests/install/check_headers.sh checks the installed tree).
foreach(dir IN LISTS _troupe_include_dirs)
  install(DIRECTORY ${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev
          FILES_MATCHING PATTERN "*.hpp")
endforeach()
install(EXPORT troupeTargets NAMESPACE troupe:: DESTINATION ${TROUPE_INSTALL_CMAKEDIR} COMPONENT dev)

# A CUDA build's command finds the toolkit's runtime where it was linked (/usr/local/cuda is
# not on the loader's path); without CUDA it links only libraries the loader finds anyway.
set_target_properties(troupe PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
install(TARGETS troupe RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)

# ---- the CMake package ----------------------------------------------------------------------
configure_package_config_file(cmake/troupeConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/troupeConfig.cmake
  INSTALL_DESTINATION ${TROUPE_INSTALL_CMAKEDIR})
# 0.x: a minor version may change the API (as semantic versioning allows before 1.0), so
# find_package(troupe 0.2) accepts 0.2.* and refuses 0.1 and 0.3. From 1.0 on: SameMajorVersion.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/troupeConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/troupeConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/troupeConfigVersion.cmake
        DESTINATION ${TROUPE_INSTALL_CMAKEDIR} COMPONENT dev)

# ---- troupe.pc ------------------------------------------------------------------------------
# Relocatable: the prefix is found from the file's own place, so that a tree unpacked anywhere
# (dpkg-deb -x, a copied prefix) works with PKG_CONFIG_PATH alone.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  message(FATAL_ERROR "troupe.pc needs a CMAKE_INSTALL_LIBDIR relative to the prefix, not ${CMAKE_INSTALL_LIBDIR}")
endif()
file(RELATIVE_PATH _troupe_pc_to_prefix /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
string(REGEX REPLACE "/$" "" _troupe_pc_to_prefix "${_troupe_pc_to_prefix}")
set(TROUPE_PC_PREFIX "\${pcfiledir}/${_troupe_pc_to_prefix}")
# Link order: each library before those it uses.
set(TROUPE_PC_LIBS "")
foreach(module federated pipeline kernels actors)
  list(FIND _troupe_modules ${module} _troupe_at)
  if(_troupe_at GREATER -1)
    string(APPEND TROUPE_PC_LIBS " -ltroupe_${module}")
  endif()
endforeach()
string(APPEND TROUPE_PC_LIBS " -ltroupe_wire -ltroupe_core")
set(TROUPE_PC_REQUIRES_PRIVATE "capnp kj libssl libcrypto zlib")
foreach(dep IN LISTS _troupe_pkg_config_deps)
  string(REPLACE "|" ";" dep "${dep}")
  list(GET dep 2 pc_module)
  string(APPEND TROUPE_PC_REQUIRES_PRIVATE " ${pc_module}")
endforeach()
set(TROUPE_PC_LIBS_PRIVATE "-pthread ${CMAKE_DL_LIBS}")
if(CMAKE_DL_LIBS)
  set(TROUPE_PC_LIBS_PRIVATE "-pthread -l${CMAKE_DL_LIBS}")
endif()
if(TROUPE_WITH_CUDA)
  string(APPEND TROUPE_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcudart")
endif()
configure_file(cmake/troupe.pc.in ${CMAKE_CURRENT_BINARY_DIR}/troupe.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/troupe.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

# ---- Debian packages (CPack) ----------------------------------------------------------------
set(TROUPE_PACKAGE_MAINTAINER "troupe developers" CACHE STRING "The Debian packages' Maintainer field")
set(CPACK_PACKAGE_NAME troupe)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${TROUPE_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "C++20 actor framework with a federated-learning simulator")
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL dev cli)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
# The command is stripped (its exported symbols, which `node start --load` libraries use, stay in
# .dynsym); CMake never strips static libraries.
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libtroupe-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_COMPONENT_DEV_DESCRIPTION
  "troupe: headers, static libraries, CMake package and pkg-config file\n Typed actors (tell/ask, futures, coroutines, supervision, remote nodes), numerical\n kernels, pipeline-parallel training and federated-learning simulation, for C++20.\n find_package(troupe 0.2 CONFIG REQUIRED COMPONENTS actors federated).")
set(CPACK_DEBIAN_CLI_PACKAGE_NAME troupe)
set(CPACK_DEBIAN_CLI_PACKAGE_SECTION science)
set(CPACK_COMPONENT_CLI_DESCRIPTION
  "troupe: the command (fedsim, train, schedule, partition, node, bench)\n Federated-learning simulation, pipeline schedules and training, and actor clusters\n from the command line.")
# Depends: the static libraries' users link these (the CMake package finds them through
# find_dependency, troupe.pc through pkg-config), and OpenBLAS is loaded at run time by name
# (libopenblas.so.0, kernels/src/gemm.cpp). libsodium: the federated module's cryptography.
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
  "libspdlog-dev, libfmt-dev, libcapnp-dev, libssl-dev, zlib1g-dev, libzip-dev, libsodium-dev, pkgconf | pkg-config, libopenblas0 | libopenblas-dev")
# The command's shared libraries come from dpkg-shlibdeps where it is installed (dpkg-dev);
# OpenBLAS is named as well: it is loaded with dlopen, which dpkg-shlibdeps cannot see.
set(CPACK_DEBIAN_CLI_PACKAGE_DEPENDS "libopenblas0 | libopenblas-dev")
set(CPACK_DEBIAN_CLI_PACKAGE_RECOMMENDS "dataset-fashion-mnist")
find_program(TROUPE_DPKG_SHLIBDEPS dpkg-shlibdeps)
set(_troupe_shlibdeps OFF)
if(TROUPE_DPKG_SHLIBDEPS)
  set(_troupe_shlibdeps ON)
  if(TROUPE_WITH_CUDA)
    # dpkg-shlibdeps refuses a library that no Debian package installed, as the CUDA runtime of
    # NVIDIA's installer in /usr/local/cuda is: the Depends are then the list below, and the
    # toolkit is the machine's business (the command finds it through its RUNPATH).
    get_target_property(_troupe_cudart CUDA::cudart IMPORTED_LOCATION)
    get_filename_component(_troupe_cudart "${_troupe_cudart}" REALPATH)
    execute_process(COMMAND dpkg -S "${_troupe_cudart}" RESULT_VARIABLE _troupe_owned OUTPUT_QUIET ERROR_QUIET)
    if(NOT _troupe_owned EQUAL 0)
      set(_troupe_shlibdeps OFF)
    endif()
  endif()
endif()
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ${_troupe_shlibdeps})
if(NOT _troupe_shlibdeps)
  # Debian 12's packages of the libraries the command links.
  string(APPEND CPACK_DEBIAN_CLI_PACKAGE_DEPENDS
    ", libcapnp-0.9.2, libspdlog1.10-fmt9, libfmt9, libssl3, libzip4, zlib1g, libsodium23, libstdc++6, libc6")
endif()
include(CPack)
