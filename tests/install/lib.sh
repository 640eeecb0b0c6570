# Shared by install_test.sh and deb_test.sh: checks of an installed troupe tree and the build of
# the consumer project (tests/install/consumer/) against it. Every check exits 1 with the reason.

fail() {
  echo "FAILED: $*" >&2
  exit 1
}

# check_installed_tree PREFIX LIBDIR VERSION: the layout, the public headers only (nothing that
# includes Asio, Cap'n Proto, OpenSSL, libzip, zlib, BLAS or CUDA headers, or a private header),
# and a command that runs.
check_installed_tree() {
  local prefix=$1 libdir=$2 version=$3
  local inc=$prefix/include lib=$prefix/$libdir
  [[ -d $inc/troupe ]] || fail "$inc/troupe is missing"
  local top
  top=$(cd "$inc" && ls -A)
  [[ $top == troupe ]] || fail "$inc holds more than troupe/: $top"
  local modules
  modules=$(cd "$inc/troupe" && ls -A | tr '\n' ' ')
  [[ $modules == "actors core federated kernels pipeline " ]] || fail "$inc/troupe holds '$modules', not the five modules"
  local others
  others=$(find "$inc" -type f ! -name '*.hpp')
  [[ -z $others ]] || fail "files that are not public headers were installed: $others"
  local leaks
  leaks=$(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"](boost/|asio|capnp/|kj/|openssl/|zip\.h|zlib\.h|cblas|openblas|cuda|cublas|sodium|net/|.*\.capnp\.h)' "$inc" || true)
  [[ -z $leaks ]] || fail "installed headers include private or unlisted dependencies:
$leaks"
  # Every troupe header an installed header includes is installed too.
  local missing=""
  while IFS= read -r included; do
    [[ -f $inc/$included ]] || missing+=" $included"
  done < <(grep -rhoE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]troupe/[^>"]+' "$inc" | sed -E 's/.*[<"]//' | sort -u)
  [[ -z $missing ]] || fail "installed headers include headers that are not installed:$missing"
  local m
  for m in core wire actors kernels pipeline federated; do
    [[ -f $lib/libtroupe_$m.a ]] || fail "$lib/libtroupe_$m.a is missing"
  done
  local f
  for f in troupeConfig.cmake troupeConfigVersion.cmake troupeTargets.cmake; do
    [[ -f $lib/cmake/troupe/$f ]] || fail "$lib/cmake/troupe/$f is missing"
  done
  [[ -f $lib/pkgconfig/troupe.pc ]] || fail "$lib/pkgconfig/troupe.pc is missing"
  local said
  said=$("$prefix/bin/troupe" --version) || fail "$prefix/bin/troupe --version failed"
  [[ $said == "troupe $version" ]] || fail "$prefix/bin/troupe --version said '$said', not 'troupe $version'"
  echo "installed tree: ok ($(find "$inc" -name '*.hpp' | wc -l) headers, no private includes)"
}

# run_consumer_programs DIR: runs the two programs, each of which checks its own results.
run_consumer_programs() {
  local dir=$1 out
  out=$("$dir/counter_app" 2>&1) || fail "counter_app failed: $out"
  echo "$out"
  grep -q '^counter_app: ok$' <<<"$out" || fail "counter_app did not say ok"
  out=$(TROUPE_LOG_LEVEL=warn "$dir/fedsim_app" 2>&1) || fail "fedsim_app failed: $out"
  echo "$out"
  grep -q '^fedsim_app: ok$' <<<"$out" || fail "fedsim_app did not say ok"
}

# build_consumer SRC PREFIX DIR GENERATOR CXX: configures the consumer with CMAKE_PREFIX_PATH=PREFIX
# (and nothing of the source or build tree), builds it and runs both programs.
build_consumer() {
  local src=$1 prefix=$2 dir=$3 generator=$4 cxx=$5
  cmake -S "$src/tests/install/consumer" -B "$dir" -G "$generator" -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
    > "$dir.configure.log" 2>&1 || fail "the consumer's configuration failed: $(cat "$dir.configure.log")"
  local found
  found=$(sed -n 's/^troupe_DIR:PATH=//p' "$dir/CMakeCache.txt")
  [[ $found == "$prefix"/* ]] || fail "find_package(troupe) found '$found', not the package under $prefix"
  cmake --build "$dir" > "$dir.build.log" 2>&1 || fail "the consumer's build failed: $(tail -n 60 "$dir.build.log")"
  # Its compile commands see the installed headers only: no source tree, no Boost/Cap'n Proto paths.
  local leaks
  leaks=$(grep -oE -- "-I[^ ]*|-isystem [^ ]*" "$dir/compile_commands.json" | grep -E "$src/(core|actors|kernels|pipeline|federated|tests)/|/generated|boost|capnp" || true)
  [[ -z $leaks ]] || fail "the consumer compiles with private include paths: $leaks"
  run_consumer_programs "$dir"
}

# expect_find_package_failure PREFIX DIR GENERATOR CXX "FIND_PACKAGE ARGS" MESSAGE
expect_find_package_failure() {
  local prefix=$1 dir=$2 generator=$3 cxx=$4 args=$5 message=$6
  mkdir -p "$dir"
  printf 'cmake_minimum_required(VERSION 3.25)\nproject(refused LANGUAGES CXX)\nfind_package(%s)\n' "$args" > "$dir/CMakeLists.txt"
  local out
  if out=$(cmake -S "$dir" -B "$dir/build" -G "$generator" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$prefix" 2>&1); then
    fail "find_package($args) was accepted"
  fi
  grep -qF -- "$message" <<<"$out" || fail "find_package($args) failed without saying '$message': $out"
  echo "find_package($args) refused: ok"
}
