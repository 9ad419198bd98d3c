"""The hosts that Slurm or SkyPilot start a cluster's tasks on, and this task's rank, read from their variables
without TensorFlow (`trainer.distribute.cluster` makes a role of them, `trainer.distribute.strategies` the
cluster TensorFlow connects).

    srun python run.py strategy=multi_worker strategy.cluster=slurm     # SLURM_STEP_NODELIST=gpu[01-02] ...
    python run.py strategy=multi_worker strategy.cluster=skypilot       # in a SkyPilot task's `run:` section

Both name hosts without ports: the tasks of one host listen on `strategy.slurm_port_base` and up (`on_ports`).
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass

from trainer.errors import ConfigError

_RANGE = re.compile(r"(\d+)(?:-(\d+))?$")  # one item between a hostlist's brackets: 7, or 01-04
_TASKS = re.compile(r"(\d+)(?:\(x(\d+)\))?$")  # one item of SLURM_STEP_TASKS_PER_NODE: 2, or 2(x3)


@dataclass(frozen=True)
class Tasks:
    """Every training task's host in rank order (a host running several tasks repeats), and this task's rank."""

    hosts: tuple[str, ...]
    rank: int


def on_ports(hosts: tuple[str, ...] | list[str], port_base: int) -> list[str]:
    """`host:port` of each task: the tasks of one host count up from `port_base` in rank order, as TensorFlow's
    `SlurmClusterResolver` numbers them (an IPv6 host is bracketed)."""
    taken: dict[str, int] = {}
    addresses = []
    for host in hosts:
        offset = taken[host] = taken.get(host, -1) + 1
        addresses.append(f"[{host}]:{port_base + offset}" if ":" in host else f"{host}:{port_base + offset}")
    return addresses


def _bad_hostlist(variable: str, text: str, reason: str) -> ConfigError:
    return ConfigError(
        f"{variable}={text!r} is not a Slurm hostlist ({reason}); expected names with bracketed ranges, "
        f"e.g. gpu[01-04,07],n[1-2]-ib"
    )


def _names(text: str, variable: str) -> list[str]:
    """The comma-separated names of a hostlist; the commas between brackets belong to the ranges."""
    names, current, depth = [], "", 0
    for character in text:
        if character == "[":
            depth += 1
            if depth > 1:
                raise _bad_hostlist(variable, text, "a bracket inside a bracket")
        elif character == "]":
            depth -= 1
            if depth < 0:
                raise _bad_hostlist(variable, text, "a ']' without its '['")
        elif character == "," and depth == 0:
            names.append(current)
            current = ""
            continue
        current += character
    if depth:
        raise _bad_hostlist(variable, text, "a '[' without its ']'")
    names.append(current)
    if not all(names):
        raise _bad_hostlist(variable, text, "an empty name")
    return names


def _expand_ranges(body: str, variable: str, text: str) -> list[str]:
    """`01-03,7` -> 01, 02, 03, 7: each range keeps the width of its first number (Slurm's zero padding)."""
    values = []
    for item in body.split(","):
        match = _RANGE.match(item)
        if not match:
            raise _bad_hostlist(variable, text, f"[{body}] holds {item!r}, not a number or a range like 1-4")
        first, last = match.group(1), match.group(2) or match.group(1)
        if int(last) < int(first):
            raise _bad_hostlist(variable, text, f"the range {item} counts down")
        values.extend(str(number).zfill(len(first)) for number in range(int(first), int(last) + 1))
    return values


def expand_hostlist(text: str, variable: str = "SLURM_STEP_NODELIST") -> list[str]:
    """The hosts of a Slurm hostlist in Slurm's order (`scontrol show hostnames`): comma-separated names, each
    with any number of bracketed ranges anywhere in it, e.g. `gpu[01-03,07]`, `n[1-2]-ib`, `r[1-2]-n[1-4]` (the
    leftmost range varies slowest). TensorFlow's own parser takes one range, at the end of a name.

    Raises:
        ConfigError: naming `variable`, for text that is no hostlist.
    """
    hosts = []
    for name in _names(text, variable):
        pieces = re.split(r"\[([^\]]*)\]", name)  # text, ranges, text, ranges, ..., text
        choices = [[piece] if index % 2 == 0 else _expand_ranges(piece, variable, text) for index, piece in
                   enumerate(pieces)]  # fmt: skip
        hosts.extend("".join(parts) for parts in itertools.product(*choices))
    return hosts


def expand_tasks_per_node(text: str, variable: str = "SLURM_STEP_TASKS_PER_NODE") -> list[int]:
    """`2(x3),1` -> [2, 2, 2, 1]: the tasks on each node of the hostlist, in its order.

    Raises:
        ConfigError: naming `variable`, for text of another form.
    """
    counts = []
    for item in text.split(","):
        match = _TASKS.match(item.strip())
        if not match:
            raise ConfigError(f"{variable}={text!r}: {item!r} is not a task count like 2 or 2(x3)")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _integer(variable: str, meaning: str) -> int:
    text = os.environ.get(variable, "")
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{variable} must be an integer ({meaning}); got {text!r}") from None


def _rank_of(variable: str, hosts: tuple[str, ...], among: str) -> Tasks:
    """This task's rank from `variable`, checked against `among` (e.g. "the 2 node(s) of SKYPILOT_NODE_IPS")."""
    rank = _integer(variable, f"this task's rank among {among}")
    if not 0 <= rank < len(hosts):
        raise ConfigError(f"{variable}={rank} is outside {among}; expected 0 to {len(hosts) - 1}")
    return Tasks(hosts, rank)


def slurm_tasks() -> Tasks | None:
    """The tasks of the Slurm job step this process belongs to (started by `srun`); None outside Slurm (no
    SLURM_PROCID).

    Raises:
        ConfigError: one line naming the variable that is missing, or does not agree with the others.
    """
    if "SLURM_PROCID" not in os.environ:
        return None
    layout = {}
    for variable in ("SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE"):
        if not os.environ.get(variable):
            raise ConfigError(
                f"strategy.cluster=slurm: {variable} is not set; start the tasks with srun (one per node), as in "
                f"docs/distributed.md"
            )
        layout[variable] = os.environ[variable]
    nodes = expand_hostlist(layout["SLURM_STEP_NODELIST"])
    per_node = expand_tasks_per_node(layout["SLURM_STEP_TASKS_PER_NODE"])
    if len(per_node) != len(nodes):
        raise ConfigError(
            f"SLURM_STEP_TASKS_PER_NODE={layout['SLURM_STEP_TASKS_PER_NODE']!r} counts {len(per_node)} node(s), "
            f"SLURM_STEP_NODELIST={layout['SLURM_STEP_NODELIST']!r} names {len(nodes)}"
        )
    hosts = tuple(node for node, count in zip(nodes, per_node, strict=True) for _ in range(count))
    total = "SLURM_STEP_NUM_TASKS" if os.environ.get("SLURM_STEP_NUM_TASKS") else "SLURM_NTASKS"
    if os.environ.get(total) and _integer(total, "the tasks of the step") != len(hosts):
        raise ConfigError(
            f"{total}={os.environ[total]} but SLURM_STEP_TASKS_PER_NODE="
            f"{layout['SLURM_STEP_TASKS_PER_NODE']!r} places {len(hosts)} task(s)"
        )
    return _rank_of("SLURM_PROCID", hosts, f"the {len(hosts)} task(s) of the Slurm step")


def skypilot_tasks() -> Tasks | None:
    """The nodes of the SkyPilot task this process runs on, one task each (its `run:` section runs once per
    node); None outside SkyPilot (no SKYPILOT_NODE_IPS).

    Raises:
        ConfigError: one line naming SKYPILOT_NODE_IPS or SKYPILOT_NODE_RANK.
    """
    if "SKYPILOT_NODE_IPS" not in os.environ:
        return None
    ips = tuple(line.strip() for line in os.environ["SKYPILOT_NODE_IPS"].splitlines() if line.strip())
    if not ips:
        raise ConfigError("SKYPILOT_NODE_IPS is empty; expected the IP address of every node, one a line")
    if "SKYPILOT_NODE_RANK" not in os.environ:
        raise ConfigError(f"SKYPILOT_NODE_RANK is not set beside SKYPILOT_NODE_IPS; expected 0 to {len(ips) - 1}")
    return _rank_of("SKYPILOT_NODE_RANK", ips, f"the {len(ips)} node(s) of SKYPILOT_NODE_IPS")
