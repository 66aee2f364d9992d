# shellcheck shell=bash
#
# The Python package's tests: python_tests builds crates/jobguard-py into one wheel, installs it
# into a cached virtualenv per suite and runs pytest against the same PostgreSQL as the Rust
# tests, with the `jobguard` binary cargo built for the cross-language tests: the core suite
# (every driver), then each framework's kill tests (Celery, arq, taskiq on RabbitMQ and Redis)
# in a virtualenv of its own.
#
#   JOBGUARD_PY_VENV_DIR   where the virtualenvs live (default ~/.cache/jobguard/py), one per
#                          requirements file and its hash, so a machine installs each once
#   JOBGUARD_CLI           the jobguard binary (default: cargo's target dir, debug)
#
# pytest's "no tests collected" (exit 5) fails the run like a failing test. Without a Python
# 3.10+ the tests are skipped with a warning, or fail the run with CI=true.

py_venv_root() {
    printf '%s\n' "${JOBGUARD_PY_VENV_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/jobguard/py}"
}

# A Python 3.10 or newer on PATH.
py_find_python() {
    local candidate
    for candidate in python3.13 python3.12 python3.11 python3.10 python3; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

# py_venv NAME REQUIREMENTS: the path of a virtualenv with REQUIREMENTS installed, created
# once per content of the file.
py_venv() {
    local name=$1 requirements=$2 python hash venv
    python=$(py_find_python) || return 1
    hash=$(cat "$requirements" | sha256sum | cut -c1-12)
    venv="$(py_venv_root)/$name-$hash"
    if [[ ! -x "$venv/bin/python" || ! -f "$venv/.installed" ]]; then
        log "creating the $name virtualenv in $venv (once per requirements)"
        rm -rf "$venv"
        mkdir -p "$(dirname "$venv")"
        "$python" -m venv "$venv" >&2 || return 1
        "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements" \
            </dev/null >&2 || return 1
        touch "$venv/.installed"
    fi
    printf '%s\n' "$venv"
}

# Runs pytest in VENV on PATHS; exit 5 (nothing collected) is a failure.
py_pytest() {
    local venv=$1
    shift
    local rc=0
    "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" </dev/null || rc=$?
    if [[ $rc -eq 5 ]]; then
        log "pytest collected no tests in $*: that is a failure"
        return 1
    fi
    return "$rc"
}

# The frameworks whose kill tests run in a virtualenv of their own (their pins conflict: arq
# needs redis-py < 6, kombu's Redis transport >= 6.1), from tests/frameworks/NAME.
PY_FRAMEWORKS=(celery arq taskiq django)

python_tests() {
    local crate="$ROOT/crates/jobguard-py" venv target wheel_dir wheel rc=0 name started
    if ! py_find_python >/dev/null; then
        if is_ci; then
            die "CI=true but no Python 3.10+ for the Python package's tests"
        fi
        warn "no Python 3.10+: the Python package's tests are SKIPPED"
        return 0
    fi
    venv=$(py_venv core "$crate/tests/requirements.txt") || {
        warn "could not create the Python virtualenv"
        return 1
    }
    target=${CARGO_TARGET_DIR:-$ROOT/target}
    log "building the Python package's wheel"
    # One abi3 wheel, installed into every virtualenv. Its Rust build shares cargo's target
    # dir, so a rebuild is incremental.
    wheel_dir=$(mktemp -d)
    CARGO_TARGET_DIR=$target "$venv/bin/maturin" build --release --quiet \
        --manifest-path "$crate/Cargo.toml" -o "$wheel_dir" </dev/null >&2 || return 1
    wheel=$(ls "$wheel_dir"/jobguard-*.whl)
    py_install_wheel "$venv" "$wheel" || return 1
    export JOBGUARD_CLI=${JOBGUARD_CLI:-$target/debug/jobguard}
    if [[ ! -x "$JOBGUARD_CLI" ]]; then
        cargo build -p jobguard-cli >&2 || return 1
    fi
    (cd "$crate/tests" && py_pytest "$venv" . --ignore=frameworks) || rc=1
    for name in "${PY_FRAMEWORKS[@]}"; do
        started=$SECONDS
        venv=$(py_venv "$name" "$crate/tests/frameworks/$name/requirements.txt") || {
            warn "could not create the $name virtualenv"
            rc=1
            continue
        }
        py_install_wheel "$venv" "$wheel" || { rc=1; continue; }
        log "$name: workers killed with SIGKILL on real brokers"
        (cd "$crate/tests" && py_pytest "$venv" "frameworks/$name") || rc=1
        log "$name: $((SECONDS - started))s"
    done
    rm -rf "$wheel_dir"
    return "$rc"
}

py_install_wheel() {
    "$1/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "$2" \
        </dev/null >&2
}
