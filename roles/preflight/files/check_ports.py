#!/usr/bin/env python3
"""Fail if a port the kit needs is held by a process that is not the kit's service user.

Reads /proc/net/tcp{,6} (no iproute2 needed on minimal hosts). Usage:
check_ports.py SERVICE_USER PORT [PORT...]
"""

import os
import pwd
import sys


def listeners():
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A":  # LISTEN
                yield int(f[1].rsplit(":", 1)[1], 16), int(f[7]), f[9]


def owner_pid(inode):
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
                    return pid, cmd.strip()[:120]
        except OSError:
            continue
    return "?", "?"


def main():
    user, ports = sys.argv[1], {int(p) for p in sys.argv[2:]}
    try:
        ours = pwd.getpwnam(user).pw_uid
    except KeyError:
        ours = None
    bad = []
    for port, uid, inode in listeners():
        if port in ports and uid != ours:
            pid, cmd = owner_pid(inode)
            bad.append(f"port {port} is already in use by PID {pid} ({cmd}), uid {uid}")
    if bad:
        print("; ".join(sorted(set(bad))))
        print("fix: stop that process, or choose other ports (e.g. -e vllm_server_port=8010 -e chat_ui_port=8511)")
        return 1
    print("ports free: " + ", ".join(map(str, sorted(ports))))
    return 0


sys.exit(main())
