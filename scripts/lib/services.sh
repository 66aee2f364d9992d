# shellcheck shell=bash
#
# Helpers for scripts/test and .ci/run: locate the Rust toolchain, a
# PostgreSQL server and the message brokers (Redis, RabbitMQ, NATS with
# JetStream) for the test suite. Sourced, never executed directly.
#
# Entry points:
#   ensure_cargo     - make sure `cargo` is on PATH, or explain how to get it.
#   setup_postgres   - export JOBGUARD_TEST_DATABASE_URL (or warn / fail).
#   setup_brokers    - export JOBGUARD_TEST_{REDIS,AMQP,NATS}_URL, starting a
#                      broker that is not running (installing its Debian
#                      package first when missing and root); warn / fail.
#   pg_tool NAME     - path of a PostgreSQL program (psql, initdb, ...).
#   redact_url URL   - URL with any password replaced by ***.
#
# Environment knobs (all optional):
#   JOBGUARD_TEST_DATABASE_URL  use this server as-is (highest priority).
#   DATABASE_URL                used when it is a postgres:// URL.
#   JOBGUARD_PG_HOST/PORT       where to look for an already running server
#                               (default 127.0.0.1:5432). Only the detection
#                               step uses them, e.g. point PORT at a closed
#                               port to force the throwaway cluster.
#   JOBGUARD_PG_THROWAWAY_PORT  first port tried for the throwaway cluster
#                               (default 54329; the next free one is used).
#   JOBGUARD_TEST_REDIS_URL     use this Redis as-is (default: the one on
#                               127.0.0.1:6379, started when not running).
#   JOBGUARD_TEST_AMQP_URL      likewise RabbitMQ (default 127.0.0.1:5672).
#   JOBGUARD_TEST_NATS_URL      likewise NATS with JetStream (127.0.0.1:4222).
#   CI                          when "true", a missing PostgreSQL or broker is
#                               an error instead of a warning.

# The throwaway cluster's temp dir; empty when none was started.
JOBGUARD_PG_TMP=""

log() { printf '%s: %s\n' "${JOBGUARD_LOG_PREFIX:-scripts}" "$*" >&2; }
warn() { log "WARNING: $*"; }
die() {
    log "ERROR: $*"
    exit 1
}

is_ci() { [[ "${CI:-}" == "true" ]]; }
is_root() { [[ "$(id -u)" -eq 0 ]]; }

# --- Cleanup on exit ----------------------------------------------------------
# Every service this script starts and must stop again registers its stop
# function with `on_exit FN`; they run in reverse order when the script exits
# (normally, on error, on Ctrl-C or a CI cancel), and keep the exit status.
JOBGUARD_EXIT_HOOKS=()
run_exit_hooks() {
    local rc=$? i
    for ((i = ${#JOBGUARD_EXIT_HOOKS[@]} - 1; i >= 0; i--)); do
        "${JOBGUARD_EXIT_HOOKS[i]}" || true
    done
    exit "$rc"
}
on_exit() {
    JOBGUARD_EXIT_HOOKS+=("$1")
    trap run_exit_hooks EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

# The services this script started, by name (redis, rabbitmq, nats, and the modules in
# scripts/lib: sqs, kafka): `stop_started` stops them and only them, never a server that was
# already running. scripts/test stops them when it exits; scripts/services keeps them.
JOBGUARD_STARTED=()
mark_started() { JOBGUARD_STARTED+=("$1"); }
stop_started() {
    local i
    for ((i = ${#JOBGUARD_STARTED[@]} - 1; i >= 0; i--)); do
        "${JOBGUARD_STARTED[i]}_stop" || true
    done
    JOBGUARD_STARTED=()
}

# --- Rust toolchain ---------------------------------------------------------

ensure_cargo() {
    if command -v cargo >/dev/null 2>&1; then
        return 0
    fi
    # rustup installs here but non-login shells (CI runners, cron) often
    # do not have it on PATH yet.
    if [[ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]]; then
        PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
        export PATH
        return 0
    fi
    log "ERROR: cargo not found on PATH."
    log "Install the Rust toolchain with rustup (https://rustup.rs):"
    log "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh"
    log "then open a new shell (or run: . \"\$HOME/.cargo/env\") and retry."
    exit 1
}

# --- small utilities ----------------------------------------------------------

# Print URL with the password (if any) replaced, so logs never leak it.
redact_url() {
    # shellcheck disable=SC2001  # a regex is needed; ${//} can't anchor this
    sed -E 's#^([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@]*):[^@]*@#\1:***@#' <<<"$1"
}

# Print the path of PostgreSQL program NAME. Debian keeps the server
# programs (initdb, pg_ctl) in /usr/lib/postgresql/<ver>/bin, off PATH,
# so look there too, newest version first.
pg_tool() {
    local name=$1 dir
    if command -v "$name" >/dev/null 2>&1; then
        command -v "$name"
        return 0
    fi
    for dir in $(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -type d -name bin 2>/dev/null | sort -rV); do
        if [[ -x "$dir/$name" ]]; then
            printf '%s\n' "$dir/$name"
            return 0
        fi
    done
    return 1
}

# True when a TCP connect to HOST:PORT succeeds (i.e. something listens).
tcp_open() {
    local host=$1 port=$2
    # `timeout` guards against firewalled ports that never answer.
    if command -v timeout >/dev/null 2>&1; then
        timeout 3 bash -c ": >/dev/tcp/$host/$port" 2>/dev/null
    else
        bash -c ": >/dev/tcp/$host/$port" 2>/dev/null
    fi
}

# True when a PostgreSQL server seems to answer on HOST:PORT.
pg_answers() {
    local host=$1 port=$2 pg_isready
    if pg_isready=$(pg_tool pg_isready); then
        # Exit 0 = accepting, 1 = rejecting (e.g. starting up); both mean a
        # server is there. 2 = no response, 3 = bad parameters.
        local rc=0
        "$pg_isready" -q -h "$host" -p "$port" -t 3 || rc=$?
        [[ $rc -eq 0 || $rc -eq 1 ]]
        return
    fi
    tcp_open "$host" "$port"
}

# True when psql can log in to URL and run a query. Without psql we cannot
# check, so trust the caller's evidence (return 0).
pg_url_works() {
    local url=$1 psql
    psql=$(pg_tool psql) || return 0
    # -w: never prompt for a password (CI has no stdin).
    PGCONNECT_TIMEOUT=5 "$psql" -w -X -A -t -q -d "$url" -c 'select 1' >/dev/null 2>&1
}

# --- detection ------------------------------------------------------------------

# Step a: a URL the user chose explicitly. Sets PG_URL/PG_SOURCE.
pg_from_env() {
    if [[ -n "${JOBGUARD_TEST_DATABASE_URL:-}" ]]; then
        PG_URL=$JOBGUARD_TEST_DATABASE_URL
        PG_SOURCE="JOBGUARD_TEST_DATABASE_URL"
        return 0
    fi
    if [[ "${DATABASE_URL:-}" == postgres* ]]; then
        PG_URL=$DATABASE_URL
        PG_SOURCE="DATABASE_URL"
        return 0
    fi
    return 1
}

# Step b: a server already running locally (the dev machine's or CI's own).
pg_from_local_server() {
    local host=${JOBGUARD_PG_HOST:-127.0.0.1} port=${JOBGUARD_PG_PORT:-5432}
    local url="postgres://postgres@$host:$port/postgres"
    pg_answers "$host" "$port" || return 1
    # Something answers, but trust auth for user postgres is not a given.
    if ! pg_url_works "$url"; then
        warn "a server answers on $host:$port but psql cannot log in as 'postgres' without a password; ignoring it"
        warn "(set JOBGUARD_TEST_DATABASE_URL=postgres://USER:PASS@$host:$port/DB to use it)"
        return 1
    fi
    PG_URL=$url
    PG_SOURCE="running server on $host:$port"
}

# --- throwaway cluster ------------------------------------------------------------

# Run a command as the user that owns the throwaway cluster. initdb and the
# server refuse to run as root, so root delegates to the `postgres` user.
as_pg_owner() {
    if ! is_root; then
        "$@"
    elif command -v runuser >/dev/null 2>&1; then
        runuser -u postgres -- "$@"
    else
        # su needs one shell string; quote every argument for it.
        su postgres -s /bin/sh -c "$(printf '%q ' "$@")"
    fi
}

# Install the server package when it is missing (root only: we will not
# sudo behind the user's back).
pg_install_server() {
    if pg_tool initdb >/dev/null && pg_tool pg_ctl >/dev/null; then
        return 0
    fi
    local cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql"
    if ! is_root; then
        warn "PostgreSQL server programs (initdb, pg_ctl) not found. Install them with:"
        warn "  sudo sh -c '$cmd'"
        return 1
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        warn "initdb not found and apt-get is unavailable; install PostgreSQL manually"
        return 1
    fi
    log "initdb not found; installing PostgreSQL: $cmd"
    # </dev/null: CI has no stdin and apt must never wait for an answer.
    apt-get update </dev/null >&2 || return 1
    DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql </dev/null >&2 || return 1
    pg_tool initdb >/dev/null && pg_tool pg_ctl >/dev/null
}

# Root needs an unprivileged `postgres` account to own the cluster. The
# Debian package creates it; create it ourselves if it is missing.
pg_ensure_owner_user() {
    is_root || return 0
    id -u postgres >/dev/null 2>&1 && return 0
    log "creating system user 'postgres' to own the throwaway cluster"
    useradd --system --user-group --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin postgres
}

# Print the first port from JOBGUARD_PG_THROWAWAY_PORT (default 54329)
# upwards that nothing listens on.
pg_pick_port() {
    local port=${JOBGUARD_PG_THROWAWAY_PORT:-54329} last
    last=$((port + 50))
    while ((port <= last)); do
        if ! tcp_open 127.0.0.1 "$port"; then
            printf '%s\n' "$port"
            return 0
        fi
        port=$((port + 1))
    done
    return 1
}

# Make the temp dir that holds data dir, socket and log. When root it must be
# reachable by `postgres`: a TMPDIR under /root would not be, so fall back to
# /tmp in that case.
pg_make_tmpdir() {
    local dir
    dir=$(mktemp -d "${TMPDIR:-/tmp}/jobguard-pg.XXXXXX") || return 1
    if is_root; then
        chown postgres: "$dir" || return 1
        if ! as_pg_owner test -w "$dir"; then
            rm -rf "$dir"
            dir=$(mktemp -d /tmp/jobguard-pg.XXXXXX) || return 1
            chown postgres: "$dir" || return 1
        fi
    fi
    printf '%s\n' "$dir"
}

# Exit hook: stop the throwaway cluster and delete its files. Must never
# fail.
pg_cleanup() {
    if [[ -n "$JOBGUARD_PG_TMP" && -d "$JOBGUARD_PG_TMP" ]]; then
        local data="$JOBGUARD_PG_TMP/data" pg_ctl pid
        if [[ -f "$data/postmaster.pid" ]]; then
            log "stopping throwaway PostgreSQL cluster"
            if pg_ctl=$(pg_tool pg_ctl); then
                (cd "$JOBGUARD_PG_TMP" && as_pg_owner "$pg_ctl" -D "$data" -m fast -w -t 30 stop >/dev/null 2>&1) || true
            fi
            # pg_ctl failed or is gone: signal the postmaster we started.
            if [[ -f "$data/postmaster.pid" ]]; then
                pid=$(head -n1 "$data/postmaster.pid" 2>/dev/null || true)
                if [[ "$pid" =~ ^[0-9]+$ ]]; then
                    kill -TERM "$pid" 2>/dev/null || true
                    sleep 2
                fi
            fi
        fi
        rm -rf "$JOBGUARD_PG_TMP"
        JOBGUARD_PG_TMP=""
    fi
}

# Step c: initdb + pg_ctl start a private cluster in a temp dir. Sets
# PG_URL/PG_SOURCE. Runs under `if`, so every step checks errors itself.
pg_start_throwaway() {
    pg_install_server || return 1
    pg_ensure_owner_user || return 1

    local initdb pg_ctl port tmp
    initdb=$(pg_tool initdb) || return 1
    pg_ctl=$(pg_tool pg_ctl) || return 1
    port=$(pg_pick_port) || {
        warn "no free port found for the throwaway cluster"
        return 1
    }
    tmp=$(pg_make_tmpdir) || return 1

    # Register cleanup before anything is started.
    JOBGUARD_PG_TMP=$tmp
    on_exit pg_cleanup

    log "starting throwaway PostgreSQL cluster ($initdb) on 127.0.0.1:$port in $tmp"
    # cd: the postgres user may not be allowed into the caller's cwd.
    # --locale=C: exists on every machine, unlike en_US.UTF-8.
    # --no-sync: the data is thrown away, durability is pointless.
    if ! (cd "$tmp" && as_pg_owner "$initdb" -D "$tmp/data" -U postgres \
        --auth=trust -E UTF8 --locale=C --no-sync >"$tmp/initdb.log" 2>&1); then
        warn "initdb failed:"
        sed 's/^/    /' "$tmp/initdb.log" >&2
        return 1
    fi

    # Settings appended to the cluster's own config (pg_ctl -o would need
    # nested quoting). Speed over safety: it is a test database.
    cat >>"$tmp/data/postgresql.conf" <<EOF

# --- added by jobguard scripts/test ---
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$tmp'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
EOF

    if ! (cd "$tmp" && as_pg_owner "$pg_ctl" -D "$tmp/data" -l "$tmp/server.log" \
        -w -t 60 start >/dev/null 2>&1); then
        warn "pg_ctl start failed; server log:"
        sed 's/^/    /' "$tmp/server.log" >&2 2>/dev/null || true
        return 1
    fi

    PG_URL="postgres://postgres@127.0.0.1:$port/postgres"
    PG_SOURCE="throwaway cluster (stopped and removed on exit)"
}

# --- orchestration ---------------------------------------------------------------

# Export JOBGUARD_TEST_DATABASE_URL pointing at a usable PostgreSQL, trying
# in order: explicit env, a local running server, a throwaway cluster. When
# none works: fail on CI (a skipped suite must never pass CI), warn elsewhere.
setup_postgres() {
    PG_URL=""
    PG_SOURCE=""
    if pg_from_env || pg_from_local_server || pg_start_throwaway; then
        export JOBGUARD_TEST_DATABASE_URL="$PG_URL"
        log "PostgreSQL: $(redact_url "$PG_URL") [$PG_SOURCE]"
        return 0
    fi

    unset JOBGUARD_TEST_DATABASE_URL
    if is_ci; then
        die "CI=true but no PostgreSQL is available for the tests (see messages above)."
    fi
    warn "no PostgreSQL available: PostgreSQL tests will be SKIPPED."
    warn "set JOBGUARD_TEST_DATABASE_URL, run a server on 127.0.0.1:5432, or install PostgreSQL."
}

# --- message brokers ---------------------------------------------------------------
#
# The broker tests run against real Redis, RabbitMQ and NATS. Each is found
# in this order: its JOBGUARD_TEST_*_URL; a server already listening on its
# default port on 127.0.0.1; a server this script starts (the Debian package
# is apt-installed first when the program is missing and we are root). A
# server started here is recorded (`mark_started`): scripts/test stops it when
# it exits, scripts/services leaves it running.

# Path of a broker program, also looking in the sbin directories that a
# non-root PATH often lacks.
broker_tool() {
    local name=$1 dir
    if command -v "$name" >/dev/null 2>&1; then
        command -v "$name"
        return 0
    fi
    for dir in /usr/sbin /usr/local/sbin /sbin; do
        if [[ -x "$dir/$name" ]]; then
            printf '%s\n' "$dir/$name"
            return 0
        fi
    done
    return 1
}

# Install PACKAGE when PROGRAM is missing. Root only: we will not sudo behind
# the user's back. `apt-get update` runs once per script run.
JOBGUARD_APT_UPDATED=0
broker_install() {
    local program=$1 package=$2
    broker_tool "$program" >/dev/null && return 0
    local cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $package"
    if ! is_root; then
        warn "$program not found. Install it with:"
        warn "  sudo sh -c '$cmd'"
        return 1
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        warn "$program not found and apt-get is unavailable; install $package manually"
        return 1
    fi
    log "$program not found; installing it: $cmd"
    # </dev/null: CI has no stdin and apt must never wait for an answer. The
    # package's own service start may fail in a container; we start it below.
    if [[ "$JOBGUARD_APT_UPDATED" == 0 ]]; then
        apt-get update </dev/null >&2 || return 1
        JOBGUARD_APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y "$package" </dev/null >&2 || return 1
    broker_tool "$program" >/dev/null
}

# Wait up to SECONDS for HOST:PORT to accept connections.
wait_for_port() {
    local host=$1 port=$2 seconds=$3 waited=0
    while ! tcp_open "$host" "$port"; do
        ((waited >= seconds)) && return 1
        sleep 1
        waited=$((waited + 1))
    done
}

# A directory the broker may write to: the system one when root, else a
# per-user one under the temp dir.
broker_dir() {
    local system=$1 name=$2 dir
    if is_root; then
        dir=$system
    else
        dir="${TMPDIR:-/tmp}/jobguard-$name-$(id -u)"
    fi
    mkdir -p "$dir" && printf '%s\n' "$dir"
}

# start_redis [PORT]: a Redis without persistence, daemonized.
start_redis() {
    local port=${1:-6379} redis data logs
    broker_install redis-server redis-server || return 1
    redis=$(broker_tool redis-server) || return 1
    data=$(broker_dir /var/lib/redis redis) || return 1
    logs=$(broker_dir /var/log/redis redis-log) || return 1
    log "starting Redis on 127.0.0.1:$port ($redis)"
    "$redis" --daemonize yes --bind 127.0.0.1 -::1 --port "$port" --save "" --appendonly no \
        --dir "$data" --logfile "$logs/ci.log" --pidfile "$data/redis-$port.pid" \
        </dev/null >&2 || return 1
    JOBGUARD_REDIS_PIDFILE="$data/redis-$port.pid"
    mark_started redis
    wait_for_port 127.0.0.1 "$port" 30
}

# Stops the Redis start_redis started.
redis_stop() {
    local pid
    [[ -f "${JOBGUARD_REDIS_PIDFILE:-}" ]] || return 0
    pid=$(cat "$JOBGUARD_REDIS_PIDFILE")
    if [[ "$pid" =~ ^[0-9]+$ ]] && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == redis* ]]; then
        log "stopping Redis (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
    fi
}

# start_rabbitmq: the node on its default port, 5672, detached.
start_rabbitmq() {
    local rabbit
    broker_install rabbitmq-server rabbitmq-server || return 1
    rabbit=$(broker_tool rabbitmq-server) || return 1
    log "starting RabbitMQ on 127.0.0.1:5672 ($rabbit -detached); it takes a while to boot"
    "$rabbit" -detached </dev/null >&2 || return 1
    mark_started rabbitmq
    wait_for_port 127.0.0.1 5672 120
}

# Stops the RabbitMQ node start_rabbitmq started.
rabbitmq_stop() {
    local ctl
    ctl=$(broker_tool rabbitmqctl) || return 0
    log "stopping RabbitMQ"
    "$ctl" stop </dev/null >/dev/null 2>&1 || true
}

# start_nats [PORT [STORE]]: NATS with JetStream storing in STORE, in the
# background.
start_nats() {
    local port=${1:-4222} store=${2:-} nats logs
    broker_install nats-server nats-server || return 1
    nats=$(broker_tool nats-server) || return 1
    [[ -n "$store" ]] || store=$(broker_dir /var/lib/nats-server nats) || return 1
    logs=$(broker_dir /var/log nats-log) || return 1
    log "starting NATS with JetStream on 127.0.0.1:$port ($nats)"
    local args=(-a 127.0.0.1 -p "$port" -js -sd "$store" -l "$logs/nats-server-$port.log")
    if is_root && command -v start-stop-daemon >/dev/null 2>&1; then
        # The pid file makes start-stop-daemon tell this server from another
        # nats-server on another port, which --exec alone would match.
        start-stop-daemon --start --oknodo --background --make-pidfile \
            --pidfile "$logs/nats-server-$port.pid" --exec "$nats" -- "${args[@]}" \
            </dev/null >&2 || return 1
        JOBGUARD_NATS_PID=$(cat "$logs/nats-server-$port.pid" 2>/dev/null || true)
    else
        nohup "$nats" "${args[@]}" </dev/null >/dev/null 2>&1 &
        JOBGUARD_NATS_PID=$!
        disown
    fi
    mark_started nats
    wait_for_port 127.0.0.1 "$port" 30
}

# Stops the NATS server start_nats started.
nats_stop() {
    local pid=${JOBGUARD_NATS_PID:-}
    if [[ "$pid" =~ ^[0-9]+$ ]] && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == nats* ]]; then
        log "stopping NATS (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
    fi
}

# Export VAR for one broker: its URL from the environment, a server already
# listening, or one started now. Returns non-zero when none answers.
setup_broker() {
    local title=$1 var=$2 url=$3 port=$4 start=$5
    if [[ -n "${!var:-}" ]]; then
        export "${var?}"
        log "$title: $(redact_url "${!var}") [$var]"
        return 0
    fi
    if tcp_open 127.0.0.1 "$port" || "$start"; then
        export "$var=$url"
        log "$title: $url"
        return 0
    fi
    unset "$var"
    warn "$title is not available on 127.0.0.1:$port"
    return 1
}

# Export the brokers' URLs for the tests. A missing broker fails the run on CI
# (a skipped broker suite must never pass CI) and is a warning elsewhere: its
# tests skip.
setup_brokers() {
    local missing=()
    setup_broker Redis JOBGUARD_TEST_REDIS_URL redis://127.0.0.1:6379 6379 start_redis || missing+=(Redis)
    setup_broker RabbitMQ JOBGUARD_TEST_AMQP_URL amqp://127.0.0.1:5672 5672 start_rabbitmq || missing+=(RabbitMQ)
    setup_broker NATS JOBGUARD_TEST_NATS_URL nats://127.0.0.1:4222 4222 start_nats || missing+=(NATS)
    ((${#missing[@]} == 0)) && return 0
    if is_ci; then
        die "CI=true but ${missing[*]} cannot be reached or started for the tests (see messages above)."
    fi
    warn "${missing[*]} unavailable: their broker tests will be SKIPPED."
}

# Chromium and its WebDriver for the browser tests of the dashboard and the console: found on
# PATH, else Debian's `chromium` and `chromium-driver` installed when root. Their paths are
# exported as JOBGUARD_TEST_CHROMIUM and JOBGUARD_TEST_CHROMEDRIVER. Missing: an error on CI
# (a skipped browser test must never pass CI), a warning elsewhere (the tests skip).
setup_chromium() {
    local chromium driver
    chromium=$(command -v chromium || command -v chromium-browser || true)
    driver=$(command -v chromedriver || true)
    if [[ -z "$chromium" || -z "$driver" ]]; then
        broker_install chromium chromium || true
        broker_install chromedriver chromium-driver || true
        chromium=$(command -v chromium || command -v chromium-browser || true)
        driver=$(command -v chromedriver || true)
    fi
    if [[ -n "$chromium" && -n "$driver" ]]; then
        export JOBGUARD_TEST_CHROMIUM=$chromium JOBGUARD_TEST_CHROMEDRIVER=$driver
        log "Chromium for the browser tests: $chromium (driver $driver)"
        return 0
    fi
    if is_ci; then
        die "CI=true but chromium and chromedriver cannot be found or installed for the browser tests."
    fi
    warn "chromium or chromedriver unavailable: the browser tests will be SKIPPED."
}
