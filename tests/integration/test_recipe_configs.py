"""The recipe's verl configs (recipe/configs/) and its launcher (recipe/run.sh).

The configs are composed with verl 0.9.1's own Hydra tree, in struct mode, with hydra-core and omegaconf only:
``import verl`` (torch, ray) is never run. The tree is found with ``importlib.util.find_spec``, and the configs'
``pkg://verl.trainer.config`` search path (which would import verl) is replaced with a ``file://`` one.

Hydra lets a config file add keys that verl's tree lacks (only command-line overrides need ``+``), so a typo in a
YAML key composes silently; :func:`unknown_keys` is the check that catches it.
Skipped locally when verl/hydra are missing, failed in CI (``CI`` set).
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from conftest import verl_package
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, ListConfig, OmegaConf

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "recipe" / "configs"
RUN_SH = ROOT / "recipe" / "run.sh"
MAIN, DEMO = "grpo_qwen7b", "grpo_collapse_demo"
N_GPUS = 8

# Keys verl reads that its YAML tree does not declare (on the command line they need `+`): DAPO's overlong shaping,
# read by verl/experimental/reward_loop/reward_manager/dapo.py:33-35 via config.reward.get("reward_kwargs").
ALLOWED_NEW_PREFIXES = ("reward.reward_kwargs.",)

# the demo's deliberately broken values (docs/seed-tutorial.md §7.1, as verl keys) ...
BROKEN = {
    "actor_rollout_ref.actor.optim.lr": 5.0e-5,
    "actor_rollout_ref.actor.kl_loss_coef": 1.0e-4,
    "actor_rollout_ref.rollout.temperature": 0.5,
}
# ... and its own experiment name (separate checkpoints); values interpolating it differ only by that name
EXPERIMENT = "trainer.experiment_name"


@pytest.fixture(scope="module")
def verl_config_dir() -> Path:
    return verl_package() / "trainer" / "config"


@pytest.fixture
def recipe_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The variables the configs read: the real checkout as RECIPE_ROOT (the reward file must exist), tmp data/out."""
    env = {
        "RECIPE_ROOT": str(ROOT),
        "RECIPE_DATA": str(tmp_path / "data"),
        "RECIPE_OUT": str(tmp_path / "out"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("RECIPE_RETRIEVAL_URL", raising=False)
    return env


def compose_recipe(
    verl_dir: Path, name: str, overrides: list[str] | None = None, config_dir: Path = CONFIGS
) -> DictConfig:
    """Composed once per argument set (about a second each). ``${oc.env:...}`` is resolved later, on access, in
    the calling test's environment; the tests never modify the returned config."""
    return _compose(verl_dir, name, tuple(overrides or ()), config_dir)


@functools.cache
def _compose(verl_dir: Path, name: str, overrides: tuple[str, ...], config_dir: Path) -> DictConfig:
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(name, overrides=[f"hydra.searchpath=[file://{verl_dir}]", *overrides])


@functools.cache
def verl_tree(verl_dir: Path) -> dict[str, Any]:
    """verl's own ppo_trainer, composed, as plain nested dicts (a `???` value is still a key)."""
    with initialize_config_dir(config_dir=str(verl_dir), version_base=None):
        tree = OmegaConf.to_container(compose("ppo_trainer"), resolve=False)
    assert isinstance(tree, dict)
    return tree


def leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf; lists are leaves. Interpolations are not resolved."""
    if isinstance(node, DictConfig | Mapping):
        items = node.items_ex(resolve=False) if isinstance(node, DictConfig) else node.items()
        for key, value in items:
            yield from leaves(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1], node


def raw_tree(path: Path) -> dict[str, Any]:
    """The file's own keys (the guardian's view of it), without Hydra's defaults list and hydra node."""
    tree = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    assert isinstance(tree, dict)
    return {k: v for k, v in tree.items() if k not in ("defaults", "hydra")}


def unknown_keys(path: Path, verl_dir: Path) -> list[str]:
    """Keys the recipe file sets that verl 0.9.1's ppo_trainer tree does not have (minus the allowed new ones)."""
    missing = []
    for key, _ in leaves(raw_tree(path)):
        if key.startswith(ALLOWED_NEW_PREFIXES):
            continue
        node: Any = verl_tree(verl_dir)
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                missing.append(key)
                break
            node = node[part]
    return missing


# ------------------------------------------------------------------------------------------------ key existence


@pytest.mark.parametrize("name", [MAIN, DEMO])
def test_every_recipe_key_exists_in_verls_tree(name: str, verl_config_dir: Path) -> None:
    assert unknown_keys(CONFIGS / f"{name}.yaml", verl_config_dir) == []


def test_a_typo_in_a_key_composes_but_the_key_check_catches_it(
    verl_config_dir: Path, recipe_env: dict[str, str], tmp_path: Path
) -> None:
    bad_dir = tmp_path / "configs"
    bad_dir.mkdir()
    text = (CONFIGS / f"{MAIN}.yaml").read_text()
    assert text.count("      lr: 1.0e-6\n") == 1
    (bad_dir / f"{MAIN}.yaml").write_text(text.replace("      lr: 1.0e-6\n", "      lrr: 1.0e-6\n"))
    # Hydra merges a file's new key without complaint (struct mode applies to overrides only) ...
    cfg = compose_recipe(verl_config_dir, MAIN, config_dir=bad_dir)
    assert cfg.actor_rollout_ref.actor.optim.lrr == 1.0e-6
    # ... which is why the recipe's keys are checked against verl's tree
    assert unknown_keys(bad_dir / f"{MAIN}.yaml", verl_config_dir) == ["actor_rollout_ref.actor.optim.lrr"]


def test_struct_mode_refuses_a_misspelt_override(verl_config_dir: Path, recipe_env: dict[str, str]) -> None:
    cfg = compose_recipe(verl_config_dir, MAIN)
    assert OmegaConf.is_struct(cfg)
    with pytest.raises(ConfigCompositionException, match="lrr"):
        compose_recipe(verl_config_dir, MAIN, ["actor_rollout_ref.actor.optim.lrr=1e-6"])


# ------------------------------------------------------------------------------------------------ values


@pytest.fixture
def main_cfg(verl_config_dir: Path, recipe_env: dict[str, str]) -> DictConfig:
    return compose_recipe(verl_config_dir, MAIN)


def test_interpolations_resolve_to_absolute_paths(main_cfg: DictConfig, recipe_env: dict[str, str]) -> None:
    cfg = OmegaConf.create(OmegaConf.to_container(main_cfg, resolve=True))
    out, data = recipe_env["RECIPE_OUT"], recipe_env["RECIPE_DATA"]
    assert cfg.data.train_files == f"{data}/train.parquet"
    assert cfg.data.val_files == f"{data}/val.parquet"
    assert cfg.trainer.default_local_dir == f"{out}/checkpoints/search_agent/qwen7b_grpo"
    assert cfg.trainer.rollout_data_dir == f"{out}/rollouts/search_agent/qwen7b_grpo"
    assert cfg.trainer.validation_data_dir == f"{out}/validation/search_agent/qwen7b_grpo"
    paths = [
        cfg.data.train_files,
        cfg.data.val_files,
        cfg.trainer.default_local_dir,
        cfg.trainer.rollout_data_dir,
        cfg.trainer.validation_data_dir,
        cfg.reward.custom_reward_function.path,
        cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path,
        cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path,
    ]
    assert all(Path(p).is_absolute() for p in paths), paths


def test_paths_default_under_recipe_root(
    verl_config_dir: Path, recipe_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RECIPE_DATA")
    monkeypatch.delenv("RECIPE_OUT")
    cfg = OmegaConf.create(OmegaConf.to_container(compose_recipe(verl_config_dir, MAIN), resolve=True))
    assert cfg.data.train_files == f"{ROOT}/data/search/train.parquet"
    assert cfg.trainer.default_local_dir == f"{ROOT}/outputs/checkpoints/search_agent/qwen7b_grpo"


def test_recipe_root_is_required(verl_config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RECIPE_ROOT", "RECIPE_DATA", "RECIPE_OUT"):
        monkeypatch.delenv(name, raising=False)
    cfg = compose_recipe(verl_config_dir, MAIN)
    with pytest.raises(Exception, match="RECIPE_ROOT"):
        OmegaConf.to_container(cfg, resolve=True)


def test_model_algorithm_and_dapo_values(main_cfg: DictConfig) -> None:
    cfg = main_cfg
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-7B-Instruct"
    assert cfg.algorithm.adv_estimator == "grpo"
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28)
    assert rollout.n == 16
    assert rollout.name == "vllm"
    assert rollout.temperature == 1.0
    assert actor.optim.lr == 1.0e-6
    assert actor.use_kl_loss is True
    assert (actor.kl_loss_coef, actor.kl_loss_type) == (0.01, "low_var_kl")
    assert cfg.algorithm.use_kl_in_reward is False
    assert actor.loss_agg_mode == "token-mean"


def test_filter_groups_meets_the_v1_constraints(main_cfg: DictConfig) -> None:
    from recipe.reward import compute_score

    cfg = main_cfg
    fg = cfg.algorithm.filter_groups
    assert fg.enable is True
    assert fg.metric == "correctness"
    # the metric is read from the reward function's dict (reward_extra_info)
    scored = compute_score(data_source="hotpotqa", solution_str="<answer>x</answer>", ground_truth={"target": ["x"]})
    assert fg.metric in scored
    # V1 (trainer_base.py:187-212,728-742): sync mode, built-in sampler, rule-based reward, no gen_batch_size
    assert cfg.trainer.use_v1 is True
    assert cfg.trainer.v1.trainer_mode == "sync"
    assert cfg.trainer.v1.sampler.custom_sampler.path is None
    assert cfg.reward.reward_model.enable is False
    assert cfg.data.gen_batch_size is None
    assert fg.max_num_gen_batches == 0  # V1 ignores it, with a warning when > 0


def test_overlong_shaping_uses_the_dapo_manager(main_cfg: DictConfig) -> None:
    reward = main_cfg.reward
    assert reward.reward_manager.name == "dapo"
    buf = reward.reward_kwargs.overlong_buffer_cfg
    assert buf.enable is True
    assert reward.reward_kwargs.max_resp_len == main_cfg.data.max_response_length
    # dapo.py's own asserts
    assert 0 < buf.len <= reward.reward_kwargs.max_resp_len
    assert buf.penalty_factor > 0


def test_custom_reward_function_is_the_recipes(main_cfg: DictConfig) -> None:
    crf = main_cfg.reward.custom_reward_function
    assert Path(crf.path) == ROOT / "recipe" / "reward.py"
    assert Path(crf.path).is_file()
    assert crf.name == "compute_score"
    # the legacy top-level key, which main_ppo 0.9.1 silently ignores, is not used
    assert main_cfg.custom_reward_function.path is None
    for name in (MAIN, DEMO):
        assert "custom_reward_function" not in raw_tree(CONFIGS / f"{name}.yaml")


def test_trainer_values(main_cfg: DictConfig) -> None:
    t = main_cfg.trainer
    assert list(t.logger) == ["console", "file"]
    assert t.rollout_data_dir
    assert (t.save_freq, t.test_freq) == (200, 200)
    assert t.resume_mode == "auto"
    assert (t.nnodes, t.n_gpus_per_node) == (1, N_GPUS)


def test_batch_sizes_are_valid_for_8_gpus(main_cfg: DictConfig) -> None:
    """validate_config's rules (verl/utils/config.py:100-190, workers/config/actor.py:222-242), without verl."""
    cfg = main_cfg
    gpus = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    n = cfg.actor_rollout_ref.rollout.n
    actor = cfg.actor_rollout_ref.actor
    assert cfg.data.train_batch_size * n % gpus == 0
    assert cfg.data.train_batch_size >= actor.ppo_mini_batch_size
    assert cfg.data.train_batch_size % actor.ppo_mini_batch_size == 0
    # per-GPU mini batch, and micro batches that divide it (used when use_dynamic_bsz is false)
    assert actor.ppo_mini_batch_size * n % gpus == 0
    assert (actor.ppo_mini_batch_size * n // gpus) % actor.ppo_micro_batch_size_per_gpu == 0
    assert actor.ppo_micro_batch_size is None
    for section in (cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.ref):
        assert section.log_prob_micro_batch_size is None
        assert section.log_prob_micro_batch_size_per_gpu
    # dynamic batching packs by tokens: at least one full-length trajectory must fit
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    assert actor.ppo_max_token_len_per_gpu >= longest


def test_agent_loop_and_multi_turn_settings(main_cfg: DictConfig) -> None:
    rollout = main_cfg.actor_rollout_ref.rollout
    assert rollout.agent.default_agent_loop == "search_agent"
    assert Path(rollout.agent.agent_loop_config_path) == CONFIGS / "agent_loops.yaml"
    assert Path(rollout.multi_turn.tool_config_path) == CONFIGS / "search_tool.yaml"
    assert rollout.multi_turn.max_tool_response_length > 256
    assert rollout.multi_turn.format == "hermes"


def test_agent_loop_registry_file(monkeypatch: pytest.MonkeyPatch) -> None:
    entries = OmegaConf.load(CONFIGS / "agent_loops.yaml")
    assert isinstance(entries, ListConfig)
    [entry] = [e for e in entries if e.name == "search_agent"]
    module, _, cls = entry["_target_"].rpartition(".")
    assert (module, cls) == ("recipe.agent.verl_loop", "SearchAgentLoop")
    kwargs = {k: v for k, v in entry.items() if k not in ("_target_", "name")}
    assert set(kwargs) == {"retrieval_url", "topk", "max_turns", "max_result_chars", "retrieval_timeout_s"}
    assert (entry.topk, entry.max_turns, entry.retrieval_timeout_s) == (3, 8, 30)
    # hydra.utils.instantiate resolves the file's interpolations in the worker: default, then the env var
    monkeypatch.delenv("RECIPE_RETRIEVAL_URL", raising=False)
    assert OmegaConf.to_container(entry, resolve=True)["retrieval_url"] == "http://127.0.0.1:8000/retrieve"
    monkeypatch.setenv("RECIPE_RETRIEVAL_URL", "http://10.0.0.5:9000/retrieve")
    assert OmegaConf.to_container(entry, resolve=True)["retrieval_url"] == "http://10.0.0.5:9000/retrieve"


def test_tool_config_file(main_cfg: DictConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RECIPE_RETRIEVAL_URL", raising=False)
    tools = OmegaConf.to_container(OmegaConf.load(CONFIGS / "search_tool.yaml"), resolve=True)
    assert isinstance(tools, dict)
    [tool] = tools["tools"]
    assert tool["class_name"] == "recipe.agent.search_tool.SearchTool"
    config = tool["config"]
    assert config["type"] == "native"
    assert config["retrieval_service_url"] == "http://127.0.0.1:8000/retrieve"
    assert (config["topk"], config["timeout"]) == (3, 30)
    # verl's own character cap sits above the tool's, so it never cuts a result the tool has already capped
    assert config["max_result_chars"] < main_cfg.actor_rollout_ref.rollout.multi_turn.max_tool_response_length
    function = tool["tool_schema"]["function"]
    assert tool["tool_schema"]["type"] == "function"
    assert function["name"] == "search"
    assert function["parameters"]["properties"]["query"]["type"] == "string"
    assert function["parameters"]["required"] == ["query"]


def test_agent_loop_and_tool_share_their_limits() -> None:
    loop = OmegaConf.load(CONFIGS / "agent_loops.yaml")[0]
    tool = OmegaConf.load(CONFIGS / "search_tool.yaml").tools[0].config
    assert loop.max_result_chars == tool.max_result_chars
    assert loop.topk == tool.topk


# ------------------------------------------------------------------------------------------------ collapse demo


def test_collapse_demo_differs_only_in_the_broken_keys(verl_config_dir: Path, recipe_env: dict[str, str]) -> None:
    """Composed with verl's tree: the demo sets exactly the broken keys and its experiment name differently.
    (Resolved, more values differ: those that interpolate these, e.g. the checkpoint dir.)"""
    main_cfg, demo_cfg = compose_recipe(verl_config_dir, MAIN), compose_recipe(verl_config_dir, DEMO)
    main, demo = dict(leaves(main_cfg)), dict(leaves(demo_cfg))
    assert main.keys() == demo.keys()
    assert {k for k in main if main[k] != demo[k]} == {*BROKEN, EXPERIMENT}
    assert {k: demo[k] for k in BROKEN} == BROKEN
    assert all(main[k] != v for k, v in BROKEN.items())
    # separate checkpoints: the demo never resumes from the healthy run (resume_mode: auto), nor overwrites it
    assert main_cfg.trainer.default_local_dir != demo_cfg.trainer.default_local_dir
    assert main_cfg.trainer.rollout_data_dir != demo_cfg.trainer.rollout_data_dir


def test_collapse_demo_file_is_the_main_file_with_the_broken_keys(verl_config_dir: Path) -> None:
    """The guardian reads the --config-name file alone, so the demo is a full copy; it must not drift."""
    main = dict(leaves(raw_tree(CONFIGS / f"{MAIN}.yaml")))
    demo = dict(leaves(raw_tree(CONFIGS / f"{DEMO}.yaml")))
    assert main.keys() == demo.keys()
    assert {k for k in main if main[k] != demo[k]} == {*BROKEN, EXPERIMENT}
    # both are primary configs that find verl's tree themselves
    for name in (MAIN, DEMO):
        tree = OmegaConf.load(CONFIGS / f"{name}.yaml")
        assert list(tree.hydra.searchpath) == ["pkg://verl.trainer.config"]
        assert list(tree.defaults) == ["ppo_trainer", "_self_"]


# ------------------------------------------------------------------------------------------------ run.sh


def run_sh(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(RUN_SH), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(env) if env is not None else None,
        cwd="/",  # works from anywhere
        check=False,
    )


@pytest.fixture
def bare_env(tmp_path: Path) -> dict[str, str]:
    """No GPU tools, no guardian, no data, no Ray on PATH; absolute tmp folders."""
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "RECIPE_DATA": str(tmp_path / "data"),
        "RECIPE_OUT": str(tmp_path / "out"),
        "RECIPE_INDEX": str(tmp_path / "index"),
        "RECIPE_CORPUS": str(tmp_path / "wiki-18.jsonl"),
    }


def final_command(stdout: str) -> list[str]:
    lines = [line for line in stdout.splitlines() if line.startswith("run.sh: + ")]
    return shlex.split(lines[-1].removeprefix("run.sh: + "))


def test_dry_run_prints_every_step_in_order(bare_env: dict[str, str]) -> None:
    result = run_sh("--dry-run", env=bare_env)
    assert result.returncode == 0, result.stderr
    steps = [line for line in result.stdout.splitlines() if line.startswith("run.sh: step ")]
    assert [line.split()[2] for line in steps] == [f"{i}/7" for i in range(1, 8)]
    for word, line in zip(["GPUs", "data", "index", "retrieval", "retrieval", "Ray", "training"], steps, strict=True):
        assert word in line, line
    out = result.stdout
    assert "+ nvidia-smi -L" in out
    assert "+ python -m recipe.prepare_data --out " + bare_env["RECIPE_DATA"] in out
    assert f"+ python -m recipe.search.index --corpus {bare_env['RECIPE_CORPUS']}" in out
    assert "PeterJinGo/wiki-18-corpus" in out  # the corpus is missing: how to get it
    assert "+ python -m recipe.search.server --index " + bare_env["RECIPE_INDEX"] in out
    assert "+ ray start --head" in out
    cmd = final_command(out)
    assert cmd[:6] == ["guardian", "run", "--", "python", "-m", "verl.trainer.main_ppo"]
    assert cmd[6:10] == ["--config-path", str(CONFIGS), "--config-name", MAIN]
    assert not (Path(bare_env["RECIPE_OUT"])).exists()  # nothing was run


def test_dry_run_command_composes_and_matches_the_configs_paths(
    bare_env: dict[str, str], verl_config_dir: Path, recipe_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECIPE_OUT", bare_env["RECIPE_OUT"])
    monkeypatch.setenv("RECIPE_DATA", bare_env["RECIPE_DATA"])
    for name in (MAIN, DEMO):
        result = run_sh("--dry-run", "--config", name, "trainer.total_training_steps=5", env=bare_env)
        assert result.returncode == 0, result.stderr
        cmd = final_command(result.stdout)
        overrides = cmd[cmd.index("--config-name") + 2 :]
        assert overrides[-1] == "trainer.total_training_steps=5"  # passed through, last
        launched = compose_recipe(verl_config_dir, name, overrides)
        plain = compose_recipe(verl_config_dir, name)
        # run.sh spells out the dirs the config's interpolations give (for the guardian): no drift
        for key in ("default_local_dir", "rollout_data_dir"):
            assert launched.trainer[key] == plain.trainer[key], key
        env_vars = launched.ray_kwargs.ray_init.runtime_env.env_vars
        assert dict(env_vars) | {"PYTHONPATH": "-", "VERL_FILE_LOGGER_ROOT": "-"} == {
            "RECIPE_ROOT": str(ROOT),
            "RECIPE_DATA": bare_env["RECIPE_DATA"],
            "RECIPE_OUT": bare_env["RECIPE_OUT"],
            "RECIPE_RETRIEVAL_URL": "http://127.0.0.1:8000/retrieve",
            "PYTHONPATH": "-",
            "VERL_FILE_LOGGER_ROOT": "-",
        }
        assert str(ROOT) in env_vars.PYTHONPATH.split(":")
        assert launched.trainer.total_training_steps == 5


def test_runtime_env_values_reach_ray_as_strings(
    bare_env: dict[str, str], verl_config_dir: Path, recipe_env: dict[str, str]
) -> None:
    """Ray refuses a runtime_env whose env_vars are not all strings, and Hydra reads an unquoted 1 as an integer."""
    result = run_sh("--dry-run", env={**bare_env, "RECIPE_TOPK": "1", "RECIPE_MAX_RESULT_CHARS": "400"})
    assert result.returncode == 0, result.stderr
    cmd = final_command(result.stdout)
    launched = compose_recipe(verl_config_dir, MAIN, cmd[cmd.index("--config-name") + 2 :])
    env_vars = OmegaConf.to_container(launched.ray_kwargs.ray_init.runtime_env.env_vars)
    assert isinstance(env_vars, dict) and all(isinstance(v, str) for v in env_vars.values()), env_vars
    assert (env_vars["RECIPE_TOPK"], env_vars["RECIPE_MAX_RESULT_CHARS"]) == ("1", "400")


def test_dry_run_collapse_demo_and_no_guardian(bare_env: dict[str, str]) -> None:
    result = run_sh("--dry-run", "--config", DEMO, "--no-guardian", env=bare_env)
    assert result.returncode == 0, result.stderr
    cmd = final_command(result.stdout)
    assert cmd[:3] == ["python", "-m", "verl.trainer.main_ppo"]
    assert cmd[cmd.index("--config-name") + 1] == DEMO
    demo_ckpt = f"{bare_env['RECIPE_OUT']}/checkpoints/search_agent/qwen7b_grpo_collapse_demo"
    assert f"trainer.default_local_dir={demo_ckpt}" in cmd


def test_guardian_args_go_between_guardian_run_and_the_command(bare_env: dict[str, str]) -> None:
    result = run_sh("--dry-run", "--guardian-args", "--mode observe  --run-id smoke-1", env=bare_env)
    assert result.returncode == 0, result.stderr
    cmd = final_command(result.stdout)
    assert cmd[:7] == ["guardian", "run", "--mode", "observe", "--run-id", "smoke-1", "--"]
    assert cmd[7:10] == ["python", "-m", "verl.trainer.main_ppo"]


def test_dry_run_reads_the_gpu_count_from_the_overrides(bare_env: dict[str, str]) -> None:
    result = run_sh("--dry-run", "--", "trainer.n_gpus_per_node=4", env=bare_env)
    assert result.returncode == 0, result.stderr
    assert "step 1/7 check GPUs: need 4" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--frobnicate"], "unknown option: --frobnicate"),
        (["--config", "grpo_nope", "--dry-run"], "--config must be grpo_qwen7b or grpo_collapse_demo"),
        (["--config"], "--config needs a value"),
        (["stray", "--dry-run"], "unexpected argument: stray"),
    ],
)
def test_bad_arguments_exit_non_zero_with_a_message(args: list[str], message: str, bare_env: dict[str, str]) -> None:
    result = run_sh(*args, env=bare_env)
    assert result.returncode == 2
    assert message in result.stderr
    assert "step 1/7" not in result.stdout


def test_help(bare_env: dict[str, str]) -> None:
    result = run_sh("--help", env=bare_env)
    assert result.returncode == 0
    for flag in ("--dry-run", "--config", "--no-guardian", "--help"):
        assert flag in result.stdout


def test_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        message = "shellcheck is not installed"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    result = subprocess.run([shellcheck, str(RUN_SH)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
