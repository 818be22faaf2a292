#!/usr/bin/env bash
# Installs what lockkit's tests need, from Debian's packages and PyPI, if it is
# missing. Idempotent: a second run installs nothing and changes nothing.
#
#   redis-server   the Redis backend's tests (started by lockkit-testkit)
#   openssl        certificates for the TLS test
#   python3 redis  redis-py, for the interop test
#   zookeeper      /usr/share/java/zookeeper.jar (+ the jars it names, and
#                  slf4j-simple), run by lockkit-testkit's ZkServer/ZkEnsemble
#   default-jre-headless   the `java` that runs it
#   python3 kazoo  the Python ZooKeeper client, for the interop test
#
# Later backends add mariadb-server and postgresql.
set -euo pipefail

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3 python3-pip)
command -v setpriv >/dev/null 2>&1 || need_apt+=(util-linux)
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
[ -f /usr/share/java/slf4j-simple.jar ] || need_apt+=(libslf4j-java)
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)

if ((${#need_apt[@]})); then
    echo "install-services: installing ${need_apt[*]} from Debian's packages" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# The Debian packages start a system-wide redis-server and ZooKeeper (port
# 2181) through systemd where systemd runs; the tests never use them (they
# start their own on free ports).

if ! python3 -c 'import redis' >/dev/null 2>&1; then
    echo "install-services: installing Python's redis client from PyPI" >&2
    python3 -m pip install --quiet --disable-pip-version-check redis \
        || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages redis
fi

if ! python3 -c 'import kazoo' >/dev/null 2>&1; then
    echo "install-services: installing Python's ZooKeeper client kazoo from PyPI" >&2
    python3 -m pip install --quiet --disable-pip-version-check kazoo \
        || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages kazoo
fi

redis-server --version >&2
python3 -c 'import redis; print("redis-py", redis.__version__)' >&2
java -version 2>&1 | head -n 1 >&2
java -cp /usr/share/java/zookeeper.jar org.apache.zookeeper.version.VersionInfoMain >&2
python3 -c 'import kazoo.version; print("kazoo", kazoo.version.__version__)' >&2
