# shellcheck shell=bash
#
# Kafka for the tests: tansu, a Kafka-protocol broker in one Rust binary
# (https://crates.io/crates/tansu), storing in memory. Sourced after
# scripts/lib/services.sh, never executed directly.
#
# Entry points (the services contract):
#   kafka_setup   - export JOBGUARD_TEST_KAFKA_URL: the URL already set when it
#                   answers, else a broker listening on 127.0.0.1:9092, else
#                   tansu installed (`cargo install --locked`, once per machine)
#                   and started in the background, its pid in the state dir.
#                   Returns non-zero, with a warning, when none can be had.
#   kafka_stop    - stops the tansu this module started, if any.
#   kafka_install_start / kafka_install_wait
#                 - when Kafka will have to be tansu and tansu is not installed, start its
#                   build in the background (kafka_install_start returns 0 only then), and
#                   wait for it: the build overlaps the tests that need no Kafka.
#   kafka_status  - says whether Kafka answers, and where.
#
# Knobs: JOBGUARD_TEST_KAFKA_URL (kafka://host:port), JOBGUARD_KAFKA_PORT
# (default 9092), JOBGUARD_STATE_DIR (where the pid and log go),
# JOBGUARD_TANSU_VERSION (default 0.6.0).

kafka_state_dir() {
    local dir=${JOBGUARD_STATE_DIR:-${TMPDIR:-/tmp}/jobguard-services-$(id -u)}
    mkdir -p "$dir" && printf '%s\n' "$dir"
}

# host:port of a kafka:// (or tcp://, or bare host:port) URL.
kafka_address() {
    local url=${1#kafka://}
    url=${url#tcp://}
    url=${url%%/*}
    printf '%s\n' "${url%%,*}"
}

kafka_answers() {
    local address host port
    address=$(kafka_address "$1")
    host=${address%:*}
    port=${address##*:}
    [[ -n "$host" && "$port" =~ ^[0-9]+$ ]] && tcp_open "$host" "$port"
}

# The tansu binary, installed with cargo when missing. The build takes about
# ten minutes on two cores, paid once: the binary stays in ~/.cargo/bin.
# Without --locked, its `postgres` feature fails to compile; without
# `dynostore`, it has no storage engine.
kafka_tansu() {
    local cargo_bin=${CARGO_HOME:-$HOME/.cargo}/bin
    if command -v tansu >/dev/null 2>&1; then
        command -v tansu
        return 0
    fi
    if [[ -x "$cargo_bin/tansu" ]]; then
        printf '%s\n' "$cargo_bin/tansu"
        return 0
    fi
    if ! command -v cargo >/dev/null 2>&1; then
        warn "tansu is not installed and cargo is not on PATH to build it"
        return 1
    fi
    local version=${JOBGUARD_TANSU_VERSION:-0.6.0} state
    state=$(kafka_state_dir) || return 1
    log "tansu not found; building it once with cargo (about ten minutes; log: $state/tansu-install.log)"
    if ! nice -n 10 cargo install --locked tansu --version "$version" \
        --features dynostore,postgres >"$state/tansu-install.log" 2>&1; then
        warn "cargo install tansu failed; the end of its log:"
        tail -n 20 "$state/tansu-install.log" | sed 's/^/    /' >&2
        return 1
    fi
    printf '%s\n' "$cargo_bin/tansu"
}

# Whether kafka_setup will need to build tansu: no URL set that answers, nothing on the port,
# and no tansu binary.
kafka_needs_install() {
    local port=${JOBGUARD_KAFKA_PORT:-9092} cargo_bin=${CARGO_HOME:-$HOME/.cargo}/bin
    if [[ -n "${JOBGUARD_TEST_KAFKA_URL:-}" ]] && kafka_answers "$JOBGUARD_TEST_KAFKA_URL"; then
        return 1
    fi
    ! tcp_open 127.0.0.1 "$port" && ! command -v tansu >/dev/null 2>&1 &&
        [[ ! -x "$cargo_bin/tansu" ]] && command -v cargo >/dev/null 2>&1
}

KAFKA_INSTALL_PID=
kafka_install_start() {
    kafka_needs_install || return 1
    kafka_tansu >/dev/null &
    KAFKA_INSTALL_PID=$!
}

kafka_install_wait() {
    [[ -n $KAFKA_INSTALL_PID ]] || return 0
    log "waiting for tansu's build to finish"
    wait "$KAFKA_INSTALL_PID" || true
    KAFKA_INSTALL_PID=
}

kafka_setup() {
    local port=${JOBGUARD_KAFKA_PORT:-9092}
    if [[ -n "${JOBGUARD_TEST_KAFKA_URL:-}" ]]; then
        if kafka_answers "$JOBGUARD_TEST_KAFKA_URL"; then
            export JOBGUARD_TEST_KAFKA_URL
            log "Kafka: $JOBGUARD_TEST_KAFKA_URL [JOBGUARD_TEST_KAFKA_URL]"
            return 0
        fi
        warn "JOBGUARD_TEST_KAFKA_URL=$JOBGUARD_TEST_KAFKA_URL does not answer; looking on 127.0.0.1:$port"
    fi
    local url="kafka://127.0.0.1:$port"
    if tcp_open 127.0.0.1 "$port"; then
        export JOBGUARD_TEST_KAFKA_URL=$url
        log "Kafka: $url [already listening]"
        return 0
    fi
    local tansu state
    if ! tansu=$(kafka_tansu) || ! state=$(kafka_state_dir); then
        unset JOBGUARD_TEST_KAFKA_URL
        warn "Kafka is not available on 127.0.0.1:$port"
        return 1
    fi
    log "starting tansu on 127.0.0.1:$port ($tansu, in memory; log: $state/tansu.log)"
    nohup "$tansu" broker \
        --listener-url "tcp://127.0.0.1:$port" \
        --advertised-listener-url "tcp://127.0.0.1:$port" \
        --storage-engine memory://tansu/ </dev/null >"$state/tansu.log" 2>&1 &
    printf '%s\n' "$!" >"$state/tansu.pid"
    disown
    mark_started kafka
    if ! wait_for_port 127.0.0.1 "$port" 30; then
        warn "tansu did not listen on 127.0.0.1:$port within 30 s; its log:"
        tail -n 20 "$state/tansu.log" | sed 's/^/    /' >&2
        kafka_stop
        unset JOBGUARD_TEST_KAFKA_URL
        return 1
    fi
    export JOBGUARD_TEST_KAFKA_URL=$url
    log "Kafka: $url [tansu started, pid $(cat "$state/tansu.pid")]"
}

# Stops the tansu recorded in the state dir: only one this module started,
# and only while that pid is still a tansu.
kafka_stop() {
    local state pid
    state=$(kafka_state_dir) || return 0
    [[ -f "$state/tansu.pid" ]] || return 0
    pid=$(cat "$state/tansu.pid")
    if [[ "$pid" =~ ^[0-9]+$ ]] && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == tansu* ]]; then
        log "stopping tansu (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        local waited=0
        while kill -0 "$pid" 2>/dev/null && ((waited < 10)); do
            sleep 1
            waited=$((waited + 1))
        done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$state/tansu.pid"
}

kafka_status() {
    local url=${JOBGUARD_TEST_KAFKA_URL:-kafka://127.0.0.1:${JOBGUARD_KAFKA_PORT:-9092}} state
    state=$(kafka_state_dir) || return 1
    if kafka_answers "$url"; then
        if [[ -f "$state/tansu.pid" ]]; then
            printf 'kafka: answers at %s (tansu started here, pid %s)\n' "$url" "$(cat "$state/tansu.pid")"
        else
            printf 'kafka: answers at %s\n' "$url"
        fi
    else
        printf 'kafka: does not answer at %s\n' "$url"
        return 1
    fi
}
