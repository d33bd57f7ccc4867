"""Certificates for the local control plane.

One CA (:mod:`reversi.certs`) signs everything: the kube-apiserver serving certificate, client
certificates for the admin, the controller manager, the node agent and any test user, and the
node agent's serving certificate. A separate RSA key pair signs service-account tokens.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from reversi.certs import KeyPair, write_key, issue, make_ca

__all__ = ["KeyPair", "issue", "make_ca", "make_service_account_keys"]


def make_service_account_keys(directory: Path) -> KeyPair:
    """Create (or reuse) the RSA key pair that signs service-account tokens.

    Returned as a :class:`KeyPair` whose ``cert`` is the public key PEM (``sa.pub``).
    """
    directory.mkdir(parents=True, exist_ok=True)
    pair = KeyPair(directory / "sa.pub", directory / "sa.key")
    if pair.cert.exists() and pair.key.exists():
        return pair
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    write_key(key, pair.key)
    pair.cert.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pair
