# shellcheck shell=bash
#
# Amazon SQS for the tests: moto's server mode (PyPI `moto[server]`), an SQS
# that answers SigV4-signed requests on 127.0.0.1. Sourced after
# scripts/lib/services.sh, never executed directly.
#
# Entry points:
#   sqs_setup   - export JOBGUARD_TEST_SQS_URL: the URL already set, when it
#                 answers; else a server on 127.0.0.1:9324; else moto's server
#                 started there (scripts/lib/moto_sqs.py: moto_server with races
#                 in its DeleteMessage and ReceiveMessage closed and SQS's FIFO
#                 order kept; moto[server] installed into a cached virtualenv
#                 first when missing). Also exports JOBGUARD_TEST_SQS_PYTHON, the
#                 Python that has moto, for the test that runs
#                 scripts/lib/moto_fifo_order.py (moto's FIFO inversion, in
#                 process). Returns non-zero, with a warning, when it cannot.
#   sqs_stop    - stop the server sqs_setup started, if any.
#   sqs_status  - say whether SQS answers, and where.
#
# Environment knobs (all optional):
#   JOBGUARD_TEST_SQS_URL   use this endpoint as-is (http://HOST:PORT).
#   JOBGUARD_SQS_VENV       the virtualenv moto is installed into (default
#                           ~/.cache/jobguard/moto-venv), so a machine pays
#                           the install once.
#   JOBGUARD_STATE_DIR      where the pid and log of a started server are kept.

JOBGUARD_SQS_PORT=9324

sqs_state_dir() {
    local dir="${JOBGUARD_STATE_DIR:-${TMPDIR:-/tmp}/jobguard-services-$(id -u)}"
    mkdir -p "$dir" && printf '%s\n' "$dir"
}

sqs_venv() {
    printf '%s\n' "${JOBGUARD_SQS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/jobguard/moto-venv}"
}

# HOST PORT of an http://HOST:PORT URL (port 80 when none is given).
sqs_host_port() {
    local rest=${1#*://}
    rest=${rest%%/*}
    rest=${rest##*@}
    if [[ "$rest" == *:* ]]; then
        printf '%s %s\n' "${rest%:*}" "${rest##*:}"
    else
        printf '%s 80\n' "$rest"
    fi
}

sqs_url_answers() {
    local host port
    read -r host port < <(sqs_host_port "$1")
    tcp_open "$host" "$port"
}

# A Python that has moto[server]: the cached virtualenv's, or python3 on PATH.
sqs_moto_python() {
    local candidate
    for candidate in "$(sqs_venv)/bin/python" "$(command -v python3 2>/dev/null || true)"; do
        [[ -n "$candidate" && -x "$candidate" ]] || continue
        if "$candidate" -c 'import moto.server, moto.sqs.models' >/dev/null 2>&1; then
            printf '%s\n' "$candidate"
            return 0
        fi
    done
    return 1
}

# Install moto[server] into the cached virtualenv.
sqs_install_moto() {
    local venv python
    venv=$(sqs_venv)
    python=$(command -v python3 || true)
    if [[ -z "$python" ]]; then
        if is_root && command -v apt-get >/dev/null 2>&1; then
            log "python3 not found; installing it"
            apt-get update </dev/null >&2 || return 1
            DEBIAN_FRONTEND=noninteractive apt-get install -y python3 python3-venv </dev/null >&2 || return 1
            python=$(command -v python3) || return 1
        else
            warn "python3 not found: install it to run moto_server for the SQS tests"
            return 1
        fi
    fi
    log "installing moto[server] into $venv (once per machine)"
    mkdir -p "$(dirname "$venv")" || return 1
    if ! "$python" -m venv "$venv" >&2; then
        if is_root && command -v apt-get >/dev/null 2>&1; then
            apt-get update </dev/null >&2 || return 1
            DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv </dev/null >&2 || return 1
            "$python" -m venv "$venv" >&2 || return 1
        else
            warn "cannot create a virtualenv with $python (install python3-venv)"
            return 1
        fi
    fi
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'moto[server]' </dev/null >&2
}

# Start moto's server (scripts/lib/moto_sqs.py: moto_server with its delete and
# receive races closed and SQS's FIFO order kept) on 127.0.0.1:9324, recording
# its pid.
sqs_start() {
    local python state here
    python=$(sqs_moto_python) || { sqs_install_moto && python=$(sqs_moto_python); } || {
        warn "moto[server] could not be installed"
        return 1
    }
    state=$(sqs_state_dir) || return 1
    here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
    log "starting moto (SQS) on 127.0.0.1:$JOBGUARD_SQS_PORT ($python $here/moto_sqs.py)"
    nohup "$python" "$here/moto_sqs.py" -H 127.0.0.1 -p "$JOBGUARD_SQS_PORT" \
        </dev/null >"$state/sqs.log" 2>&1 &
    printf '%s\n' "$!" >"$state/sqs.pid"
    disown
    mark_started sqs
    if ! wait_for_port 127.0.0.1 "$JOBGUARD_SQS_PORT" 60; then
        warn "moto did not listen within 60 s; its log:"
        sed 's/^/    /' "$state/sqs.log" >&2 || true
        sqs_stop
        return 1
    fi
}

# Export JOBGUARD_TEST_SQS_PYTHON when a Python has moto.
sqs_export_python() {
    local python
    if python=$(sqs_moto_python); then
        export JOBGUARD_TEST_SQS_PYTHON=$python
    fi
}

sqs_setup() {
    if [[ -n "${JOBGUARD_TEST_SQS_URL:-}" ]]; then
        if sqs_url_answers "$JOBGUARD_TEST_SQS_URL"; then
            export JOBGUARD_TEST_SQS_URL
            log "SQS: $(redact_url "$JOBGUARD_TEST_SQS_URL") [JOBGUARD_TEST_SQS_URL]"
            sqs_export_python
            return 0
        fi
        warn "nothing answers at JOBGUARD_TEST_SQS_URL=$(redact_url "$JOBGUARD_TEST_SQS_URL"); trying 127.0.0.1:$JOBGUARD_SQS_PORT"
        unset JOBGUARD_TEST_SQS_URL
    fi
    local url="http://127.0.0.1:$JOBGUARD_SQS_PORT"
    if tcp_open 127.0.0.1 "$JOBGUARD_SQS_PORT" || sqs_start; then
        export JOBGUARD_TEST_SQS_URL=$url
        log "SQS: $url"
        sqs_export_python
        return 0
    fi
    warn "SQS is not available on 127.0.0.1:$JOBGUARD_SQS_PORT"
    return 1
}

# Stops the moto_server sqs_setup started; never one it did not start.
sqs_stop() {
    local state pidfile pid
    state=$(sqs_state_dir) || return 0
    pidfile="$state/sqs.pid"
    [[ -f "$pidfile" ]] || return 0
    pid=$(head -n1 "$pidfile" 2>/dev/null || true)
    if [[ "$pid" =~ ^[0-9]+$ ]] && grep -qa moto_sqs "/proc/$pid/cmdline" 2>/dev/null; then
        log "stopping moto (SQS), pid $pid"
        kill -TERM "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
}

sqs_status() {
    local url=${JOBGUARD_TEST_SQS_URL:-http://127.0.0.1:$JOBGUARD_SQS_PORT} state started=""
    state=$(sqs_state_dir) || true
    if [[ -n "$state" && -f "$state/sqs.pid" ]]; then
        started=" (moto started by scripts/services, pid $(head -n1 "$state/sqs.pid"))"
    fi
    if sqs_url_answers "$url"; then
        printf 'SQS: answers at %s%s\n' "$(redact_url "$url")" "$started"
    else
        printf 'SQS: nothing answers at %s\n' "$(redact_url "$url")"
    fi
}
