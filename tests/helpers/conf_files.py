"""Checks on conf/ files shared by the planner's and the trainer's config tests.

A group file lists its dataclass's defaults node first (planner/configs.py register_defaults) and
states only what differs; these helpers read a file as written and as Hydra composes it.
"""

from __future__ import annotations

from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from planner.configs import defaults
from tests.helpers import CONF


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def composed(group: str, option: str) -> dict[str, Any]:
    """`conf/<group>/<option>.yaml` as Hydra composes it (its defaults list applied); the
    caller registers the defaults nodes first."""
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return OmegaConf.to_container(compose(config_name=f"{group}/{option}"), resolve=False)[group]


def own_keys(group: str, option: str) -> dict[str, Any]:
    """The keys the file itself sets (its defaults list and `name` aside)."""
    raw = yaml.safe_load((CONF / group / f"{option}.yaml").read_text()) or {}
    return {k: v for k, v in raw.items() if k not in ("defaults", "name")}


def leaves(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def restated_defaults(group: str, option: str, cls: type) -> list[str]:
    """Keys the file sets to the dataclass's own default (a copy that could drift)."""
    default = leaves(defaults(cls))
    return [k for k, v in leaves(own_keys(group, option)).items() if k in default and default[k] == v]


def extends(group: str, option: str) -> list[str]:
    """The entries of the file's defaults list other than `_self_` (`/base/...` or a sibling)."""
    raw = yaml.safe_load((CONF / group / f"{option}.yaml").read_text()) or {}
    return [e for e in raw.get("defaults", []) if e != "_self_"]
