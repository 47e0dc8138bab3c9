"""Ed25519 primitives (the `cryptography` package): loading keys, signing bytes, checking a
signature, naming a key. Releases (release/signing.py) and signed cache records (remote.py)
both stand on these.

A signature is a small record:

    {"algorithm": "ed25519", "key_id": <sha256 of the raw public key>,
     "public_key": <base64 raw public key>, "signature": <base64 signature of the bytes>}

Keys are PEM files: the private key PKCS#8 (unencrypted, mode 0600), the public key
SubjectPublicKeyInfo beside it as <key>.pub (`doit keygen key=PATH` makes a pair).
`cryptography` is imported inside the functions: loading the project never pays for it.
"""
from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

from .errors import PipelineError

ENV_KEY = "MODELYARD_SIGNING_KEY"     # a path to the private key, or the PEM text itself
ENV_PUBKEY = "MODELYARD_VERIFY_KEY"   # a path to the public key that must have signed a bundle
ALGORITHM = "ed25519"
KEYGEN_HINT = "make a key pair with `doit keygen key=PATH` (keep the private key out of git)"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def raw(public_key) -> bytes:
    # cryptography: 0.01 s, only to sign or check
    from cryptography.hazmat.primitives import serialization
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public_key) -> str:
    return hashlib.sha256(raw(public_key)).hexdigest()


def _pem(source: str, what: str, hint: str | None, where: dict) -> tuple[bytes, str]:
    """(PEM bytes, where they came from) of a path or of PEM text itself."""
    if source.lstrip().startswith("-----BEGIN"):
        return source.encode(), "the PEM text given"
    try:
        return Path(source).read_bytes(), source
    except OSError as exc:
        raise PipelineError(f"cannot read the {what} {source}: {exc.strerror}", hint=hint,
                            **where) from None


def load_private_key(path: str | None, env: str | None = ENV_KEY, hint: str = KEYGEN_HINT,
                     **where):
    """The Ed25519 private key at `path` (a path or the PEM text), else from $`env`."""
    # cryptography: 0.01 s, only to sign or check
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    source = path or (os.environ.get(env, "") if env else "")
    if not source.strip():
        given = f"give key=PATH or set {env}" if env else "give the key's path"
        raise PipelineError(f"no signing key: {given} (a path, or the PEM text itself)",
                            hint=hint, **where)
    pem, origin = _pem(source, "signing key", hint, where)
    if origin == "the PEM text given" and env and not path:
        origin = f"${env}"
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:  # TypeError: the key is encrypted
        raise PipelineError(f"the signing key {origin} is not an unencrypted PEM private key: {exc}",
                            hint=hint, **where) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise PipelineError(f"the signing key {origin} is a {type(key).__name__}, not Ed25519",
                            hint=hint, **where)
    return key


def load_public_key(path: str | None, env: str | None = ENV_PUBKEY, **where):
    """The Ed25519 public key at `path` (a path or the PEM text), else from $`env`; None when
    neither is given. A private key is accepted too: its public half is used."""
    # cryptography: 0.01 s, only to sign or check
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    source = path or (os.environ.get(env, "") if env else "")
    if not source.strip():
        return None
    pem, origin = _pem(source, "public key", None, where)
    try:
        key = serialization.load_pem_public_key(pem)
    except ValueError:
        try:
            key = serialization.load_pem_private_key(pem, password=None).public_key()
        except (ValueError, TypeError) as exc:
            raise PipelineError(f"{origin} is not a PEM Ed25519 key: {exc}", **where) from None
    if not isinstance(key, Ed25519PublicKey):
        raise PipelineError(f"{origin} is a {type(key).__name__}, not an Ed25519 key", **where)
    return key


def sign(private_key, data: bytes) -> dict:
    public = private_key.public_key()
    return {"algorithm": ALGORITHM, "key_id": key_id(public), "public_key": b64(raw(public)),
            "signature": b64(private_key.sign(data))}


def check(signature, data: bytes, expected=None) -> tuple[str | None, str | None]:
    """(key id, problem): problem is None when `signature` is valid for `data`, made by `expected`
    when given, else by the public key the signature names."""
    # cryptography: 0.01 s, only to sign or check
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
