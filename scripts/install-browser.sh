#!/usr/bin/env bash
# Installs what the console's browser test drives: Debian's headless Chromium and its WebDriver (chromedriver),
# from the distribution's packages, when they are missing. Needs root (or sudo) for apt-get.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "install-browser: chromium and chromium-driver are missing, and installing them needs root or sudo" >&2
  exit 1
fi

"${as_root[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq chromium chromium-driver >/dev/null
chromedriver --version
