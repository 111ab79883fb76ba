#!/usr/bin/python
"""Whether the node can listen on each address a service is set to: bind a socket to it, port 0.

Read-only (the socket is closed at once, on a port the kernel picks). Asking the kernel is the
one answer that holds on every node: gathered facts list no addresses where `ip` is missing
(a minimal image), and cannot say whether an IPv6 address is usable.
"""

from __future__ import annotations

import errno
import socket

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: glmdeploy_listen_address
short_description: Check that the node can listen on each given address
options:
  addresses: {description: setting name -> address or host name, type: dict, required: true}
"""

RETURN = r"""
problems: {description: one sentence per setting the node cannot listen on (empty when all can), type: list}
"""


def problem(name: str, host: str) -> str | None:
    """Why the node cannot listen on host (None: it can)."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"{name}={host}: not an address, and the name does not resolve on the node ({exc.strerror})"
    reasons = []
    for family, kind, proto, _, address in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.bind(address)
            return None
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                reasons.append(f"{address[0]} is not an address of this node")
            elif exc.errno in (errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT):
                reasons.append("this node has no IPv6" if family == socket.AF_INET6 else str(exc))
            else:
                reasons.append(f"{address[0]}: {exc.strerror}")
    return f"{name}={host}: {'; '.join(reasons)}"


def main() -> None:
    module = AnsibleModule(argument_spec={"addresses": {"type": "dict", "required": True}}, supports_check_mode=True)
    found = [problem(name, str(host)) for name, host in sorted(module.params["addresses"].items())]
    module.exit_json(changed=False, problems=[p for p in found if p])


if __name__ == "__main__":
    main()
