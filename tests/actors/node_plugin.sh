#!/usr/bin/env bash
# `troupe node start --load`: a head that loads a library built from troupe's headers alone
# hosts the library's class (its code runs in the head's process); a head without it refuses.
#
#   tests/actors/node_plugin.sh PATH/TO/troupe PATH/TO/plugin.so PATH/TO/plugin_driver
set -euo pipefail
troupe=${1:?usage: $0 TROUPE PLUGIN DRIVER}
plugin=${2:?usage: $0 TROUPE PLUGIN DRIVER}
driver=${3:?usage: $0 TROUPE PLUGIN DRIVER}
name=node_plugin
source "$(dirname "$0")/../nodes_lib.sh"
export TROUPE_CLUSTER_TOKEN=node-plugin-test-token
export TROUPE_LOG_LEVEL=warn

start_head "$troupe" --load "$plugin"
head_pid=${pids[-1]}
out=$(timeout 60 "$driver" "127.0.0.1:$port" 2>&1) || fail "the driver failed: $out"
[[ $out == "greeter in process $head_pid; 2 + 3 = 5" ]] || fail "unexpected answer: $out"

start_head "$troupe"
if out=$(timeout 60 "$driver" "127.0.0.1:$port" 2>&1); then fail "a head without the library hosted its class: $out"; fi
grep -q "does not know the class" <<<"$out" || fail "no reason for the refusal: $out"
echo "node_plugin: ok"
