#!/usr/bin/python
"""Place a release's container image in the node's store from its archive, checked twice.

Why a module: the image travels as a file (no registry anywhere), so three facts must hold before
a release may name it, and each must be said plainly when it does not: the archive is the one the
control node made (its SHA256), it holds the image the release was built for (the image ID after
`podman load`, which is the digest of the image's configuration and so of every layer), and the
store keeps it under the kit's name. An image already in the store under its ID is left alone
(changed=false), so a second deploy changes nothing; check mode says what would be loaded.
"""

from __future__ import annotations

import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.glmdeploy_integrity import file_sha256

DOCUMENTATION = r"""
module: glmdeploy_image
short_description: Load a release's image archive into the node's podman store and check its ID
options:
  podman: {description: the podman command (with the kit's store options), type: list, elements: str, required: true}
  archive: {description: the zstd-compressed image archive on the node, type: path, required: true}
  sha256: {description: the archive's SHA256 (made on the control node), type: str, required: true}
  image_id: {description: the image ID the archive must hold, type: str, required: true}
  name: {description: the name the store keeps it under, type: str, required: true}
"""

RETURN = r"""
image_id: {description: the image's ID in the store, type: str}
loaded: {description: true when the archive was loaded by this run, type: bool}
"""


def present_id(podman: list[str], ref: str) -> str | None:
    proc = subprocess.run([*podman, "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def load(podman: list[str], archive: str) -> tuple[int, str]:
    """zstd -dc | podman load: the archive is kept compressed on disk."""
    unzip = subprocess.Popen(["zstd", "-dcq", archive], stdout=subprocess.PIPE)
    proc = subprocess.run([*podman, "load", "--quiet"], stdin=unzip.stdout, capture_output=True, text=True)
    assert unzip.stdout is not None
    unzip.stdout.close()
    unzip.wait()
    return (unzip.returncode or proc.returncode), (proc.stdout + proc.stderr).strip()


def loaded_name(out: str) -> str:
    """The image `podman load` names ("Loaded image: localhost/name:tag"; "Loaded image(s):" on
    some versions); "" when it names none."""
    for line in out.splitlines():
        if line.startswith("Loaded image"):
            return line.split(":", 1)[1].strip().split(",")[0].strip()
    return ""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "podman": {"type": "list", "elements": "str", "required": True},
            "archive": {"type": "path", "required": True},
            "sha256": {"type": "str", "required": True},
            "image_id": {"type": "str", "required": True},
            "name": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    podman, want = p["podman"], p["image_id"]
    if present_id(podman, want) == want:
        tagged = present_id(podman, p["name"]) == want
        if not tagged and not module.check_mode:
            subprocess.run([*podman, "tag", want, p["name"]], check=True, capture_output=True)
        module.exit_json(changed=not tagged, image_id=want, loaded=False)
    if module.check_mode:
        module.exit_json(changed=True, image_id=want, loaded=False, msg=f"would load {p['archive']}")
    got = file_sha256(p["archive"])
    if got != p["sha256"]:
        module.fail_json(
            msg=f"{p['archive']} does not match its SHA256 (got {got}, made as {p['sha256']}): it was damaged or "
            "replaced on the way. fix: deploy again (the archive is sent again); the running release is untouched"
        )
    rc, out = load(podman, p["archive"])
    if rc != 0:
        module.fail_json(msg=f"podman load of {p['archive']} failed: {out[-2000:]}")
    loaded = loaded_name(out)
    got_id = present_id(podman, loaded) if loaded else None
    if got_id != want:
        if loaded:
            subprocess.run([*podman, "rmi", "--force", loaded], capture_output=True)
        module.fail_json(
            msg=f"{p['archive']} holds image {got_id or out!r}, not {want}: the archive was made from another "
            "image. fix: make image and deploy again; the running release is untouched"
        )
    subprocess.run([*podman, "tag", want, p["name"]], check=True, capture_output=True)
    module.exit_json(changed=True, image_id=want, loaded=True)


if __name__ == "__main__":
    main()
