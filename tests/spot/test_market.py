"""The trace-driven market and the provider registry."""

from __future__ import annotations

import pytest

from trainwarden.events import Offer
from trainwarden.spot import market as market_mod
from trainwarden.spot.market import TraceMarket, open_market, register_provider
from trainwarden.spot.poller import MarketPoller
from trainwarden.yamlsrc import ConfigError

HEAD = """\
pools:
  general: {notice_s: 5}
  lingjun: {discount_only: true, compare: average}
instance_types:
  a: {pool: general, on_demand: 1.0}
  b: {pool: lingjun, on_demand: 10.0}
"""


def trace(tmp_path, prices: str, head: str = HEAD) -> TraceMarket:
    path = tmp_path / "market.yaml"
    path.write_text(head + prices)
    return TraceMarket.load(path)


def load_error(tmp_path, text: str) -> str:
    path = tmp_path / "market.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        TraceMarket.load(path)
    return str(caught.value)


def test_a_row_holds_until_the_next_row_of_its_type(tmp_path):
    market = trace(tmp_path, """prices:
  - {time: 0, instance_type: a, price: 0.3, stock: 4}
  - {time: 60, instance_type: a, price: 0.9, stock: 2}
""")
    assert market.offers(-1) == ()
    assert market.offers(59.9) == (Offer("a", 0.3, 4, 1.0, 0.0, 5.0),)
    assert market.offers(60) == (Offer("a", 0.9, 2, 1.0, 0.0, 5.0),)
    assert market.change_times() == [0.0, 60.0]


def test_an_average_pool_without_averages_gets_the_mean_of_the_prices_so_far(tmp_path):
    market = trace(tmp_path, """prices:
  - {time: 0, instance_type: b, price: 2, stock: 4}
  - {time: 10, instance_type: b, price: 4, stock: 4}
  - {time: 20, instance_type: b, price: 9, stock: 4, average_price: 3.5}
""")
    assert [market.offers(t)[0].average_price for t in (0, 10, 20)] == [2.0, 3.0, 3.5]


def test_prices_can_come_from_a_csv_file_next_to_the_trace(tmp_path):
    (tmp_path / "prices.csv").write_text("time,instance_type,price,stock\n0,a,0.25,3\n30,a,0.5,3\n")
    market = trace(tmp_path, "prices: prices.csv\n")
    assert market.offers(45)[0].price == 0.5


def test_a_csv_row_with_a_negative_price_is_refused_naming_its_line(tmp_path):
    (tmp_path / "prices.csv").write_text("time,instance_type,price,stock\n0,a,0.25,3\n30,a,-1,3\n")
    path = tmp_path / "market.yaml"
    path.write_text(HEAD + "prices: prices.csv\n")
    with pytest.raises(ConfigError, match=r"prices.csv:3: 'price' must be 0 or more"):
        TraceMarket.load(path)


def test_a_csv_file_with_unknown_columns_is_refused(tmp_path):
    (tmp_path / "prices.csv").write_text("t,instance_type,price,stock\n")
    path = tmp_path / "market.yaml"
    path.write_text(HEAD + "prices: prices.csv\n")
    with pytest.raises(ConfigError, match="the columns must be time,instance_type,price,stock"):
        TraceMarket.load(path)


def test_a_price_row_of_an_undeclared_type_is_refused_naming_its_line(tmp_path):
    message = load_error(tmp_path, HEAD + "prices:\n  - {time: 0, instance_type: z, price: 1, stock: 1}\n")
    assert "market.yaml:8:" in message and "instance type 'z' is not declared" in message


def test_a_negative_stock_is_refused(tmp_path):
    assert "'stock' must be 0 or more" in load_error(
        tmp_path, HEAD + "prices:\n  - {time: 0, instance_type: a, price: 1, stock: -1}\n")


def test_a_negative_time_is_refused(tmp_path):
    assert "'time' must be seconds from the job's submission" in load_error(
        tmp_path, HEAD + "prices:\n  - {time: -5, instance_type: a, price: 1, stock: 1}\n")


def test_an_unknown_key_in_the_trace_is_refused(tmp_path):
    assert "unknown key 'currency'" in load_error(tmp_path, HEAD + "currency: USD\nprices: []\n")


def test_a_type_in_an_undeclared_pool_is_refused(tmp_path):
    assert "pool 'gpu' is not declared" in load_error(
        tmp_path, "instance_types:\n  a: {pool: gpu, on_demand: 1}\nprices: []\n")


def test_an_unknown_comparison_of_a_pool_is_refused(tmp_path):
    assert "'compare' must be market or average" in load_error(
        tmp_path, "pools:\n  p: {compare: median}\ninstance_types: {}\nprices: []\n")


def test_a_zero_on_demand_price_is_refused(tmp_path):
    assert "'on_demand' must be a price above 0" in load_error(
        tmp_path, "instance_types:\n  a: {on_demand: 0}\nprices: []\n")


def test_a_trace_without_prices_is_refused(tmp_path):
    assert "the trace has no prices" in load_error(tmp_path, HEAD + "prices: []\n")


def test_a_registered_provider_opens_its_scheme(tmp_path, monkeypatch):
    class Fixed:
        name = "fixed"

        def pools(self):
            return {}

        def instance_types(self):
            return {}

        def offers(self, at):
            return (Offer("a", 0.1, 1, 1.0),)

    monkeypatch.setattr(market_mod, "_PROVIDERS", dict(market_mod._PROVIDERS))
    register_provider("fixed", lambda target: Fixed())
    assert open_market("fixed://region-1").offers(0)[0].price == 0.1


def test_an_unknown_market_scheme_is_refused_with_the_known_ones():
    with pytest.raises(ConfigError) as caught:
        open_market("nimbus://eu-1")
    assert "unknown scheme nimbus://" in str(caught.value) and "trace://" in caught.value.hint


def test_the_poller_reports_only_changes_and_survives_a_failing_provider():
    class Flaky:
        name = "flaky"
        calls = 0

        def offers(self, at):
            self.calls += 1
            if self.calls == 2:
                raise TimeoutError("api down")
            return (Offer("a", 0.1 if at < 10 else 0.2, 1, 1.0),)

    told = []
    poller = MarketPoller(Flaky(), "j", origin=100.0, interval_s=1.0, on_error=told.append)
    first = poller.poll(100.0)
    assert first is not None and first.time == 100.0
    assert poller.poll(100.5) is None  # inside the interval
    assert poller.poll(101.0) is None and told  # the provider failed: reported once, no update
    assert poller.poll(102.0) is None  # unchanged
    assert poller.poll(110.0).offers[0].price == 0.2
