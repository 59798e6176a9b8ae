#!/usr/bin/env bash
# One-time set-up of a fresh GPU machine (see README.md beside this file; .carry/ from make_carry.py).
set -e
mkdir -p ~/site
tar xzf .carry/site.tar.gz -C ~/site
if ls .carry/wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target ~/site .carry/wheels/*.whl
fi
echo "site ready: $(ls ~/site | wc -l) entries"
