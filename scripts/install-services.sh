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
#   python3 psycopg, pymysql  Python's PostgreSQL and MySQL drivers, for the
#                  fence interop tests (lockkit_fence called from Python)
#   libcurator-recipes-java  Apache Curator (its jars name their dependencies),
#                  and default-jdk-headless for `javac`: lockkit-zk's interop
#                  test compiles a small Curator program against them
#   util-linux     setpriv, which starts every test server (and runs
#                  PostgreSQL as the user postgres when the tests run as root)
#   postgresql     postgres, initdb, pg_isready and psql under
#                  /usr/lib/postgresql/<version>/bin (and the user postgres),
#                  run by lockkit-testkit's PostgresServer and the SQL backend's
#                  tests
#   mariadb-server mariadbd and mariadb-install-db, run by lockkit-testkit's
#                  MariaDbServer and the SQL backend's tests
#   mariadb-client the mariadb client, its readiness probe and MariaDbServer::sql
#   fonts-dejavu-core  the font of the benchmark charts (lockkit-scale)
#   etcd-server    etcd, run by lockkit-testkit's EtcdServer
#   etcd-client    etcdctl, for the etcd backend's interop tests
#   protobuf-compiler, libprotobuf-dev  protoc and the well-known types, which
#                  the etcd-client crate needs to build
#   gcc            `cc`, which builds lockkit-testkit's clock library (the
#                  fault suite's clock-jump; Rust links with it too)
#   iproute2       `ip`, for the network namespaces of the server-partition
#                  scenario (lockkit-testkit's Fabric; needs root)
set -euo pipefail

# The newest /usr/lib/postgresql/<version>/bin that has initdb, if any.
postgres_bin_dir() {
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    [ -n "$dir" ] && [ -x "$dir/initdb" ] && echo "$dir"
}

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3 python3-pip)
command -v setpriv >/dev/null 2>&1 || need_apt+=(util-linux)
# The CLI test that types Ctrl-C into a pseudo-terminal starts lockkit with setsid.
command -v setsid >/dev/null 2>&1 || need_apt+=(util-linux)
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
[ -f /usr/share/java/slf4j-simple.jar ] || need_apt+=(libslf4j-java)
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
command -v javac >/dev/null 2>&1 || need_apt+=(default-jdk-headless)
[ -f /usr/share/java/curator-recipes.jar ] || need_apt+=(libcurator-recipes-java)
postgres_bin_dir >/dev/null || need_apt+=(postgresql)
{ command -v mariadbd || [ -x /usr/sbin/mariadbd ]; } >/dev/null 2>&1 \
    && command -v mariadb-install-db >/dev/null 2>&1 \
    || need_apt+=(mariadb-server)
command -v mariadb >/dev/null 2>&1 || need_apt+=(mariadb-client)
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_apt+=(fonts-dejavu-core)
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need_apt+=(etcd-client)
# etcd-client (the crate) compiles etcd's .proto files at build time: protoc
# and the well-known types.
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)
[ -f /usr/include/google/protobuf/descriptor.proto ] || need_apt+=(libprotobuf-dev)
command -v cc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)

if ((${#need_apt[@]})); then
    echo "install-services: installing ${need_apt[*]} from Debian's packages" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# The Debian packages start a system-wide redis-server, ZooKeeper (port
# 2181), PostgreSQL (5432), MariaDB (3306) and etcd (2379) through systemd where systemd
# runs (elsewhere, e.g. in a container whose policy-rc.d denies it, they do
# not start: harmless); the tests never use them (they start their own on
# free ports, from their own data directories).

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

# The fence interop tests call lockkit_fence from Python's PostgreSQL and
# MySQL drivers.
if ! python3 -c 'import psycopg' >/dev/null 2>&1; then
    echo "install-services: installing Python's PostgreSQL driver psycopg from PyPI" >&2
    python3 -m pip install --quiet --disable-pip-version-check 'psycopg[binary]' \
        || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages 'psycopg[binary]'
fi

if ! python3 -c 'import pymysql' >/dev/null 2>&1; then
    echo "install-services: installing Python's MySQL driver PyMySQL from PyPI" >&2
    python3 -m pip install --quiet --disable-pip-version-check pymysql \
        || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages pymysql
fi

redis-server --version >&2
python3 -c 'import redis; print("redis-py", redis.__version__)' >&2
# `sed -n 1p` reads all of its input: `head` may exit first and, under
# pipefail, fail the script with the version command's SIGPIPE.
java -version 2>&1 | sed -n 1p >&2
java -cp /usr/share/java/zookeeper.jar org.apache.zookeeper.version.VersionInfoMain >&2
python3 -c 'import kazoo.version; print("kazoo", kazoo.version.__version__)' >&2
python3 -c 'import psycopg, pymysql; print("psycopg", psycopg.__version__, "PyMySQL", pymysql.__version__)' >&2
"$(postgres_bin_dir)/postgres" --version >&2
mariadbd=$(command -v mariadbd || echo /usr/sbin/mariadbd)
"$mariadbd" --version >&2
etcd --version | sed -n 1p >&2
protoc --version >&2
