#!/usr/bin/env bash
# Installs what lockkit's tests need, from Debian's packages and PyPI, if it is
# missing. Idempotent: a second run installs nothing and changes nothing.
#
#   redis-server   the Redis backend's tests (started by lockkit-testkit)
#   openssl        certificates for the TLS test
#   python3 redis  redis-py, for the interop test
#
# Later backends add zookeeper + a headless JRE, mariadb-server and postgresql.
set -euo pipefail

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3 python3-pip)
command -v setpriv >/dev/null 2>&1 || need_apt+=(util-linux)

if ((${#need_apt[@]})); then
    echo "install-services: installing ${need_apt[*]} from Debian's packages" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# The Debian package starts a system-wide redis-server through systemd where
# systemd runs; the tests never use it (they start their own on free ports).

if ! python3 -c 'import redis' >/dev/null 2>&1; then
    echo "install-services: installing Python's redis client from PyPI" >&2
    python3 -m pip install --quiet --disable-pip-version-check redis \
        || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages redis
fi

redis-server --version >&2
python3 -c 'import redis; print("redis-py", redis.__version__)' >&2
