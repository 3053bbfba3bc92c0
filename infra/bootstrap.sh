#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install pamledger (and pamledger-client, client/) editable with its test and
# bench extras.
# Re-installs only when pyproject.toml or constraints.txt is newer than .venv/.installed, so repeated `make` calls
# are fast. constraints.txt pins every package to the versions the suite last passed with (make and CI alike);
# refresh it with `.venv/bin/pip freeze --exclude-editable | grep -v '^pamledger' > constraints.txt`.
set -euo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

VENV=.venv
STAMP="$VENV/.installed"
VERSION_CHECK='import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'

say() { printf 'bootstrap: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

find_python() {
    local candidate
    for candidate in python3.11 python3; do
        if command -v "$candidate" >/dev/null 2>&1; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

create_venv() {
    local python
    python="$(find_python)" || die "neither python3.11 nor python3 is on PATH; install Python 3.11+"
    "$python" -c "$VERSION_CHECK" \
        || die "$python is $("$python" -V 2>&1); pamledger needs Python >= 3.11"
    "$python" -c 'import ensurepip, venv' 2>/dev/null \
        || die "$python lacks venv/ensurepip (on Debian/Ubuntu: apt-get install python3.11-venv)"
    say "creating $VENV with $python ($("$python" -V 2>&1))"
    if ! "$python" -m venv "$VENV" >&2; then
        rm -rf "$VENV"
        die "could not create $VENV"
    fi
}

# A venv's scripts name its interpreter by absolute path: after the checkout moved they point at the old
# place (`pamledger: cannot execute`), and the editable install at the old sources. Rebuild it then.
if [ -x "$VENV/bin/python" ] && [ -f "$VENV/bin/pamledger" ] \
        && [ "$(head -n 1 "$VENV/bin/pamledger")" != "#!$(pwd -P)/$VENV/bin/python" ]; then
    say "$VENV was made for another folder ($(head -n 1 "$VENV/bin/pamledger" | cut -c3-)): rebuilding it here"
    rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
    create_venv
fi
"$VENV/bin/python" -c "$VERSION_CHECK" \
    || die "$VENV uses $("$VENV/bin/python" -V 2>&1); remove $VENV and re-run to rebuild it with Python >= 3.11"

if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ client/pyproject.toml -nt "$STAMP" ] \
        || [ constraints.txt -nt "$STAMP" ]; then
    # The client distribution first in the same call: the server depends on it (pamledger-client==<version>).
    say "installing pamledger into $VENV: pip install -c constraints.txt -e './client[admin,tracing]' -e '.[test,bench]'"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c constraints.txt \
        -e './client[admin,tracing]' -e '.[test,bench]' >&2
    touch "$STAMP"
    say "installed; stamp $STAMP"
else
    say "$VENV is up to date (pyproject.toml and constraints.txt older than $STAMP)"
fi
