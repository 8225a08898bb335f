#!/usr/bin/env bash
# Install the real Prometheus and Alertmanager that the alert tests use (Debian 12 packages:
# prometheus 2.42 brings prometheus + promtool, prometheus-alertmanager 0.25 brings
# prometheus-alertmanager + amtool). Idempotent: returns at once when every binary is there.
#
# No daemon is started: the tests run their own servers on 127.0.0.1 with temporary
# storage. While the packages install, a policy-rc.d that exits 101 keeps their maintainer
# scripts from starting services (an existing policy-rc.d is left as it was).
#
# Usage (as root, or with passwordless sudo): scripts/install-prometheus.sh
set -euo pipefail

need=()
for bin in prometheus promtool; do
    command -v "$bin" >/dev/null 2>&1 || { need+=(prometheus); break; }
done
# Debian names the Alertmanager binary prometheus-alertmanager; upstream, alertmanager.
if ! command -v amtool >/dev/null 2>&1 || \
   ! { command -v prometheus-alertmanager || command -v alertmanager; } >/dev/null 2>&1; then
    need+=(prometheus-alertmanager)
fi
if [ ${#need[@]} -eq 0 ]; then
    echo "install-prometheus: $(promtool --version 2>&1 | head -1 | cut -d' ' -f1-3), $(amtool --version 2>&1 | head -1 | cut -d' ' -f1-3): already installed"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n env DEBIAN_FRONTEND=noninteractive"
    else
        echo "install-prometheus: need root (or passwordless sudo) to apt-get install ${need[*]}" >&2
        exit 1
    fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-prometheus: no apt-get here; install ${need[*]} (Prometheus 2.4x and Alertmanager 0.2x) yourself" >&2
    exit 1
fi

policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
    $SUDO chmod 755 "$policy"
    made_policy=1
fi
cleanup() { if [ "$made_policy" = 1 ]; then $SUDO rm -f "$policy"; fi; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
echo "install-prometheus: apt-get install ${need[*]}"
# A fresh machine has no package lists: update only when a candidate is unknown, or when
# the install fails on stale lists.
if apt-cache policy "${need[@]}" 2>/dev/null | grep -q 'Candidate: (none)' || \
   ! apt-cache policy "${need[@]}" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    $SUDO apt-get update -qq
fi
if ! $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; then
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
for bin in prometheus promtool prometheus-alertmanager amtool; do
    command -v "$bin" >/dev/null 2>&1 || { echo "install-prometheus: $bin missing after install" >&2; exit 1; }
done
echo "install-prometheus: $(promtool --version 2>&1 | head -1 | cut -d' ' -f1-3), $(amtool --version 2>&1 | head -1 | cut -d' ' -f1-3)"
