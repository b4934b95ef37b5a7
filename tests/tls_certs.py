"""Certificates for TLS tests, made in the test with ``cryptography``: a self-signed
CA, a server certificate it signs (for the IP 127.0.0.1 only, so that a client that
checks the host name accepts 127.0.0.1 and refuses ``localhost``), a client
certificate it signs, and a second CA that signed none of them."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Certs:
    """The files of one test's PKI (PEM)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    #: A CA that signed nothing here: trusting it alone must refuse the server.
    other_ca: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _ca(common_name: str, path: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(common_name))
            .issuer_name(_name(common_name)).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def _leaf(common_name: str, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, *,
          server: bool, cert_path: Path, key_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(common_name))
               .issuer_name(ca.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(hours=1))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                              critical=True)
               .add_extension(x509.ExtendedKeyUsage(
                   [ExtendedKeyUsageOID.SERVER_AUTH if server
                    else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                   ca_key.public_key()), critical=False))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.IPv4Address("127.0.0.1"))]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, key_path)


def make_certs(directory: Path, *, client_name: str = "postgres") -> Certs:
    """A CA, a server and a client certificate (``client_name`` as its common name:
    PostgreSQL's ``cert`` authentication maps it to the user), and another CA."""
    directory.mkdir(parents=True, exist_ok=True)
    certs = Certs(ca=directory / "ca.pem", server_cert=directory / "server.pem",
                  server_key=directory / "server.key", client_cert=directory / "client.pem",
                  client_key=directory / "client.key", other_ca=directory / "other-ca.pem")
    ca, ca_key = _ca("meshpoint test CA", certs.ca)
    _ca("some other CA", certs.other_ca)
    _leaf("meshpoint test server", ca, ca_key, server=True, cert_path=certs.server_cert,
          key_path=certs.server_key)
    _leaf(client_name, ca, ca_key, server=False, cert_path=certs.client_cert,
          key_path=certs.client_key)
    return certs
