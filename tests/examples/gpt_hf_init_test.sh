#!/usr/bin/env bash
# gpt_train's --save-init and --init-from (examples/gpt/hf_weights):
#  - the initial weights saved by 2 ranks at stage 3 and read back by 1 rank
#    accumulating 2 micro-batches at stage 0 give the same losses, bit for
#    bit; read by a run of another seed and saved again, the same file;
#  - an --init-from directory whose config.json has another n_head, a
#    missing one, and --init-from with --resume fail naming it.
# usage: gpt_hf_init_test.sh GPT_TRAIN TEXT
set -euo pipefail
gpt=$1 text=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/config.json" <<'JSON'
{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 2, "n_head": 2,
 "n_embd": 32, "n_positions": 64, "vocab_size": 256, "layer_norm_epsilon": 1e-5}
JSON
common=(--config "$work/config.json" --data "$text" --seq 32 --micro-batch 2 --steps 6
        --quiet --seed $((RANDOM + 1)))
losses() { python3 -c 'import json,sys; [print(repr(json.loads(l)["loss"])) for l in open(sys.argv[1])]' "$1"; }
fail() { echo "FAIL: $*"; exit 1; }

"$gpt" "${common[@]}" --ranks 2 --stage 3 --save-init "$work/init" --log-json "$work/a.jsonl" \
  >/dev/null 2>"$work/a.err" || fail "--save-init: $(cat "$work/a.err")"
[ -f "$work/init/model.safetensors" ] && [ -f "$work/init/config.json" ] ||
  fail "--save-init wrote $(ls "$work/init")"
grep -q '"tie_word_embeddings": true' "$work/init/config.json" || fail "config.json: $(cat "$work/init/config.json")"

# Another seed: its own initialisation is not used, the file's is.
"$gpt" "${common[@]}" --seed $((RANDOM + 40000)) --init-from "$work/init" \
  --save-init "$work/init2" >/dev/null 2>"$work/s.err" || fail "--init-from: $(cat "$work/s.err")"
cmp "$work/init/model.safetensors" "$work/init2/model.safetensors" ||
  fail "the weights read by --init-from and saved again differ from the file read"
"$gpt" "${common[@]}" --ranks 1 --accum 2 --stage 0 --init-from "$work/init" \
  --log-json "$work/b.jsonl" >/dev/null 2>"$work/b.err" || fail "--init-from: $(cat "$work/b.err")"
diff <(losses "$work/a.jsonl") <(losses "$work/b.jsonl") ||
  fail "the run from --init-from does not repeat the run that saved its weights"

# Weights of another model: refused, naming the key.
sed 's/"n_head": 2/"n_head": 4/' "$work/init/config.json" >"$work/other.json"
mkdir "$work/other" && cp "$work/init/model.safetensors" "$work/other/" && mv "$work/other.json" "$work/other/config.json"
set +e
"$gpt" "${common[@]}" --init-from "$work/other" >/dev/null 2>"$work/e1"
rc=$?
"$gpt" "${common[@]}" --init-from "$work/nowhere" >/dev/null 2>"$work/e2"
rc2=$?
"$gpt" "${common[@]}" --init-from "$work/init" --resume --checkpoint-dir "$work/ckpt" >/dev/null 2>"$work/e3"
rc3=$?
set -e
[ $rc != 0 ] && grep -q "n_head is 4 there and 2 in the run's config" "$work/e1" || fail "other n_head: rc $rc, $(cat "$work/e1")"
[ $rc2 != 0 ] && grep -q "nowhere" "$work/e2" || fail "missing directory: rc $rc2, $(cat "$work/e2")"
[ $rc3 = 2 ] && grep -q "drop them or --resume" "$work/e3" || fail "--init-from --resume: rc $rc3, $(cat "$work/e3")"
echo "PASS"
