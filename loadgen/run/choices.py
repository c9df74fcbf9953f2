"""The string grammars of two flags every load command takes, parsed once where the
config is built (:class:`~servemon.loadgen.run.config.LoadConfig`), as ``--hold`` is
in its section: ``--energy`` into an :class:`EnergyChoice`, ``--model`` into a
:class:`ModelChoice`. ``str()`` of either gives the flag's text back (what
``run.json`` keeps)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from servemon.core.errors import ConfigError
from servemon.loadgen.workloads.modelmix import ModelMix, parse_model

__all__ = ["EnergyChoice", "ModelChoice", "parse_energy", "parse_model_choice"]


@dataclass(frozen=True, slots=True)
class EnergyChoice:
    """``--energy``: where the target's GPU energy is read
    (:mod:`servemon.loadgen.run.energy`)."""

    #: auto (Prometheus with ``--prometheus``, else NVML when the target runs here),
    #: off, nvml, or an exporter's /metrics at :attr:`url`.
    source: Literal["auto", "off", "nvml", "exporter"]
    #: The exporter's /metrics URL (``source`` exporter only).
    url: str | None = None

    def __str__(self) -> str:
        return self.url if self.url is not None else self.source


def parse_energy(text: str) -> EnergyChoice:
    """``--energy``'s text as an :class:`EnergyChoice`; a one-line error naming the
    flag."""
    if text == "auto":
        return EnergyChoice("auto")
    if text == "off":
        return EnergyChoice("off")
    if text == "nvml":
        return EnergyChoice("nvml")
    if text.startswith(("http://", "https://")):
        return EnergyChoice("exporter", text)
    raise ConfigError(
        f"--energy {text!r}: expected auto, off, nvml or the http(s) URL of an "
        "exporter's /metrics"
    )


@dataclass(frozen=True, slots=True)
class ModelChoice:
    """``--model``: one model's name, or a mix of models with weights
    (:mod:`servemon.loadgen.workloads.modelmix`)."""

    text: str
    #: The mix (``a=0.7,b=0.3``); None: one model, :attr:`text`.
    mix: ModelMix | None

    @property
    def name(self) -> str | None:
        """The one model asked for; None for a mix."""
        return self.text if self.mix is None else None

    def __str__(self) -> str:
        return self.text


def parse_model_choice(text: str) -> ModelChoice:
    """``--model``'s text as a :class:`ModelChoice` (a mix checked whole)."""
    return ModelChoice(text, parse_model(text))
