"""``settings.decisions`` of a rule file: how what the job did before it
failed weighs beside its lines (engine/operational.py; the fields are
those of rules.model.OperationalSettings).

    settings:
      decisions:
        repeat_restarts: 1        # the same failure while the job gets no further; -1: off
        second_chance: true       # one restart for a first weak not-retryable error after progress
        sure_categories: [cuda_oom, user_shape_error, user_missing_module, numerical, storage_full]
        sure_rules: [torch_program_error]  # classifiers whose not-retryable verdict is strong anyway
        start_categories: [config_error]   # a first error of these before any progress: one restart
        node_repeats: 2           # the same retryable error on one node this many times in a row; -1: off
        node_categories: [gpu_hardware, host_oom, connection_lost, collective_error, infra_transient]

A key left out keeps the value of the file before (or the default), so a
site file can change one of them.
"""

from __future__ import annotations

import dataclasses
import re

from trainwarden.limits import quote
from trainwarden.rules.model import OperationalSettings
from trainwarden.yamlsrc import Fields

MAX_REPEATS = 100
MAX_CATEGORIES = 100
_CATEGORY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")
# A classifier's name (rules/loader.py NAME_RE).
_RULE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


def decisions_setting(fields: Fields, before: OperationalSettings) -> OperationalSettings:
    changes: dict = {}
    for key, low, what in (("repeat_restarts", 0, "restarts of the same failure while the job gets no further"),
                           ("node_repeats", 2, "times in a row the same retryable error on one node isolates it")):
        value = fields.get(key, int, None)
        if value is None:
            continue
        if isinstance(value, bool) or not (value == -1 or low <= value <= MAX_REPEATS):
            raise fields.error(key, f"{key} must be from {low} to {MAX_REPEATS}, or -1 (off)", hint=what)
        changes[key] = value
    chance = fields.get("second_chance", bool, None)
    if chance is not None:
        changes["second_chance"] = chance
    for key in ("sure_categories", "start_categories", "node_categories"):
        categories = fields.get(key, list, None)
        if categories is None:
            continue
        if len(categories) > MAX_CATEGORIES:
            raise fields.error(key, f"{key} may list at most {MAX_CATEGORIES} categories")
        for category in categories:
            if not isinstance(category, str) or not category or not set(category) <= _CATEGORY_CHARS:
                raise fields.error(key, f"{key}: {quote(category)} is not a category name",
                                   hint="a classifier's category, e.g. cuda_oom")
        changes[key] = tuple(categories)
    rules = fields.get("sure_rules", list, None)
    if rules is not None:
        if len(rules) > MAX_CATEGORIES:
            raise fields.error("sure_rules", f"sure_rules may list at most {MAX_CATEGORIES} classifiers")
        for rule in rules:
            if not isinstance(rule, str) or not _RULE_NAME.match(rule):
                raise fields.error("sure_rules", f"sure_rules: {quote(rule)} is not a classifier name",
                                   hint="a classifier's name, e.g. torch_program_error")
        changes["sure_rules"] = tuple(rules)
    fields.done()
    return dataclasses.replace(before, **changes)
