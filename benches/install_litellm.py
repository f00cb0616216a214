"""Install LiteLLM's proxy into its own virtual environment, for comparison runs only.

`pip install 'litellm[proxy]'` fails here: its metadata pins versions the package index does not
have (certifi, litellm-proxy-extras, ...). So: install the wheel without dependencies, then its
requirements (base + the "proxy" extra), relaxing only the pins pip reports as unavailable.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

VERSION = "1.109.1"
VENV = Path(__file__).resolve().parent / ".venv-litellm"


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VENV / "bin" / "pip"), *args], capture_output=True, text=True, check=False)


def main() -> int:
    marker = VENV / f".installed-{VERSION}"
    if marker.exists():
        return 0
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip("install", "--quiet", "--upgrade", "pip")
    with tempfile.TemporaryDirectory() as tmp:
        out = pip("download", "--no-deps", "--quiet", "-d", tmp, f"litellm=={VERSION}")
        if out.returncode != 0:
            print(out.stderr, file=sys.stderr)
            return 1
        wheel = next(Path(tmp).glob("litellm-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            lines = z.read(meta).decode().splitlines()
        install = pip("install", "--quiet", "--no-deps", str(wheel))
        if install.returncode != 0:
            print(install.stderr, file=sys.stderr)
            return 1
    env = {"python_full_version": "3.11.7", "python_version": "3.11", "sys_platform": "linux"}
    requirements: dict[str, str] = {}
    for line in lines:
        if not line.startswith("Requires-Dist: "):
            continue
        req = Requirement(line.removeprefix("Requires-Dist: "))
        if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in ("", "proxy")):
            extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
            requirements[req.name.lower()] = f"{req.name}{extras}{req.specifier}"
    for _ in range(10):
        result = pip("install", "--quiet", *requirements.values())
        if result.returncode == 0:
            marker.touch()
            print(f"LiteLLM {VERSION} installed in {VENV}")
            return 0
        missing = re.findall(r"No matching distribution found for ([A-Za-z0-9_.\-]+)", result.stderr)
        missing += re.findall(
            r"Could not find a version that satisfies the requirement ([A-Za-z0-9_.\-]+)", result.stderr
        )
        relaxed = [
            m.lower() for m in missing if m.lower() in requirements and requirements[m.lower()] != m.lower()
        ]
        if not relaxed:
            print(result.stderr[-3000:], file=sys.stderr)
            return 1
        for name in relaxed:
            print(f"relaxing the pin on {name} (not on the index): {requirements[name]}", file=sys.stderr)
            requirements[name] = re.split(r"[<>=!~;]", requirements[name], maxsplit=1)[0]
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
