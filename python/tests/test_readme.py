"""The README's ten lines of Python run as printed."""

import os
import re
import subprocess
import sys

import orbitte

README = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "README.md")


def test_readme_python_block_runs():
    blocks = re.findall(r"```python\n(.*?)```", open(README).read(), re.S)
    assert len(blocks) == 1
    lines = [ln for ln in blocks[0].splitlines() if ln.strip()]
    assert len(lines) == 10, "the README promises ten lines of Python"
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(orbitte.__file__)),
               ORBITTE_LIBRARY=orbitte.library_path)
    r = subprocess.run([sys.executable, "-c", blocks[0]], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
