"""Install (or remove) the rehearsal stand-in into a vLLM 0.4.3 venv: nothing in the kit changes.

    python tests/rehearsal/install_standin.py --venv /var/cache/glmdeploy/rehearsal-venv
    python tests/rehearsal/install_standin.py --venv DIR --uninstall

Writes into the venv's site-packages:
  glmdeploy_rehearsal_standin/__init__.py         copy of tests/rehearsal/standin_hook.py
  glmdeploy_rehearsal_standin/standin_executor.py copy of tests/rehearsal/standin_executor.py
  glmdeploy_rehearsal_standin.pth                 one line: activate the hook at interpreter start

Copies, not links: the venv is cached outside any clone and must not depend on one. Re-run after
changing either file (it is idempotent and says whether anything changed). The venv must be a
rehearsal-only one: every vLLM server started from it serves the stand-in (unless
GLMDEPLOY_REHEARSAL_STANDIN=0).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = "glmdeploy_rehearsal_standin"
PTH_LINE = f"import {PACKAGE}; {PACKAGE}.activate()\n"
FILES = {"__init__.py": HERE / "standin_hook.py", "standin_executor.py": HERE / "standin_executor.py"}


def site_packages(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"error: {python} does not exist: --venv must name a virtual environment")
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        env={"GLMDEPLOY_REHEARSAL_STANDIN": "0", "PATH": "/usr/bin:/bin"},
    )
    return Path(out.stdout.strip())


def install(site: Path) -> bool:
    changed = False
    target = site / PACKAGE
    target.mkdir(exist_ok=True)
    for name, source in FILES.items():
        dest = target / name
        if not dest.exists() or dest.read_bytes() != source.read_bytes():
            shutil.copyfile(source, dest)
            changed = True
    pth = site / f"{PACKAGE}.pth"
    if not pth.exists() or pth.read_text() != PTH_LINE:
        pth.write_text(PTH_LINE)
        changed = True
    return changed


def uninstall(site: Path) -> bool:
    changed = False
    pth = site / f"{PACKAGE}.pth"
    if pth.exists():
        pth.unlink()
        changed = True
    if (site / PACKAGE).exists():
        shutil.rmtree(site / PACKAGE)
        changed = True
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, required=True, help="the rehearsal venv (vLLM 0.4.3 installed)")
    parser.add_argument("--uninstall", action="store_true", help="remove the stand-in from the venv")
    args = parser.parse_args(argv)
    site = site_packages(args.venv.resolve())
    if args.uninstall:
        print(f"==> stand-in {'removed from' if uninstall(site) else 'was not in'} {site}")
    else:
        print(f"==> stand-in {'installed into' if install(site) else 'already current in'} {site}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
