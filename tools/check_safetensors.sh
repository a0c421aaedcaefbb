#!/usr/bin/env bash
# Checks a `zeroshard export` file with the Hugging Face safetensors package
# against the checkpoint it came from (tools/check_safetensors.py). Creates
# its own venv (python3 -m venv, packages from the package registry) in
# ${ZS_VENV:-build/venv-safetensors}; prints why and exits 77 when that is not
# possible (no python3, no network).
#
#   tools/check_safetensors.sh FILE.safetensors CHECKPOINT_DIR [--dtype fp32|bf16]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${ZS_VENV:-$here/../build/venv-safetensors}
if ! command -v python3 >/dev/null; then
  echo "check_safetensors: skipped: python3 is not installed" >&2
  exit 77
fi
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import safetensors, numpy" 2>/dev/null; then
  python3 -m venv "$venv" >/dev/null 2>&1 ||
    { echo "check_safetensors: skipped: python3 -m venv failed (install python3-venv)" >&2; exit 77; }
  "$venv/bin/pip" install --quiet safetensors numpy >/dev/null 2>&1 ||
    { echo "check_safetensors: skipped: pip could not install safetensors and numpy (no network?)" >&2; exit 77; }
fi
exec "$venv/bin/python" "$here/check_safetensors.py" "$@"
