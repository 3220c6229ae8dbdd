#!/usr/bin/env bash
# Debian's Chromium and its chromedriver, for the test that drives the report's failure browser in
# a real headless browser (tests/test_browser.py). Idempotent: does nothing when both are there.
set -euo pipefail
command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 && exit 0
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
echo "env/setup-browser.sh: chromium $(chromium --version | awk '{print $2}') installed"
