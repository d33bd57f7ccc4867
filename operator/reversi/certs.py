"""X.509 certificates made with ``cryptography``: a CA and leaf certificates it signs.

Used for the operator's admission webhook server (kopf's own self-signed path needs
oscrypto, which fails on OpenSSL 3) and by the local control plane for every component.

Client certificate identity follows Kubernetes' x509 authenticator: the certificate's common
name is the user name and each organization is a group.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class KeyPair:
    """PEM paths of a certificate and its private key."""

    cert: Path
    key: Path


def write_key(key, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _key_usage(ca: bool) -> x509.KeyUsage:
    """Digital signatures for every certificate; certificate and CRL signing for a CA only."""
    return x509.KeyUsage(
        digital_signature=True, key_cert_sign=ca, crl_sign=ca, content_commitment=False,
        key_encipherment=False, data_encipherment=False, key_agreement=False,
        encipher_only=False, decipher_only=False,
    )


def _load(pair: KeyPair):
    cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    key = serialization.load_pem_private_key(pair.key.read_bytes(), password=None)
    return cert, key


def make_ca(directory: Path, name: str = "reversi-local-ca") -> KeyPair:
    """Create (or reuse) a self-signed CA in ``directory`` as ``ca.crt``/``ca.key``."""
    directory.mkdir(parents=True, exist_ok=True)
    pair = KeyPair(directory / "ca.crt", directory / "ca.key")
    if pair.cert.exists() and pair.key.exists():
        return pair
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY * 5)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    write_key(key, pair.key)
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return pair


def issue(
    ca: KeyPair,
    directory: Path,
    stem: str,
    common_name: str,
    *,
    organizations: tuple[str, ...] = (),
    dns_names: tuple[str, ...] = (),
    ip_addresses: tuple[str, ...] = (),
    server: bool = False,
    client: bool = False,
) -> KeyPair:
    """Issue a leaf certificate signed by ``ca`` and write ``<stem>.crt``/``<stem>.key``.

    ``common_name`` is the user name and ``organizations`` the groups for a client
    certificate; ``dns_names``/``ip_addresses`` are the subject alternative names of a
    serving certificate. Existing files are reused.
    """
    directory.mkdir(parents=True, exist_ok=True)
    pair = KeyPair(directory / f"{stem}.crt", directory / f"{stem}.key")
    if pair.cert.exists() and pair.key.exists():
        return pair
    ca_cert, ca_key = _load(ca)
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    now = dt.datetime.now(dt.UTC)
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),
            critical=False,
        )
    )
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ip_addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    write_key(key, pair.key)
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return pair
