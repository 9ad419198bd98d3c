"""A search's space: `hydra.sweeper.params` (and sweep overrides on the command line) as Optuna distributions.

    params:
      optimizer.lr: tag(log, interval(0.001, 0.2))   # FloatDistribution(0.001, 0.2, log=True)
      model.dropout: interval(0.0, 0.6)              # FloatDistribution(0.0, 0.6)
      trainer.epochs: range(2, 10, 2)                # IntDistribution(2, 8, step=2): the end is excluded
      trainer.batch_size: choice(32, 64, 128)        # CategoricalDistribution
      trainer.verbose: 0                             # a fixed value: every trial gets it

Hydra's override grammar parses each value, so what `python run.py -m KEY=...` accepts
is what `params` accepts; anything else is one line naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer.errors import ConfigError

EXPECTED = (
    "interval(LOW, HIGH), tag(log, interval(LOW, HIGH)), range(START, STOP[, STEP]), choice(A, B, ...) or a value"
)


@dataclass(frozen=True)
class Space:
    """The distributions Optuna samples ({key: distribution}) and the values every trial gets ({key: text})."""

    distributions: dict[str, Any]
    fixed: dict[str, str]

    def overrides(self, params: dict[str, Any]) -> list[str]:
        """A trial's Hydra overrides: its sampled `params`, then the fixed values."""
        sampled = [f"{key}={override_text(value)}" for key, value in params.items()]
        return [*sampled, *(f"{key}={value}" for key, value in self.fixed.items())]


def override_text(value: Any) -> str:
    """A value (a string, number, list or mapping) as Hydra override text, strings quoted (a choice of `adam`
    stays the string `adam`)."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{override_text(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(override_text(item) for item in value) + "]"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return "null" if value is None else str(value)


def parse_space(params: dict[str, Any], arguments: list[str]) -> Space:
    """The search space of `hydra.sweeper.params` ({key: override text}) and of the sweep's command-line
    `arguments` (a command-line value wins).

    Raises:
        ConfigError: a value that is no distribution nor a value (`hydra.sweeper.params.KEY` named).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    distributions, fixed = {}, {}
    texts = {key: str(value).lower() if isinstance(value, bool) else value for key, value in (params or {}).items()}
    items = [(f"hydra.sweeper.params.{key}", f"{key}={value}") for key, value in texts.items()]
    items += [(argument, argument) for argument in arguments]
    for name, text in items:
        try:
            (override,) = parser.parse_overrides([text])
        except OverrideParseException:
            raise ConfigError(f"{name}: '{text.partition('=')[2]}' is not {EXPECTED}") from None
        key = override.get_key_element()
        distributions.pop(key, None)
        fixed.pop(key, None)
        if override.is_sweep_override():
            distributions[key] = _distribution(name, override)
        else:
            fixed[key] = override.get_value_element_as_str()
    return Space(distributions, fixed)


def _distribution(name: str, override) -> Any:
    """The Optuna distribution of one sweep override."""
    from hydra.core.override_parser.types import Transformer
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    value = override.value()
    tags = set(getattr(value, "tags", set()))
    if tags - {"log"}:
        raise ConfigError(f"{name}: unknown tag {sorted(tags - {'log'})}; the one tag is log, e.g. {EXPECTED}")
    if override.is_choice_sweep() or (override.is_range_sweep() and value.shuffle):
        choices = list(override.sweep_iterator(transformer=Transformer.encode))
        if not choices:
            raise ConfigError(f"{name}: a choice needs at least one value")
        return CategoricalDistribution(choices)
    if override.is_range_sweep():
        numbers = (value.start, value.stop, value.step)
        if any(isinstance(number, float) for number in numbers):
            raise ConfigError(f"{name}: range() takes integers; use interval(LOW, HIGH) for a float")
        if value.step <= 0 or value.stop <= value.start:
            raise ConfigError(f"{name}: range({value.start}, {value.stop}, {value.step}) is empty")
        high = value.start + ((value.stop - value.start - 1) // value.step) * value.step  # the end is excluded
        return IntDistribution(int(value.start), int(high), step=int(value.step))
    if override.is_interval_sweep():
        low, high, log = value.start, value.end, "log" in tags
        if not low < high or (log and low <= 0):
            expected = "0 < LOW < HIGH" if log else "LOW < HIGH"
            raise ConfigError(f"{name}: interval({low}, {high}) needs {expected}")
        return FloatDistribution(float(low), float(high), log=log)
    raise ConfigError(f"{name}: '{override.get_value_element_as_str()}' is not {EXPECTED}")
