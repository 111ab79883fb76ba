"""A node's plan: its profile, Python, lock and wheelhouse, decided once from the registry,
the inventory's choice and what the node reports (`registry.PROBE`).

Every playbook starts with this plan (plugins/action/glmdeploy_plan.py sets it as the fact
`glmdeploy_plan`), and it is the roles' one channel for what the registry says about a node: the
profile's own table (`spec`), its units, logs, ports and packages, the driver branch. Before it,
the GPU rule was written in four places by two rules, the lock's name in seven, and roles read
the registry's profile tables directly 31 times beside the plan.

A plan never fails on what the node is: a Python without a lock, or a GPU profile on a node
without a GPU, goes into `problems`, which preflight turns into the deploy's error (so undeploy,
releases and smoke still run on such a node). An unknown profile name is the inventory's mistake
and stops the plan itself. Standard library only: the unit tests run it without Ansible.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from glmdeploy_control.registry import Gpu, Registry, RegistryError

AUTO = "auto"
#: How a node runs its releases (glmdeploy_runtime): its own Python's venv, or the kit's image.
RUNTIMES = ("venv", "container")
_NO_GPU = Gpu(driver_branch="", min_driver="", min_memory_mib=0)


@dataclass(frozen=True)
class NodePlan:
    profile: str
    #: "inventory" (glmdeploy_profile named it) or "auto" (the GPU rule chose it).
    profile_source: str
    #: The Python minor version ("3.11") the node's releases run: the node's own (venv runtime)
    #: or the image's (container runtime); "missing" when the node's own cannot be read.
    python: str
    #: The Pythons the profile has locks for.
    pythons: list[str]
    #: The node has a PCI device of the kit's GPU vendor.
    gpu_present: bool
    #: The profile needs one (it has a [gpu] table): the driver role runs, preflight checks.
    gpu_required: bool
    #: The profile's lock for the node's Python ("" when it has none: see problems).
    lock_name: str
    lock_file: str
    #: The wheelhouse directory's name under artifacts/wheelhouse (glmdeploy_wheelhouse_dir).
    wheelhouse_name: str
    #: How releases run: "venv" (the node's own Python) or "container" (the kit's image).
    runtime: str = "venv"
    #: The node's own Python minor version (what glmdeploy_python reports), whatever the runtime.
    host_python: str = ""
    problems: list[str] = field(default_factory=list)
    #: The GPU rule's verdict, one of `problems` ("" when the node may run the profile): the
    #: driver role stops on it too, when run without preflight (make driver).
    gpu_problem: str = ""
    #: The profile's registry table ([profile.<name>]: model, packages, runtime, gpu, ...).
    spec: dict[str, Any] = field(default_factory=dict)
    #: Each kit unit's name and log file name, by service ([kit] unit and log patterns filled in).
    units: dict[str, str] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)
    #: Each service's default port ([kit.services]); an inventory may set its own per service.
    ports: dict[str, int] = field(default_factory=dict)
    #: What node_base installs from the kit's apt repository for this profile and runtime.
    base_packages: list[str] = field(default_factory=list)
    #: The GPU classes the engine is sized for ([kit.gpu_classes]); none for a profile without a GPU.
    gpu_classes: dict[str, Any] = field(default_factory=dict)
    #: The NVIDIA driver branch: the profile's, or the GPU profile's where it has none (a host
    #: that only stages the driver's packages).
    driver_branch: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan(
    registry: Registry,
    *,
    host: str,
    profile: str,
    python_path: str,
    probe: dict[str, str],
    runtime: str = "venv",
    require_gpu: bool = True,
) -> NodePlan:
    """The plan of one node. `probe` is `registry.parse_probe` of `registry.PROBE` run there.
    In the container runtime the release runs the image's Python, so that picks the lock.
    `require_gpu` false lets a GPU profile's node lack a GPU (the rehearsal: docs/rehearsal.md)."""
    source = "auto" if profile == AUTO else "inventory"
    vendors = probe["pci_vendors"].split()
    name = registry.auto_profile(vendors) if profile == AUTO else profile
    spec = registry.profile(name)
    if runtime not in RUNTIMES:
        raise RegistryError(f"unknown glmdeploy_runtime {runtime!r} for {host}: fix: use one of {', '.join(RUNTIMES)}")
    host_python = probe["python"] or "missing"
    image_python = registry.kit.image.python
    python = image_python if runtime == "container" else host_python
    gpu_present = registry.has_gpu(vendors)
    supported = python in spec.python
    lock_name = registry.lock_name(name, python) if supported else ""
    constraints = registry.path.parent
    problems: list[str] = []
    if not supported and runtime == "container":
        problems.append(
            f"profile {name} has no lock for the image's Python {image_python} (it has {', '.join(spec.python)}): "
            f"fix: add {image_python} to [profile.{name}] python in {registry.path.name} and run make lock."
        )
    elif not supported:
        container = (
            f" Or run the releases from the kit's image, which carries its own Python {image_python}: set "
            f"glmdeploy_runtime: container for {host} (images/README.md)."
            if image_python in spec.python
            else ""
        )
        problems.append(
            f"unsupported Python on {host}: {python_path} is "
            f"{python if python != 'missing' else 'missing or broken'}; profile {name} has locks for "
            f"Python {', '.join(spec.python)}. fix: install one of those and point glmdeploy_python at it." + container
        )
    gpu_problem = ""
    if spec.gpu is not None and not gpu_present and require_gpu:
        gpu_problem = (
            f"profile {name} needs an NVIDIA GPU, and {host} has no NVIDIA PCI device (vendor "
            f"{registry.kit.gpu_pci_vendor} under /sys/bus/pci/devices). fix: deploy to the GPU server you "
            f"meant, or deploy PROFILE={registry.kit.auto.none} to this host."
        )
        problems.append(gpu_problem)
    if spec.gpu is not None and runtime == "container":
        problems.append(
            f"glmdeploy_runtime: container on {host} needs a profile without a GPU so far (the {name} image "
            f"is rendered and checked, never run: images/README.md). fix: glmdeploy_runtime: venv for this host."
        )
    return NodePlan(
        profile=name,
        profile_source=source,
        python=python,
        pythons=list(spec.python),
        gpu_present=gpu_present,
        gpu_required=spec.gpu is not None,
        lock_name=lock_name,
        lock_file=str(constraints / lock_name) if lock_name else "",
        wheelhouse_name=registry.wheelhouse_name(name, python),
        runtime=runtime,
        host_python=host_python,
        problems=problems,
        gpu_problem=gpu_problem,
        spec=asdict(spec),
        units={service: registry.unit_name(service) for service in registry.node_units()},
        logs={service: registry.log_name(service) for service in registry.node_units()},
        ports={service: svc.port for service, svc in registry.kit.services.items()},
        base_packages=registry.apt_packages()["node_base/" + ("container" if runtime == "container" else name)],
        gpu_classes={n: asdict(c) for n, c in registry.kit.gpu_classes.items()} if spec.gpu else {},
        driver_branch=(spec.gpu or registry.profile(registry.kit.auto.gpu).gpu or _NO_GPU).driver_branch,
    )
