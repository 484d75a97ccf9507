"""The leadership group as Kafka's coordinator describes it (``pgrouter status`` with
``[ha] enabled``): its members — each a ``pgrouter run`` process, named by its client id
``pgrouter-<host>-<pid>`` — and the leader, the member assigned the control topic's
partition 0. Read from Kafka, never from a router (which may be the one that hangs).
Blocking; called from a worker thread."""

from __future__ import annotations

from router.delivery.ha import control_topic, group_id

TIMEOUT = 10.0


def describe_group(cfg, slot: str) -> dict:
    """The group of ``slot``'s routers as Kafka's coordinator describes it."""
    from confluent_kafka.admin import AdminClient

    from ..kafka.admin import connection_conf

    group = group_id(cfg.ha, slot)
    topic = control_topic(cfg.ha, slot)
    admin = AdminClient(connection_conf(cfg.kafka.bootstrap_servers, dict(cfg.kafka.settings)))
    desc = admin.describe_consumer_groups([group], request_timeout=TIMEOUT)[group].result(TIMEOUT)
    members, leader = [], None
    for m in sorted(desc.members, key=lambda m: m.client_id):
        parts = m.assignment.topic_partitions if m.assignment is not None else []
        leads = any(p.topic == topic and p.partition == 0 for p in parts)
        members.append({"client_id": m.client_id, "member_id": m.member_id, "host": m.host,
                        "role": "leader" if leads else "standby"})
        if leads:
            leader = m.client_id
    return {"group": group, "topic": topic, "state": desc.state.name.lower(),
            "leader": leader, "members": members}


def text(ha: dict) -> list[str]:
    """``pgrouter status``'s lines for the group."""
    lines = [f"leadership group {ha['group']} ({ha['state']}): leader {ha['leader'] or '-'}, "
             f"{len(ha['members'])} member(s)"]
    lines += [f"  {m['client_id']} on {m['host']}: {m['role']}" for m in ha["members"]]
    return lines
