"""What a run directory holds that bertattn did not write: another tool's manifest is never cleared,
a link in a table folder is removed as a link, and a manifest's entry never leads out of the run."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from helpers import RUN_HEADER

from bertattn_batch import schema
from bertattn_batch.errors import RunDirError
from bertattn_batch.run import MANIFEST, RunDir, read_manifest

HEADER = RUN_HEADER


def _tables() -> dict[str, pa.Table]:
    return {t: schema.arrow(t).empty_table() for t in schema.TABLES}


@pytest.mark.parametrize("on_existing", ["resume", "overwrite"])
def test_another_tools_manifest_is_never_overwritten(tmp_path, on_existing):
    (tmp_path / MANIFEST).write_text('[{"model": "other"}]')
    (tmp_path / "predictions").mkdir()
    (tmp_path / "predictions" / "results.csv").write_text("the user's")
    with pytest.raises(RunDirError) as e:
        RunDir(tmp_path, HEADER, on_existing=on_existing).open()
    assert "choose another --out" in str(e.value) and "--overwrite" not in str(e.value)
    assert "\n" not in str(e.value)
    assert (tmp_path / "predictions" / "results.csv").read_text() == "the user's"


def test_a_linked_folder_in_a_table_folder_is_removed_as_a_link(tmp_path):
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("not the run's")
    with RunDir(run, HEADER) as rd:
        rd.begin_pass(0)
        rd.commit(rd.part_writer.stage(0, 10, _tables()))
    (run / "predictions" / "linked").symlink_to(elsewhere, target_is_directory=True)
    with RunDir(run, HEADER) as rd:  # a resume sweeps the table folders
        assert [p.start_row for p in rd.parts] == [0]
    assert not (run / "predictions" / "linked").is_symlink()
    assert (elsewhere / "keep.txt").read_text() == "not the run's"


@pytest.mark.parametrize("path", ["/etc/passwd", "../other/predictions/part.parquet", "predictions/../../x"])
def test_a_part_entry_outside_the_run_is_refused(tmp_path, path):
    with RunDir(tmp_path, HEADER) as rd:
        rd.begin_pass(0)
        rd.commit(rd.part_writer.stage(0, 10, _tables()))
        rd.finalize({})
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    manifest["parts"][0]["files"]["predictions"] = path
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(RunDirError, match=r"files.predictions is .*, outside the run"):
        read_manifest(tmp_path)
