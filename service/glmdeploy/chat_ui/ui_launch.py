"""`glmdeploy-ui`: start the Streamlit chat app of this installed package (the chat UI's command).

Streamlit runs a script file, not a module, and the file's place depends on where the wheel was
installed; this finds it beside itself and hands the rest of the command line to Streamlit's
own command-line entry point (what ``python -m streamlit run`` calls).
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Run ``streamlit run <this package>/ui.py <argv>``; returns (or exits with) Streamlit's status."""
    from streamlit.web import cli  # the node's environment has Streamlit; the control node need not

    app = Path(__file__).with_name("ui.py")
    sys.argv = ["streamlit", "run", str(app), *(sys.argv[1:] if argv is None else argv)]
    result: int | None = cli.main()
    return result or 0


if __name__ == "__main__":
    sys.exit(main())
