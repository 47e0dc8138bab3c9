"""Ed25519 keys and signatures for releases (the `cryptography` package): key pairs, the
manifest's detached signature, DSSE envelopes. The primitives (loading keys, sign, check,
key_id) are core/signing.py's, shared with the cache's signed key records.

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
import json
import os
from pathlib import Path

from ..core.errors import PipelineError
# The primitives live in core (the cache signs its key records with them too); their names stay
# importable from here.
from ..core.signing import (ALGORITHM, ENV_KEY, ENV_PUBKEY, KEYGEN_HINT, b64 as _b64, check,
                            key_id, load_private_key, load_public_key, sign)

__all__ = ["ALGORITHM", "DSSE_TYPE", "ENV_KEY", "ENV_PUBKEY", "KEYGEN_HINT", "check",
           "dsse_envelope", "generate", "key_id", "keygen", "load_private_key", "load_public_key",
           "open_envelope", "sign"]

DSSE_TYPE = "application/vnd.in-toto+json"


def generate(path: Path) -> str:
    """Write a new private key to `path` (0600) and its public key to `path`.pub; returns the key id."""
    # cryptography: 0.01 s, only to sign or check
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
