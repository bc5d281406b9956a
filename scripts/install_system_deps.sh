#!/usr/bin/env bash
# Debian packages the deployment tests need (a real Slurm, munge, Prometheus + promtool).
# Installs only what is missing; needs root (CI runs as root). Without root it prints what is missing
# and exits 0: the tests that need a missing binary then fail with a message naming it.
set -euo pipefail
PACKAGES=(slurm-wlm munge prometheus)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "install_system_deps: not root; missing Debian packages: ${missing[*]}" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
