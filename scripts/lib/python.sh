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
PY_FRAMEWORKS=(celery arq taskiq django dramatiq rq)

# python_tests in the background, its output kept until python_tests_wait shows it: the
# Python suites, the wheel's build included, run beside cargo's tests, which mostly wait on
# services and processes they kill. Call after `cargo test --no-run`, which builds the
# `jobguard` binary the cross-language tests run (cargo holds its target dir while its tests
# run; the wheel builds in target/wheel).
PY_TESTS_PID=
PY_TESTS_LOG=
python_tests_start() {
    PY_TESTS_LOG=$(mktemp)
    python_tests >"$PY_TESTS_LOG" 2>&1 &
    PY_TESTS_PID=$!
}

python_tests_wait() {
    local rc=0
    [[ -n $PY_TESTS_PID ]] || return 0
    wait "$PY_TESTS_PID" || rc=$?
    PY_TESTS_PID=
    log "the Python suites (run beside cargo's tests) ended with status $rc; their output:"
    cat "$PY_TESTS_LOG"
    rm -f "$PY_TESTS_LOG"
    return "$rc"
}

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
    # One abi3 wheel, the one scripts/wheel builds for a release, installed into every
    # virtualenv; in its own target dir, since cargo may hold the workspace's.
    wheel_dir=$(mktemp -d)
    CARGO_TARGET_DIR=$target/wheel py_build_dist "$venv" "$wheel_dir" wheel || return 1
    wheel=$(ls "$wheel_dir"/jobguard-*.whl)
    export JOBGUARD_CLI=${JOBGUARD_CLI:-$target/debug/jobguard}
    if [[ ! -x "$JOBGUARD_CLI" ]]; then
        cargo build -p jobguard-cli >&2 || return 1
    fi
    # From here on nothing can compile Rust: the wheel is installed and tested as a user
    # without a toolchain installs it.
    local saved_path=$PATH
    PATH=$(py_path_without_rust) || return 1
    export PATH
    py_fresh_install "$wheel" || rc=1
    py_install_wheel "$venv" "$wheel" || { PATH=$saved_path; return 1; }
    # The core suite runs beside the frameworks' suites, which run one after another: it uses
    # PostgreSQL and SQLite only, on databases of its own, and they use brokers and Redis
    # databases each test leases. Its output is shown when it ends.
    local core_log core_pid core_started=$SECONDS
    core_log=$(mktemp)
    (cd "$crate/tests" && py_pytest "$venv" . --ignore=frameworks) >"$core_log" 2>&1 &
    core_pid=$!
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
    local core_rc=0
    wait "$core_pid" || core_rc=$?
    log "the core suite (beside the frameworks'): $((SECONDS - core_started))s, exit $core_rc"
    cat "$core_log"
    rm -f "$core_log"
    [[ $core_rc -eq 0 ]] || rc=1
    rm -rf "$wheel_dir"
    PATH=$saved_path
    export PATH
    return "$rc"
}

# py_build_dist VENV OUT [wheel|sdist|all]: the Python package's release artifacts, built with
# VENV's maturin into OUT: one abi3 wheel (CPython 3.10+ on x86_64 Linux, manylinux2014: linked
# by zig against glibc 2.17, so it installs on any distribution of the last ten years) and, for
# `sdist` or `all`, the source distribution (which builds with a Rust toolchain).
py_build_dist() {
    local venv=$1 out=$2 what=${3:-all} crate="$ROOT/crates/jobguard-py"
    local target=${CARGO_TARGET_DIR:-$ROOT/target}
    if [[ $what != sdist ]]; then
        log "building the Python package's wheel (manylinux2014, linked by zig)"
        # maturin finds zig as `python -m ziglang` with the first python on PATH: the venv's.
        # Niced: beside cargo's tests, theirs is the CPU that matters.
        PATH="$venv/bin:$PATH" CARGO_TARGET_DIR=$target nice -n 10 "$venv/bin/maturin" build --release \
            --quiet --zig --compatibility manylinux2014 --manifest-path "$crate/Cargo.toml" \
            -o "$out" </dev/null >&2 || return 1
    fi
    if [[ $what != wheel ]]; then
        log "building the Python package's sdist"
        "$venv/bin/maturin" sdist --manifest-path "$crate/Cargo.toml" -o "$out" \
            </dev/null >&2 || return 1
    fi
}

# PATH without the directories holding cargo, rustc or rustup: what a Python user without a
# Rust toolchain has.
py_path_without_rust() {
    local dir kept=() IFS=:
    for dir in $PATH; do
        [[ -z $dir || -x $dir/cargo || -x $dir/rustc || -x $dir/rustup ]] && continue
        kept+=("$dir")
    done
    local joined="${kept[*]}"
    if PATH=$joined command -v cargo >/dev/null 2>&1 || PATH=$joined command -v rustc >/dev/null 2>&1; then
        warn "cargo or rustc is still on PATH after removing it"
        return 1
    fi
    printf '%s\n' "$joined"
}

# The wheel installed into a new, empty virtualenv (no cargo or rustc on PATH, no index: the
# package needs no dependency) and the guide's experiment run from it on SQLite. Logs the
# wheel's size and the install's time.
py_fresh_install() {
    local wheel=$1 python dir started size
    python=$(py_find_python) || return 1
    dir=$(mktemp -d)
    "$python" -m venv "$dir/venv" >&2 || { rm -rf "$dir"; return 1; }
    started=$EPOCHREALTIME
    if ! "$dir/venv/bin/pip" install --quiet --disable-pip-version-check --no-index "$wheel" \
        </dev/null >&2; then
        warn "the wheel did not install into a fresh virtualenv without a Rust toolchain"
        rm -rf "$dir"
        return 1
    fi
    size=$(du -k "$wheel" | cut -f1)
    log "$(basename "$wheel"): ${size} KiB, installed in $(awk -v a="$started" \
        -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s into a fresh virtualenv without cargo"
    if ! (cd "$dir" && "$dir/venv/bin/python" -m jobguard demo \
        --database-url "sqlite:$dir/demo.db" </dev/null >&2); then
        warn "python -m jobguard demo failed from the fresh install"
        rm -rf "$dir"
        return 1
    fi
    rm -rf "$dir"
}

py_install_wheel() {
    "$1/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "$2" \
        </dev/null >&2
}
