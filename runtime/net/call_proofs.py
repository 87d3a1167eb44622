"""Per-call proofs of the cluster token on gRPC: the token itself never travels.

A plain-TCP channel proves the token once, by challenge and response
(:func:`~clamor.runtime.net.transport.prove_token_server`). A gRPC call has no
handshake of its own that Python can reach, so each call carries a one-time proof
instead (metadata ``x-clamor-proof``): ``time:nonce:mac``, where ``mac`` is
HMAC-SHA256 under the token of the method, the time and a random nonce. The server
accepts a proof once: its time within :data:`WINDOW` seconds of the server's clock
and its nonce not seen in that window (a replay of a captured call is refused, and
one older than the window is refused by its time). Without TLS the calls' contents
still travel in clear, and a party in the path that drops a call could use its proof
for another call of the same method within the window; ``Cluster(tls=True)``
encrypts and authenticates everything (docs/deployment.md).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time

#: The metadata key of a call's proof.
PROOF_METADATA_KEY = "x-clamor-proof"
#: Seconds a proof is valid for, either side of the server's clock (hosts' clocks must
#: agree within it: NTP keeps them within milliseconds).
WINDOW = 60.0


def _mac(token: bytes, method: str, stamp: str, nonce: str) -> str:
    return hmac.new(token, f"{method}|{stamp}|{nonce}".encode(), hashlib.sha256).hexdigest()


def prove(token: bytes, method: str, now: float | None = None) -> str:
    """A one-time proof for a call of ``method`` (``/clamor.v1.Worker/Stats``)."""
    stamp = f"{time.time() if now is None else now:.3f}"
    nonce = secrets.token_hex(12)
    return f"{stamp}:{nonce}:{_mac(token, method, stamp, nonce)}"


class ProofChecker:
    """A server's side: checks proofs and remembers the nonces of its window."""

    def __init__(self, token: bytes) -> None:
        self._token = token
        self._lock = threading.Lock()
        self._seen: dict[str, float] = {}  # nonce -> when it may be forgotten
        self._next_sweep = 0.0

    def check(self, method: str, proof: str | None, now: float | None = None) -> str | None:
        """``None`` if ``proof`` is good for a call of ``method`` (its nonce is then used
        up); else why not."""
        if proof is None:
            return f"missing proof of the cluster token ({PROOF_METADATA_KEY})"
        try:
            stamp, nonce, mac = proof.split(":")
            sent = float(stamp)
        except ValueError:
            return "a malformed proof of the cluster token"
        if not hmac.compare_digest(mac, _mac(self._token, method, stamp, nonce)):
            return "invalid proof of the cluster token (a token file from another cluster?)"
        now = time.time() if now is None else now
        if abs(now - sent) > WINDOW:
            return (f"the call's proof is {now - sent:+.0f} s off this host's clock (more than "
                    f"{WINDOW:.0f} s): a replay, or the hosts' clocks disagree (use NTP)")  # fmt: skip
        with self._lock:
            if nonce in self._seen:
                return "a replayed proof of the cluster token"
            self._seen[nonce] = now + 2 * WINDOW
            if now >= self._next_sweep:  # forget what its time would refuse anyway
                self._seen = {n: t for n, t in self._seen.items() if t > now}
                self._next_sweep = now + WINDOW
        return None
