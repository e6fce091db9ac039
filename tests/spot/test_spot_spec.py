"""The spot section of a job file: strict, one test per invalid input, errors name the field and line."""

from __future__ import annotations

import textwrap

import pytest

from trainwarden.jobspec import load_job_file
from trainwarden.spot.market import TraceMarket
from trainwarden.spot.spec import check_bids
from trainwarden.yamlsrc import ConfigError

MARKET = """\
pools:
  general: {}
  lingjun: {discount_only: true, compare: average}
instance_types:
  ecs.g7.xlarge: {pool: general, on_demand: 1.2}
  ml.gu7ef.8xlarge: {pool: lingjun, on_demand: 20}
prices:
  - {time: 0, instance_type: ecs.g7.xlarge, price: 0.3, stock: 8}
"""


def job_file(tmp_path, spot: str, count: int = 2):
    body = textwrap.indent(textwrap.dedent(spot), " " * 6)
    path = tmp_path / "job.yaml"
    path.write_text(f"roles:\n  worker:\n    count: {count}\n    command: [python3, train.py]\n    spot:\n{body}")
    return path


def market(tmp_path) -> TraceMarket:
    path = tmp_path / "market.yaml"
    path.write_text(MARKET)
    return TraceMarket.load(path)


def error_of(tmp_path, spot: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_job_file(job_file(tmp_path, spot))
    return str(caught.value)


def test_a_discount_bid_is_read_with_its_role_count_and_type(tmp_path):
    job = load_job_file(job_file(tmp_path, """\
        SpotStrategy: SpotWithPriceLimit
        SpotDiscountLimit: 0.4
        instance_type: ecs.g7.xlarge
    """))
    [bid] = job.spot
    assert (bid.role, bid.count, bid.instance_type, bid.discount, bid.price_limit) == (
        "worker", 2, "ecs.g7.xlarge", 0.4, None)
    [engine_bid] = check_bids(job.spot, market(tmp_path))
    assert engine_bid.discount == 0.4 and not engine_bid.compare_average


def test_a_checked_bid_names_its_pool_and_the_submitted_spec_carries_each_spot_roles_pool(tmp_path):
    from trainwarden.services.follow import job_submitted

    job = load_job_file(job_file(tmp_path, """\
        SpotStrategy: SpotWithPriceLimit
        SpotDiscountLimit: 0.4
        instance_type: ecs.g7.xlarge
    """))
    bids = check_bids(job.spot, market(tmp_path))
    assert bids[0].pool == "general"
    # Where a cluster runtime places the role (kubernetes: the pool's nodes); none for a job on ordinary capacity.
    assert job_submitted(job, bids).spec.spot_pools == (("worker", "general"),)
    assert job_submitted(job).spec.spot_pools == ()


def test_a_discount_of_0_35_is_refused_naming_the_field_and_its_line(tmp_path):
    message = error_of(tmp_path, """\
        SpotStrategy: SpotWithPriceLimit
        SpotDiscountLimit: 0.35
        instance_type: ecs.g7.xlarge
    """)
    assert "job.yaml:7:" in message and "'SpotDiscountLimit' must be 0.1 to 0.9 in steps of 0.1" in message


def test_a_discount_of_1_is_refused(tmp_path):
    assert "'SpotDiscountLimit' must be 0.1 to 0.9" in error_of(tmp_path, """\
        SpotStrategy: SpotWithPriceLimit
        SpotDiscountLimit: 1.0
        instance_type: ecs.g7.xlarge
    """)


def test_a_discount_of_0_is_refused(tmp_path):
    assert "'SpotDiscountLimit' must be 0.1 to 0.9" in error_of(tmp_path, """\
        SpotStrategy: SpotWithPriceLimit
        SpotDiscountLimit: 0
        instance_type: ecs.g7.xlarge
    """)


def test_both_limits_at_once_are_refused_naming_the_price_limit(tmp_path):
    message = error_of(tmp_path, """\
        SpotStrategy: SpotWithPriceLimit
        SpotDiscountLimit: 0.4
        SpotPriceLimit: 0.011
        instance_type: ecs.g7.xlarge
    """)
    assert "job.yaml:8:" in message and "either 'SpotDiscountLimit' or 'SpotPriceLimit', not both" in message


def test_a_bid_without_any_limit_is_refused(tmp_path):
    assert "needs 'SpotDiscountLimit' or 'SpotPriceLimit'" in error_of(tmp_path, """\
        SpotStrategy: SpotWithPriceLimit
        instance_type: ecs.g7.xlarge
    """)


def test_an_unknown_strategy_is_refused(tmp_path):
    assert "'SpotStrategy' must be SpotWithPriceLimit, not 'SpotAsPriceGo'" in error_of(tmp_path, """\
        SpotStrategy: SpotAsPriceGo
        SpotDiscountLimit: 0.4
        instance_type: ecs.g7.xlarge
    """)


def test_a_missing_strategy_is_refused(tmp_path):
    assert "needs 'SpotStrategy'" in error_of(tmp_path, """\
        SpotDiscountLimit: 0.4
        instance_type: ecs.g7.xlarge
    """)


def test_an_unknown_key_in_the_spot_section_is_refused(tmp_path):
    message = error_of(tmp_path, """\
        SpotStrategy: SpotWithPriceLimit
        SpotDiscountLimit: 0.4
        instance_type: ecs.g7.xlarge
        EcsSpec: ecs.g7.xlarge
    """)
    assert "job.yaml:9:" in message and "unknown key 'EcsSpec'" in message


def test_a_price_limit_of_zero_is_refused(tmp_path):
    assert "'SpotPriceLimit' must be a price above 0" in error_of(tmp_path, """\
        SpotStrategy: SpotWithPriceLimit
        SpotPriceLimit: 0
        instance_type: ecs.g7.xlarge
    """)


def test_a_text_discount_is_refused(tmp_path):
    assert "'SpotDiscountLimit' must be an integer or a number" in error_of(tmp_path, """\
        SpotStrategy: SpotWithPriceLimit
        SpotDiscountLimit: "40%"
        instance_type: ecs.g7.xlarge
    """)


def test_a_missing_instance_type_is_refused(tmp_path):
    assert "needs 'instance_type'" in error_of(tmp_path, """\
        SpotStrategy: SpotWithPriceLimit
        SpotDiscountLimit: 0.4
    """)


def test_a_discount_only_pool_refuses_a_price_limit_naming_the_field_and_its_line(tmp_path):
    job = load_job_file(job_file(tmp_path, """\
        SpotStrategy: SpotWithPriceLimit
        SpotPriceLimit: 5.0
        instance_type: ml.gu7ef.8xlarge
    """))
    with pytest.raises(ConfigError) as caught:
        check_bids(job.spot, market(tmp_path))
    assert "job.yaml:7:" in str(caught.value)
    assert "pool 'lingjun' of ml.gu7ef.8xlarge accepts only 'SpotDiscountLimit', not 'SpotPriceLimit'" in \
        str(caught.value)


def test_a_discount_only_pool_accepts_a_discount_and_compares_on_the_average_price(tmp_path):
    job = load_job_file(job_file(tmp_path, """\
        SpotStrategy: SpotWithPriceLimit
        SpotDiscountLimit: 0.3
        instance_type: ml.gu7ef.8xlarge
    """))
    [bid] = check_bids(job.spot, market(tmp_path))
    assert bid.compare_average and bid.discount == 0.3


def test_an_instance_type_the_market_does_not_offer_is_refused_naming_its_line(tmp_path):
    job = load_job_file(job_file(tmp_path, """\
        SpotStrategy: SpotWithPriceLimit
        SpotDiscountLimit: 0.4
        instance_type: ecs.nope
    """))
    with pytest.raises(ConfigError) as caught:
        check_bids(job.spot, market(tmp_path))
    assert "job.yaml:8:" in str(caught.value) and "'ecs.nope' is not in the market" in str(caught.value)


def test_checkpoint_dir_is_resolved_next_to_the_job_file_with_the_job_id(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("job_id: j1\ncheckpoint_dir: ckpt/{job_id}\nroles:\n  worker:\n    command: [x]\n")
    assert load_job_file(path).checkpoint_dir == str(tmp_path / "ckpt" / "j1")
