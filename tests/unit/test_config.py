"""The config tree: help on every field, docs/config.md in sync, one default per setting, the resume rule as field
metadata, the components made from their sections, and the cross-field checks naming the field and the fix."""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from examples.deepresearch.config import DeepResearchConfig
from examples.mini_swe.config import MiniSweTrainConfig
from examples.terminus.config import TerminusTrainConfig
from fullasync.client import ClientConfig
from fullasync.config import EngineSection, ModelSection, RolloutSection, RunConfig
from fullasync.config.doc import REGENERATE, config_with_file, exit_with_help_if_asked, render_help, render_markdown
from fullasync.config.fields import config_fields, config_sections
from fullasync.rollout.rollouter import RolloutSettings
from fullasync.run.runner import RunSettings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {DeepResearchConfig: "deepresearch", MiniSweTrainConfig: "mini_swe", TerminusTrainConfig: "terminus"}
CONFIGS = (RunConfig, *EXAMPLES)
# What a resumed run may set differently from its checkpoint (fields, or whole sections ending in ".").
RESUME_MAY_CHANGE = (
    "total_steps", "bind_late", "output_dir", "resume", "val_every", "val_samples_per_row", "save_checkpoint",
    "eval_keep",
    "worker_logs", "checkpoint.", "engine.", "logging.", "rollout.episode_timeout_s",
    "rollout.resume_timeout_s", "rollout.max_answer_tokens", "rollout.stream_interval",
    "rollout.join_identical_requests", "rollout.infra_retries",
    "rollout.kv_routing",
    "rollout.gateway_host", "rollout.cpus",
    "trainer.start_timeout_s", "trainer.call_timeout_s", "trainer.worker_threads", "trainer.weight_transport",
    "trainer.push_dtype",
    "trainer.worker_num_cpus", "trainer.ray_resources", "trainer.checkpoint_dir", "trainer.restart_on_failure",
    "trainer.cpus",
)


@pytest.mark.parametrize("config_type", CONFIGS, ids=lambda c: c.__name__)
def test_every_field_and_section_of_every_config_has_help(config_type):
    config = config_type()
    missing = [f.name for f in config_fields(config) if not f.help.strip()]
    missing += [s.name for s in config_sections(config) if s.name and not s.help.strip()]
    assert not missing, f"{config_type.__name__}: no help for {missing}; declare them with setting(default, help)"


def test_docs_config_md_is_generated_from_the_declarations():
    written = (ROOT / "docs" / "config.md").read_text()
    assert written == render_markdown(RunConfig), f"docs/config.md is out of date: run `{REGENERATE}` (or make docs)"


def test_help_names_every_field_with_its_type_default_and_help():
    text = render_help(RunConfig, "usage: fullasync train")
    assert text.startswith("usage: fullasync train")
    for f in config_fields(RunConfig()):
        assert f"  {f.name}: {f.type} = " in text and f.help in text, f.name
    assert "  engine.max_model_len: int = 1024  [may change on resume]" in text
    assert "  trainer.lr: float = 0.0005\n" in text  # the run's trainer, not TrainerConfig's own default


def test_fullasync_train_help_prints_every_field_and_exits_0():
    done = subprocess.run([sys.executable, "-m", "fullasync.cli", "train", "--help"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: fullasync {train,eval}") and "fullasync train --cfg job" in done.stdout
    assert all(f"  {f.name}: " in done.stdout for f in config_fields(RunConfig()))


@pytest.mark.parametrize("config_type", EXAMPLES, ids=lambda c: c.__name__)
def test_an_example_help_shows_its_own_fields_with_its_config_file_values(config_type, capsys):
    config_file = ROOT / "examples" / EXAMPLES[config_type] / "config" / "train.yaml"
    with pytest.raises(SystemExit) as exited:
        exit_with_help_if_asked(["total_steps=3", "--help"], config_type, "usage: train.py", config_file)
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert all(f"  {f.name}: " in text for f in config_fields(config_type()))
    used = config_with_file(config_type, config_file)
    assert isinstance(used, config_type) and f"  total_steps: int = {used.total_steps}" in text
    exit_with_help_if_asked(["total_steps=3"], config_type, "usage", config_file)  # no --help: returns


def test_deepresearch_help_shows_the_context_its_config_file_sets():
    used = config_with_file(DeepResearchConfig, ROOT / "examples" / "deepresearch" / "config" / "train.yaml")
    assert used.engine.max_model_len == 2048 and "  engine.max_model_len: int = 2048" in render_help(used, "")


def test_the_fingerprint_leaves_out_exactly_the_fields_declared_free_on_resume():
    config = RunConfig()
    names = [f.name for f in config_fields(config)]
    expected = [n for n in names if not any(n == free or n.startswith(free) for free in RESUME_MAY_CHANGE)]
    assert list(config.fingerprint()) == expected
    assert [f.name for f in config_fields(config) if f.resume_may_change] == [n for n in names if n not in expected]


def test_a_subclass_redeclaring_a_field_keeps_its_help_and_resume_rule():
    fields = {f.name: f for f in config_fields(TerminusTrainConfig())}
    assert fields["total_steps"].value == 20 and fields["total_steps"].resume_may_change
    assert fields["engine.max_model_len"].value == 4096 and fields["engine.max_model_len"].resume_may_change
    assert "val_samples_per_row" not in TerminusTrainConfig().fingerprint()


SIMULATED = ROOT / "fullasync" / "sim"  # models of a device's costs (DecodeCost.max_num_seqs), not the stack's settings


def _literal_defaults(name: str, roots: tuple[str, ...]) -> list[str]:
    """Where a class declares field `name` with a literal default (`x: int = 1` or `x: int = setting(1, ...)`)."""
    found = []
    for root in roots:
        for path in sorted((ROOT / root).rglob("*.py")):
            if SIMULATED in path.parents:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ClassDef):
                    continue
                for item in node.body:
                    if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                            and item.target.id == name and item.value is not None):
                        continue
                    value = item.value
                    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "setting" and value.args:
                        value = value.args[0]
                    if isinstance(value, ast.Constant):
                        found.append(f"{path.relative_to(ROOT)}:{item.lineno} {node.name}.{name}")
    return found


@pytest.mark.parametrize("name", ["max_model_len", "max_num_seqs", "max_logprobs", "max_top_logprobs",
                                  "stall_timeout_s", "probe_interval_s", "resume_timeout_s", "served_model_name",
                                  "served_name", "tool_parser", "max_running_rows", "filter_zero_variance",
                                  "val_samples_per_row", "engine_probe_interval_s"])
def test_each_setting_has_one_literal_default(name):
    """(The examples size their runs by redeclaring a field in their RunConfig subclass: a default of theirs.)"""
    found = _literal_defaults(name, ("fullasync", "agents"))
    assert len(found) <= 1, f"{name} has a default in several places: {found}; refer to the run config's"


def test_components_made_on_their_own_have_the_run_defaults():
    engine, model, rollout = EngineSection(), ModelSection(), RolloutSection()
    client = ClientConfig()
    assert (client.model_name, client.max_model_len, client.max_top_logprobs, client.resume_timeout_s,
            client.tool_parser) == (model.served_name, engine.max_model_len, engine.max_logprobs,
                                    rollout.resume_timeout_s, model.tool_parser)
    assert RunSettings.from_config(RunConfig()).rollout == RolloutSettings()


def test_the_rollouter_settings_are_the_rollout_sections_shared_fields():
    config = RunConfig()
    config.rollout = RolloutSection(n=3, max_running_rows=5, episode_timeout_s=7.0, filter_zero_variance=True)
    settings = RunSettings.from_config(config)
    assert settings.rollout == RolloutSettings(n=3, max_running_rows=5, episode_timeout_s=7.0,
                                               filter_zero_variance=True)
    assert (settings.batch_size, settings.engine_probe_interval_s, settings.restart_engines) == (
        config.rollout.batch_size, config.engine.probe_interval_s, config.engine.restart_on_failure)


def test_hydra_builds_the_config_from_the_declarations():
    from omegaconf import OmegaConf

    built = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RunConfig),
                                                OmegaConf.from_dotlist(["engine.max_model_len=2048"])))
    assert isinstance(built, RunConfig) and built.engine.max_model_len == 2048
    assert built.engine.ray_resources == {} and built.engine.ray_resources is not RunConfig().engine.ray_resources


@pytest.mark.parametrize("override, message", [
    ({"max_logprobs": -1}, r"engine.max_logprobs=-1 must be >= 0"),
    ({"max_model_len": 0}, r"engine.max_model_len=0 must be >= 1"),
    ({"num_engines": 0}, r"engine.num_engines=0 must be >= 1"),
    ({"tensor_parallel_size": 0}, r"engine.tensor_parallel_size=0 must be >= 1"),
    ({"start_timeout_s": 0.0}, r"engine.start_timeout_s=0.0 must be > 0"),
    ({"probe_interval_s": 200.0}, r"engine.probe_interval_s=200.0 must be > 0 and below engine.stall_timeout_s"),
])
def test_engine_settings_are_checked_naming_the_field(override, message):
    config = RunConfig(engine=dataclasses.replace(EngineSection(), **override))
    with pytest.raises(ValueError, match=message):
        config.validate()


def test_a_rollout_timeout_must_be_positive():
    with pytest.raises(ValueError, match=r"rollout.resume_timeout_s=0.0 must be > 0"):
        RunConfig(rollout=RolloutSection(resume_timeout_s=0.0)).validate()


@pytest.mark.parametrize("host, message", [
    ("0.0.0.0", r"rollout.gateway_host='0.0.0.0' binds every address, and no base URL can name that"),
    ("", r"binds every address"),
    ("http://10.0.0.5", r"is not an address or host name \(no scheme"),
    ("[::1]", r"no scheme, port or brackets"),
])
def test_the_gateway_host_must_be_one_address_a_harness_can_be_given(host, message):
    with pytest.raises(ValueError, match=message):
        RunConfig(rollout=RolloutSection(gateway_host=host)).validate()
    assert RunSettings.from_config(RunConfig(rollout=RolloutSection(gateway_host="::1"))).gateway_host == "::1"


@pytest.mark.parametrize("config_type", CONFIGS, ids=lambda c: c.__name__)
def test_a_name_no_field_declares_is_refused_in_every_section_and_dict_fields_take_new_keys(config_type):
    """OmegaConf drops such a name (`+engine.gpu_memory_utilization=0.5` composes and reaches nothing)."""
    from omegaconf import OmegaConf, open_dict

    from fullasync.config.compose import UndeclaredSettingError, build_config, schema_node

    assert build_config(schema_node(config_type), config_type) == config_type()
    for section in config_sections(config_type()):
        composed = schema_node(config_type)
        with open_dict(composed):
            OmegaConf.update(composed, f"{section.name}not_a_setting", 1, force_add=True)
        with pytest.raises(UndeclaredSettingError, match=f"^{section.name}not_a_setting is not a setting;"):
            build_config(composed, config_type)
    dict_fields = [f.name for f in config_fields(config_type()) if isinstance(f.value, dict)]
    assert {"engine.vllm", "engine.ray_resources", "trainer.ray_resources"} <= set(dict_fields)
    composed = schema_node(config_type)
    for name in dict_fields:  # open without `+`, as Hydra's struct mode would otherwise refuse
        OmegaConf.set_struct(composed, True)
        # a dict of settings by name (beside.judge.base_url=...) takes a new key and the keys below it
        key, value = ("new_key.base_url", "http://127.0.0.1:1/v1") if name == "beside" else ("new_key", 1)
        OmegaConf.update(composed, f"{name}.{key}", value)
    built = build_config(composed, config_type)
    assert built.engine.vllm == {"new_key": 1} and built.trainer.ray_resources == {"new_key": 1}
    assert built.beside == {"new_key": {"base_url": "http://127.0.0.1:1/v1"}}


@pytest.mark.parametrize("name, more, nearest", [
    ("engine.gpu_memory_utilization", ["engine.vllm.gpu_memory_utilization"], "engine.vllm.gpu_memory_utilization"),
    ("engine.max_num_seqs", ["engine.vllm.max_num_seqs"], "engine.vllm.max_num_seqs"),
    ("rollout.batchsize", [], "rollout.batch_size"),
    ("trainer.lrr", [], "trainer.lr"),
    ("lr", [], "trainer.lr"),
    ("engine.zzzz", [], None),
])
def test_a_refused_name_comes_with_the_nearest_declared_one(name, more, nearest):
    from omegaconf import OmegaConf, open_dict

    from fullasync.config.compose import UndeclaredSettingError, build_config, schema_node

    composed = schema_node(RunConfig)
    with open_dict(composed):
        OmegaConf.update(composed, name, 1, force_add=True)
    with pytest.raises(UndeclaredSettingError) as refused:
        build_config(composed, RunConfig, lambda: more)
    guess = f" (did you mean {nearest}?)" if nearest else ""
    assert str(refused.value) == f"{name} is not a setting{guess}; --help lists every setting"


# `fullasync train` with a mistyped setting, then which of the heavy modules the refusal had imported
REFUSE_AND_LIST_IMPORTS = """
import sys
from fullasync.cli.main import main
sys.argv = ["fullasync", "train", "+engine.gpu_memory_utilization=0.5"]
try:
    main()
finally:
    print(" ".join(name for name in ("vllm", "torch", "ray", "fullasync.api") if name in sys.modules))
"""


def test_the_command_line_refuses_an_undeclared_name_in_one_line_and_passes_vllm_arguments_without_plus(tmp_path):
    """The first refusal reads vLLM's argument names (importing vLLM) and keeps them in the cache; the next one
    says the same without importing vLLM, torch, Ray or the run."""
    environment = {**os.environ, "FULLASYNC_CACHE_DIR": str(tmp_path)}
    for imported in ("vllm", ""):
        refused = subprocess.run([sys.executable, "-c", REFUSE_AND_LIST_IMPORTS], capture_output=True, text=True,
                                 timeout=300, cwd=ROOT, env=environment)
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert refused.stderr.strip().splitlines()[-1] == (
            "fullasync: invalid configuration: engine.gpu_memory_utilization is not a setting (did you mean "
            "engine.vllm.gpu_memory_utilization?); --help lists every setting")
        assert imported in refused.stdout.split() if imported else refused.stdout.split() == [], refused.stdout
        assert len(list((tmp_path / "vllm").glob("engine-args-*.json"))) == 1
    command = [sys.executable, "-m", "fullasync.cli.main", "train"]
    shown = subprocess.run([*command, "engine.vllm.enforce_eager=true", "engine.vllm.max_num_seqs=7", "--cfg", "job"],
                           capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "  vllm:\n    enforce_eager: true\n    max_num_seqs: 7\n" in shown.stdout


def test_vllms_argument_names_are_read_again_for_another_copy_of_vllm_or_an_unreadable_kept_list(tmp_path, monkeypatch):
    from fullasync.engines.vllm import args

    source, cache, reads = tmp_path / "arg_utils.py", tmp_path / "cache", []
    source.write_text("one copy")
    monkeypatch.setattr(args, "_arg_utils_file", lambda: source)
    monkeypatch.setattr(args, "_engine_arg_types", lambda: reads.append(source.read_text()) or {"max_num_seqs": int})
    for _ in range(2):
        assert args.engine_arg_names(cache) == ["engine.vllm.max_num_seqs"]
    assert reads == ["one copy"]
    [kept] = cache.glob("engine-args-*.json")
    kept.write_text("{cut sh")
    assert args.engine_arg_names(cache) == ["engine.vllm.max_num_seqs"]
    assert reads == ["one copy"] * 2
    source.write_text("another copy")
    assert args.engine_arg_names(cache) == ["engine.vllm.max_num_seqs"]
    assert reads == ["one copy"] * 2 + ["another copy"]
    assert len(list(cache.glob("engine-args-*.json"))) == 2
    monkeypatch.setattr(args, "_arg_utils_file", lambda: None)  # no vLLM installed
    assert args.engine_arg_names(cache) == []


@pytest.mark.parametrize("model_dtype, engine_dtype, pushed", [
    ("fp32", "auto", "float32"), ("bf16", "auto", "bfloat16"), ("bf16", "float32", "float32"),
    ("fp32", "half", "float16")])
def test_pushes_travel_in_the_dtype_the_engines_serve_unless_set(model_dtype, engine_dtype, pushed):
    config = RunConfig(engine=EngineSection(dtype=engine_dtype))
    config.trainer.model_dtype = model_dtype
    assert config.resolved_trainer().push_dtype == pushed
    config.trainer.push_dtype = "float32"
    assert config.resolved_trainer().push_dtype == "float32"
