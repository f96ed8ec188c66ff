#!/usr/bin/env bash
# Formats every C++ source of the project in place with clang-format (.clang-format).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
find src tools tests bench -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -print0 \
  | xargs -0 -r clang-format -i
