"""Which webhook targets a subscription may reach: what the README promises
(its notifications paragraph) is what the address checks do. Loopback only
when the target says so; metadata, link-local and multicast never."""

import pytest

from trainwarden.notify.safety import TargetRefused, check_addresses
from tests.conftest import ROOT

LOOPBACK = {  # host, the address it resolved to
    "loopback": ("receiver.internal", "127.0.0.1"),
    "loopback v6": ("receiver.internal", "::1"),
    "unspecified": ("receiver.internal", "0.0.0.0"),
}
NEVER = {
    "link-local": ("receiver.internal", "169.254.10.1"),
    "cloud metadata": ("metadata.google.internal", "169.254.169.254"),
    "metadata by address": ("receiver.internal", "169.254.169.254"),
    "metadata through IPv4-mapped IPv6": ("receiver.internal", "::ffff:169.254.169.254"),
    "multicast": ("receiver.internal", "224.0.0.1"),
}
ALLOWED = {
    "10/8": ("alertmanager.monitoring.svc", "10.96.0.12"),
    "172.16/12": ("hooks.internal", "172.20.1.5"),
    "192.168/16": ("hooks.lan", "192.168.1.20"),
    "fc00::/7": ("hooks.internal", "fd12:3456::1"),
    "public": ("hooks.slack.com", "34.226.36.48"),
}


@pytest.mark.parametrize("host,address", LOOPBACK.values(), ids=LOOPBACK.keys())
def test_a_loopback_target_is_refused_unless_its_target_sets_allow_private_targets(host, address):
    with pytest.raises(TargetRefused, match="add 'allow_private_targets: true' to the subscription's 'target:'"):
        check_addresses(host, [address], allow_private=False, allow_loopback=False)
    check_addresses(host, [address], allow_private=True, allow_loopback=False)


@pytest.mark.parametrize("host,address", NEVER.values(), ids=NEVER.keys())
def test_link_local_multicast_and_metadata_targets_are_refused_whatever_the_subscription_says(host, address):
    for allow_private in (False, True):
        with pytest.raises(TargetRefused, match="no setting allows it"):
            check_addresses(host, [address], allow_private=allow_private, allow_loopback=True)


@pytest.mark.parametrize("host,address", ALLOWED.values(), ids=ALLOWED.keys())
def test_private_network_and_public_targets_are_allowed_without_any_setting(host, address):
    check_addresses(host, [address], allow_private=False, allow_loopback=False)


def test_the_readme_says_what_the_checks_do():
    text = " ".join((ROOT / "docs" / "GUIDE.md").read_text().split())
    assert ("Targets that are or resolve to link-local, multicast or cloud metadata addresses are always refused, "
            "loopback ones unless the subscription's target sets `allow_private_targets: true`; private-network "
            "addresses (10/8, 172.16/12, 192.168/16, fc00::/7) are allowed") in text
