"""strata.info(): what this strata is and finds. Internal; strata.info and
`python -m strata info` are the entry points.

A small probe engine (1 MiB budgets) says which device strata picks and
why, how the host tier is backed and which I/O backend runs. The tiers are
shown with their budgets and the roles homed on each: the probe engine's
by default, or those a ds_config or explicit budgets give. The probe never
allocates those budgets: opening an engine maps its whole host budget."""
from __future__ import annotations

import ctypes as C
import os
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import strata
from strata import _native
from strata._native import lib

ConfigSource = Union[str, os.PathLike, dict[str, Any]]

_PROBE_BUDGET = 1 << 20
_UNITS = ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB"))


@dataclass
class _Setup:
    """What to show: the device asked for, each tier's budget (a budget of
    None: what `unset` says; no budgets: the probe engine's), each role's
    home tier, and where they came from."""
    source: str
    device: str = "auto"
    budgets: Optional[dict[str, Optional[int]]] = None
    home: dict[str, str] = field(default_factory=dict)
    unset: str = "not given"
    swap_dir: Optional[str] = None


def info(config: Optional[ConfigSource] = None, *,
         budgets: Optional[dict[str, int]] = None) -> str:
    """Prints and returns the version, the library's path, the probe
    engine's device (and why), host backing and I/O backend, then each
    tier's budget and the roles homed there.

    The tiers are the probe engine's unless `config` (a ds_config.json
    path or dict, read by strata.torch.config.load, so it needs torch) or
    `budgets` (bytes per tier: {"device": ..., "host": ..., "nvme": ...})
    is given; with a config the probe also uses its strata.device."""
    if config is not None and budgets is not None:
        raise ValueError("info: pass a config or budgets, not both")
    if config is not None:
        setup = _from_config(config)
    elif budgets is not None:
        setup = _from_budgets(budgets)
    else:
        setup = _Setup(source="the probe engine's; pass a config or "
                       "budgets for yours", home=_default_home())
    lines = [f"strata {strata.version()} ({lib().path})"]
    with strata.Engine(device=setup.device, device_budget=_PROBE_BUDGET,
                       host_budget=_PROBE_BUDGET) as probe:
        lines += [f"  {key}: {value}" for key, value in probe.info().items()]
        if setup.budgets is None:
            setup.budgets = {tier: stats["budget"] for tier, stats
                             in probe.stats()["tiers"].items()}
    lines += _tier_lines(setup)
    text = "\n".join(lines)
    print(text)
    return text


def _default_home() -> dict[str, str]:
    """The library's default home of every role (strata_engine_options)."""
    options = _native.EngineOptions()
    lib().call("strata_engine_options_init", C.byref(options))
    tiers = {number: name for name, number in strata.TIERS.items()}
    return {role: tiers[options.home[number]]
            for role, number in strata.ROLES.items()}


def _from_budgets(budgets: dict[str, int]) -> _Setup:
    unknown = sorted(set(budgets) - set(strata.TIERS))
    if unknown:
        raise ValueError(f"info: unknown tier {unknown[0]!r} in budgets; "
                         f"use {', '.join(strata.TIERS)}")
    return _Setup(source="the budgets given", home=_default_home(),
                  budgets={tier: budgets.get(tier)
                           for tier in strata.TIERS})


def _from_config(config: ConfigSource) -> _Setup:
    """The device, budgets and homes strata.torch.initialize would use;
    budgets the config leaves out it sizes from the model."""
    try:
        from strata.torch.config import load
    except ImportError as error:
        raise ImportError(
            f"reading a ds_config needs strata.torch, which needs torch "
            f"({error}); pip install 'strata-offload[torch]', or pass budgets "
            f"instead") from error
    cfg = load(config)
    home = cfg.homes()
    on_nvme = "nvme" in home.values()
    nvme = cfg.nvme_budget
    if nvme is None and not on_nvme:
        nvme = 0
    return _Setup(
        source=("the config dict" if isinstance(config, dict)
                else os.fspath(config)),
        device=cfg.device, home=home, unset="from the model's sizes",
        budgets={"device": cfg.device_budget, "host": cfg.host_budget,
                 "nvme": nvme},
        swap_dir=cfg.nvme_path if on_nvme else None)


def _tier_lines(setup: _Setup) -> list[str]:
    """One line per tier: its budget and the roles homed on it."""
    lines = [f"tiers ({setup.source}):"]
    for tier in strata.TIERS:
        budget = (setup.budgets or {}).get(tier)
        shown = setup.unset if budget is None else _size(budget)
        if budget == 0 and tier == "nvme":
            shown += " (no NVMe tier)"
        roles = [role for role, home in setup.home.items() if home == tier]
        line = (f"  {tier:<6}  budget {shown:<26}  home of: "
                f"{', '.join(roles) or '-'}")
        if tier == "nvme" and setup.swap_dir:
            line += f" (swap_dir {setup.swap_dir})"
        lines.append(line)
    return lines


def _size(n: int) -> str:
    """Bytes, readable: "1.0 MiB (1048576 B)"."""
    for shift, unit in _UNITS:
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit} ({n} B)"
    return f"{n} B"
