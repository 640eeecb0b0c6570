#!/usr/bin/env bash
# Fine-tuning from the command line: a base model saved by --checkpoint, then LoRA adapters on
# rotated images; the JSON summary's uplink bytes are the adapters' floats times 4, a LoRA run
# resumes from its own checkpoint as if never stopped, and the combinations that cannot work
# are refused with a message that names the flag.
#
#   tests/federated/fedsim_lora.sh PATH/TO/troupe
set -euo pipefail

troupe="$(realpath "$1")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }

common=(--clients 10 --per-round 3 --model mlp:784-16-10 --eval-every 100 --seed 3)
"$troupe" fedsim "${common[@]}" --rounds 2 --checkpoint base --json >base.json
[[ -f base/fedsim.ckpt ]] || fail "no base checkpoint"

"$troupe" fedsim "${common[@]}" --rounds 2 --finetune-from base --shift rot90 --lora 4 --lora-agg fedex --json >lora.json
summary="$(grep '^{"final_accuracy":' lora.json)" || fail "no summary: $(cat lora.json)"
# 2 rounds x 3 clients x rank 4 x (784 + 16 + 16 + 10) floats x 4 bytes.
[[ "$summary" == *'"uplink_bytes":79296,'* ]] || fail "uplink bytes: $summary"
[[ "$summary" == *'"uplink_bytes_per_round":39648'* ]] || fail "uplink bytes per round: $summary"
[[ "$summary" == *'"shift":"rot90","finetuned":true,"lora":"4","lora_agg":"fedex","lora_alpha":0'* ]] ||
  fail "the settings: $summary"
grep -q '^{"round":2,.*"uplink_bytes":79296' lora.json || fail "the round line's uplink: $(cat lora.json)"

# A LoRA run stopped at round 1 and resumed ends as the run never stopped (mixed ranks, FlexLoRA).
mixed=(--finetune-from base --shift rot90 --lora 2,4,8 --lora-agg flexlora --json)
"$troupe" fedsim "${common[@]}" "${mixed[@]}" --rounds 2 --checkpoint straight >straight.json
"$troupe" fedsim "${common[@]}" "${mixed[@]}" --rounds 1 --checkpoint resumed >/dev/null
"$troupe" fedsim "${common[@]}" "${mixed[@]}" --rounds 2 --checkpoint resumed >resumed.json 2>err
grep -q "resumed from the checkpoint of round 1" err || fail "not resumed: $(cat err)"
crc() { grep -o '"model_crc32":"[0-9a-f]*"' "$1"; }
[[ -n "$(crc straight.json)" && "$(crc straight.json)" == "$(crc resumed.json)" ]] ||
  fail "resumed $(crc resumed.json), straight $(crc straight.json)"

# Full fine-tuning of the same model: every parameter travels (12730 floats per update).
"$troupe" fedsim "${common[@]}" --rounds 2 --finetune-from base --shift brightness:0.5 --json >full.json
grep -q '"uplink_bytes":305520,' full.json || fail "full fine-tuning's uplink: $(cat full.json)"

refused() {  # refused EXPECTED-WORDS FLAGS... (the common flags, with --model mlp:784-16-10, unless -- comes first)
  local words="$1"
  shift
  local flags=("${common[@]}")
  if [[ "$1" == "--" ]]; then flags=(--clients 10 --per-round 3); shift; fi
  if "$troupe" fedsim "${flags[@]}" --rounds 1 "$@" >out 2>err; then fail "accepted $*: $(cat out)"; fi
  grep -qF -- "$words" err || fail "the refusal of $* says: $(cat err)"
}
refused "give --finetune-from" --lora 4
refused "needs one rank for every client" --finetune-from base --lora 2,4 --lora-agg fedit
refused "--secagg cannot combine with --lora" --finetune-from base --lora 4 --secagg
refused "--strategy scaffold cannot combine with --lora" --finetune-from base --lora 4 --strategy scaffold
refused "saved with --model mlp:784-16-10; this run has --model mlp:784-32-10" -- --finetune-from base --model mlp:784-32-10
refused "holds no fedsim.ckpt" --finetune-from "$work"
refused "unknown --shift 'flip'" --finetune-from base --shift flip
refused "unknown --lora-agg 'fedavg'" --finetune-from base --lora 4 --lora-agg fedavg
echo "fedsim_lora: all checks passed"
