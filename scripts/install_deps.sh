#!/usr/bin/env bash
# Installs what atom needs to build and test on Debian 12 (run as root). Idempotent.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
pkgs=(build-essential cmake ninja-build pkg-config git
      nlohmann-json3-dev libfmt-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev libcli11-dev
      libxxhash-dev libgtest-dev python3 python3-jinja2 python3-numpy nodejs npm)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}"
fi
