"""`verifiers`: an environment written for the `verifiers` library (0.4, its `verifiers.v1` API), unchanged.

`task=verifiers task.env=ID task.env_args={...}` loads the environment the way verifiers' own
`load_environment` does: `ID` is its taskset module (`--env.taskset.id`), `env_args` that
taskset's config keys, `env_config` the rest of verifiers' `EnvConfig` (its seats, timeouts,
retries). Each episode is verifiers' own `Env.run_episode`: its harness plays the model's side
through verifiers' interception server, and verifiers' `TrainClient` renders every turn to token
ids client-side and posts them to a generate endpoint, here the run's `TurnEndpoint`
(envs/turn_endpoint.py), which samples the turn on the run's engine through the episode's
`TurnClient`. So the library decides every token (its renderer bridges each turn onto the last
one), the run trains exactly the sampled tokens, and the reward is the library's: the sum of the
episode's traces' weighted rewards, each named term (unweighted, plus metrics) in `terms`.

An episode verifiers reports as failed (an error on the episode or a trace) ends with an
`env_error` fault naming verifiers' last error; a turn the `TurnClient` refused ends with that
fault (`prefix_mismatch`, `too_long`). A failure to load (no such module, a module that raises,
a key the taskset's config refuses) is a `load_error` naming the key the user typed.

Prompts: the taskset's rows, in `load()` order, at most `max_tasks`. Each prompt's token ids are
what verifiers' renderer writes for the first turn (the task's system prompt and prompt, with the
generation prompt), so the first turn the harness sends extends the prompt exactly. A harness
that opens with something else (its own system prompt, tool schemas) sends a first turn that does
not extend it: a `prefix_mismatch` fault, counted. Held-out split: the taskset loaded again with
`env_args` updated by `test_env_args` (e.g. `{split: test}`), else the last `test_share` of rows.

Deliberately left out: more than one sampled conversation per episode (verifiers' multi-agent
envs, best-of-n): an episode is one token sequence here, so a second conversation is a
`prefix_mismatch`. The environment's own sampling knobs (temperature, ...) do not act: the run
samples with its own (envs/turn_endpoint.py).

Resources (the endpoint and verifiers' `Env.serving()`) start on the first episode's event loop
and stay up until `aclose()`, or until that loop's end cancels the task that holds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import logging
import tempfile
from dataclasses import dataclass, field
from typing import Any

from jaxrl_async.envs.episode import EpisodeFault, EpisodeResult, TurnClient
from jaxrl_async.envs.task import EnvTaskConfig, EpisodeContext, EpisodeTask
from jaxrl_async.tasks.base import Example, Prompt, register_task
from jaxrl_async.tokenizer import Tokenizer
from planner.configs import check

log = logging.getLogger(__name__)

INSTALL_HINT = 'task=verifiers needs the verifiers library: pip install -e ".[envs]"'
# EnvTaskConfig's keys that the library's own limits replace (a warning when set)
INERT_KEYS = ("max_turns", "env_timeout_s", "env_workers")
# verifiers' own log, its interception server's access log, and the HTTP client its harnesses use
QUIET_LOGGERS = ("verifiers", "aiohttp.access", "httpx")
ENDPOINT_KEY_VAR = "JAXRL_ASYNC_TURN_ENDPOINT_KEY"  # an unset variable: the loopback route takes no key


@dataclass(frozen=True, kw_only=True)
class VerifiersConfig(EnvTaskConfig):
    """`task=verifiers`: an environment of the verifiers library, run as verifiers runs it.

    Attributes:
      env: required: the environment's id as verifiers loads it (its taskset module, verifiers'
        `--env.taskset.id`), an installed module or one on PYTHONPATH; e.g. guess_digit from
        examples/verifiers_envs.
      env_args: the taskset's config keys (its verifiers `TasksetConfig` fields), checked by
        verifiers; a key it refuses is named as task.env_args.KEY. null: none.
      env_config: the other keys of verifiers' `EnvConfig`: seats (e.g. {agent: {runtime: {type:
        subprocess}}}), timeout, retries, interception. null: none.
      test_env_args: the held-out split: the taskset loaded again with env_args updated by these
        (e.g. {split: test}); null: the last test_share of the rows.
      test_share: with test_env_args null, the share of the rows (the last ones) held out, in (0, 1).
      max_tasks: most rows read from the taskset (bounds an infinite one).
      renderer_model: the tokenizer verifiers renders turns with (a HF directory or hub id, the
        policy model's); "": the run's own tokenizer and chat template, written out as a HF
        directory for the run's lifetime.
      renderer: verifiers' `TrainClientConfig.renderer` (a `renderers.RendererConfig`, e.g.
        {name: default}); null: chosen from renderer_model.
    """

    env: str = ""
    env_args: dict[str, Any] | None = None
    env_config: dict[str, Any] | None = None
    test_env_args: dict[str, Any] | None = None
    test_share: float = 0.1
    max_tasks: int = 10000
    renderer_model: str = ""
    renderer: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check(bool(self.env), "task.env", self.env, "task=verifiers needs the environment's id (task.env=MODULE)")
        check(0.0 < self.test_share < 1.0, "task.test_share", self.test_share, "must be in (0, 1)")
        check(isinstance(self.max_tasks, int) and self.max_tasks >= 1, "task.max_tasks", self.max_tasks,
              "must be an int >= 1")
        env_config = self.env_config or {}
        check("taskset" not in env_config, "task.env_config.taskset", env_config.get("taskset"),
              "the taskset is task.env with task.env_args")


class LoadFault(EpisodeFault, ValueError):
    """The environment cannot be loaded: a `load_error` fault that is also bad input (one line, exit 1)."""

    def __init__(self, reason: str) -> None:
        super().__init__("load_error", reason)


def import_verifiers() -> Any:
    """`verifiers.v1`, imported on first use: the `envs` extra is optional."""
    if importlib.util.find_spec("verifiers") is None:
        raise LoadFault(INSTALL_HINT)
    import verifiers.v1 as vf

    return vf


@register_task
class VerifiersTask(EpisodeTask):
    name = "verifiers"
    config_class = VerifiersConfig
    cfg: VerifiersConfig

    def __init__(self, cfg: VerifiersConfig) -> None:
        super().__init__(cfg)
        defaults = {f.name: f.default for f in dataclasses.fields(EnvTaskConfig)}
        for key in INERT_KEYS:
            if getattr(cfg, key) != defaults[key]:
                log.warning("task.%s has no effect for task=verifiers: the environment's own limits apply "
                            "(task.env_config, task.env_args)", key)
        self.vf = import_verifiers()
        for name in QUIET_LOGGERS:  # per-rollout and per-request INFO lines would fill the run's log
            if logging.getLogger(name).level == logging.NOTSET:
                logging.getLogger(name).setLevel(logging.WARNING)
        self._envs = {"train": self._load(cfg.env_args or {}, "task.env_args")}
        if cfg.test_env_args is not None:
            self._envs["test"] = self._load({**(cfg.env_args or {}), **cfg.test_env_args}, "task.test_env_args")
        self._tasks: dict[str, list[Any]] = {}
        self._renderer: Any = None
        self._own_tokenizer: tempfile.TemporaryDirectory | None = None  # renderer_model "": the run's, written out
        self._endpoint: Any = None
        self._keeper: asyncio.Task | None = None  # holds the serving resources open (_keep)
        self._stop = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starting: asyncio.Lock | None = None

    # --- loading ---------------------------------------------------------------------------------

    def _load(self, env_args: dict[str, Any], args_key: str) -> Any:
        """verifiers' `resolve_env_config` + `load_environment`; every failure a LoadFault naming a key."""
        from pydantic import ValidationError

        data = {**(self.cfg.env_config or {}), "taskset": {**env_args, "id": self.cfg.env}}
        try:
            config = self.vf.resolve_env_config(data)
            return self.vf.load_environment(config)
        except ValidationError as e:
            raise LoadFault(_validation_line(e, self.cfg.env, args_key)) from None
        except ModuleNotFoundError as e:  # the env's module, or one it imports (its own dependency)
            missing = getattr(e.__cause__, "name", None) or e.name or self.cfg.env
            raise LoadFault(f"task.env={self.cfg.env!r}: no module named {missing!r} (install it, or put its "
                            "folder on PYTHONPATH)") from None
        except Exception as e:  # the environment's own code ran at import or construction
            raise LoadFault(f"task.env={self.cfg.env!r}: the environment raised at load: "
                            f"{type(e).__name__}: {_first_line(e)}") from None

    def _env(self, split: str) -> Any:
        """The verifiers Env that plays `split`: the test one when test_env_args loaded one."""
        return self._envs.get(split, self._envs["train"])

    def _split_tasks(self, split: str) -> list[Any]:
        """The split's verifiers tasks, in `load()` order (read once)."""
        if split not in self._tasks:
            try:
                rows = list(self._env(split).taskset.take(self.cfg.max_tasks))
            except Exception as e:  # the taskset's own `load()`
                raise LoadFault(f"task.env={self.cfg.env!r}: the taskset's load() raised "
                                f"{type(e).__name__}: {_first_line(e)}") from None
            if "test" not in self._envs:
                cut = len(rows) - max(1, round(len(rows) * self.cfg.test_share))
                check(cut >= 1, "task.test_share", self.cfg.test_share,
                      f"leaves no training rows of the taskset's {len(rows)}")
                rows = rows[:cut] if split == "train" else rows[cut:]
            check(bool(rows), "task.env_args" if split == "train" else "task.test_env_args", self.cfg.env,
                  f"the taskset yields no {split} rows")
            self._tasks[split] = rows
        return self._tasks[split]

    def examples(self) -> list[Example]:
        return self._examples("train")

    def test_examples(self) -> list[Example]:
        return self._examples("test")

    def _examples(self, split: str) -> list[Example]:
        examples = []
        for row, task in enumerate(self._split_tasks(split)):
            data = task.data
            ident = data.id or f"{row}-{task.key[:12]}"  # rows without an id may repeat their content
            examples.append(Example(f"verifiers-{self.cfg.env}-{split}-{ident}", data.prompt_text, None,
                                    {"split": split, "row": row}))
        return examples

    # --- prompts: verifiers' first-turn render ------------------------------------------------

    def renderer_model(self) -> str:
        """What verifiers loads its renderer's tokenizer from: task.renderer_model, else the run's tokenizer
        as `encoder` wrote it out."""
        if self.cfg.renderer_model:
            return self.cfg.renderer_model
        if self._own_tokenizer is None:
            raise EpisodeFault("load_error", "task.renderer_model='': the run's tokenizer is written out when its "
                                             "prompts are encoded (encoder), which has not happened")
        return self._own_tokenizer.name

    def renderer(self) -> Any:
        """The renderer verifiers' TrainClient builds (same model, same config): prompts render as turns do."""
        if self._renderer is None:
            from renderers import create_renderer
            from renderers.base import load_tokenizer

            try:
                self._renderer = create_renderer(load_tokenizer(self.renderer_model()), self._renderer_config())
            except Exception as e:
                raise LoadFault(f"task.renderer_model={self.cfg.renderer_model!r}: verifiers' renderer cannot load "
                                f"{self.renderer_model()!r}: {type(e).__name__}: {_first_line(e)}") from None
        return self._renderer

    def _renderer_config(self) -> Any:
        if self.cfg.renderer is None:
            return None
        return self.vf.TrainClientConfig(renderer=self.cfg.renderer).renderer

    def first_messages(self, task: Any) -> list[dict[str, Any]]:
        """The first turn's conversation as verifiers' chat harnesses open it: the system prompt, then the prompt."""
        from verifiers.v1.dialects.chat import message_to_wire

        data = task.data
        messages = [] if data.system_prompt is None else [{"role": "system", "content": data.system_prompt}]
        if isinstance(data.prompt, str):
            messages.append({"role": "user", "content": data.prompt})
        else:
            messages += [message_to_wire(m) for m in data.prompt or []]
        return messages

    def encoder(self, tokenizer: Tokenizer, chat_template: str | None):  # type: ignore[override]
        """Example -> Prompt rendered by verifiers' renderer, so the first turn verifiers sends extends it.
        With task.renderer_model "" that renderer reads the run's `tokenizer` and `chat_template`."""
        if not self.cfg.renderer_model and self._own_tokenizer is None:
            if chat_template is not None:
                tokenizer = dataclasses.replace(tokenizer, chat_template=chat_template)
            self._own_tokenizer = tempfile.TemporaryDirectory(prefix="jaxrl_async_renderer_")
            tokenizer.save_hf_dir(self._own_tokenizer.name)
        renderer = self.renderer()

        def encode(example: Example) -> Prompt:
            task = self._split_tasks(example.meta["split"])[example.meta["row"]]
            ids = list(renderer.render(self.first_messages(task), add_generation_prompt=True).token_ids)
            return Prompt(example.prompt_id, tokenizer.decode(ids, skip_special_tokens=False), ids, None,
                          {**example.meta, "content": example.content})

        return encode

    # --- episodes --------------------------------------------------------------------------------

    async def _serving(self) -> None:
        """Start the endpoint and verifiers' serving resources once, on the episodes' loop."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._starting, self._keeper = loop, asyncio.Lock(), None
        async with self._starting:
            if self._keeper is not None and not self._keeper.done():
                return
            ready: asyncio.Future = loop.create_future()
            self._stop = asyncio.Event()
            self._keeper = loop.create_task(self._keep(ready, self._stop), name="verifiers-serving")
            self._endpoint = await ready

    async def _keep(self, ready: asyncio.Future, stop: asyncio.Event) -> None:
        """Hold the endpoint and each Env's `serving()` open until `stop` is set or this task is cancelled.
        A task of their own closes them in order even when nobody calls `aclose`: the loop's end
        (asyncio.run) cancels pending tasks before it finalizes async generators."""
        from jaxrl_async.envs.turn_endpoint import TurnEndpoint

        async with contextlib.AsyncExitStack() as stack:
            endpoint = TurnEndpoint()
            try:
                await endpoint.start()
                stack.push_async_callback(endpoint.stop)
                for env in self._envs.values():
                    await stack.enter_async_context(env.serving())
            except Exception as e:
                ready.set_exception(EpisodeFault("load_error", f"task.env={self.cfg.env!r}: the environment's "
                                                               f"start() raised {type(e).__name__}: {_first_line(e)}"))
                return
            ready.set_result(endpoint)
            await stop.wait()

    async def aclose(self) -> None:
        """Stop the endpoint and verifiers' serving resources (on the loop that started them)."""
        if self._keeper is not None:
            keeper, self._keeper = self._keeper, None
            self._stop.set()
            await keeper

    def model_context(self, key: str) -> Any:
        """verifiers' `ModelContext` of one episode: its TrainClient posts to our endpoint under `key`."""
        client = self.vf.TrainClientConfig(
            base_url=self._endpoint.base_url, api_key_var=ENDPOINT_KEY_VAR, renderer_model_name=self.renderer_model(),
            renderer=self.cfg.renderer)
        return self.vf.ModelContext(model=key, client=client,
                                    sampling=self.vf.SamplingConfig(max_tokens=self.cfg.turn_max_new_tokens))

    async def run_episode(self, prompt: Prompt, client: TurnClient, ctx: EpisodeContext) -> EpisodeResult:
        await self._serving()
        split = prompt.meta["split"]
        task = self._split_tasks(split)[prompt.meta["row"]]
        key = self._endpoint.open(client)
        try:
            episode = await self._env(split).run_episode(task, self.model_context(key))
        finally:
            route = self._endpoint.close(key)
        if route.aborted:
            raise asyncio.CancelledError  # the engine gave a turn up: the episode is aborted (envs/engine.py)
        if route.fault is not None:
            raise route.fault
        result = episode_result(episode)
        result.info["generate_calls"] = route.calls
        return result


def episode_result(episode: Any) -> EpisodeResult:
    """verifiers' finished `Episode` -> EpisodeResult; a failed episode is an `env_error` fault."""
    if not episode.ok:
        errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
        why = f"{errors[-1].type}: {_first_line(errors[-1].message)}" if errors else "no error recorded"
        raise EpisodeFault("env_error", f"verifiers marked the episode failed ({why})")
    if not episode.traces:
        raise EpisodeFault("env_error", "verifiers returned an episode without a trace")
    from verifiers.v1.dialects.chat import message_to_wire

    several = len(episode.traces) > 1
    terms: dict[str, float] = {}
    for trace in episode.traces:
        prefix = f"{trace.agent.name}." if several and trace.agent.name else ""
        terms |= {prefix + k: r.score for k, r in trace.rewards.items() if r is not None}
        terms |= {prefix + k: v for k, v in trace.metrics.items() if v is not None}
    last = episode.traces[-1]
    messages = [message_to_wire(m) for m in last.branches[-1].messages] if last.branches else []
    return EpisodeResult(reward=float(sum(t.reward for t in episode.traces)), terms=terms, messages=messages,
                         info={"verifiers_episode": episode.id, "turns": episode.num_turns})


def _first_line(e: Any) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else ""


def _validation_line(e: Any, env: str, args_key: str) -> str:
    """pydantic's first error as the key the user typed: taskset.K -> task.env_args.K, else task.env_config.K."""
    err = e.errors()[0]
    loc = [str(p) for p in err["loc"]]
    key = f"{args_key}.{'.'.join(loc[1:])}" if loc[:1] == ["taskset"] else f"task.env_config.{'.'.join(loc)}"
    return f"{key}: {err['msg']} (task.env={env!r})"
