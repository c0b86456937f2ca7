"""Compare the cost of one endpoint per model with one shared endpoint; prints a markdown table.

Every number is a parameter. The default price is an EXAMPLE: the on-demand price of a SageMaker
real-time inference ml.g4dn.xlarge in us-east-1 (USD 0.7364 an hour, as listed in 2024). Look up
your region's current price and pass it with --single-price / --shared-price.

    python -m scripts.sagemaker cost
    python -m scripts.sagemaker cost --hours 200 --shared-instances 2 --shared-price 1.408 \\
        --shared-instance-type ml.g5.xlarge
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

EXAMPLE_INSTANCE = "ml.g4dn.xlarge"
EXAMPLE_PRICE = 0.7364  # USD per hour, on-demand, us-east-1, 2024: an example, not a quote
HOURS_PER_MONTH = 730  # 24 x 365 / 12


@dataclass(frozen=True)
class Setup:
    label: str
    endpoints: int
    instances_per_endpoint: int
    price_per_hour: float

    @property
    def instances(self) -> int:
        return self.endpoints * self.instances_per_endpoint

    @property
    def hourly(self) -> float:
        return self.instances * self.price_per_hour

    def cost(self, hours: float) -> float:
        return self.hourly * hours


def table(single: Setup, shared: Setup, hours: float) -> str:
    rows = [
        "| setup | endpoints | instances | USD per hour | hours | USD total |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for setup in (single, shared):
        rows.append(
            f"| {setup.label} | {setup.endpoints} | {setup.instances} | {setup.hourly:,.4f} | "
            f"{hours:,.0f} | {setup.cost(hours):,.2f} |"
        )
    saving = single.cost(hours) - shared.cost(hours)
    share = 100 * saving / single.cost(hours) if single.cost(hours) else 0.0
    rows.append(
        f"| saving with the shared endpoint | | | {single.hourly - shared.hourly:,.4f} | {hours:,.0f} | "
        f"{saving:,.2f} ({share:.0f}%) |"
    )
    return "\n".join(rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.sagemaker cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--models", type=int, default=3, help="models, one endpoint each in the first setup (default: 3)"
    )
    parser.add_argument(
        "--hours",
        type=float,
        default=HOURS_PER_MONTH,
        help=f"hours the endpoints run (default: {HOURS_PER_MONTH}, a month around the clock)",
    )
    parser.add_argument(
        "--single-instance-type", default=EXAMPLE_INSTANCE, help="instance of each single-model endpoint"
    )
    parser.add_argument(
        "--single-price",
        type=float,
        default=EXAMPLE_PRICE,
        help=f"its USD per hour (default: {EXAMPLE_PRICE}, an example: {EXAMPLE_INSTANCE}, us-east-1, 2024)",
    )
    parser.add_argument(
        "--single-instances", type=int, default=1, help="instances per single-model endpoint (default: 1)"
    )
    parser.add_argument("--shared-instance-type", default=EXAMPLE_INSTANCE, help="instance of the shared endpoint")
    parser.add_argument(
        "--shared-price",
        type=float,
        default=EXAMPLE_PRICE,
        help=f"its USD per hour (default: {EXAMPLE_PRICE}, the same example)",
    )
    parser.add_argument("--shared-instances", type=int, default=1, help="instances of the shared endpoint (default: 1)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    single = Setup(
        f"{args.models} single-model endpoints ({args.single_instances} x {args.single_instance_type} each)",
        args.models,
        args.single_instances,
        args.single_price,
    )
    shared = Setup(
        f"one shared endpoint ({args.shared_instances} x {args.shared_instance_type})",
        1,
        args.shared_instances,
        args.shared_price,
    )
    print(table(single, shared, args.hours))
    return 0
