"""`config_hash`: the fingerprint of a policy, stored with every tick (it must never change for the same policy)."""

from __future__ import annotations

import hashlib
import json

from planner_core.config.policy import PlannerConfig


def config_hash(config: PlannerConfig) -> str:
    """Fingerprint a policy: the identity stored with every tick.

    Only the policy is hashed, so service settings (reports, ports, endpoints) can change without changing it.
    Rows recorded before the split carry the hash of the whole file; they are looked up by that stored hash
    and their stored body still parses (see `planner_core.runtime.store.repository.ensure_deployment`).

    Args:
        config: the policy to fingerprint.

    Returns:
        The sha256 hex digest of the canonical JSON (sorted keys, no whitespace) of
        `config.model_dump(mode="json")`. Spelling a field by its alias does not change it; changing any
        value does.
    """
    canonical = json.dumps(config.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
