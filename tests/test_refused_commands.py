"""A refused command leaves the run folder it names as it was, and says why in one line; a check covers what the
command reads, and a warning about the data is said once (the red team's findings on refusals and warnings)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import pattern_records, run_cli, train_arguments

JOURNALS = ("run.log", "invocations.jsonl")  # every invocation adds its lines, a refused one too; nothing is lost


def _files(run_dir: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(path.relative_to(run_dir)): (path.read_bytes(), path.stat().st_mtime_ns)
        for path in run_dir.rglob("*")
        if path.is_file() and path.name != ".lock"  # the lock's holder is rewritten by whoever takes it
    }


def _assert_kept(before: dict, after: dict) -> None:
    """Every file of `before` is there with its bytes and modification time, no other file was made; a journal
    (run.log, invocations.jsonl) keeps every byte it had and may only grow."""
    assert sorted(after) == sorted(before)
    for name, (content, mtime) in before.items():
        if name in JOURNALS:
            assert after[name][0].startswith(content), name
        else:
            assert after[name] == (content, mtime), name


def _stopped_run(tmp_path: Path, monkeypatch) -> Path:
    """A tiny run of 2 epochs stopped by SIGTERM after its first step: a backup to resume from."""
    from conftest import stop_after_steps

    run_dir = tmp_path / "run"
    with monkeypatch.context() as patched:
        stop_after_steps(patched, 1)
        stopped = run_cli(train_arguments(tmp_path, run_dir, epochs=2), cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert (run_dir / "backup").is_dir()
    return run_dir


@pytest.mark.integration
def test_a_refused_resume_leaves_every_file_of_the_run_folder_as_it_was(tmp_path, monkeypatch):
    """Refused for a bad label (with allow_data_change=true), or for data that changed (without it): the run's
    files keep their bytes and times. config_tree.txt was rewritten by both (found by the red team)."""
    run_dir = _stopped_run(tmp_path, monkeypatch)
    test_file = tmp_path / "cifar" / "test_batch.bin"
    cases = [
        (["allow_data_change=true"], [1, 2, 3, 4, 5, 12, 6, 7], "record 5 has label 12"),
        ([], [1, 2, 3, 4, 5, 1, 6, 7], "the data differs from what"),
    ]
    for extra, labels, reason in cases:
        test_file.write_bytes(pattern_records(np.array(labels)))
        before = _files(run_dir)
        refused = run_cli([f"resume={run_dir}", *extra], cwd=tmp_path)
        assert refused.returncode == 1
        assert reason in refused.stderr.strip().splitlines()[-1]
        _assert_kept(before, _files(run_dir))


@pytest.mark.integration
def test_evaluate_of_a_run_stopped_by_a_bad_label_before_its_first_checkpoint_names_the_record(tmp_path):
    """The late label check stops a run after its first step, before any checkpoint: evaluate of that folder said
    'is it a training run folder?' (red team); it says in one line that the run stopped and why."""
    run_dir = tmp_path / "run"
    arguments = train_arguments(tmp_path, run_dir, epochs=1)
    bad = tmp_path / "cifar" / "test_batch.bin"
    bad.write_bytes(pattern_records(np.array([1, 2, 3, 4, 5, 12, 6, 7])))
    assert run_cli(arguments, cwd=tmp_path).returncode == 1
    result = run_cli(["mode=evaluate", f"checkpoint={run_dir}"], cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: checkpoint={run_dir}: the run stopped before its first checkpoint: {bad}: record 5 has label 12, "
        f"expected 0 to 9 (dataset.num_classes=10)"
    )


@pytest.mark.unit
@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([], "the folder holds no checkpoints/best.keras (is it a training run folder?)"),
        (
            ["start", {"event": "end", "outcome": "error: f.bin: record 3 has label 12"}],
            "the run stopped before its first checkpoint: f.bin: record 3 has label 12",
        ),
        (
            ["start", {"event": "end", "outcome": "preempted", "stopped": "SIGTERM"}],
            "the run was preempted before its first checkpoint; continue it with: python run.py resume={run}",
        ),
        (["start"], "the run was killed before its first checkpoint; continue it with: python run.py resume={run}"),
        (
            ["start", '{"event": "end", "outc'],
            "the run was killed before its first checkpoint; continue it with: python run.py resume={run}",
        ),  # the end line cut short
        (["42", '["start"]'], "the folder holds no checkpoints/best.keras (is it a training run folder?)"),
        ([b"\xff\xfe\x00garbage"], "the folder holds no checkpoints/best.keras (is it a training run folder?)"),
        (
            ["start", {"event": "end", "outcome": None}],
            "the folder holds no checkpoints/best.keras (the run's last command: recorded no outcome)",
        ),
        (
            [
                "start",
                {"event": "end", "outcome": "preempted", "pid": 1},
                {"event": "start", "command": "run.py resume=RUN", "pid": 2},
                {"event": "end", "outcome": "error: resume=RUN: the data differs", "pid": 2},
            ],
            "the run was preempted before its first checkpoint; continue it with: python run.py resume={run} "
            "(the last resume was refused: resume=RUN: the data differs)",
        ),  # red team: the refusal hid the run's own outcome and its resume command
    ],
    ids=[
        "no-record",
        "bad-label",
        "preempted",
        "killed",
        "cut-line",
        "not-entries",
        "not-text",
        "no-outcome",
        "refused-resume",
    ],  # fmt: skip
)
def test_a_run_folder_without_a_checkpoint_says_why_from_its_invocations(tmp_path, lines, expected):
    import json

    from trainer.errors import DataError
    from trainer.runs.checkpoints import resolve

    start = json.dumps({"event": "start", "command": "run.py", "pid": 1})
    text = [start if line == "start" else line if isinstance(line, str | bytes) else json.dumps(line) for line in lines]
    if text:  # a damaged file: JSON that is not an entry, bytes that are not text (red team: tracebacks)
        data = b"\n".join(line if isinstance(line, bytes) else line.encode() for line in text)
        (tmp_path / "invocations.jsonl").write_bytes(data + b"\n")
    with pytest.raises(DataError) as raised:
        resolve(tmp_path)
    assert str(raised.value) == f"checkpoint={tmp_path}: " + expected.format(run=tmp_path)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("bad_file", "reads", "refused"),
    [
        ("data_batch_1.bin", ("test",), False),  # evaluate of test (no report): the training files are not read
        ("data_batch_1.bin", ("test", "val"), False),  # with the report's calibration on val: the last 16 records
        ("data_batch_5.bin", ("test", "val"), True),  # ... which data_batch_5.bin holds
        ("test_batch.bin", ("test",), True),
        ("data_batch_1.bin", ("train", "val", "test"), True),  # training reads every split
    ],
    ids=["train-file-test", "train-file-val", "val-records", "test-file", "training"],
)
def test_the_label_check_covers_only_the_splits_a_mode_reads(tmp_path, bad_file, reads, refused):
    """mode=evaluate of the test split was refused for a bad label in a training file it never reads (red team)."""
    from conftest import cifar_overrides, compose, write_cifar
    from trainer.config import to_settings
    from trainer.errors import DataError
    from trainer.tasks.data import load_data

    data = write_cifar(tmp_path / "cifar")
    (data / bad_file).write_bytes(pattern_records(np.array([1, 2, 3, 4, 5, 12, 6, 7] * 2)))
    dataset = to_settings(compose(cifar_overrides(data))).dataset
    if not refused:
        load_data(dataset, 8, 0, check_val="val" in reads, reads=reads)
        return
    with pytest.raises(DataError, match=f"{bad_file}: record 5 has label 12"):
        load_data(dataset, 8, 0, check_val="val" in reads, reads=reads)


@pytest.mark.integration
def test_a_cache_folder_the_disk_refuses_is_one_warning_per_load_of_the_data(tmp_path, caplog):
    """A folder of photos with dataset.cache=disk under a folder that cannot be made: the start-up check's save
    (train, val) and each split's pipeline printed the same warning, five times in one run (red team)."""
    import logging

    from test_folder import make_folder

    from conftest import compose
    from trainer.config import to_settings
    from trainer.tasks.data import load_data

    root = make_folder(tmp_path / "photos", per_class=4)
    (tmp_path / "file").write_text("not a folder")
    overrides = ["dataset=folder", f"dataset.data_dir={root}", "dataset.val_fraction=0.25", "debug=smoke"]
    cache = ["dataset.cache=disk", f"dataset.cache_dir={tmp_path / 'file' / 'cache'}", "dataset.image_size=32"]
    dataset = to_settings(compose([*overrides, *cache])).dataset
    for load in range(2):  # a second load (a sweep's next trial in this process) warns again, once
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="trainer.data.cache"):
            data = load_data(dataset, 4, 0)
            for split in ("train", "val", "test"):
                data.split(split)  # each pipeline's cache is written as it is built
        lines = [record.getMessage() for record in caplog.records if "could not write the cache" in record.getMessage()]
        assert len(lines) == 1, (load, lines)
        assert "(Not a directory)" in lines[0]


@pytest.mark.integration
@pytest.mark.parametrize(
    ("labels", "warned"),
    [
        ([0, 1, 2, 7], "labels 3, 4, 5, 6 have no row in the train split (the classes are 0 to 7, the largest label"),
        ([0, 1, 2], None),
    ],
    ids=["gap", "no-gap"],
)
def test_parquet_integer_labels_with_a_gap_warn_once_naming_the_labels_without_rows(tmp_path, caplog, labels, warned):
    """Labels 0, 1, 2 and 7 without ClassLabel names train 8 classes, 4 of them without an example: that was
    silent (red team). One warning names them; a refusal would break labels that index a larger set of classes."""
    import logging

    import pyarrow.parquet as pq
    from test_parquet import _settings, _table

    from trainer.tasks.data import load_data

    root = tmp_path / "rows"
    root.mkdir()
    pq.write_table(_table(labels * 4, False, False), root / "train.parquet")
    pq.write_table(_table(labels, False, False), root / "test.parquet")
    with caplog.at_level(logging.WARNING, logger="trainer.data.parquet"):
        data = load_data(_settings(root, "dataset.val_fraction=0.25").dataset, 4, 0)
    assert len(data.class_names) == max(labels) + 1
    lines = [record.getMessage() for record in caplog.records if "no row in the train split" in record.getMessage()]
    assert [warned in line for line in lines] == ([True] if warned else [])
