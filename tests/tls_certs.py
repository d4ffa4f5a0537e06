"""Throw-away certificates for TLS tests: a CA, a server and a client, plus a stranger.

Made with the ``cryptography`` package when it is installed, else with the
``openssl`` command line tool. Keys are EC P-256 (fast to make); certificates
last a day. The server certificate names ``localhost`` and ``127.0.0.1``.
"""

from __future__ import annotations

import datetime
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA that signed the server and client certificates
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_ca: Path  # a CA nobody trusts
    rogue_cert: Path  # a client certificate that CA signed
    rogue_key: Path


def make_pki(directory: Path, backend: str | None = None) -> Pki:
    """Write the files under ``directory``; ``backend`` is "cryptography" or "openssl"."""
    if backend is None:
        try:
            import cryptography  # noqa: F401
        except ImportError:
            backend = "openssl"
        else:
            backend = "cryptography"
    issue = _issue_cryptography if backend == "cryptography" else _issue_openssl
    if backend == "openssl" and shutil.which("openssl") is None:
        raise RuntimeError("neither the cryptography package nor the openssl tool is available")
    d = directory
    issue(d, "ca", None, "Warren Test CA", ca=True)
    issue(d, "server", "ca", "localhost", san=("DNS:localhost", "IP:127.0.0.1"), usage="serverAuth")
    issue(d, "client", "ca", "warren-client", usage="clientAuth")
    issue(d, "rogue-ca", None, "Rogue CA", ca=True)
    issue(d, "rogue", "rogue-ca", "warren-client", usage="clientAuth")
    return Pki(
        d / "ca.crt",
        d / "server.crt",
        d / "server.key",
        d / "client.crt",
        d / "client.key",
        d / "rogue-ca.crt",
        d / "rogue.crt",
        d / "rogue.key",
    )


def _issue_openssl(
    d: Path,
    name: str,
    issuer: str | None,
    cn: str,
    *,
    ca: bool = False,
    san: tuple[str, ...] = (),
    usage: str | None = None,
) -> None:
    def run(*args: str | Path) -> None:
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)

    key, cert = d / f"{name}.key", d / f"{name}.crt"
    run("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key)
    ext = d / f"{name}.ext"
    lines = ["subjectKeyIdentifier=hash"]
    if ca:
        lines += ["basicConstraints=critical,CA:TRUE", "keyUsage=critical,keyCertSign,cRLSign"]
    else:
        lines += [
            "authorityKeyIdentifier=keyid",
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
        ]
    if san:
        lines.append("subjectAltName=" + ",".join(san))
    if usage:
        lines.append(f"extendedKeyUsage={usage}")
    ext.write_text("\n".join(lines) + "\n")
    csr = d / f"{name}.csr"
    run("req", "-new", "-key", key, "-out", csr, "-subj", f"/CN={cn}")
    if issuer is None:
        run("x509", "-req", "-in", csr, "-signkey", key, "-out", cert, "-days", "1",
            "-extfile", ext)  # fmt: skip
    else:
        serial = str(int.from_bytes(name.encode(), "big") % 10**12 + 2)
        run("x509", "-req", "-in", csr, "-CA", d / f"{issuer}.crt", "-CAkey", d / f"{issuer}.key",
            "-set_serial", serial, "-out", cert, "-days", "1", "-extfile", ext)  # fmt: skip


def _issue_cryptography(
    d: Path,
    name: str,
    issuer: str | None,
    cn: str,
    *,
    ca: bool = False,
    san: tuple[str, ...] = (),
    usage: str | None = None,
) -> None:
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    if issuer is None:
        issuer_name, signing_key = subject, key
    else:
        issuer_cert = x509.load_pem_x509_certificate((d / f"{issuer}.crt").read_bytes())
        issuer_name = issuer_cert.subject
        loaded = serialization.load_pem_private_key((d / f"{issuer}.key").read_bytes(), None)
        assert isinstance(loaded, ec.EllipticCurvePrivateKey)
        signing_key = loaded
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    )
    if issuer is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signing_key.public_key()), False
        )
    names: list[x509.GeneralName] = []
    for entry in san:
        kind, _, value = entry.partition(":")
        if kind == "IP":
            names.append(x509.IPAddress(ipaddress.ip_address(value)))
        else:
            names.append(x509.DNSName(value))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), False)
    if usage:
        oid = {"serverAuth": ExtendedKeyUsageOID.SERVER_AUTH}.get(
            usage, ExtendedKeyUsageOID.CLIENT_AUTH
        )
        builder = builder.add_extension(x509.ExtendedKeyUsage([oid]), False)
    cert = builder.sign(signing_key, hashes.SHA256())
    (d / f"{name}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    (d / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
