#!/usr/bin/env bash
# README command 2: set up, build, and run the whole test suite (ctest runs
# the Catch2 unit tests and the lit/FileCheck tool tests).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir build --output-on-failure
