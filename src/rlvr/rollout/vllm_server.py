"""The `vllm` engine in server mode (`rollout.vllm.mode=server`): generation on `vllm serve`
processes through vLLM's own HTTP API, the servers of `rollout.vllm.urls` or
`rollout.vllm.launch` ones that rlvr starts (`vllm_launch`).

Generation. Every (prompt, sample) pair is one `/v1/completions` request: the prompt as token
ids, its own 63-bit seed (`vllm.sample_seeds`, exactly as the colocated engine derives it, so
both modes draw from the same streams), `return_token_ids` (the ids the server sampled,
never re-tokenized text) and `logprobs: 0` (the sampled tokens' log-probs, after temperature
with the server's `--logprobs-mode processed_logprobs`) -> `Rollout.sampling_log_probs`. A
prompt's group goes to one server, groups to the least loaded (`vllm_fleet`).

Weights. After every optimiser step (`sync_weights`) each live server receives every weight
through vLLM's weight-transfer API (`vllm_weights`: NCCL from a GPU trainer, rlvr's
`rlvr_http` backend from a CPU one), then its weight version is set to the number of pushes
so far and read back from `/weight_info`, and its log-probs of a fixed sequence (a fixed
prompt, 8 tokens sampled at the run's temperature with a fixed seed) are compared with the
trainer's forward of the same tokens: beyond `TOLERANCE` of the server's dtype the run ends
by name (a server started with another model, dtype or log-prob mode). The first push and
check run at start, before any rollout.

Staleness (`train.max_staleness = k`). The pipeline produces the batch of step t+k on a thread
beside step t's update (`pins_weights`, `rlvr.training.pipeline.Beside`): while it is
`pinned` the servers keep the weights of version t-1 that sample it, and the update's push
waits until the batch is in. Each sample's behaviour log-prob is the server's
(`sampling_log_probs`), its version the pipeline's, so `algo.rollout_correction` weighs a
stale sample by the servers' own mu.

In flight (`train.inflight_updates`, `vllm_inflight`). Each push pauses the servers in keep
mode, sends the weights and resumes them, so a response may span several versions; requests
go to `/inference/v1/generate`, whose answers give each token's weight version
(`Rollout.token_versions`). Nothing is pinned: the push never waits for a batch.

Faults. Every wait is bounded by the servers' heartbeats (`vllm_fleet`): a server silent for
`rollout.vllm.timeout` seconds ends the run with a `VLLMServerError` naming its URL and what
it was doing, or, with others alive, has its groups sent to them (a warning, and
`rollout/vllm_failovers` in the step's metrics) and is left out from then on.
"""

from __future__ import annotations

import contextlib
import socket
import time
from urllib.parse import urlsplit

import torch

from rlvr.rollout.base import (
    EngineDefaults,
    EngineError,
    Rollout,
    SamplingParams,
)
from rlvr.rollout.vllm import sample_seeds, vllm_dtype
from rlvr.rollout.vllm_answers import choice, rollout_from_rows
from rlvr.rollout.vllm_fleet import Fleet, ServerDown, VLLMServerError, WeightClient
from rlvr.rollout.vllm_host import kv_cache_bytes
from rlvr.rollout.vllm_ranks import follow, on_main
from rlvr.rollout.weight_sync import trainable_names
from rlvr.run.distributed import Dist, gathered

# The most |server - trainer| log-prob of the check's tokens, by the server's dtype: the max
# in fp32 (rounding only), the mean in bf16/fp16 (single low-probability tokens move by more);
# tests/test_vllm_engine.py's and scripts/gpu_check.py's tolerances.
TOLERANCE = {"float32": ("max", 2e-3), "bfloat16": ("mean", 0.02), "float16": ("mean", 0.02)}
CHECK_TOKENS = 8


class VLLMServerEngine(EngineDefaults):
    """Generation on vLLM servers (the module doc). `settings`: `rollout.vllm`; `site`: the
    caller's `EngineSite`; `temperature`: the run's, for the log-prob check."""

    reports_log_probs = True
    pins_weights = True  # a push waits while a batch ahead is sampled (`pinned`)
    resident_bytes = 0  # nothing of it lives in the trainer's memory

    def __init__(self, model, *, pad_id: int, eos_ids: list[int], settings, site, temperature,
                 inflight: bool = False):  # fmt: skip
        if site.tools is not None:
            raise EngineError("rollout.vllm.mode=server: tools are not supported in server mode")
        self.model, self.pad_id, self.eos_ids = model, pad_id, list(eos_ids)
        self.site, self.temperature = site, temperature
        self.inflight = inflight  # pushes pause the servers in keep mode (`vllm_inflight`)
        self.paused_s = 0.0  # seconds the servers spent paused for pushes, since the last step
        device = site.device or next(model.parameters()).device
        self.dtype = vllm_dtype(next(model.parameters()).dtype, site.autocast, settings.dtype)
        self.backend = "nccl" if torch.device(device).type == "cuda" else "rlvr_http"
        self.launched: list = []
        self.fleet: Fleet | None = None
        self.version = 0
        self._pins = 0  # batches ahead being sampled: pushes wait (`pinned`)
        self._stale = False  # an update happened while pinned: push when unpinned
        # under torchrun rank 0 launches and pushes, every rank generates (`vllm_ranks`)
        self.d = Dist(rank=site.rank, world_size=site.world_size)
        self.changing = trainable_names(model)  # after the first push, only these are sent
        try:
            urls = list(settings.urls) or on_main(
                self.d, lambda: self._launch(settings), "launching the vLLM servers"
            )
            self.fleet = Fleet(urls, settings.timeout)
            self.served = self._served_model()
            self.senders: dict = {}  # rank 0's, one per server
            on_main(self.d, self._set_senders, "setting up the weight transfer")
            self._push()
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_config(cls, model, *, pad_id: int, eos_ids: list[int], cfg, site):
        return cls(model, pad_id=pad_id, eos_ids=eos_ids, settings=cfg.rollout.vllm, site=site,
                   temperature=cfg.rollout.temperature,
                   inflight=cfg.train.inflight_updates)  # fmt: skip

    # -- start ------------------------------------------------------------------------

    def _launch(self, settings) -> list[str]:
        from rlvr.config.placement import MACHINE_CPUS, parse_cpus
        from rlvr.rollout.vllm_launch import LaunchPlan, launch

        cfg = self.model.config
        length = self.site.max_model_len or getattr(cfg, "max_position_embeddings", 2048)
        gpus = sorted(int(g) for g in settings.gpus.split(",") if g.strip())
        rows = self.site.max_rows * self.site.world_size
        plan = LaunchPlan(
            model=getattr(cfg, "_name_or_path", None) or self.model.name_or_path,
            dtype=self.dtype,
            max_model_len=length,
            # a step's rows of every rank may reach one server
            kv_bytes=0 if gpus else kv_cache_bytes(cfg, rows, length, self.dtype),
            memory=settings.memory,
            backend=self.backend,
        )
        cpus = (
            sorted(parse_cpus("rollout.vllm.cpus", settings.cpus, MACHINE_CPUS))
            if settings.cpus
            else []
        )
        self.launched = launch(plan, settings.launch, cpus, gpus)
        return [s.url for s in self.launched]

    def _served_model(self) -> str:
        """The one model name every server serves (the `model` of each request)."""
        names = set()
        for answer, server in zip(
            self.fleet.each_live("listing its models", "GET", "/v1/models"), self.fleet.live
        ):
            served = [m["id"] for m in answer["data"]]
            if len(served) != 1:
                raise VLLMServerError(f"rollout.vllm: {server.url} serves {served}, expected one model")  # fmt: skip
            names.add(served[0])
        if len(names) > 1:
            raise VLLMServerError(f"rollout.vllm.urls: the servers serve different models: {sorted(names)}")  # fmt: skip
        return names.pop()

    def _set_senders(self) -> None:
        self.senders = {s.url: self._sender(s) for s in self.fleet.servers}

    def _sender(self, server):
        """vLLM's trainer-side weight-transfer engine for one server."""
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        from rlvr.rollout.vllm_weights import PolicySource, trainer_init_info
        from rlvr.vllm_plugin import register

        register()
        client = WeightClient(self.fleet, server)
        extra = {}
        if self.backend == "nccl":
            from rlvr.rollout.vllm_launch import free_port

            size = self.fleet.call(server, "reading its world size", "GET", "/get_world_size")
            extra = {"master_address": local_address(server.url), "master_port": free_port(),
                     "world_size": 1 + int(size["world_size"])}  # fmt: skip
        info = trainer_init_info(self.backend, **extra)
        try:
            return WeightTransferTrainerFactory.trainer_init(
                info, client=client, source=PolicySource(self.model)
            )
        except ServerDown:
            raise
        except VLLMServerError as e:  # the server refused the setup (a 500 without details)
            raise VLLMServerError(
                f'{e} (started with --weight-transfer-config \'{{"backend": '
                f'"{self.backend}"}}\'{" and rlvr installed" if self.backend == "rlvr_http" else ""}?)'
            ) from None

    # -- weights ----------------------------------------------------------------------

    def sync_weights(self) -> None:
        """After an optimiser step: every live server gets the policy's weights, at once or,
        while a batch ahead is sampled (`pinned`), when it is in."""
        self.version += 1
        if self._pins and not self.inflight:
            self._stale = True
        else:
            self._push()

    @contextlib.contextmanager
    def pinned(self):
        """The servers keep the weights they have while the caller's batch ahead is sampled
        (on another thread, beside the trainer's update): the updates made meanwhile reach
        them when the last pin ends."""
        if self.inflight:  # pushes go to the requests in flight
            yield
            return
        self._pins += 1
        try:
            yield
        finally:
            self._pins -= 1
            if not self._pins and self._stale:
                self._stale = False
                self._push()

    def _push(self) -> None:
        """Every live server: the weights, the version read back, the log-prob check; a
        server lost meanwhile is left out while others remain (`Fleet.lost`). Under
        torchrun every rank calls it and rank 0 pushes (`vllm_ranks`)."""
        if not self.d.enabled:
            self._send_all()
            self.check_log_probs()
            return
        with gathered(self.model):  # FSDP2: whole tensors on every rank, before any send
            live = on_main(self.d, self._send_and_check, f"pushing weight version {self.version}")
        follow(self.fleet, live)

    def _send_and_check(self) -> list[str]:
        self._send_all()
        self.check_log_probs()
        return [s.url for s in self.fleet.live]

    def _send_all(self) -> None:
        if not self.inflight:
            self._send_each()
            return
        from rlvr.rollout.vllm_inflight import paused

        t0 = time.perf_counter()
        with paused(self.fleet, f"the push of weight version {self.version}"):
            self._send_each()
        self.paused_s += time.perf_counter() - t0

    def _send_each(self) -> None:
        version = str(self.version)
        for server in list(self.fleet.live):
            try:
                sender = self.senders[server.url]
                sender.client.version = version
                sender.send_weights()
                sender.source.only = self.changing  # the rest stays as this push left it
                doing = f"reporting its weight version after push {version}"
                got = self.fleet.call(server, doing, "GET", "/weight_info")["weight_version"]
                if got != version:
                    raise VLLMServerError(
                        f"rollout.vllm: {server.url} reports weight version {got!r} after "
                        f"the push of version {version!r} (another trainer pushing to it?)"
                    )
            except ServerDown as e:
                self.fleet.lost(e)

    def check_log_probs(self) -> float:
        """The live servers' log-probs of the check's tokens against the trainer's forward:
        the largest difference (max or mean by dtype, `TOLERANCE`), VLLMServerError past it."""
        worst = 0.0
        for server in list(self.fleet.live):
            try:
                worst = max(worst, self._check(server))
            except ServerDown as e:
                self.fleet.lost(e)
        self.last_check = worst
        return worst

    def _check(self, server) -> float:
        how, limit = TOLERANCE[self.dtype]
        prompt = [(7 * i + 3) % self.model.config.vocab_size for i in range(16)]
        body = self._body(prompt, seed=1234, max_tokens=CHECK_TOKENS, temperature=self.temperature)  # fmt: skip
        body["ignore_eos"] = True
        doing = f"checking its log-probs (weight version {self.version})"
        ids, server_lp = choice(self.fleet.call(server, doing, "POST", "/v1/completions", body))
        diff = (self._trainer_log_probs(prompt, ids) - torch.tensor(server_lp)).abs()
        value = float(diff.max() if how == "max" else diff.mean())
        if not value <= limit:
            raise VLLMServerError(
                f"rollout.vllm: {server.url}'s log-probs of a fixed sequence differ from "
                f"the trainer's by {value:.3g} ({how}; {limit:g} allowed in {self.dtype}): "
                "a server with another model, dtype or --logprobs-mode than processed_logprobs?"
            )
        return value

    @torch.no_grad()
    def _trainer_log_probs(self, prompt: list[int], ids: list[int]) -> torch.Tensor:
        device = next(self.model.parameters()).device
        seq = torch.tensor([prompt + ids], device=device)
        training = self.model.training
        self.model.eval()
        try:
            dtype = torch.bfloat16 if self.site.autocast == "bfloat16" else None
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                logits = self.model(seq).logits[0, len(prompt) - 1 : -1].float()
        finally:
            self.model.train(training)
        lp = (logits / self.temperature).log_softmax(-1)
        return lp.gather(-1, torch.tensor(ids, device=device)[:, None])[:, 0].cpu()

    # -- generation -------------------------------------------------------------------

    def _body(self, prompt: list[int], *, seed: int, max_tokens: int, temperature: float,
              top_p: float = 1.0, top_k: int = 0, min_tokens: int = 0) -> dict:  # fmt: skip
        body = {"model": self.served, "prompt": list(prompt), "max_tokens": max_tokens,
                "temperature": temperature, "top_p": top_p, "seed": seed, "logprobs": 0,
                "return_token_ids": True, "return_tokens_as_token_ids": True,
                "stop_token_ids": self.eos_ids, "min_tokens": min_tokens,
                "skip_special_tokens": False}  # fmt: skip
        if top_k:
            body["top_k"] = top_k
        return body

    def _bodies(self, prompt: list[int], seeds: list[int], params: SamplingParams) -> list[dict]:
        """A prompt's group: one request body per seed."""
        temperature = 0.0 if params.greedy else params.temperature
        shared = {"max_tokens": params.max_new_tokens, "temperature": temperature,
                  "top_p": params.top_p, "top_k": params.top_k,
                  "min_tokens": params.min_new_tokens}  # fmt: skip
        return [self._body(prompt, seed=seed, **shared) for seed in seeds]

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollout:
        seeds = sample_seeds(params, len(prompt_ids))
        groups = [self._bodies(p, s, params) for p, s in zip(prompt_ids, seeds)]
        doing = f"generating {len(prompt_ids) * params.n} rows"
        if not self.inflight:
            answers = self.fleet.generate(groups, doing)
            rows = [choice(a) for group in answers for a in group]
            return rollout_from_rows(prompt_ids, rows, params.n, self.pad_id, self.eos_ids)
        from rlvr.rollout.vllm_inflight import GENERATE, generate_body, generated

        groups = [[generate_body(b) for b in group] for group in groups]
        answers = self.fleet.generate(groups, doing, path=GENERATE)
        rows = [generated(a) for group in answers for a in group]
        return rollout_from_rows(prompt_ids, rows, params.n, self.pad_id, self.eos_ids)

    def submit(self, prompt: list[int], params: SamplingParams):
        """train.inflight_updates: one prompt's group sent without waiting; the future of its
        answers and the server (`vllm_inflight.submit`), read with `group_rollout`."""
        from rlvr.rollout.vllm_inflight import generate_body, submit

        bodies = [
            generate_body(b) for b in self._bodies(prompt, sample_seeds(params, 1)[0], params)
        ]
        return submit(self.fleet, bodies)

    def group_rollout(self, prompt: list[int], answers: list[dict]) -> Rollout:
        """The `Rollout` of one submitted group's answers, with each token's version."""
        from rlvr.rollout.vllm_inflight import generated

        rows = [generated(a) for a in answers]
        return rollout_from_rows([prompt], rows, len(rows), self.pad_id, self.eos_ids)

    def release(self) -> None:
        """Nothing of the servers lives in the trainer's memory."""

    def step_metrics(self) -> dict[str, float]:
        """`rollout/vllm_failovers`: servers lost so far, their work sent to others;
        `rollout/vllm_retries`: requests sent again after their connection failed; in flight,
        `time/push_paused`: the seconds the servers were paused for the last push."""
        fleet = self.fleet
        out = {
            "rollout/vllm_failovers": float(fleet.failovers if fleet else 0),
            "rollout/vllm_retries": float(fleet.retries if fleet else 0),
        }
        if self.inflight:  # the servers' only idle time in flight: paused for the last push
            out["time/push_paused"], self.paused_s = self.paused_s, 0.0
        return out

    def close(self) -> None:
        """Stop the heartbeat and the servers rlvr launched (idempotent)."""
        if self.fleet is not None:
            self.fleet.close()
        if self.launched:
            from rlvr.rollout.vllm_launch import stop

            stop(self.launched)
            self.launched = []

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()


def local_address(url: str) -> str:
    """This machine's address as `url`'s host reaches it (the NCCL rendezvous address)."""
    parts = urlsplit(url)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((parts.hostname or "127.0.0.1", parts.port or 80))
        return s.getsockname()[0]
