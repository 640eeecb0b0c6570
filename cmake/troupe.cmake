# troupe_add_module(<name> [SOURCES ...] [PUBLIC_DEPS ...] [PRIVATE_DEPS ...])
#
# Gives every module the same shape: target troupe_<name> with alias troupe::<name>,
# public headers in <name>/include (included as <troupe/<name>/...>), private sources
# and headers in <name>/src. A module without sources yet is an INTERFACE library so
# that others can already link against it. The target joins the export set troupeTargets
# (cmake/install.cmake installs it as troupe::<name>, its headers under include/).
function(troupe_add_module name)
  cmake_parse_arguments(M "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  set(target troupe_${name})
  if(M_SOURCES)
    add_library(${target} STATIC ${M_SOURCES})
    target_include_directories(${target}
      PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
      PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
    target_link_libraries(${target} PUBLIC ${M_PUBLIC_DEPS} PRIVATE ${M_PRIVATE_DEPS})
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-unused-parameter>)
    # The public headers are C++20 (coroutines, concepts, designated initializers): users of the
    # installed package get the standard from the target.
    target_compile_features(${target} PUBLIC cxx_std_20)
    set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  else()
    add_library(${target} INTERFACE)
    if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/include)
      target_include_directories(${target} INTERFACE
        $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
    endif()
    target_link_libraries(${target} INTERFACE ${M_PUBLIC_DEPS})
    target_compile_features(${target} INTERFACE cxx_std_20)
  endif()
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  add_library(troupe::${name} ALIAS ${target})
  set_property(GLOBAL APPEND PROPERTY TROUPE_MODULES ${name})
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/include)
    set_property(GLOBAL APPEND PROPERTY TROUPE_PUBLIC_INCLUDE_DIRS ${CMAKE_CURRENT_SOURCE_DIR}/include)
  endif()
endfunction()

# troupe_pkg_config_dependency(<module> <PREFIX> <pkg-config module>)
#
# A system library found through pkg-config (its imported target PkgConfig::<PREFIX>) that the
# module links: found here, and recorded so that the installed CMake package finds it again for
# users of troupe::<module> (the libraries are static: their users link it too) and troupe.pc
# lists it in Requires.private.
function(troupe_pkg_config_dependency module prefix pc_module)
  find_package(PkgConfig REQUIRED)
  if(NOT TARGET PkgConfig::${prefix})
    pkg_check_modules(${prefix} REQUIRED IMPORTED_TARGET GLOBAL ${pc_module})
  endif()
  set_property(GLOBAL APPEND PROPERTY TROUPE_PKG_CONFIG_DEPS "${module}|${prefix}|${pc_module}")
endfunction()

# troupe_add_module_tests(<module> [DEPS ...])
#
# One GoogleTest executable per module, <module>_test, from tests/<module>/*_test.cpp,
# registered with ctest (one ctest entry per test case).
function(troupe_add_module_tests module)
  cmake_parse_arguments(T "" "" "DEPS" ${ARGN})
  file(GLOB sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${module}/*_test.cpp)
  if(NOT sources)
    return()
  endif()
  add_executable(${module}_test ${sources})
  target_link_libraries(${module}_test PRIVATE troupe::${module} ${T_DEPS} GTest::gtest GTest::gtest_main)
  target_compile_options(${module}_test PRIVATE -Wall -Wextra -Wno-unused-parameter)
  include(GoogleTest)
  gtest_discover_tests(${module}_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300)
endfunction()
