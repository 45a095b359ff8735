#!/usr/bin/env bash
# Build the documentation site in strict mode (a broken link or API reference fails the build). The API
# reference reads the package's source laid out under its import names (ortspec, ortspec.export).
# Usage: bash tools/docs.sh [SITE_DIR]      (default build/site; `mkdocs serve` works after one run)
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf build/apisrc
mkdir -p build/apisrc
cp -r runtime build/apisrc/ortspec
cp -r export build/apisrc/ortspec/export
NO_MKDOCS_2_WARNING=1 python3 -m mkdocs build --strict -d "${1:-build/site}"
echo "docs built in ${1:-build/site}"
