"""Regenerate src/grpo_sweep/config/trl_fields.json: the setting names `trl grpo --config` takes, per TRL version.

For a pinned older TRL (the stack Unsloth's notebooks use), the names are read from the wheels' source,
never installed: GRPOConfig, ModelConfig, the script arguments and the dataset mixture from TRL's wheel,
TrainingArguments (GRPOConfig's base class) from the transformers wheel it pins. For the installed TRL,
from its dataclasses.

    pip download --no-deps trl==0.22.2 transformers==4.56.2 -d /tmp/trl022
    python scripts/trl_fields.py --wheels /tmp/trl022 --installed
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "grpo_sweep" / "config" / "trl_fields.json"
# (the TRL wheel, the transformers wheel it pins): TRL 0.22.2 with transformers 4.56.2, as Unsloth's notebooks pin
PINNED = {"0.22": ("trl-0.22.2-py3-none-any.whl", "transformers-4.56.2-py3-none-any.whl")}
# class -> (file in the wheel); the `trl grpo` parser's dataclasses (trl/scripts/grpo.py make_parser)
TRL_CLASSES = {
    "GRPOConfig": "trl/trainer/grpo_config.py",
    "ModelConfig": "trl/trainer/model_config.py",
    "ScriptArguments": "trl/scripts/utils.py",
    "GRPOScriptArguments": "trl/scripts/grpo.py",
    "DatasetMixtureConfig": "trl/scripts/utils.py",
}


def class_fields(source: str, name: str) -> list[str]:
    """A dataclass's own field names (its annotated class attributes), in order."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return [n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    raise SystemExit(f"{name}: not found")


def from_wheels(trl_whl: Path, transformers_whl: Path) -> dict:
    trl_zip, tf_zip = zipfile.ZipFile(trl_whl), zipfile.ZipFile(transformers_whl)
    out = {
        "source": f"{trl_whl.name} ({', '.join(sorted(set(TRL_CLASSES.values())))}), {transformers_whl.name} "
        "(transformers/training_args.py TrainingArguments)"
    }
    for cls, path in TRL_CLASSES.items():
        out[cls] = class_fields(trl_zip.read(path).decode(), cls)
    out["TrainingArguments"] = class_fields(tf_zip.read("transformers/training_args.py").decode(), "TrainingArguments")
    return out


def installed() -> tuple[str, dict]:
    import importlib.metadata

    from transformers import TrainingArguments
    from trl import GRPOConfig, ModelConfig, ScriptArguments
    from trl.scripts.grpo import GRPOScriptArguments
    from trl.scripts.utils import DatasetMixtureConfig

    names = lambda c: [f.name for f in dataclasses.fields(c)]  # noqa: E731
    trl_v, tf_v = importlib.metadata.version("trl"), importlib.metadata.version("transformers")
    ta = set(names(TrainingArguments))
    out = {"source": f"installed trl {trl_v}, transformers {tf_v} (their dataclasses)"}
    out["GRPOConfig"] = [n for n in names(GRPOConfig) if n not in ta]
    for cls in (ModelConfig, ScriptArguments, GRPOScriptArguments, DatasetMixtureConfig):
        out[cls.__name__] = names(cls)
    out["TrainingArguments"] = names(TrainingArguments)
    return ".".join(trl_v.split(".")[:2]), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheels", type=Path, help="folder holding the pinned wheels (PINNED)")
    parser.add_argument("--installed", action="store_true", help="also record the installed TRL's names")
    args = parser.parse_args()
    table = json.loads(OUT.read_text()) if OUT.exists() else {}
    if args.wheels:
        for version, (trl_whl, tf_whl) in PINNED.items():
            table[version] = from_wheels(args.wheels / trl_whl, args.wheels / tf_whl)
    if args.installed:
        version, fields = installed()
        table[version] = fields
    OUT.write_text(json.dumps(dict(sorted(table.items())), indent=1) + "\n")
    print(f"wrote {OUT}: TRL {', '.join(sorted(table))}")


if __name__ == "__main__":
    main()
