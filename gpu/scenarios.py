"""The harness's scenarios and the exact trainer command each one runs (pure: no process, no file).

A scenario is a training run with a role: ``collapse`` (a wrong-signed entropy bonus; the guardian must detect,
stop, roll back, patch, resume and prove the fix), ``healthy`` (a sound config: the guardian must not intervene),
``collapse-kill`` (the collapse, with the guardian SIGKILLed once the patched trainer is launched and re-attached),
``unguarded`` (the healthy config without the guardian: the baseline of the guardian's overhead on step time) and
``search`` (the search-agent recipe's own one command, ``recipe/run.sh``, with its config, data preparation, BM25
index, retrieval server, multi-turn agent loop and reward, on a tiny model, with the guardian observing) and
``search-8gpu`` (the same recipe on eight GPUs with a random-initialised model of Qwen2.5-7B's shape, fewer layers:
``gpu.tiny.QWEN25_7B``; step time and tokens/s).

Every verl scenario takes a GPU count (``gpus``; ``python -m gpu.device_run --gpus N``): ``trainer.n_gpus_per_node=N``
(FSDP over N ranks), hence N replicas of the ``hf`` rollout (TP=1: verl makes world_size / TP replicas, replica i on
the GPU of trainer rank i, ``gpu.verl_plugin.HFReplica``), micro-batches that divide each rank's share, and NVLink
multicast off in the job's own runtime environment too.

Two trainers build the command: ``verl`` (real verl 0.9.1 with the tiny Qwen2 of ``gpu.tiny`` and the ``hf``
rollout of ``gpu.verl_plugin``, on the GPU machine) and ``cpu`` (the guardian's own CPU trainer with verl's command
line, to rehearse the whole harness on a laptop). Settings are recorded here, once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

LR_KEY = "actor_rollout_ref.actor.optim.lr"
ENTROPY_KEY = "actor_rollout_ref.actor.entropy_coeff"
KILL_AFTER_EVENT = "event=attempt_launched attempt=2"
"""guardian.log line after which ``collapse-kill`` SIGKILLs its guardian: the patched trainer has just started."""
KILL_DELAY_S = 5.0
"""seconds between that line and the SIGKILL: the relaunched trainer is alive, its first step not yet logged"""
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
"""NVLink multicast off in NCCL, PyTorch and NVSHMEM: the lent machines' GPUs share a host with others' (KINDS.md)"""
RUNTIME_ENV = "ray_kwargs.ray_init.runtime_env.env_vars."


@dataclass(frozen=True)
class Scenario:
    name: str
    guarded: bool
    overrides: Mapping[str, str]
    kill_guardian: bool = False
    expect_intervention: bool = False
    total_steps: int = 0
    recipe: bool = False  # launched by recipe/run.sh (which runs the guardian itself) instead of guardian run
    gpus: int = 1  # trainer.n_gpus_per_node: FSDP ranks, and hf rollout replicas (TP=1)
    shape: bool = False  # the recipe on the Qwen2.5-7B-shaped model (search-8gpu) instead of the tiny one
    setting: str = ""  # a twin of this named setting (SETTINGS): guarded = under guardian run, unguarded = bare

    @property
    def run_id(self) -> str:
        return f"gpu-{self.name}"


@dataclass(frozen=True)
class TrainerSetup:
    """What every scenario of one trainer shares."""

    kind: str  # "verl" or "cpu"
    python: str = "python3"
    tiny: Path | None = None  # gpu.tiny output (verl only)
    extra: Mapping[str, str] = field(default_factory=dict)
    search_tiny: Path | None = None  # gpu.tiny --task search output (the search scenario)
    search_corpus: Path | None = None  # wiki-18 style corpus for the search scenario's index
    search_shape: Path | None = None  # gpu.tiny --task search --shape qwen2.5-7b output (search-8gpu)
    repo: Path = Path(__file__).resolve().parents[1]


# The broken setting of the earlier real runs (run-a: collapse ~step 15 with lr 1e-3 and entropy_coeff -0.1) and a
# sound one (verl's default entropy_coeff 0, lr 1e-4, a small KL loss).
VERL_COLLAPSE = {LR_KEY: "1e-3", ENTROPY_KEY: "-0.1", "actor_rollout_ref.actor.use_kl_loss": "False"}
VERL_HEALTHY = {
    LR_KEY: "1e-4",
    ENTROPY_KEY: "0",
    "actor_rollout_ref.actor.use_kl_loss": "True",
    "actor_rollout_ref.actor.kl_loss_coef": "0.001",
}
CPU_COLLAPSE = {LR_KEY: "2e-5", ENTROPY_KEY: "-0.3", "+trainer.seed": "1"}
CPU_HEALTHY = {LR_KEY: "2e-5", ENTROPY_KEY: "0", "+trainer.seed": "1"}


@dataclass(frozen=True)
class Setting:
    """A named set of trainer overrides on top of the tiny task's base (``verl_overrides``), run as twins: the
    same command once bare and once under ``guardian run --mode enforce``. ``verl`` is what runs on the GPU; ``cpu``
    is the same intent for the guardian's CPU trainer (rehearsal only: its scales differ, and it refuses responses
    shorter than 16 tokens)."""

    name: str
    verl: Mapping[str, str]
    cpu: Mapping[str, str]
    why: str


KL_KEY = "actor_rollout_ref.actor.use_kl_loss"
KL_COEF_KEY = "actor_rollout_ref.actor.kl_loss_coef"
TEMPERATURE_KEY = "actor_rollout_ref.rollout.temperature"
RESPONSE_KEY = "data.max_response_length"
CPU_SANE = {**CPU_HEALTHY, KL_KEY: "True", KL_COEF_KEY: "0.001"}


def _setting(name: str, verl: Mapping[str, str], cpu: Mapping[str, str], why: str) -> Setting:
    return Setting(name, {**VERL_HEALTHY, **verl}, {**CPU_SANE, **cpu}, why)


# Every setting is the sane control (VERL_HEALTHY: lr 1e-4, no entropy bonus, KL loss 0.001, temperature 1, 16
# response tokens) with one or two things changed. The entropy-bonus settings run at lr-fast's 1e-3: verl's AdamW
# moves each weight by about lr a step whatever the loss's scale, so at 1e-4 no entropy coefficient, however large,
# moves entropy far in 40 steps (the control's entropy goes 4.09 -> 3.95 in 20); lr-fast is their comparison. The keys
# are verl 0.9.1's (actor/actor.yaml, rollout/rollout.yaml, data/legacy_data.yaml); gpu/tests/test_twins.py composes
# every command with verl's own Hydra config.
FAST = {LR_KEY: "1e-3"}
CPU_FAST = {LR_KEY: "6e-5"}
SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        _setting("sane", {}, {}, "the control: the healthy scenario's settings"),
        _setting("lr-high", {LR_KEY: "1e-2"}, {LR_KEY: "2e-4"}, "learning rate 100x the control's"),
        _setting("lr-fast", FAST, CPU_FAST, "learning rate 10x the control's: learns fast and spends entropy"),
        _setting(
            "entropy-neg-mild",
            {**FAST, ENTROPY_KEY: "-0.03"},
            {**CPU_FAST, ENTROPY_KEY: "-0.1"},
            "lr-fast with a small wrong-signed entropy bonus",
        ),
        _setting(
            "entropy-neg-strong",
            {**FAST, ENTROPY_KEY: "-0.3"},
            {**CPU_FAST, ENTROPY_KEY: "-0.3"},
            "lr-fast with a large wrong-signed entropy bonus (3x the collapse scenario's)",
        ),
        _setting(
            "entropy-pos-strong",
            {**FAST, ENTROPY_KEY: "1.0"},
            {**CPU_FAST, ENTROPY_KEY: "0.3"},
            "lr-fast with an entropy bonus far too large: the policy is held near uniform",
        ),
        _setting("kl-off", {KL_KEY: "False"}, {KL_KEY: "False"}, "the control without its KL loss"),
        _setting("temp-high", {TEMPERATURE_KEY: "2.0"}, {TEMPERATURE_KEY: "2.0"}, "rollout temperature 2"),
        _setting(
            "len-cap-short",
            {RESPONSE_KEY: "4"},
            {},
            "4 response tokens where the reward reads 8 characters: every answer cut at the cap, reward at most 0.5",
        ),
    )
}
TWIN_MODES = {"both": (True, False), "guarded": (True,), "unguarded": (False,)}


def twin_name(setting: str, guarded: bool) -> str:
    return f"{setting}.{'guarded' if guarded else 'unguarded'}"


def twin_scenarios(
    kind: str, settings: Sequence[str], *, steps: int, mode: str = "both", gpus: int | None = None
) -> dict[str, Scenario]:
    """The twins of each named setting: ``<setting>.guarded`` (guardian run, enforce mode) and/or
    ``<setting>.unguarded`` (the trainer alone), the same command and seed."""
    unknown = [name for name in settings if name not in SETTINGS]
    if unknown:
        raise ValueError(f"gpu.scenarios: unknown settings {unknown}; choose from {sorted(SETTINGS)}")
    out = {}
    for name in settings:
        chosen = SETTINGS[name]
        overrides = chosen.verl if kind == "verl" else chosen.cpu
        for guarded in TWIN_MODES[mode]:
            s = Scenario(twin_name(name, guarded), guarded, overrides, total_steps=steps, gpus=gpus or 1, setting=name)
            out[s.name] = s
    return out


def scenarios(
    kind: str,
    *,
    collapse_steps: int,
    healthy_steps: int,
    search_steps: int = 6,
    gpus: int | None = None,
    shape_steps: int = 24,
) -> dict[str, Scenario]:
    """The scenarios of one trainer. ``gpus`` is every scenario's GPU count (default 1, and 8 for ``search-8gpu``)."""
    collapse, healthy = (VERL_COLLAPSE, VERL_HEALTHY) if kind == "verl" else (CPU_COLLAPSE, CPU_HEALTHY)
    n = gpus or 1
    recipe = (
        [
            Scenario("search", True, {}, recipe=True, total_steps=search_steps, gpus=n),
            Scenario("search-8gpu", True, {}, recipe=True, total_steps=shape_steps, gpus=gpus or 8, shape=True),
        ]
        if kind == "verl"
        else []
    )
    return {
        s.name: s
        for s in (
            Scenario("collapse", True, collapse, expect_intervention=True, total_steps=collapse_steps, gpus=n),
            Scenario(
                "collapse-kill",
                True,
                collapse,
                kill_guardian=True,
                expect_intervention=True,
                total_steps=collapse_steps,
                gpus=n,
            ),
            Scenario("healthy", True, healthy, total_steps=healthy_steps, gpus=n),
            Scenario("unguarded", False, healthy, total_steps=healthy_steps, gpus=n),
            *recipe,
        )
    }


def multicast_off() -> dict[str, str]:
    """The job's runtime_env keeps NVLink multicast off in every Ray worker, whatever the raylet inherited (a quoted
    Hydra string each: Ray takes only strings there)."""
    return {f"++{RUNTIME_ENV}{name}": f"'{value}'" for name, value in NO_MULTICAST.items()}


def gpu_overrides(gpus: int, *, ppo_mini_batch: int, n: int, micro: int) -> dict[str, str]:
    """Settings that follow the GPU count: ranks, a micro-batch that divides each rank's share of a mini-batch
    (verl splits ``ppo_mini_batch_size * n`` trajectories over the ranks), CPUs for Ray (TransferQueue 1 + its
    storage units, 3 per GPU bundle), and multicast off. Nothing for one GPU: the proven one-GPU command stays."""
    if gpus <= 1:
        return {}
    per_rank = ppo_mini_batch * n // gpus
    if per_rank < 1 or ppo_mini_batch * n % gpus:
        raise ValueError(f"gpu.scenarios: a mini-batch of {ppo_mini_batch} x {n} does not split over {gpus} GPUs")
    micro = min(micro, per_rank)
    return {
        "trainer.n_gpus_per_node": str(gpus),
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": str(micro),
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": str(micro),
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": str(micro),
        "ray_kwargs.ray_init.num_cpus": str(max(16, 3 * gpus + 10)),
        **multicast_off(),
    }


def verl_overrides(tiny: Path, run_dir: Path, total_steps: int, gpus: int = 1) -> dict[str, str]:
    """The tiny run's verl 0.9.1 overrides (../shared/docs/verl-on-gpu-notes.md says why each one matters)."""
    base = {
        "algorithm.adv_estimator": "grpo",
        "algorithm.use_kl_in_reward": "False",
        "data.train_files": str(tiny / "data" / "train.parquet"),
        "data.val_files": str(tiny / "data" / "test.parquet"),
        "data.train_batch_size": "32",
        "data.max_prompt_length": "32",
        "data.max_response_length": "16",
        "data.dataloader_num_workers": "0",
        "actor_rollout_ref.model.path": str(tiny / "model"),
        "actor_rollout_ref.model.use_remove_padding": "False",
        "actor_rollout_ref.model.enable_gradient_checkpointing": "False",
        "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "16",
        "actor_rollout_ref.actor.use_torch_compile": "False",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile": "False",
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile": "False",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "16",
        "actor_rollout_ref.rollout.name": "hf",
        "actor_rollout_ref.rollout.dtype": "float32",
        "actor_rollout_ref.rollout.n": "4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size": "1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "16",
        "actor_rollout_ref.rollout.agent.num_workers": "2",
        "reward.custom_reward_function.path": str(tiny / "tiny_reward.py"),
        "reward.custom_reward_function.name": "compute_score",
        "reward.num_workers": "2",
        "trainer.logger": '["console","file"]',
        "trainer.project_name": "tiny_verl",
        "trainer.experiment_name": run_dir.name,
        "trainer.nnodes": "1",
        "trainer.n_gpus_per_node": "1",
        "trainer.total_epochs": "1000",
        "trainer.total_training_steps": str(total_steps),
        "trainer.val_before_train": "False",
        "trainer.test_freq": "-1",
        "trainer.save_freq": "3",
        "trainer.resume_mode": "auto",
        "trainer.default_local_dir": str(run_dir / "ckpt"),
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": "2",
        "ray_kwargs.ray_init.num_cpus": "16",
    }
    return {**base, **gpu_overrides(gpus, ppo_mini_batch=16, n=4, micro=16)}


# The recipe's config (recipe/configs/grpo_qwen7b.yaml: 8 GPUs, Qwen2.5-7B, vLLM) shrunk to the tiny search model
# on one GPU with the hf rollout. Everything else - the agent loop and its retrieval settings, the reward, GRPO with
# the DAPO pieces, the KL loss, the file logger and dumps - is the recipe's own.
RECIPE_CONFIG = "grpo_qwen7b"
RECIPE_SHRINK = {
    "data.train_batch_size": "8",
    # the tiny tokenizer spends one token per character: the system prompt alone is ~800 tokens
    "data.max_prompt_length": "2048",
    # room for a few turns with one short result block each (RECIPE_TOPK / RECIPE_MAX_RESULT_CHARS in recipe_env)
    "data.max_response_length": "768",
    "data.dataloader_num_workers": "0",
    "actor_rollout_ref.model.use_remove_padding": "False",
    "actor_rollout_ref.model.enable_gradient_checkpointing": "False",
    "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "4",
    "actor_rollout_ref.actor.use_torch_compile": "False",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile": "False",
    "actor_rollout_ref.ref.fsdp_config.use_torch_compile": "False",
    "actor_rollout_ref.rollout.name": "hf",
    "actor_rollout_ref.rollout.dtype": "float32",
    "actor_rollout_ref.rollout.n": "4",
    "actor_rollout_ref.rollout.agent.num_workers": "2",
    # a random model's answers are all wrong: every group would be filtered and the batch never filled
    "algorithm.filter_groups.enable": "False",
    # the recipe's overlong buffer (2048 tokens) is wider than this whole response budget
    "reward.reward_kwargs.overlong_buffer_cfg.len": "128",
    "reward.num_workers": "2",
    "trainer.n_gpus_per_node": "1",
    "trainer.total_epochs": "1000",
    "trainer.val_before_train": "False",
    "trainer.test_freq": "-1",
    "trainer.save_freq": "3",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units": "2",
}


# The recipe on N GPUs (8: the recipe's own node) with the Qwen2.5-7B-shaped model of gpu.tiny (QWEN25_7B, 4 of its
# 28 layers: 2.02 B parameters, 1.09 B of them the 152064-token embedding and output layer). What stays the recipe's:
# the agent loop and its retrieval settings, the reward with the DAPO overlong shaping, GRPO with clip 0.2/0.28 and
# the KL loss, gradient checkpointing, dynamic batch sizes by tokens (ppo_max_token_len_per_gpu 18432), the reference
# model offloaded, one replica per GPU (TP=1), the file logger and the dumps. What is shrunk, and why: the batch
# (16 prompts x 4 samples = 64 trajectories, 8 per GPU, instead of 64 x 16) and 768 response tokens (the byte
# tokenizer spends a token per character) so that a step takes seconds; no dynamic sampling (a warm-started model's
# answers are all wrong: every group would be dropped); the hf rollout in bf16 instead of vLLM (not in the bundle).
SHAPE_SHRINK = {
    "data.train_batch_size": "16",
    "data.max_prompt_length": "2048",
    "data.max_response_length": "768",
    "data.dataloader_num_workers": "0",
    "actor_rollout_ref.model.use_remove_padding": "False",
    "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "8",
    "actor_rollout_ref.actor.use_torch_compile": "False",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile": "False",
    "actor_rollout_ref.ref.fsdp_config.use_torch_compile": "False",
    "actor_rollout_ref.rollout.name": "hf",
    "actor_rollout_ref.rollout.dtype": "bfloat16",
    "actor_rollout_ref.rollout.n": "4",
    "algorithm.filter_groups.enable": "False",
    "reward.reward_kwargs.overlong_buffer_cfg.len": "128",
    "trainer.total_epochs": "1000",
    "trainer.val_before_train": "False",
    "trainer.test_freq": "-1",
    "trainer.save_freq": "12",
}


def recipe_overrides(
    model: Path, run_dir: Path, total_steps: int, *, gpus: int = 1, shape: bool = False
) -> dict[str, str]:
    per_gpu = {}
    if shape:
        per_gpu = {
            "trainer.n_gpus_per_node": str(gpus),
            "actor_rollout_ref.rollout.agent.num_workers": str(gpus),
            "reward.num_workers": str(gpus),
            **multicast_off(),
        }
    elif gpus > 1:
        per_gpu = gpu_overrides(gpus, ppo_mini_batch=4, n=4, micro=4)
        per_gpu.pop("ray_kwargs.ray_init.num_cpus")  # run.sh joins device.sh's Ray head: its CPUs are the machine's
    return {
        **(SHAPE_SHRINK if shape else RECIPE_SHRINK),
        **per_gpu,
        "actor_rollout_ref.model.path": str(model),
        "trainer.total_training_steps": str(total_steps),
        "trainer.experiment_name": run_dir.name,
        "trainer.default_local_dir": str(run_dir / "ckpt"),
    }


def recipe_command(setup: TrainerSetup, scenario: Scenario, run_dir: Path) -> list[str]:
    """argv of ``recipe/run.sh``, which prepares data and index, starts the retrieval server and Ray, and runs the
    training under ``guardian run`` with these options (observe: the point is the recipe, not a rescue)."""
    model_root = setup.search_shape if scenario.shape else setup.search_tiny
    if model_root is None:
        what = "--task search --shape qwen2.5-7b" if scenario.shape else "--task search"
        raise ValueError(f"gpu.scenarios: the {scenario.name} scenario needs its model (gpu.tiny {what})")
    guardian = f"--config {run_dir / 'guardian.yaml'} --no-live --mode observe --run-id {scenario.run_id}"
    overrides = {
        **recipe_overrides(
            model_root / "model", run_dir, scenario.total_steps, gpus=scenario.gpus, shape=scenario.shape
        ),
        **setup.extra,
    }
    return [
        "bash",
        str(setup.repo / "recipe" / "run.sh"),
        "--config",
        RECIPE_CONFIG,
        "--guardian-args",
        guardian,
        "--",
        *(f"{k}={v}" for k, v in overrides.items()),
    ]


def recipe_env(setup: TrainerSetup, run_dir: Path) -> dict[str, str]:
    """run.sh's inputs: the repository's real HotpotQA / 2Wiki samples, the corpus, folders of this run."""
    if setup.search_corpus is None:
        raise ValueError("gpu.scenarios: the search scenario needs a corpus (recipe.search.hotpot_corpus --out)")
    fixtures = setup.repo / "tests" / "fixtures" / "recipe"
    return {
        "PYTHON": setup.python,
        "RECIPE_DATA": str(run_dir / "data"),
        "RECIPE_OUT": str(run_dir / "out"),
        "RECIPE_INDEX": str(run_dir / "index"),
        "RECIPE_CORPUS": str(setup.search_corpus),
        "RECIPE_HOTPOTQA": str(fixtures / "hotpotqa_train_100.json"),
        "RECIPE_2WIKI": str(fixtures / "2wiki_500_first100.jsonl"),
        "RECIPE_HEALTH_TIMEOUT": "180",
        # one passage of at most 400 characters per search: the tiny tokenizer spends a token per character
        "RECIPE_TOPK": "1",
        "RECIPE_MAX_RESULT_CHARS": "400",
    }


def cpu_overrides(run_dir: Path, total_steps: int) -> dict[str, str]:
    return {
        "trainer.total_training_steps": str(total_steps),
        "trainer.total_epochs": "1000",
        "trainer.save_freq": "10",
        "trainer.logger": '["console","file"]',
        "trainer.default_local_dir": str(run_dir / "ckpt"),
    }


def trainer_command(setup: TrainerSetup, scenario: Scenario, run_dir: Path) -> list[str]:
    """argv of the scenario's trainer (what ``guardian run --`` receives, or what runs bare when unguarded)."""
    if setup.kind == "verl":
        if setup.tiny is None:
            raise ValueError("gpu.scenarios: the verl trainer needs the tiny model folder (gpu.tiny --out)")
        base = verl_overrides(setup.tiny, run_dir, scenario.total_steps, scenario.gpus)
        module = "verl.trainer.main_ppo"
    elif setup.kind == "cpu":
        base = cpu_overrides(run_dir, scenario.total_steps)
        module = "guardian.demo.trainer"
    else:
        raise ValueError(f"gpu.scenarios: unknown trainer {setup.kind!r} (verl or cpu)")
    merged = {**base, **scenario.overrides, **setup.extra}
    return [setup.python, "-m", module, *(f"{k}={v}" for k, v in merged.items())]


def guardian_yaml(home: Path, kind: str) -> str:
    """The guardian's config for a scenario: real verl starts in ~150 s and steps every ~5 s."""
    if kind == "verl":
        return (
            f"home: {home}\n"
            "intervention: {probation_steps: 8, startup_seconds: 400, stop_sigint_s: 20, stop_sigterm_s: 10}\n"
            "checks: {stall: {startup_seconds: 600}}\n"
        )
    return f"home: {home}\nintervention: {{probation_steps: 8, stop_sigint_s: 5, stop_sigterm_s: 5}}\n"
