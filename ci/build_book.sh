#!/usr/bin/env bash
# Build the book on the offline default (smoke) profile into _build/html, executing every
# chapter from a clean state: all at once on the machine's cores (tools/execute_chapters.py,
# into the execution cache), then the build, which finds them executed. Usage: bash ci/build_book.sh
source "$(dirname "$0")/env.sh"
rm -rf _build/.jupyter_cache _build/jupyter_execute
python tools/execute_chapters.py
jupyter-book build . --warningiserror --keep-going
echo "[ccu] book built: $ROOT/_build/html/index.html"
