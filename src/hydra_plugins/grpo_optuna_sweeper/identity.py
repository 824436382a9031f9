"""What a study is: recorded when it is created, compared when a sweep joins or resumes it.

A study name reused for another search would mix two searches silently: the second sweep counts the
first one's trials toward its n_trials, starts neighbour moves from them, keeps the first one's
direction (Optuna ignores `direction` on load) and names its values by the wrong objective. So the
study keeps its identity as user attributes (`identity:<field>`, JSON values), and a sweep whose
identity differs stops before any trial, naming each difference and suggesting a new study_name.

The identity is a plain dict of fields; `enforce` knows nothing about any one field except the search
space (compared parameter by parameter). A new field is one more key in the dict the sweeper passes
(e.g. `"recipe": {...}`): recorded on creation; a study created before the field existed gets it
recorded on its next run (nothing to compare it with).

Changing a `choice()` list is refused like any other change: Optuna itself refuses it (a parameter's
CategoricalDistribution must keep the same choices in a study: `check_distribution_compatibility`,
"CategoricalDistribution does not support dynamic value space"), so not even extending one is
possible without a new study. Numeric ranges Optuna would accept, but a changed range is another
search (the old trials' points may lie outside it), so it is refused too.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from grpo_sweep.study.attrs import Key

from . import space

if TYPE_CHECKING:
    from optuna import Study
    from optuna.distributions import BaseDistribution

PREFIX = "identity:"
# The user attribute the report and summary read the objective from (older studies have only this).
OBJECTIVE_ATTR = Key.OBJECTIVE


class StudyMismatch(ValueError):
    """The sweep is not the search the study holds; the message lists each difference, in one line."""


def space_of(distributions: Mapping[str, BaseDistribution]) -> dict[str, Any]:
    """The search space as JSON-able data: {parameter: Optuna's own JSON of its distribution}."""
    from optuna.distributions import distribution_to_json

    return {key: json.loads(distribution_to_json(dist)) for key, dist in sorted(distributions.items())}


def recorded(study: Study) -> dict[str, Any]:
    """The identity fields the study holds (older studies: what Optuna and the objective attribute say)."""
    attrs = study.user_attrs
    fields = {key[len(PREFIX) :]: value for key, value in attrs.items() if key.startswith(PREFIX)}
    if "direction" not in fields and study.get_trials(deepcopy=False):  # created before identities
        fields["direction"] = study.direction.name.lower()
    if "objective" not in fields and OBJECTIVE_ATTR in attrs:
        fields["objective"] = attrs[OBJECTIVE_ATTR]
    return fields


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Each difference between the study's identity `old` and this sweep's `new`, in words. A field
    the study does not hold yet is no difference (recorded by `enforce`)."""
    out = []
    for field, value in new.items():
        if field not in old or old[field] == value:
            continue
        if field == "search_space" and isinstance(value, dict) and isinstance(old[field], dict):
            out += _space_differences(old[field], value)
        elif isinstance(value, dict) and isinstance(old[field], dict):  # e.g. the recipe: each setting named
            out += [
                f"{field} {key}: the study has {_show(old[field].get(key))}, this sweep {_show(value.get(key))}"
                for key in sorted(set(old[field]) | set(value))
                if old[field].get(key) != value.get(key)
            ]
        else:
            out.append(f"{field}: the study has {_show(old[field])}, this sweep {_show(value)}")
    return out


def _space_differences(old: dict, new: dict) -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        if key not in old:
            out.append(f"parameter {key} added ({_show_dist(new[key])})")
        elif key not in new:
            out.append(f"parameter {key} removed (the study has {_show_dist(old[key])})")
        elif old[key] != new[key]:
            out.append(f"parameter {key}: the study has {_show_dist(old[key])}, this sweep {_show_dist(new[key])}")
    return out


def _show_dist(data: dict) -> str:
    attrs = data.get("attributes", {})
    if data.get("name") == "CategoricalDistribution":
        return f"choice({', '.join(map(str, attrs.get('choices', [])))})"
    low, high, step, log = attrs.get("low"), attrs.get("high"), attrs.get("step"), attrs.get("log")
    kind = "int" if data.get("name") == "IntDistribution" else "float"
    return f"{kind} {low}..{high}" + (f" step {step}" if step not in (None, 1) else "") + (" log" if log else "")


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)[:200]


STUDY_NAME = "hydra.sweeper.study_name"


def enforce(study: Study, fields: dict[str, Any], storage: str = "") -> None:
    """Record `fields` on a study that does not hold them; StudyMismatch when it holds different ones.

    Called right after the study is opened, before any trial is asked or queued.

    Args:
        study: The study just opened.
        fields: The search's identity, field to value.
        storage: The storage's URL, named in the error ("" leaves it out).
    """
    old = recorded(study)
    found = differences(old, fields)
    if found:
        raise StudyMismatch(
            f"study {study.study_name!r}{f' in {storage}' if storage else ''} is another search: "
            + "; ".join(found)
            + f". Run this one under a new name ({shlex.quote(space.to_override(STUDY_NAME, f'{study.study_name}-2'))}), "
            "or run the study's own search again to resume it"
        )
    for field, value in fields.items():
        if study.user_attrs.get(PREFIX + field) != value:
            study.set_user_attr(PREFIX + field, value)
    if "objective" in fields and study.user_attrs.get(OBJECTIVE_ATTR) != fields["objective"]:
        study.set_user_attr(OBJECTIVE_ATTR, fields["objective"])  # the report names the value by it


def objective_of(study: Study, default: str) -> str:
    """The objective the study was created with (best.yaml and the summary print it)."""
    attrs = study.user_attrs
    return attrs.get(PREFIX + "objective") or attrs.get(OBJECTIVE_ATTR) or default
