"""The kit's profile registry (constraints/profiles.toml) as data: `lookup('glmdeploy_registry', path)`.

Why a lookup of our own: Ansible has no TOML filter or lookup (ansible-core has only a TOML
inventory plugin; community.general has none), and the registry is read through one loader
everywhere (glmdeploy_control.registry), which refuses unknown keys by name. The loader keeps
one parse per file version, so templating a default that reads it many times costs nothing.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

# The kit's control package: the tool environment (make tools) has it on its path.
from glmdeploy_control import registry

DOCUMENTATION = """
name: glmdeploy_registry
short_description: The kit's profile registry as a dictionary
description:
  - Reads constraints/profiles.toml through glmdeploy_control.registry (kit, profiles, locks).
options:
  _terms:
    description: Path of the registry file (default constraints/profiles.toml of this checkout).
    required: false
"""


class LookupModule(LookupBase):
    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[Any]:
        path = terms[0] if terms else registry.DEFAULT_PATH
        try:
            return [registry.load(path).to_dict()]
        except (OSError, registry.RegistryError) as exc:
            raise AnsibleLookupError(f"the profile registry cannot be read: {exc}") from exc
