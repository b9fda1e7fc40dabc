"""No way to read a SWE row's fix from git history (podman, `make setup-containers`): an image whose repository holds
the fix as a later commit on another branch — and as a tag, a stash, a packed ref, a reflog and a dangling blob of
the fixed file — reaches the episode's container holding the base commit's objects and nothing else; the same image
with `git_history="full"` shows the fix (the checks can fail); a cut image changed after its cut is refused at the
container's start; and an episode's edits to the scorer's test files are undone before scoring and counted."""

from __future__ import annotations

import subprocess
import textwrap

import pytest
from agents_common import our_containers, podman_required  # noqa: F401

from fullasync.errors import InfraError
from fullasync_agents.containers import BASE_IMAGE, Containers, ContainerSettings
from fullasync_agents.swe_tasks.history import Cut, HistoryGuard
from fullasync_agents.swe_tasks.swebench import DEFAULT_TEST_COMMAND, score_in_container

pytestmark = pytest.mark.usefixtures("podman_required")

LEAKY = "localhost/fullasync/test-history-leaky:1"
PAST_BASE = "localhost/fullasync/test-history-past-base:1"  # the leaky image checked out at the fix
BUGGY, FIXED = "def add(a, b):\n    return a - b\n", "def add(a, b):\n    return a + b\n"
FILES = {"app.py": BUGGY, "fixed.py": FIXED, "dangling.py": "def add(a, b):\n    return b + a  # the fix again\n",
         "test_app.py": "from app import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"}
# the repository every leak comes from: the base on main; the fix on `fix` (a new file too), tagged, packed, stashed,
# in the reflog of a deleted branch, and a fixed file once more as a dangling blob
REPOSITORY = textwrap.dedent("""\
    set -e
    rm -rf /testbed && mkdir /testbed && cd /testbed && cp /files/app.py /files/test_app.py . && cp /files/*.py /
    git init -q -b main && git config user.email t@t && git config user.name t
    git add -A && git commit -qm base && git rev-parse HEAD > /base
    git checkout -q -b fix && cp /fixed.py app.py && echo 'the fix' > NOTES && git add -A && git commit -qm fix
    git rev-parse HEAD > /fix && git tag v1 && git tag -a v1-annotated -m fix && git branch gone && git pack-refs --all
    git branch -D gone && git checkout -q main && echo wip >> app.py && git stash -q
    git hash-object -w /dangling.py > /dangling && git checkout -q fix && git checkout -q main
    """)
SCORER_ROW = {"workdir": "/testbed", "fail_to_pass": ["test_app.py::test_add"], "pass_to_pass": [],
              "test_command": DEFAULT_TEST_COMMAND,
              "test_patch": ("diff --git a/test_app.py b/test_app.py\n--- a/test_app.py\n+++ b/test_app.py\n"
                             "@@ -3,3 +3,4 @@ from app import add\n \n def test_add():\n     assert add(2, 3) == 5\n"
                             "+    assert add(1, 1) == 2\n")}


def _build(tag: str, containerfile: str, tmp_path) -> None:
    (tmp_path / "Containerfile").write_text(containerfile)
    built = subprocess.run(["podman", "build", "--network=none", "-q", "--tag", tag, str(tmp_path)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]


@pytest.fixture(scope="module")
def leaky(tmp_path_factory):
    """The leaky image and what its repository holds: the base and fix commits, the dangling blob."""
    context = tmp_path_factory.mktemp("leaky")
    (context / "files").mkdir()
    for name, text in {**FILES, "repository.sh": REPOSITORY}.items():
        (context / "files" / name).write_text(text)
    _build(LEAKY, f"FROM {BASE_IMAGE}\nCOPY files/ /files/\nRUN bash /files/repository.sh\nWORKDIR /testbed\n",
           context)
    _build(PAST_BASE, f"FROM {LEAKY}\nRUN git checkout -q fix\n", tmp_path_factory.mktemp("past"))
    read = subprocess.run(["podman", "run", "--rm", "--network=none", LEAKY, "cat", "/base", "/fix", "/dangling"],
                          capture_output=True, text=True, check=True).stdout.split()
    return dict(zip(("base", "fix", "dangling"), read, strict=True))


async def _sh(container, command: str) -> str:
    done = await container.exec(command, 60.0)
    assert done.returncode == 0, (command, done.output)
    return done.output


async def _leaks(container, leaky) -> dict[str, object]:
    """What the container's repository gives away about the fix, by every route an agent could take."""
    stored = set((await _sh(container, "git cat-file --batch-all-objects --batch-check='%(objectname)'")).split())
    reachable = {line.split()[0] for line in (await _sh(container, f"git rev-list --objects {leaky['base']}"))
                 .splitlines()}
    return {"log --all": (await _sh(container, "git log --all --format=%H")).split(),
            "reflog": (await _sh(container, "git reflog --all 2>&1 || true")).strip(),
            "stash": (await _sh(container, "git stash list")).strip(),
            "tags": (await _sh(container, "git tag")).split(),
            "refs": (await _sh(container, "git for-each-ref --format='%(refname)'")).split(),
            "lost-found": (await _sh(container, "git fsck --lost-found --no-progress 2>&1")).strip(),
            "unreachable": (await _sh(container, "git fsck --unreachable --no-reflogs --no-progress 2>&1")).strip(),
            "objects beyond the base": sorted(stored - reachable),
            "fixed blob": (await container.exec(f"git cat-file -e {leaky['dangling']}", 60.0)).returncode == 0,
            "fix commit": (await container.exec(f"git cat-file -e {leaky['fix']}", 60.0)).returncode == 0}


async def test_the_cut_repository_holds_nothing_after_the_base_and_the_full_history_shows_the_fix(leaky):
    before, guard = our_containers(), HistoryGuard(Containers())
    container, task = await guard.start({"workdir": "/testbed", "base_commit": leaky["base"]}, LEAKY, "history-cut")
    try:
        leaks = await _leaks(container, leaky)
        tree = await _sh(container, "cat app.py; git status --porcelain; git rev-parse HEAD")
    finally:
        await container.remove()
    assert leaks == {"log --all": [leaky["base"]], "reflog": "", "stash": "", "tags": [], "refs": ["refs/heads/main"],
                     "lost-found": "", "unreachable": "", "objects beyond the base": [], "fixed blob": False,
                     "fix commit": False}
    assert tree == f"{BUGGY}{leaky['base']}\n" and task["base_commit"] == leaky["base"]
    # another process reads the cut from its image's labels: no second build
    assert (await HistoryGuard(Containers()).cut(LEAKY, "/testbed", leaky["base"])) == \
        await guard.cut(LEAKY, "/testbed", leaky["base"])

    full = HistoryGuard(Containers(ContainerSettings(git_history="full")))
    container, _ = await full.start({"workdir": "/testbed", "base_commit": leaky["base"]}, LEAKY, "history-full")
    try:
        leaked = await _leaks(container, leaky)
    finally:
        await container.remove()
    assert leaky["fix"] in leaked["log --all"] and "v1" in leaked["tags"] and leaked["stash"]
    assert leaked["fixed blob"] and leaked["fix commit"] and leaked["objects beyond the base"]
    assert our_containers() == before


async def test_an_image_checked_out_past_the_base_gets_the_base_working_tree(leaky):
    container, _ = await HistoryGuard(Containers()).start({"workdir": "/testbed", "base_commit": leaky["base"]},
                                                          PAST_BASE, "history-past")
    try:
        leaks = await _leaks(container, leaky)
        tree = await _sh(container, "cat app.py; ls; git status --porcelain")
    finally:
        await container.remove()
    assert leaks["log --all"] == [leaky["base"]] and not leaks["objects beyond the base"]
    assert tree == f"{BUGGY}app.py\ntest_app.py\n"  # the fix's app.py and its NOTES are gone


async def test_a_cut_image_changed_after_its_cut_is_refused_at_the_start(leaky, tmp_path):
    containers = Containers()
    cut = await HistoryGuard(containers).cut(LEAKY, "/testbed", leaky["base"])
    _build("localhost/fullasync/test-history-tampered:1",
           f"FROM {cut.image}\nRUN cd /testbed && git hash-object -w /fixed.py\n", tmp_path)
    container = await containers.start("localhost/fullasync/test-history-tampered:1", "/testbed", "history-tamper")
    try:
        with pytest.raises(InfraError, match="objects in the store"):
            await Cut("localhost/fullasync/test-history-tampered:1", cut.base, cut.ref, cut.objects).check(
                container, "/testbed")
        with pytest.raises(InfraError, match="no repository at /nowhere"):
            await cut.check(container, "/nowhere")
    finally:
        await container.remove()


async def test_edits_to_the_scorers_tests_are_undone_before_scoring_and_counted(leaky):
    guard = HistoryGuard(Containers())
    row = {**SCORER_ROW, "base_commit": leaky["base"]}
    scores = {}
    for name, edit in {"tampered": "printf 'def test_add():\\n    pass\\n' > test_app.py",
                       "removed": "rm test_app.py",
                       "solved": "cp /fixed.py app.py",
                       "solved and tampered": "cp /fixed.py app.py && echo '# mine' >> test_app.py"}.items():
        container, task = await guard.start(row, LEAKY, f"history-score-{name.replace(' ', '-')}")
        try:
            await _sh(container, edit)
            scores[name] = await score_in_container(task, container, 120.0)
        finally:
            await container.remove()
    assert {name: (score.reward, score.tampered) for name, score in scores.items()} == {
        "tampered": (0.0, ("test_app.py",)), "removed": (0.0, ("test_app.py",)), "solved": (1.0, ()),
        "solved and tampered": (1.0, ("test_app.py",))}
