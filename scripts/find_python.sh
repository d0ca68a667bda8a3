#!/usr/bin/env bash
# Prints the path of the newest suitable Python for the course, or fails saying why.
# Suitable: 3.12 (Kaggle's version, newest JAX) first, then 3.13 (Colab's), then 3.11.
# Python 3.10 cannot run the JAX versions the course supports (jax 0.7.2 needs 3.11).
# An argument (such as 3.13) asks for that version only. Looks at python3.X on PATH, then at pyenv's versions; PYTHON=/path/to/python overrides.
set -u
if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; exit 0; fi
roots=()
command -v pyenv >/dev/null 2>&1 && roots+=("$(pyenv root)/versions")
for v in ${1:-3.12 3.13 3.11}; do
  cands=("$(command -v python$v 2>/dev/null)")
  for r in "${roots[@]}"; do cands+=("$r"/$v.*/bin/python$v); done
  cands+=("$(command -v python3 2>/dev/null)")
  for c in "${cands[@]}"; do
    [ -n "$c" ] && [ -x "$c" ] || continue
    if [ "$("$c" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$v" ]; then
      echo "$c"; exit 0
    fi
  done
done
echo "No Python ${1:-3.12, 3.13 or 3.11} found (the course needs JAX >= 0.7.2, which needs Python >= 3.11). Install one (for example 'pyenv install 3.12', or your distribution's python3.12 package) or set PYTHON=/path/to/python3.12." >&2
exit 1
