"""MODEL_CARD.md: what a published model is, in the layout of a Hugging Face model card, from the run folder alone.

    python run.py mode=export checkpoint=RUN export.dir=serving/pets     # serving/pets/MODEL_CARD.md

YAML front matter (license, tags, datasets, metrics and the `model-index` results the Hub
reads), then the data, the training command and config, the precision trained in, the test
metrics, and the input contract and its limits. Every figure is copied from the run's
`metrics.json`, `data.json` and `.hydra/config.yaml`, and from the export's
`serving_info.json`; nothing is typed by hand. A bare `.keras` file, without its run folder,
gets a card that says which of these it cannot tell.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

SAVED_CONFIG = Path(".hydra") / "config.yaml"


@dataclass(frozen=True)
class RunRecord:
    """What the training run folder says of the model (each None where the folder has no such file)."""

    folder: str | None = None
    metrics: dict | None = None  # metrics.json
    config: str | None = None  # .hydra/config.yaml, as written
    command: str | None = None  # the first command invocations.jsonl records
    data_files: list | None = None  # data.json's [file, bytes, sha256] of every data file


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _command(path: Path) -> str | None:
    if not path.is_file():
        return None
    events = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return next((event["command"] for event in events if event.get("event") == "start"), None)


def read_run(folder: Path | None) -> RunRecord:
    """The record of the training run `folder` (None: a bare checkpoint file, nothing recorded)."""
    if folder is None:
        return RunRecord()
    config = folder / SAVED_CONFIG
    return RunRecord(
        folder=str(folder),
        metrics=_json(folder / "metrics.json"),
        config=config.read_text(encoding="utf-8") if config.is_file() else None,
        command=_command(folder / "invocations.jsonl"),
        data_files=(_json(folder / "data.json") or {}).get("sha256"),
    )


def _figure(value: float | None) -> str:
    return "not recorded" if value is None else f"{value:.4f}"


def _front_matter(serving_info: dict, run: RunRecord, license: str) -> str:
    metrics = run.metrics or {}
    dataset = serving_info.get("dataset") or "unknown"
    results = [
        {"type": kind, "name": name, "value": metrics[key]}
        for kind, name, key in (
            ("accuracy", "test accuracy", "test_accuracy"),
            ("f1", "test macro F1", "test_macro_f1"),
            ("ece", "test expected calibration error", "test_ece"),
        )
        if metrics.get(key) is not None
    ]
    front = {
        "license": license,
        "library_name": "keras",
        "pipeline_tag": "image-classification",
        "tags": ["image-classification", "keras", "vggtrain", dataset],
        "datasets": [dataset],
        "metrics": [result["type"] for result in results],
        "model-index": [
            {
                "name": Path(run.folder).name if run.folder else "vggtrain model",
                "results": [
                    {
                        "task": {"type": "image-classification"},
                        "dataset": {"name": dataset, "type": dataset, "split": "test"},
                        "metrics": results,
                    }
                ],
            }
        ],
    }
    return "---\n" + yaml.safe_dump(front, sort_keys=False) + "---\n"


def _data(serving_info: dict, run: RunRecord) -> list[str]:
    metrics = run.metrics or {}
    source = _source(run.config)
    lines = ["## Data", "", f"- Dataset: `{serving_info.get('dataset') or 'unknown'}`, read from `{source}`"]
    examples = metrics.get("num_examples") or {}
    if examples:
        lines.append("- Images per split: " + ", ".join(f"{split} {count}" for split, count in examples.items()))
    if run.data_files:
        lines += ["- Data files (SHA-256 of the whole file, as `data.json` records them):", ""]
        lines += ["| file | bytes | SHA-256 |", "|---|---|---|"]
        lines += [f"| `{name}` | {size} | `{digest}` |" for name, size, digest in run.data_files]
    else:
        lines.append("- Data digest: not recorded (no `data.json` in the run folder)")
    return [*lines, ""]


def _source(config: str | None) -> str:
    if not config:
        return "not recorded"
    dataset = (yaml.safe_load(config) or {}).get("dataset") or {}
    return str(dataset.get("data_dir") or dataset.get("name") or "not recorded")


def _training(serving_info: dict, run: RunRecord) -> list[str]:
    lines = ["## Training", ""]
    lines.append(f"- Command: `{run.command}`" if run.command else "- Command: not recorded")
    lines.append(f"- Precision trained in: {serving_info.get('trained_precision', 'not recorded')} (saved and "
                 "exported in float32)")  # fmt: skip
    start = (run.metrics or {}).get("init_from")  # model.init_from: the weights the run started from
    if start:
        head = "a new head for these classes" if start.get("new_head") else "the same classes"
        lines.append(f"- Started from: `{start['file']}` (its epoch {start.get('epoch') or 'not recorded'}; {head})")
    if run.folder is None:
        lines.append("- Exported from a bare `.keras` file: its run folder (config, metrics, data) was not given")
    lines.append("")
    if run.config:
        lines += ["The config the run composed (`.hydra/config.yaml`):", "", "```yaml", run.config.rstrip(), "```", ""]
    return lines


def _evaluation(serving_info: dict, run: RunRecord) -> list[str]:
    metrics = run.metrics
    if not metrics:
        return ["## Evaluation", "", "Not recorded: no `metrics.json` in the run folder.", ""]
    names = serving_info["class_names"]
    lines = [
        "## Evaluation",
        "",
        f"On the test split ({metrics.get('test_num_examples', 'not recorded')} images), by the training run:",
        "",
        f"- Accuracy: {_figure(metrics.get('test_accuracy'))}",
        f"- Macro F1: {_figure(metrics.get('test_macro_f1'))}",
        f"- Expected calibration error (ECE): {_figure(metrics.get('test_ece'))}",
        f"- Temperature (fitted by the run's report): {_figure(metrics.get('test_temperature'))}",
        f"- Temperature baked into these files: {_figure(serving_info['output'].get('temperature'))}",
        "",
    ]
    per_class = metrics.get("test_per_class") or {}
    if per_class:
        lines += ["| class | F1 | precision | recall | support |", "|---|---|---|---|---|"]
        for index, name in enumerate(names):
            row = per_class.get(name) or per_class.get(str(index)) or {}
            lines.append(
                f"| {name} | {_figure(row.get('f1'))} | {_figure(row.get('precision'))} | "
                f"{_figure(row.get('recall'))} | {row.get('support', 'not recorded')} |"
            )
        lines.append("")
    return lines


def _contract(serving_info: dict) -> list[str]:
    names = serving_info["class_names"]
    files = ", ".join(f"`{format}`" for format in serving_info["files"])
    return [
        "## Input contract and limits",
        "",
        f"- Files: {files} (`serving_info.json` names each file's input and output)",
        f"- Input: RGB uint8 pixels; the SavedModel's `serve` takes any size and resizes in the graph, the other "
        f"files take {serving_info['image_size']}x{serving_info['image_size']}",
        f"- Resize: each image is made square by `{serving_info['resize_mode']}`, resized to "
        f"{serving_info['resize_to']} and centre-cropped to {serving_info['image_size']}",
        f"- Normalization: {serving_info['normalization']}",
        f"- Output: probabilities over {len(names)} classes, in this order: {', '.join(names)}",
        "- Limits: the model always answers one of these classes. It has no class for anything else, so an image "
        "of something none of them covers still gets one of them, often with high probability. The figures "
        "above hold for images like the test split's; other cameras, crops or subjects are not measured.",
        "",
    ]


def render(serving_info: dict, run: RunRecord, license: str = "other") -> str:
    """MODEL_CARD.md's text for the export that `serving_info` (serving_info.json's content) describes."""
    title = f"# {Path(run.folder).name if run.folder else 'vggtrain model'}: {serving_info.get('dataset') or ''}"
    intro = (
        f"An image classifier trained with vggtrain on `{serving_info.get('dataset') or 'unknown'}`. "
        "This card is generated by `mode=export` from the run folder; do not edit it by hand."
    )
    sections = [_data(serving_info, run), _training(serving_info, run), _evaluation(serving_info, run)]
    body = [title.rstrip(": "), "", intro, "", *sum(sections, []), *_contract(serving_info)]
    return _front_matter(serving_info, run, license) + "\n" + "\n".join(body)
