#!/usr/bin/env bash
# What the test suite needs from the system, installed from Debian's packages when absent:
# Chromium (tests/ui drives it headless), iproute2 (tests/resilience puts nodes in network
# namespaces), PostgreSQL 15 (tests/deploy starts a real server with initdb + pg_ctl) and
# libfaketime (`fm chaos run`'s clock-skew fault runs a trainer whose wall clock is ahead).
# `make test` runs it first, so the README's test command passes on a fresh machine.
set -euo pipefail

missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || missing+=(faketime)
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" != 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "the tests need these Debian packages: ${missing[*]}; install them as root" \
         "(apt-get install ${missing[*]}) or run make test as root" >&2
    exit 1
  fi
  SUDO="sudo"
fi
echo ">> installing system packages the tests need: ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
