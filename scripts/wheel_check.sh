#!/usr/bin/env bash
# Checks the wheel as a user meets it (run by scripts/test.sh): scripts/wheel.sh builds
# dist/orbitte-*.whl; it is installed offline (pip --no-index) into a new virtual
# environment, and the README's Python example runs as printed from a directory outside the
# checkout, with no PYTHONPATH or ORBITTE_LIBRARY: the package and liborbitte.so come from
# the venv. The venv sees Debian's site packages only for numpy, which the example imports.
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -f dist/orbitte-*.whl
scripts/wheel.sh >"$work/wheel.log" 2>&1 || { cat "$work/wheel.log"; echo "wheel_check: scripts/wheel.sh failed"; exit 1; }
whl=$(ls dist/orbitte-*-py3-none-linux_x86_64.whl)
"$PY" -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install --no-index --quiet "$whl" ||
    { echo "wheel_check: pip install --no-index $whl failed"; exit 1; }
"$PY" - "$ROOT/README.md" "$work/example.py" <<'PYEOF'
import re, sys
blocks = re.findall(r"```python\n(.*?)```", open(sys.argv[1]).read(), re.S)
assert len(blocks) == 1, "README.md must hold exactly one ```python block"
open(sys.argv[2], "w").write(blocks[0])
PYEOF
cd "$work"
env -u PYTHONPATH -u ORBITTE_LIBRARY timeout 300 "$work/venv/bin/python" - "$work" <<'PYEOF' ||
import sys, orbitte
venv = sys.argv[1]
assert orbitte.__file__.startswith(venv), "orbitte imported from %s, not the venv" % orbitte.__file__
assert orbitte.library_path.startswith(venv), orbitte.library_path
assert orbitte.__version__ == orbitte.library_version(), (orbitte.__version__, orbitte.library_version())
print("wheel_check: orbitte %s from %s, features %s" % (orbitte.__version__, orbitte.library_path,
                                                      sorted(orbitte.features())))
PYEOF
    { echo "wheel_check: the installed package is not the wheel's"; exit 1; }
env -u PYTHONPATH -u ORBITTE_LIBRARY timeout 300 "$work/venv/bin/python" "$work/example.py" ||
    { echo "wheel_check: the README's Python example failed from the wheel"; exit 1; }
echo "wheel_check: ok ($(basename "$whl"): README example ran from $work)"
