"""The balancer's checks of a certificate and key given in the inventory
(roles/load_balancer/tasks/tls_check.yml), run by the tools environment's ansible-playbook on
certificates made here: a bad pair is refused, naming why, before anything changes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from local_play import TOOLS, run_tasks

# Run by the tools environment's Python (it has `cryptography`): a key, and a certificate for
# another key or this one, valid from `start` days from now for `days` days.
MAKE = """
import datetime as dt, sys
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
out, start, days, same = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "same"
key, other = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "lb")])
begin = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=start)
cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key((key if same else other).public_key()).serial_number(1)
        .not_valid_before(begin).not_valid_after(begin + dt.timedelta(days=days))
        .sign(key if same else other, hashes.SHA256()))
open(out + ".crt", "wb").write(cert.public_bytes(serialization.Encoding.PEM))
open(out + ".key", "wb").write(key.private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
"""


def pair(tmp_path: Path, name: str, start: int, days: int, same: bool = True) -> tuple[str, str]:
    out = tmp_path / name
    subprocess.run(
        [str(TOOLS / "python"), "-c", MAKE, str(out), str(start), str(days), "same" if same else "other"], check=True
    )
    return f"{out}.crt", f"{out}.key"


def check(tmp_path: Path, cert: str, key: str) -> subprocess.CompletedProcess[str]:
    task = {"ansible.builtin.include_role": {"name": "load_balancer", "tasks_from": "tls_check"}}
    return run_tasks(tmp_path, [task], {"load_balancer_tls_cert": cert, "load_balancer_tls_key": key})


def test_a_current_certificate_with_its_own_key_passes(tmp_path):
    proc = check(tmp_path, *pair(tmp_path, "good", -1, 30))
    assert proc.returncode == 0, proc.stdout[-2000:]


@pytest.mark.parametrize(
    ("start", "days", "same", "said"),
    [(-30, 10, True, "not now"), (5, 30, True, "not now"), (-1, 30, False, "does not match the key")],
    ids=["expired", "not-valid-yet", "another-key"],
)
def test_a_bad_certificate_is_refused_naming_why_and_the_fix(tmp_path, start, days, same, said):
    proc = check(tmp_path, *pair(tmp_path, "bad", start, days, same))
    assert proc.returncode != 0 and said in proc.stdout and "fix:" in proc.stdout, proc.stdout[-2000:]


def test_a_certificate_without_its_key_is_refused(tmp_path):
    cert, _ = pair(tmp_path, "alone", -1, 30)
    proc = check(tmp_path, cert, "")
    assert proc.returncode != 0 and "go together" in proc.stdout, proc.stdout[-2000:]
