"""What episode containers may take of the host (podman, `make setup-containers`): past the image disk budget the
least recently used of the run's own images go (never one in use, the one just built, a base image or another run's)
and come back when needed; a start waits for a running place; the preflight names what is missing in one line."""

from __future__ import annotations

import asyncio
import subprocess
import uuid

import pytest
from agents_common import our_containers, podman_required  # noqa: F401

from fullasync.cli.doctor import containers_check
from fullasync_agents import container_budget
from fullasync_agents.containers import BASE_IMAGE, Containers, ContainerSettings
from fullasync_agents.swe_tasks.history import HistoryGuard

pytestmark = pytest.mark.usefixtures("podman_required")


def _exists(image: str) -> bool:
    return subprocess.run(["podman", "image", "exists", image]).returncode == 0


def _recipe(name: str) -> dict[str, object]:
    """A row whose image is built here, new to this run (its files are unique)."""
    return {"id": name, "image_recipe": {"files": {"a.txt": f"{name} {uuid.uuid4().hex}\n"}}}


async def test_past_the_disk_budget_the_runs_least_recently_used_images_go_and_come_back_when_needed():
    other = Containers()  # another run's image: not this run's to remove
    theirs = await other.image_for(_recipe("theirs"))
    containers = Containers(ContainerSettings(image_disk_gb=1e-9))  # any image of ours is over it
    recipe = _recipe("first")
    first = await containers.image_for(recipe)
    second = await containers.image_for(_recipe("second"))
    assert containers.budget.removed == [first] and not _exists(first) and _exists(second)
    running = await containers.start(second, "/testbed", "budget-running")
    try:
        cut = await HistoryGuard(containers).cut(second, "/testbed", "")  # a cut image counts like a built one
        assert _exists(second) and _exists(cut.image)  # in use; just built
        third = await containers.image_for(_recipe("third"))
        assert containers.budget.removed == [first, cut.image] and _exists(second) and _exists(third)
    finally:
        await running.remove()
    again = await containers.image_for(recipe)  # needed again: built again, and the run goes on within budget
    assert again == first and _exists(first) and not _exists(second) and not _exists(third)
    assert _exists(theirs) and _exists(BASE_IMAGE)  # another run's image, and the image they are built on
    left = await containers.budget.held()
    assert [image.tags for image in left] == [(first,)] and 0 < left[0].own_bytes < 10**6
    subprocess.run(["podman", "rmi", theirs, first], capture_output=True)


async def test_a_start_waits_for_a_running_place_and_a_removal_gives_it_back():
    before = our_containers()
    containers = Containers(ContainerSettings(max_running=1))
    image = await containers.image_for({"id": "places", "image_recipe": {"files": {"a.txt": "a\n"}}})
    first = await containers.start(image, "/testbed", "places-1")
    waiting = asyncio.create_task(containers.start(image, "/testbed", "places-2"))
    try:
        for _ in range(20):  # the waiting start never reaches podman while the place is held
            await asyncio.sleep(0.05)
        assert not waiting.done() and len(our_containers()) == len(before) + 1
    finally:
        await first.remove()
    second = await asyncio.wait_for(waiting, 120.0)
    await second.remove()
    await second.remove()  # removing twice gives the place back once
    assert containers.places == 1 and our_containers() == before
    third = await asyncio.wait_for(containers.start(image, "/testbed", "places-3"), 120.0)
    await third.remove()


def test_fullasync_doctor_checks_the_containers_preflight():
    found = containers_check()
    assert (found.name, found.status) == ("container", "ok") and BASE_IMAGE in found.detail


async def test_the_preflight_names_what_is_missing_in_one_line(monkeypatch):
    assert await Containers().preflight(BASE_IMAGE) == ""
    missing = await Containers(ContainerSettings(executable="/nowhere/podman")).preflight()
    assert missing == ("containers: /nowhere/podman is not installed: run `make setup-containers` "
                       "(containers/setup.sh: podman, its configuration, the base images)")
    no_image = await Containers().preflight("localhost/fullasync/no-such-image:0")
    assert no_image.startswith("containers: the base image localhost/fullasync/no-such-image:0 is missing: run `make")
    monkeypatch.setattr(container_budget, "MIN_FREE_GB", 1e9)
    low = await Containers().preflight()
    assert "GB free under /var/lib/containers/storage, 1000000000 GB needed: free disk there, or cap" in low
    assert "\n" not in missing + no_image + low
