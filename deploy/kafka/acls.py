"""The ACLs of local-kafka's secure mode: each Trainwarden user may do only
what its service needs, for the topics and groups of one topic prefix.

    acls.py BOOTSTRAP PREFIX [PREFIX ...]     (as the admin; secrets from $LOCAL_KAFKA_SECRETS)

local-kafka runs it in its secure mode, deploy/docker-compose.yml as its
kafka-acls service.

The table follows the services' produce and consume sets
(pipeline/trainwarden/services/*.py, bus/base.py): topics are PREFIX.KIND,
consumer groups PREFIX-SERVICE (an agent's PREFIX-agent-NODE). Only the
actuator writes commands, only the processor writes decisions, only the
actuator and an operator (cli) write node states; an agent, which runs next
to the jobs, writes observations only. Run again, it changes nothing.
"""

from __future__ import annotations

import logging
import os
import sys

logging.getLogger("kafka").addHandler(logging.NullHandler())
logging.getLogger("kafka").propagate = False

from kafka import KafkaAdminClient  # noqa: E402
from kafka.admin import (  # noqa: E402
    ACL,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ResourcePattern,
    ResourceType,
)

READ, WRITE = "read", "write"

# user -> (what it reads, what it writes, its consumer groups; a trailing '-' is a prefix of groups)
GRANTS = {
    # The market topic is read whole, outside the group (services/market_feed.py).
    "processor": ({"events", "logs", "market"}, {"decisions", "events", "deadletter"}, ["processor"]),
    "actuator": ({"decisions", "nodes", "actuator", "deadletter"},
                 {"commands", "events", "nodes", "actuator", "deadletter"},
                 ["actuator", "actuator-dead-letters"]),
    "agent": ({"commands"}, {"events", "logs", "nodes", "deadletter"}, ["agent-"]),
    "notifier": ({"decisions", "actuator"}, {"deadletter"}, ["notifier"]),
    "market": (set(), {"market", "deadletter"}, []),  # trainwarden market: publishes the quotes
    # submit (writes a submission, follows logs and decisions), nodes (reads
    # states and heartbeats, isolates), kafka init (creates the topics); like
    # every consumer, it dead-letters a message whose signature fails.
    "cli": ({"logs", "decisions", "actuator", "nodes"}, {"events", "actuator", "deadletter"}, []),
}


def client_options(secrets: str) -> dict:
    """The admin's login: admin.password and ca.pem in ``secrets``; the
    mechanism from $LOCAL_KAFKA_SASL_MECHANISM (the compose broker has PLAIN users only)."""
    with open(os.path.join(secrets, "admin.password")) as f:
        password = f.read().strip()
    mechanism = os.environ.get("LOCAL_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    return dict(security_protocol="SASL_SSL", sasl_mechanism=mechanism, sasl_plain_username="admin",
                sasl_plain_password=password, ssl_cafile=os.path.join(secrets, "ca.pem"))


def acls_for(prefix: str) -> list[ACL]:
    def acl(user: str, operation: ACLOperation, kind: ResourceType, name: str,
            pattern: ACLResourcePatternType = ACLResourcePatternType.LITERAL) -> ACL:
        return ACL(f"User:{user}", "*", operation, ACLPermissionType.ALLOW, ResourcePattern(kind, name, pattern))

    acls = []
    for user, (reads, writes, groups) in GRANTS.items():
        for topic in sorted(reads):
            acls.append(acl(user, ACLOperation.READ, ResourceType.TOPIC, f"{prefix}.{topic}"))
        for topic in sorted(writes):
            acls.append(acl(user, ACLOperation.WRITE, ResourceType.TOPIC, f"{prefix}.{topic}"))
        for group in groups:
            if group.endswith("-"):
                acls.append(acl(user, ACLOperation.READ, ResourceType.GROUP, f"{prefix}-{group}",
                                ACLResourcePatternType.PREFIXED))
            else:
                acls.append(acl(user, ACLOperation.READ, ResourceType.GROUP, f"{prefix}-{group}"))
    # kafka init: create this prefix's topics, see the ones that exist, and
    # have them record the broker's append time (bus/kafka.py).
    for operation in (ACLOperation.CREATE, ACLOperation.DESCRIBE, ACLOperation.DESCRIBE_CONFIGS,
                      ACLOperation.ALTER_CONFIGS):
        acls.append(acl("cli", operation, ResourceType.TOPIC, f"{prefix}.", ACLResourcePatternType.PREFIXED))
    return acls


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: acls.py BOOTSTRAP PREFIX [PREFIX ...]", file=sys.stderr)
        return 2
    bootstrap, prefixes = argv[0], argv[1:]
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="local-kafka-acls", request_timeout_ms=15000,
                             **client_options(os.environ["LOCAL_KAFKA_SECRETS"]))
    try:
        wanted = [a for prefix in prefixes for a in acls_for(prefix)]
        result = admin.create_acls(wanted)
    finally:
        admin.close()
    if result["failed"]:
        for acl, error in result["failed"]:
            print(f"acls.py: {acl.principal} {acl.operation.name} {acl.resource_pattern}: {error}", file=sys.stderr)
        return 1
    print(f"acls.py: {len(wanted)} ACLs for prefix(es) {', '.join(prefixes)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
