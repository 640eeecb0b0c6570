#!/usr/bin/env bash
# `cmake --install` into a fresh prefix, then a user's project against it: the CMake package
# (find_package(troupe 0.2 CONFIG REQUIRED COMPONENTS actors federated), its refusals) and
# troupe.pc (a pkg-config build). Reuses the build tree: run after the build (`make test`).
#
#   install_test.sh BUILD_DIR SOURCE_DIR WORK_DIR GENERATOR CXX LIBDIR VERSION
set -euo pipefail
build=$1 src=$2 work=$3 generator=$4 cxx=$5 libdir=$6 version=$7
. "$src/tests/install/lib.sh"

rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" > "$work/install.log" 2>&1 ||
  fail "cmake --install $build --prefix $prefix failed: $(tail -n 20 "$work/install.log")"
check_installed_tree "$prefix" "$libdir" "$version"

build_consumer "$src" "$prefix" "$work/consumer" "$generator" "$cxx"

expect_find_package_failure "$prefix" "$work/unknown_component" "$generator" "$cxx" \
  "troupe 0.2 CONFIG REQUIRED COMPONENTS actors no_such" "troupe has no component 'no_such'"
expect_find_package_failure "$prefix" "$work/newer_minor" "$generator" "$cxx" \
  "troupe 0.3 CONFIG REQUIRED" "version: $version"
expect_find_package_failure "$prefix" "$work/older_minor" "$generator" "$cxx" \
  "troupe 0.1 CONFIG REQUIRED" "version: $version"

# pkg-config: the actor program compiled and linked by hand.
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
said=$(pkg-config --modversion troupe) || fail "pkg-config does not find troupe in $PKG_CONFIG_PATH"
[[ $said == "$version" ]] || fail "pkg-config --modversion troupe said '$said', not '$version'"
cflags=$(pkg-config --cflags troupe)
libs=$(pkg-config --static --libs troupe)
# The include directory, relative to the .pc file's place, is the installed one.
incdir=$(sed -nE 's/^-I([^ ]+).*/\1/p' <<<"$cflags")
[[ -n $incdir && $(realpath "$incdir") == $(realpath "$prefix/include") ]] ||
  fail "troupe.pc's Cflags ('$cflags') do not name $prefix/include first"
# shellcheck disable=SC2086
"$cxx" -std=c++20 -O1 "$src/tests/install/consumer/counter_app.cpp" $cflags -o "$work/counter_app_pc" $libs \
  > "$work/pkg-config.log" 2>&1 || fail "the pkg-config build failed ($cxx ... $cflags ... $libs): $(tail -n 30 "$work/pkg-config.log")"
out=$("$work/counter_app_pc" 2>&1) || fail "the pkg-config build's counter_app failed: $out"
grep -q '^counter_app: ok$' <<<"$out" || fail "the pkg-config build's counter_app did not say ok: $out"
echo "pkg-config build: ok"

# Vendored instead of installed: the same project with add_subdirectory of this source tree
# configures and generates (building it would rebuild troupe; the install above tested the code).
cmake -S "$src/tests/install/consumer" -B "$work/vendored" -G "$generator" -DCMAKE_CXX_COMPILER="$cxx" \
  -DTROUPE_VENDORED_SOURCE="$src" > "$work/vendored.log" 2>&1 ||
  fail "the consumer with add_subdirectory($src) did not configure: $(tail -n 30 "$work/vendored.log")"
if grep -rlq troupeTargets "$work/vendored" --include=cmake_install.cmake; then
  fail "the vendored troupe added its install rules to its user's project"
fi
echo "add_subdirectory configuration: ok"
echo "install_test: ok"
