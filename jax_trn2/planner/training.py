"""What a training run would take: time to train N tokens, chip-hours, and money.

    run = training_run(step_seconds=2.0, tokens_per_step=524_288, chips=64,
                       tokens=1e12, price_per_chip_hour=price_per_chip_hour(40.0))
    run.days, run.chip_hours, run.cost

Prices. AWS sells Trainium2 by the instance: trn2.48xlarge and trn2u.48xlarge (the instance
an UltraServer is made of) each hold 16 Trainium2 chips (Neuron documentation, "Amazon EC2
Trn2 Architecture", awsdocs-neuron.readthedocs-hosted.com, read 2026-11-27). Their
on-demand hourly prices are on AWS's pricing pages, which this project could not read in a
published AWS source when this was written (2026-11-27): no price is shipped as a default,
because a number without its source would be invented. Give the price you pay, per chip-hour
or per instance-hour through `price_per_chip_hour(instance_price, instance)`.
"""

from __future__ import annotations

from dataclasses import dataclass

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0

# Trainium2 chips per instance (Neuron docs, "Amazon EC2 Trn2 Architecture").
INSTANCE_CHIPS = {"trn2.48xlarge": 16, "trn2u.48xlarge": 16}


def price_per_chip_hour(instance_price_per_hour: float,
                        instance: str = "trn2.48xlarge") -> float:
    """The price of one chip-hour from an instance's hourly price (USD, or any currency:
    the cost comes out in the same one)."""
    if instance not in INSTANCE_CHIPS:
        raise ValueError(f"unknown instance {instance!r}; known: {sorted(INSTANCE_CHIPS)}")
    if not instance_price_per_hour > 0:
        raise ValueError(f"an instance price must be positive, got {instance_price_per_hour}")
    return instance_price_per_hour / INSTANCE_CHIPS[instance]


@dataclass(frozen=True)
class TrainingRun:
    """Training `tokens` tokens at a step's throughput on `chips` chips."""

    tokens: float
    seconds: float  # wall-clock time of the run
    chips: int
    price_per_chip_hour: float | None  # None: no price given, no cost

    @property
    def days(self) -> float:
        """The run's wall-clock time in days."""
        return self.seconds / SECONDS_PER_DAY

    @property
    def chip_hours(self) -> float:
        """Chips x hours of the run."""
        return self.chips * self.seconds / SECONDS_PER_HOUR

    @property
    def cost(self) -> float | None:
        """chip-hours x the price per chip-hour (None without a price)."""
        if self.price_per_chip_hour is None:
            return None
        return self.chip_hours * self.price_per_chip_hour


def training_run(step_seconds: float, tokens_per_step: float, chips: int, tokens: float,
                 price_per_chip_hour: float | None = None) -> TrainingRun:
    """The run that trains `tokens` tokens with steps of `step_seconds` that each train
    `tokens_per_step` tokens on `chips` chips (a last partial step counts in full)."""
    for name, value in (("step_seconds", step_seconds), ("tokens_per_step", tokens_per_step),
                        ("tokens", tokens)):
        if not value > 0:
            raise ValueError(f"training_run: {name} must be positive, got {value}")
    if chips < 1:
        raise ValueError(f"training_run: chips must be >= 1, got {chips}")
    if price_per_chip_hour is not None and not price_per_chip_hour > 0:
        raise ValueError(f"training_run: price_per_chip_hour must be positive, got "
                         f"{price_per_chip_hour}")
    steps = -(-tokens // tokens_per_step)  # whole steps
    return TrainingRun(tokens, steps * step_seconds, chips, price_per_chip_hour)
