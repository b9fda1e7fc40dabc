"""SWE-bench-style records (`fullasync_agents.swe_tasks.swebench`, `.records`): the shipped toy set loads through
the data path as container rows, the file is what the generator writes, and bad records are refused naming the
field. No container is started here (`tests/integration/test_agents_mini_swe_containers.py` runs them)."""

from __future__ import annotations

import pytest

from fullasync.data import load_rows
from fullasync_agents.container_budget import memory_bytes, places
from fullasync_agents.containers import ContainerSettings
from fullasync_agents.swe_tasks.records import SHIPPED, new_file_patch, shipped, swe_records
from fullasync_agents.swe_tasks.swebench import patched_files, scorer_files, swe_row


def test_the_shipped_records_load_through_the_data_path_as_container_rows():
    records = list(load_rows(str(SHIPPED), "data.train_dataset"))
    assert [r["instance_id"] for r in records] == [r["instance_id"] for r in shipped()]
    assert shipped() == [*swe_records("settings"), *swe_records("bugs")]  # the file is what the generator writes
    rows = [swe_row(record) for record in records]
    assert len(rows) == 230 and {r["workdir"] for r in rows} == {"/testbed"}
    assert all(r["fail_to_pass"] == ["hidden_tests/test_hidden.py"] and r["test_patch"].startswith("diff --git")
               for r in rows)
    with pytest.raises(ValueError, match="names no container image"):
        swe_row({"instance_id": "x", "problem_statement": "fix it", "FAIL_TO_PASS": "[]"})
    with pytest.raises(ValueError, match="FAIL_TO_PASS is empty"):
        swe_row({"instance_id": "x", "problem_statement": "fix it", "image_name": "i", "FAIL_TO_PASS": "[]"})
    with pytest.raises(ValueError, match="neither a list nor JSON"):
        swe_row({"instance_id": "x", "problem_statement": "p", "image_name": "i", "FAIL_TO_PASS": "tests/a.py"})


def test_a_swe_bench_record_keeps_its_fields_and_a_list_or_json_test_ids():
    record = {"instance_id": "astropy__astropy-12907", "repo": "astropy/astropy", "base_commit": "d16bfe0",
              "problem_statement": "separability_matrix is wrong for nested models", "image_name": "sweb.eval.x",
              "test_patch": new_file_patch({"t/test_a.py": "def test_a():\n    assert True\n"}),
              "FAIL_TO_PASS": '["t/test_a.py::test_a"]', "PASS_TO_PASS": ["t/test_b.py::test_b"]}
    row = swe_row(record)
    assert (row["id"], row["image"], row["base_commit"], row["repo"]) == ("astropy__astropy-12907", "sweb.eval.x",
                                                                         "d16bfe0", "astropy/astropy")
    assert row["fail_to_pass"] == ["t/test_a.py::test_a"] and row["pass_to_pass"] == ["t/test_b.py::test_b"]
    assert patched_files(row["test_patch"]) == ["t/test_a.py"] and "{tests}" in row["test_command"]
    assert swe_row({**record, "image_name": None, "docker_image": "r2e/x"})["image"] == "r2e/x"  # R2E-Gym's field
    assert swe_row({**record, "test_cmd": "bash run_tests.sh"})["test_command"] == "bash run_tests.sh"


def test_the_scorers_files_are_the_test_patchs_and_those_its_test_ids_name():
    row = {"test_patch": new_file_patch({"t/test_a.py": "def test_a():\n    assert True\n"}),
           "fail_to_pass": ["t/test_a.py::test_a", "t/test_b.py::C::test_b", "test_c (module.C)"],
           "pass_to_pass": ["t/test_d.py", "/abs/test_e.py::x", "t/test_a.py::test_z"]}
    assert scorer_files(row) == ["t/test_a.py", "t/test_b.py", "t/test_d.py"]
    assert scorer_files({"fail_to_pass": ["test_c (module.C)"]}) == []


def test_a_git_history_setting_it_cannot_keep_is_refused_naming_both_choices():
    assert ContainerSettings().git_history == "base"
    with pytest.raises(ValueError, match="git_history='none'.*choose base .* or full"):
        ContainerSettings(git_history="none")


def test_running_places_come_from_the_running_cap_and_the_memory_cap():
    assert places(0, "", "2g") == 0 and places(8, "", "2g") == 8  # 0: no cap
    assert places(0, "64g", "2g") == 32 and places(8, "64g", "2g") == 8 and places(0, "1g", "2g") == 1
    assert memory_bytes("512m") == 512 * 2**20 and memory_bytes("2G") == 2 * 2**30 and memory_bytes("1024") == 1024
    with pytest.raises(ValueError, match="memory 'lots' is not a size; write it as podman does"):
        ContainerSettings(max_memory="lots")
    with pytest.raises(ValueError, match="max_running=-1, image_disk_gb=0.0 and warm_pool=0 must be >= 0"):
        ContainerSettings(max_running=-1)
    with pytest.raises(ValueError, match="reuse=true puts reset containers back into the warm pool: set warm_pool"):
        ContainerSettings(reuse=True)
