"""Event notifications: webhook subscriptions with templates, signing, retries
and a delivery log (issue 5; docs/EVENTS.md is the payload contract).

Embedding::

    subs = load_subscriptions("rules/notifications")          # strict; ConfigError names file:line
    notifier = Notifier(subs, notify_dir, writer=JsonlDeliveryLog(notify_dir / "deliveries.jsonl"))
    notifier.start()                                           # background delivery
    notifier.submit_decision(decision, {"framework": "pytorch"})   # per engine decision; durable, fast
    notifier.close()                                           # pending deliveries stay on disk
"""

from trainwarden.notify.config import load_subscriptions, missing_env, shipped_notifications_dir
from trainwarden.notify.events import (
    EVENT_TYPES,
    SCHEMA_VERSION,
    NotificationEvent,
    Severity,
    events_from_decision,
    sample_event,
)
from trainwarden.notify.model import Subscription, SubscriptionSet
from trainwarden.notify.notifier import Notifier, NotifierSettings, delivery_id
from trainwarden.notify.queue import QueueError, default_directory
from trainwarden.notify.records import (
    DeliveryRecord,
    DeliveryStatus,
    DeliveryWriter,
    JsonlDeliveryLog,
    MemoryDeliveryLog,
    read_delivery_log,
)

__all__ = [
    "EVENT_TYPES", "SCHEMA_VERSION", "DeliveryRecord", "DeliveryStatus", "DeliveryWriter", "JsonlDeliveryLog",
    "MemoryDeliveryLog", "NotificationEvent", "Notifier", "NotifierSettings", "QueueError", "Severity",
    "Subscription", "SubscriptionSet", "default_directory", "delivery_id", "events_from_decision", "load_subscriptions",
    "missing_env", "read_delivery_log", "sample_event", "shipped_notifications_dir",
]
