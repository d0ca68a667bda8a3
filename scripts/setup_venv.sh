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
"$venv/bin/python" -m pip install -q --upgrade pip
args=(-e ".[$extras]" "$@")
[ -n "$constraints" ] && args+=(-c "$constraints")
"$venv/bin/python" -m pip install -q "${args[@]}"
"$venv/bin/python" -m pip freeze --exclude-editable > "$venv/versions.txt"
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
print("Installed:", ", ".join(f"{p} {md.version(p)}" for p in ("jax", "jaxlib", "flax", "optax")))
PY
