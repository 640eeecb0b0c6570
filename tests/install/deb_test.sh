#!/usr/bin/env bash
# The Debian packages: cpack -G DEB makes libtroupe-dev and troupe from the build tree, their
# control fields and contents are checked, both are unpacked (dpkg-deb -x) into a fresh root,
# and a user's project builds against that root and runs. Run after the build (`make test`).
#
#   deb_test.sh BUILD_DIR SOURCE_DIR WORK_DIR GENERATOR CXX LIBDIR VERSION
set -euo pipefail
build=$1 src=$2 work=$3 generator=$4 cxx=$5 libdir=$6 version=$7
. "$src/tests/install/lib.sh"

rm -rf "$work"
mkdir -p "$work/packages"
cpack -G DEB --config "$build/CPackConfig.cmake" -B "$work/packages" > "$work/cpack.log" 2>&1 ||
  fail "cpack -G DEB failed: $(tail -n 30 "$work/cpack.log")"
shopt -s nullglob
devs=("$work/packages"/libtroupe-dev_"$version"-1_*.deb)
clis=("$work/packages"/troupe_"$version"-1_*.deb)
[[ ${#devs[@]} -eq 1 ]] || fail "no single libtroupe-dev_$version-1_*.deb in $work/packages: $(ls "$work/packages")"
[[ ${#clis[@]} -eq 1 ]] || fail "no single troupe_$version-1_*.deb in $work/packages: $(ls "$work/packages")"
dev=${devs[0]} cli=${clis[0]}

# field DEB NAME: one control field.
field() { dpkg-deb -f "$1" "$2"; }
[[ $(field "$dev" Package) == libtroupe-dev ]] || fail "$dev is not the package libtroupe-dev"
[[ $(field "$cli" Package) == troupe ]] || fail "$cli is not the package troupe"
for deb in "$dev" "$cli"; do
  [[ $(field "$deb" Version) == "$version-1" ]] || fail "$deb has version '$(field "$deb" Version)', not $version-1"
done
# depends DEB PATTERN...: each glob pattern matches a whole package name in DEB's Depends (any
# version, either side of an alternative).
depends() {
  local deb=$1 d name found
  shift
  local names
  names=$(field "$deb" Depends | sed -E 's/ *\([^)]*\)//g; s/ *[|,] */\n/g')
  for d in "$@"; do
    found=0
    while IFS= read -r name; do
      # shellcheck disable=SC2053
      [[ $name == $d ]] && found=1
    done <<<"$names"
    [[ $found == 1 ]] || fail "$(field "$deb" Package)'s Depends ('$(field "$deb" Depends)') lacks $d"
  done
}
depends "$dev" libspdlog-dev libfmt-dev libcapnp-dev libssl-dev zlib1g-dev libzip-dev libsodium-dev libopenblas0
# The command's shared libraries (from dpkg-shlibdeps) and the dlopen'ed OpenBLAS.
depends "$cli" libc6 'libstdc++6' 'libcapnp-*' 'libfmt[0-9]*' 'libspdlog1.*' libssl3 'libzip[0-9]*' zlib1g libsodium23 libopenblas0
# Each package once: a name listed by hand and again by dpkg-shlibdeps is a duplicate.
for deb in "$dev" "$cli"; do
  twice=$(field "$deb" Depends | sed -E 's/ *\([^)]*\)//g; s/ *, */\n/g' | sort | uniq -d)
  [[ -z $twice ]] || fail "$(field "$deb" Package)'s Depends names $twice more than once: $(field "$deb" Depends)"
done
echo "libtroupe-dev Depends: $(field "$dev" Depends)"
echo "troupe Depends: $(field "$cli" Depends)"

# Contents: the command only in troupe, the rest only in libtroupe-dev.
cli_files=$(dpkg-deb -c "$cli" | awk '$1 !~ /^d/ {print $NF}')
[[ $cli_files == ./usr/bin/troupe ]] || fail "troupe holds more or less than ./usr/bin/troupe: $cli_files"
dev_files=$(dpkg-deb -c "$dev" | awk '$1 !~ /^d/ {print $NF}')
grep -q '^\./usr/bin/' <<<"$dev_files" && fail "libtroupe-dev holds a command: $(grep '^\./usr/bin/' <<<"$dev_files")"
for f in ./usr/include/troupe/actors/actor_system.hpp "./usr/$libdir/libtroupe_actors.a" \
         "./usr/$libdir/cmake/troupe/troupeConfig.cmake" "./usr/$libdir/pkgconfig/troupe.pc"; do
  grep -qxF "$f" <<<"$dev_files" || fail "libtroupe-dev lacks $f"
done

root=$work/root
dpkg-deb -x "$dev" "$root"
dpkg-deb -x "$cli" "$root"
check_installed_tree "$root/usr" "$libdir" "$version"
out=$("$root/usr/bin/troupe" schedule simulate --schedule 1f1b --stages 2 --microbatches 2 --json) ||
  fail "the packaged troupe failed: $out"
[[ $out == '{"schedule":"1f1b","stages":2,"microbatches":2'* ]] || fail "the packaged troupe said: $out"
build_consumer "$src" "$root/usr" "$work/consumer" "$generator" "$cxx"
echo "deb_test: ok"
