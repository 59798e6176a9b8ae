#!/usr/bin/env bash
# One-time set-up of a fresh GPU machine (see README.md beside this file).
set -e
mkdir -p ~/site
tar xzf .carry/site.tar.gz -C ~/site
python3 -m pip install -q --no-deps --no-build-isolation --target ~/site .carry/pycosat-*.tar.gz
echo "site ready: $(ls ~/site | wc -l) entries"
