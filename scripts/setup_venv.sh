#!/usr/bin/env bash
# Creates (or refreshes) a virtual environment with the course installed in editable mode.
#   scripts/setup_venv.sh VENV PYTHON EXTRAS [CONSTRAINTS [EXTRA_REQUIREMENT...]]
# Called by `make setup` (newest JAX) and `make setup-colab` (Colab's own versions, from
# ci/colab.txt; libtpu is named on its own there because Colab's libtpu is not the one
# jax[tpu] pins).
set -euo pipefail
venv=$1; python=$2; extras=$3; constraints=${4:-}
shift $(( $# < 4 ? $# : 4 ))
echo "Creating $venv with $("$python" --version) ($python), extras [$extras]"
"$python" -m venv "$venv"
args=(-e ".[$extras]" "$@")
[ -n "$constraints" ] && args+=(-c "$constraints")
# uv (from PyPI) downloads and unpacks in parallel: about 10 s for a set pip takes minutes
# over. Where uv cannot be had or fails, pip does the same install.
# Where PYTHONDONTWRITEBYTECODE is set, Python never caches what it compiles: every
# process then compiled jax, flax, optax and orbax from source again (import jax: 3.3 s of
# CPU instead of 1.2), so the packages' bytecode is compiled here, once, at install.
compile=()
[ -n "${PYTHONDONTWRITEBYTECODE:-}" ] && compile=(--compile-bytecode)
if "$venv/bin/python" -m pip install -q uv \
   && "$venv/bin/python" -m uv pip install -q "${compile[@]}" --python "$venv/bin/python" "${args[@]}"; then
  echo "installed with uv $("$venv/bin/python" -m uv --version | cut -d' ' -f2)"
else
  echo "uv unavailable or failed: installing with pip"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "${args[@]}"
fi
"$venv/bin/python" -m pip freeze --exclude-editable > "$venv/versions.txt"
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
print("Installed:", ", ".join(f"{p} {md.version(p)}" for p in ("jax", "jaxlib", "flax", "optax")))
PY
