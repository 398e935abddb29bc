#!/usr/bin/env bash
# Build the book on the offline default (smoke) profile into _build/html, executing every
# chapter from a clean state. Usage: bash ci/build_book.sh
source "$(dirname "$0")/env.sh"
rm -rf _build/.jupyter_cache _build/jupyter_execute
jupyter-book build . --warningiserror --keep-going
echo "[ccu] book built: $ROOT/_build/html/index.html"
