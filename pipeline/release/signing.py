"""Ed25519 keys and signatures for releases (the `cryptography` package).

A release signs its manifest.json with a detached signature file (`manifest.json.sig`):

    {"algorithm": "ed25519", "key_id": <sha256 of the raw public key>,
     "public_key": <base64 raw public key>, "signature": <base64 signature of the file's bytes>}

and its provenance as a DSSE envelope, the standard wrapping of in-toto statements.
Ed25519 signatures are deterministic: the same key and bytes give the same signature.

Keys are PEM files: the private key PKCS#8 (unencrypted, mode 0600), the public key
SubjectPublicKeyInfo beside it as <key>.pub. Make a pair with `doit keygen key=PATH`.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

from ..core.errors import PipelineError

ENV_KEY = "MODELYARD_SIGNING_KEY"     # a path to the private key, or the PEM text itself
ENV_PUBKEY = "MODELYARD_VERIFY_KEY"   # a path to the public key that must have signed a bundle
ALGORITHM = "ed25519"
DSSE_TYPE = "application/vnd.in-toto+json"
KEYGEN_HINT = "make a key pair with `doit keygen key=PATH` (keep the private key out of git)"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def key_id(public_key) -> str:
    return hashlib.sha256(_raw(public_key)).hexdigest()


def _raw(public_key) -> bytes:
    from cryptography.hazmat.primitives import serialization
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def generate(path: Path) -> str:
    """Write a new private key to `path` (0600) and its public key to `path`.pub; returns the key id."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = Path(path)
    pub = path.with_name(path.name + ".pub")
    for existing in (path, pub):
        if existing.exists():
            raise PipelineError(f"{existing} already exists: a key is never overwritten",
                                stage="keygen", hint="choose another key=PATH, or move the old key away")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return key_id(key.public_key())


def keygen(path: str | None) -> str:
    """`doit keygen key=PATH`: a new key pair, described for people."""
    if not path:
        raise PipelineError("say where to write the key: doit keygen key=PATH", stage="keygen")
    kid = generate(Path(path))
    return (f"wrote the private key {path} (mode 0600; keep it out of git) and the public key "
            f"{path}.pub; key id {kid}")


def load_private_key(path: str | None, **where):
    """The signing key from key=PATH, else from $MODELYARD_SIGNING_KEY (a path or PEM text)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    source = path or os.environ.get(ENV_KEY, "")
    if not source.strip():
        raise PipelineError(f"no signing key: give key=PATH or set {ENV_KEY} "
                            f"(a path, or the PEM text itself)", hint=KEYGEN_HINT, **where)
    if source.lstrip().startswith("-----BEGIN"):
        pem, origin = source.encode(), f"${ENV_KEY}"
    else:
        origin = source
        try:
            pem = Path(source).read_bytes()
        except OSError as exc:
            raise PipelineError(f"cannot read the signing key {source}: {exc.strerror}",
                                hint=KEYGEN_HINT, **where) from None
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:  # TypeError: the key is encrypted
        raise PipelineError(f"the signing key {origin} is not an unencrypted PEM private key: {exc}",
                            hint=KEYGEN_HINT, **where) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise PipelineError(f"the signing key {origin} is a {type(key).__name__}, not Ed25519",
                            hint=KEYGEN_HINT, **where)
    return key


def load_public_key(path: str | None, **where):
    """The key a bundle must be signed with (pubkey=PATH or $MODELYARD_VERIFY_KEY), or None.

    A private key file is accepted too: its public half is used.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    source = path or os.environ.get(ENV_PUBKEY, "")
    if not source.strip():
        return None
    try:
        pem = Path(source).read_bytes()
    except OSError as exc:
        raise PipelineError(f"cannot read the public key {source}: {exc.strerror}", **where) from None
    try:
        key = serialization.load_pem_public_key(pem)
    except ValueError:
        try:
            key = serialization.load_pem_private_key(pem, password=None).public_key()
        except (ValueError, TypeError) as exc:
            raise PipelineError(f"{source} is not a PEM Ed25519 key: {exc}", **where) from None
    if not isinstance(key, Ed25519PublicKey):
        raise PipelineError(f"{source} is a {type(key).__name__}, not an Ed25519 key", **where)
    return key


def sign(private_key, data: bytes) -> dict:
    public = private_key.public_key()
    return {"algorithm": ALGORITHM, "key_id": key_id(public), "public_key": _b64(_raw(public)),
            "signature": _b64(private_key.sign(data))}


def check(signature: dict, data: bytes, expected=None) -> tuple[str | None, str | None]:
    """(key id, problem): problem is None when `signature` is valid for `data`, made by `expected`
    when given, else by the public key the signature names."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        if signature.get("algorithm") != ALGORITHM:
            return None, f"unsupported signature algorithm {signature.get('algorithm')!r}"
        public = Ed25519PublicKey.from_public_bytes(base64.b64decode(signature["public_key"]))
        sig = base64.b64decode(signature["signature"])
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        return None, f"malformed signature record ({exc})"
    kid = key_id(public)
    if expected is not None and kid != key_id(expected):
        return kid, f"signed by key {kid[:16]}, not by the expected key {key_id(expected)[:16]}"
    try:
        public.verify(sig, data)
    except InvalidSignature:
        return kid, f"the signature of key {kid[:16]} does not match the signed bytes"
    return kid, None


def _pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE pre-authentication encoding: what a DSSE signature is computed over."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def dsse_envelope(private_key, statement: bytes) -> dict:
    record = sign(private_key, _pae(DSSE_TYPE, statement))
    return {"payloadType": DSSE_TYPE, "payload": _b64(statement),
            "signatures": [{"keyid": record["key_id"], "sig": record["signature"],
                            "publicKey": record["public_key"]}]}


def open_envelope(envelope: dict, expected=None) -> tuple[dict | None, str | None, str | None]:
    """(statement, key id, problem) of a DSSE envelope written by dsse_envelope()."""
    try:
        payload = base64.b64decode(envelope["payload"])
        (sig,) = envelope["signatures"]
        record = {"algorithm": ALGORITHM, "public_key": sig["publicKey"], "signature": sig["sig"]}
        if envelope["payloadType"] != DSSE_TYPE:
            return None, None, f"payloadType is {envelope['payloadType']!r}, not {DSSE_TYPE}"
    except (KeyError, ValueError, TypeError) as exc:
        return None, None, f"malformed DSSE envelope ({exc})"
    kid, problem = check(record, _pae(DSSE_TYPE, payload), expected)
    if problem:
        return None, kid, problem
    return json.loads(payload), kid, None
