# Sourced by scripts/test and scripts/oomwatch: make .venv with oomwatch installed (editable) into it.
# $1: pip extras, e.g. "[test]" or "".
# Dependencies come at the exact versions of constraints.txt, the set scripts/test has passed with, so a
# dependency's new release cannot change what is installed without a commit here.
ensure_venv() {
    if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
        [ "$(id -u)" = 0 ] || { echo "python3-venv is missing and we are not root to install it" >&2; return 1; }
        apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv python3-pip >&2
    fi
    [ -x .venv/bin/python ] || python3 -m venv .venv
    # Reinstall only when the project's metadata or the pins changed (the install is editable: code changes
    # need none).
    local stamp=".venv/.oomwatch-installed${1:-}" want
    want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".${1:-}" \
            >&2 2>/tmp/oomwatch-pip.log || { cat /tmp/oomwatch-pip.log >&2; return 1; }
        echo "$want" > "$stamp"
    fi
}
