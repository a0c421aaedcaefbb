# shellcheck shell=bash
# Sourced by the perf/peers scripts: a venv with PyTorch and NumPy from the
# package registry, made once and reused while it imports them.
#
#   ensure_torch_venv VENV SPEC NAME
#
# VENV: the venv's directory (the scripts use build/perf/peers-venv); SPEC:
# the pip requirement for torch ("torch", "torch==2.5.1"); NAME: the script's
# name for messages. When it cannot be installed the script says why and
# exits 0 with "skipped": it never prints numbers it did not measure.
#
# PyPI's Linux torch wheel is built for CUDA; it does not import without its
# nvidia-* dependencies (libtorch_cuda.so links libcufile, libcudart, ...),
# even on a CPU-only machine, so `pip install --no-deps torch` is not enough
# and the full install (about 5.4 GB in the venv) is what works. The CPU-only
# wheels live outside PyPI.
ensure_torch_venv() {
  local venv="$1" spec="$2" name="$3"
  _torch_skip() {
    echo "$name: skipped: $1"
    echo "$name: no numbers were measured (the comparison needs PyTorch)."
    exit 0
  }
  if ! "$venv/bin/python" -c 'import torch, numpy' > /dev/null 2>&1; then
    echo "$name: installing $spec and numpy into $venv (about 5 GB with the CUDA" \
      "libraries PyPI's wheel needs; a few minutes)"
    local t0=$SECONDS
    python3 -m venv "$venv" || _torch_skip "cannot create a venv at $venv (python3 -m venv failed)"
    local log="$venv/install.log"
    if ! "$venv/bin/pip" install "$spec" numpy > "$log" 2>&1; then
      tail -5 "$log" | sed 's/^/  /'
      _torch_skip "pip install $spec numpy failed (log: $log)"
    fi
    "$venv/bin/python" -c 'import torch, numpy' > /dev/null 2>&1 ||
      _torch_skip "torch was installed into $venv but does not import: $("$venv/bin/python" -c 'import torch' 2>&1 | tail -1)"
    echo "$name: installed in $((SECONDS - t0)) s"
  fi
}
