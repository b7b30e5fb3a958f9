"""The dev cluster's certificates and keys, made locally (as kubeadm's `certs` phase does).

One CA signs everything: the apiserver's serving certificate (127.0.0.1, localhost and the
in-cluster names), the webhook servers' serving certificate (127.0.0.1: the webhook
configurations point at URLs with this CA as their caBundle), and the client certificates
the components and users present (the CN is the user, the O the groups, as the apiserver's
x509 authenticator reads them). The service-account key pair signs and checks tokens.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

APISERVER_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                   "kubernetes.default.svc.cluster.local")
_VALID = datetime.timedelta(days=365)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _write_key(path: Path, key) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn),
                      *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs)])


class Authority:
    """A CA in `folder` (ca.crt, ca.key), made on first use."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.cert_path, key_path = folder / "ca.crt", folder / "ca.key"
        if not self.cert_path.exists():
            key = ec.generate_private_key(ec.SECP256R1())
            now = datetime.datetime.now(datetime.timezone.utc)
            cert = (x509.CertificateBuilder().subject_name(_name("fm-dev-cluster-ca"))
                    .issuer_name(_name("fm-dev-cluster-ca")).public_key(key.public_key())
                    .serial_number(x509.random_serial_number())
                    .not_valid_before(now - datetime.timedelta(minutes=5))
                    .not_valid_after(now + _VALID)
                    .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
                    .add_extension(x509.KeyUsage(False, False, False, False, False, True, True,
                                                 False, False), True)
                    .sign(key, hashes.SHA256()))
            _write_key(key_path, key)
            self.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self._key = serialization.load_pem_private_key(key_path.read_bytes(), None)
        self._cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())

    def issue(self, name: str, *, cn: str, orgs: tuple[str, ...] = (), server: bool = False,
              hosts: tuple[str, ...] = ()) -> KeyPair:
        """A key pair `<name>.crt`/`<name>.key`: a client certificate for user `cn` in groups
        `orgs`, or (server=True) a serving certificate for `hosts` (names and IPs)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (x509.CertificateBuilder().subject_name(_name(cn, orgs))
                   .issuer_name(self._cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + _VALID)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), False))
        if hosts:
            sans = []
            for host in hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    sans.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = KeyPair(self.folder / f"{name}.crt", self.folder / f"{name}.key")
        _write_key(pair.key, key)
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return pair


def service_account_keys(folder: Path) -> KeyPair:
    """The RSA pair the apiserver signs service-account tokens with (sa.key) and checks
    them by (sa.pub); the controller-manager's token controller signs with the same key."""
    pair = KeyPair(folder / "sa.pub", folder / "sa.key")
    if not pair.key.exists():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        _write_key(pair.key, key)
        pair.cert.write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pair
