"""The container runtime's gpu-cu121 launcher, rendered by the roles and checked without running it.

No GPU and no NVIDIA container toolkit here: the gpu-cu121 image's unit has never run. What can
be held without them is held: the roles render a container-runtime release for the gpu-cu121
profile and the rtx-4090 class (playbooks/image_smoke.yml, the templates a deploy uses, the sizing
module of the kit) and the launcher must be valid sh that asks podman for every GPU through CDI
(`nvidia.com/gpu=all`, the name `nvidia-ctk cdi generate` gives), runs the engine under the
process guard with the sizing's flags, float16 and the model read-only. What it does not prove:
that podman finds a CDI spec on a real node (the driver role does not write one yet), that the
engine starts in the image on a GPU, or anything of the spec's regeneration after a driver change.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".venv" / "tools"
FIXTURE = ROOT / "artifacts" / "models" / "chatglm3-fixture"
IMAGE_ID = "0" * 63 + "1"

pytestmark = pytest.mark.skipif(
    not (TOOLS / "bin" / "ansible-playbook").exists() or not (FIXTURE / "config.json").exists(),
    reason="needs the tool environment and the fixture (make tools fixture)",
)


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("gpu-release")
    extra = {
        "ansible_python_interpreter": str(TOOLS / "bin" / "python"),
        "glmdeploy_profile": "gpu-cu121",
        "glmdeploy_image": IMAGE_ID,
        "image_smoke_release": str(tmp / "release"),
        "model_dir": str(FIXTURE),
        "model_source_dir": str(FIXTURE),
        "vllm_server_gpu_class": "rtx-4090",
        "vllm_server_build_venv": str(TOOLS),
        "glmdeploy_state_dir": str(tmp / "state"),
    }
    proc = subprocess.run(
        [
            str(TOOLS / "bin" / "ansible-playbook"),
            "-i",
            "localhost,",
            "playbooks/image_smoke.yml",
            "-e",
            json.dumps(extra),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": f"{TOOLS / 'bin'}:/usr/bin:/bin", "PYTHONPATH": str(ROOT / "service"), "HOME": str(tmp)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return tmp / "release"


def _argv(script: Path) -> list[str]:
    """The launcher's exec line as words (the shell's continuation lines joined)."""
    text = script.read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.lstrip().startswith("exec "))
    return shlex.split(line.replace('"$(id -u', "'$(id -u").replace(')"', ")'"))


def test_gpu_launcher_is_valid_sh_and_asks_podman_for_every_gpu_through_cdi(release: Path) -> None:
    launcher = release / "bin" / "vllm_server"
    subprocess.run(["sh", "-n", str(launcher)], check=True)
    argv = _argv(launcher)
    assert argv[1] == "podman" and "run" in argv
    run = argv[argv.index("run") :]
    assert run[run.index("--device") + 1] == "nvidia.com/gpu=all"
    for flag in ("--init", "--rm", "--replace"):
        assert flag in run
    assert run[run.index("--network") + 1] == "host" and run[run.index("--pull") + 1] == "never"
    assert "--shm-size" in run
    assert "$M:$M:ro" in run and "$R:$R:ro" in run  # the model and the release, read-only at their own paths


def test_gpu_launcher_runs_the_engine_under_the_guard_with_the_classes_sizing(release: Path) -> None:
    run = _argv(release / "bin" / "vllm_server")
    image = run.index(IMAGE_ID, run.index("--env") + 1)
    command = run[image + 1 :]
    assert command[:3] == ["glmdeploy-procguard", "vllm_server", "--"]
    assert command[3:6] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert command[command.index("--dtype") + 1] == "float16"
    # The rtx-4090 class's sizing (glmdeploy.serving.sizing) reaches the command line.
    assert "--gpu-memory-utilization" in command and "--max-num-seqs" in command


def test_gpu_bin_run_passes_the_gpus_to_the_checks(release: Path) -> None:
    script = release / "bin" / "run"
    subprocess.run(["sh", "-n", str(script)], check=True)
    assert "--device nvidia.com/gpu=all" in script.read_text().replace("'", "")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
