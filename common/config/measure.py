"""The recipe sections that measure the built bundles: the benchmarks, the load-test profiles and their SLOs.
They change no bundle, so the recipe's hash leaves them out; each measurement's stage hashes its own."""

from typing import Literal, get_args

from edgedistill.common.config.strict import Overridden, Strict
from pydantic import Field, NonNegativeInt, PositiveInt, ValidationInfo, field_validator, model_validator

Scenario = Literal["single", "batch", "stream", "kserve"]
Profile = Literal["smoke", "steady", "step", "spike", "soak"]
DEFAULT_SCENARIOS = {"single": 1}
SHAPE_TICK_S = 1.0  # locust asks a load shape for its users about once a second


def _lasts_a_tick(seconds: float, info: ValidationInfo) -> float:
    """A load's length: one shorter than the shape's tick may never run, or run for the tick."""
    if seconds < SHAPE_TICK_S:
        raise ValueError(
            f"{info.field_name}={seconds:g} is shorter than the {SHAPE_TICK_S:g}-second tick at which locust changes "
            f"the users: a stage that short may never run; set {info.field_name} >= {SHAPE_TICK_S:g}"
        )
    return seconds


def _whole_ticks(seconds: float, info: ValidationInfo) -> float:
    """A stage after which the users change: locust changes them on the shape's tick alone, so a stage ending between
    ticks would run on to the next, its calls counted in the stage after it."""
    if _lasts_a_tick(seconds, info) % SHAPE_TICK_S:
        raise ValueError(
            f"{info.field_name}={seconds:g} is not a whole number of the {SHAPE_TICK_S:g}-second ticks at which "
            f"locust changes the users: they would change at the next tick, and the calls between count in the wrong "
            f"stage; set {info.field_name} to whole seconds"
        )
    return seconds


def _each_once(values: list, info: ValidationInfo) -> list:
    """A list of what is measured, each value once."""
    if repeated := sorted({value for value in values if values.count(value) > 1}):
        raise ValueError(
            f"{info.field_name} lists {', '.join(map(str, repeated))} more than once: a repeat is measured again for "
            "the same figure, which it would replace; list each value once"
        )
    return values


class SloConfig(Strict):
    """What a load-test run (or, for `step`, each step) must meet; a null threshold is not checked.

    Latencies are those of successful calls as the load generator saw them, in ms; a load test's from each call's due
    time (`loadtests.pacing`).
    """

    p50_ms: float | None = Field(None, gt=0, description="median call latency")
    p95_ms: float | None = Field(None, gt=0, description="95th percentile call latency")
    p99_ms: float | None = Field(None, gt=0, description="99th percentile call latency")
    max_error_rate: float = Field(0.0, ge=0, le=1, description="failed calls / all calls")
    min_rate_share: float | None = Field(
        0.95,
        gt=0,
        le=1,
        description="successful calls/s / offered calls/s: a server (or load generator) that falls behind, or "
        "refuses calls, fails",
    )


class LoadProfile(Strict):
    """What every load profile sets: the scenario mix and the SLO."""

    scenarios: dict[Scenario, int] = Field(
        default_factory=lambda: dict(DEFAULT_SCENARIOS),
        min_length=1,
        description="scenario -> weight (locust task weight)",
    )
    slo: SloConfig = SloConfig()

    @model_validator(mode="after")
    def _weights(self):
        if any(w < 0 for w in self.scenarios.values()) or not sum(self.scenarios.values()):
            raise ValueError(f"scenario weights must be >= 0 with at least one > 0, got {self.scenarios}")
        return self


class ConstantLoad(LoadProfile):
    """`users` users for `duration_s`, each paced so that together they offer `rate` calls/s."""

    users: int = Field(10, ge=1)
    rate: float = Field(200.0, gt=0, description="calls/s offered by all users together")
    duration_s: float = Field(60.0, gt=0)

    _lasts_a_tick = field_validator("duration_s")(_lasts_a_tick)

    @model_validator(mode="after")
    def _a_call_for_every_user(self):
        if (offered := self.rate * self.duration_s) < self.users:
            raise ValueError(
                f"rate {self.rate:g} calls/s for duration_s {self.duration_s:g} offers {offered:g} calls, fewer than "
                f"its {self.users} users: some would make none, and the SLO be judged on a few calls; raise rate or "
                "duration_s, or lower users"
            )
        return self

    @property
    def user_rate(self) -> float:
        return self.rate / self.users


class SoakLoad(ConstantLoad):
    """A long constant load; the server's memory growth is measured and may be gated."""

    max_rss_growth_mb_per_10k: float | None = Field(
        None, gt=0, description="server RSS slope over the second half of the run, MB per 10,000 calls"
    )


class StepLoad(LoadProfile):
    """`users`, then `step_users` more every `step_s`, `steps` steps, each user paced at `user_rate` calls/s.

    Capacity: the highest achieved calls/s of a step that met the SLO.
    """

    users: int = Field(10, ge=1, description="users in the first step")
    step_users: int = Field(10, ge=1)
    steps: int = Field(10, ge=1)
    step_s: float = Field(10.0, description="whole seconds per step, at least 1")
    settle_s: float = Field(2.0, ge=0, description="seconds at the start of each step left out of its figures")
    user_rate: float = Field(20.0, gt=0, description="calls/s per user")
    min_capacity_rps: float | None = Field(None, gt=0, description="fail the run when capacity is below this")

    _stages_last_whole_ticks = field_validator("step_s")(_whole_ticks)

    @model_validator(mode="after")
    def _settles_within_step(self):
        if self.settle_s >= self.step_s:
            raise ValueError(f"settle_s={self.settle_s} leaves nothing of step_s={self.step_s}")
        return self


class SpikeLoad(LoadProfile):
    """`users` for `before_s`, `spike_users` for `spike_s`, `users` again for `after_s`; `user_rate` calls/s each."""

    users: int = Field(10, ge=1)
    spike_users: int = Field(50, ge=1)
    user_rate: float = Field(20.0, gt=0, description="calls/s per user")
    before_s: float = Field(20.0, description="whole seconds before the spike, at least 1")
    spike_s: float = Field(10.0, description="whole seconds of the spike, at least 1")
    after_s: float = Field(20.0, description="whole seconds after it, at least 1")

    _stages_last_whole_ticks = field_validator("before_s", "spike_s", "after_s")(_whole_ticks)

    @model_validator(mode="after")
    def _spikes(self):
        if self.spike_users <= self.users:
            raise ValueError(f"spike_users={self.spike_users} must exceed users={self.users}")
        return self


class ModelBenchConfig(Strict):
    """The model benchmark (`python -m bench models`): every bundle beside the teacher in PyTorch eager."""

    batch_sizes: list[PositiveInt] = Field(
        default_factory=lambda: [1, 32], min_length=1, description="batch sizes timed, each listed once"
    )
    seq_lens: list[PositiveInt] = Field(
        default_factory=lambda: [32, 64, 128], min_length=1, description="sequence lengths timed, each listed once"
    )
    warmup: int = Field(10, ge=0)
    iterations: int = Field(100, gt=0)
    min_seconds: float = Field(1.0, ge=0, description="keep timing until this much time has passed")
    threads: int = Field(2, gt=0, description="intra-op threads for PyTorch and ONNX Runtime alike")

    _each_once = field_validator("batch_sizes", "seq_lens")(_each_once)


class ServingBenchConfig(Strict):
    """The serving benchmark (`python -m bench serving`): how long each phase runs, and its targets.

    A null target is not checked.
    """

    rate: float = Field(200.0, gt=0, description="calls/s of the paced phases")
    duration_s: float = Field(20.0, gt=0, description="seconds per phase and repeat")
    concurrency: int = Field(12, ge=1, description="calls in flight in the capacity phases")
    threads: int = Field(
        1,
        ge=0,
        description="intra-op threads of the servers and the raw backend (0: the default); a server of TensorRT "
        "engines alone runs without them",
    )
    repeats: int = Field(3, ge=1, description="repeats of every phase, interleaved; figures are their medians")
    paced_slo: SloConfig = Field(
        SloConfig(),
        description="what the server must meet when paced at `rate`: latencies (timed from each call's due time) as "
        "medians over the repeats, the error rate over every repeat's calls together, the rate share of the repeat "
        "with the least",
    )
    min_capacity_vs_echo: float | None = Field(
        None, gt=0, description="capacity target: the server's single-text calls/s / the echo server's"
    )
    min_batched_vs_raw: float | None = Field(
        None, gt=0, description="batched target: texts/s of batch-32 calls through the server / the raw backend's"
    )


class H2loadBenchConfig(Strict):
    """What the comparisons driven by h2load share (`bench.peers`, `bench.scaling`): a saturated and a paced phase on
    each server compared (a peer, or the server with one count of workers), the servers interleaved over repeats."""

    rate: float = Field(200.0, gt=0, description="calls/s of the paced phase")
    duration_s: float = Field(10.0, gt=0, description="seconds per phase, server and repeat")
    warmup_s: float = Field(3.0, ge=0, description="seconds of unrecorded load on each server before its first repeat")
    streams: int = Field(2, ge=1, description="calls in flight per connection at most (all of them at saturation)")
    paced_connections: int = Field(
        4,
        ge=1,
        description="connections of the paced phase, the same for every server, each from its own h2load process "
        "started 1/rate s after the last, so that their calls interleave (over one, a single worker would get every "
        "call)",
    )
    threads: int = Field(
        1,
        ge=1,
        description="intra-op threads of the model in each server process; a server of TensorRT engines alone "
        "runs without them",
    )
    repeats: int = Field(3, ge=1, description="repeats, the servers interleaved; figures are their medians")


class PeersBenchConfig(H2loadBenchConfig):
    """The peer comparison (`python -m bench peers`): the server against the Python servers a user would pick
    instead, on one bundle, driven by h2load. A null target is not checked."""

    peers: list[Literal["kserve", "mlserver"]] = Field(
        ["kserve", "mlserver"], min_length=1, description="the peers, each listed once, each from its own environment"
    )
    connections: int = Field(
        16, ge=1, description="HTTP/2 connections at saturation (several, so worker processes share them)"
    )
    workers: int = Field(
        0,
        ge=0,
        description="processes per server where it has that setting: the server's WORKERS and MLServer's "
        "parallel_workers (KServe's ModelServer answers gRPC from one process whatever its workers); 0: one per core as memory allows, as the server picks it",
    )
    min_capacity_vs_best_peer: float | None = Field(
        None, gt=0, description="the server's calls/s at saturation / the best peer's"
    )
    max_p99_vs_best_peer: float | None = Field(
        None,
        gt=0,
        description="the server's p99 when paced at `rate` / the best peer's (the lowest); missed too where either "
        "failed a paced call or answered under 0.95 of the calls due",
    )

    _each_once = field_validator("peers")(_each_once)


class ScalingBenchConfig(H2loadBenchConfig):
    """The server's scaling with its worker processes (`python -m bench scaling`): one bundle served with every
    count of `workers`, the servers all up at once and each driven by h2load in turn while the others idle. A null
    target is not checked."""

    workers: list[NonNegativeInt] = Field(
        [1, 2, 0],
        min_length=2,
        description="worker counts, the first the reference the others are compared with, their servers all up at "
        "once; 0: the server's default, one per core as memory allows beside the other counts' workers",
    )
    connections_per_worker: int = Field(
        4, ge=1, description="HTTP/2 connections per worker at saturation, so that the kernel spreads them over all"
    )
    client_threads: int = Field(1, ge=1, description="h2load's threads (more where one cannot keep the workers busy)")
    min_capacity_vs_first: float | None = Field(
        None, gt=0, description="calls/s at saturation with the most workers of the other counts / with the first count"
    )
    max_p99_vs_first: float | None = Field(
        None,
        gt=0,
        description="each other count's p99 paced at `rate` / the first count's; missed too where either failed a "
        "paced call or answered under 0.95 of the calls due",
    )


class BenchConfig(Strict):
    """Measurements of the built bundles: `models` for the model benchmark, `serving` for the serving one,
    `peers` for the comparison with other servers, `scaling` for the server's worker processes."""

    models: ModelBenchConfig = ModelBenchConfig()
    serving: ServingBenchConfig = ServingBenchConfig()
    peers: PeersBenchConfig = PeersBenchConfig()
    scaling: ScalingBenchConfig = ScalingBenchConfig()


# Each profile starts from its preset; a recipe's keys replace the preset's (one level: `slo` as a whole), but
# weights that overrides set one by one (`--loadtest.smoke.scenarios.batch=2`) go into the preset's (or default) mix.
LOAD_PRESETS: dict[str, dict] = {
    "smoke": {"users": 2, "rate": 20.0, "duration_s": 30.0, "scenarios": dict.fromkeys(get_args(Scenario), 1)},
    "steady": {},
    "step": {},
    "spike": {},
    "soak": {"duration_s": 600.0},
}


class LoadtestConfig(Strict):
    """Locust load tests of a served bundle (`python -m loadtests RECIPE --profile NAME`), one field per profile."""

    batch_size: int = Field(8, ge=1, description="texts per call in the `batch` scenario")
    stream_messages: int = Field(8, ge=1, description="requests (one text each) per `ClassifyStream` call")
    timeout_s: float = Field(10.0, gt=0, description="deadline per call")
    threads: int = Field(
        1,
        ge=0,
        description="the server's intra-op threads (0: the runtime's default); a server of TensorRT engines "
        "alone runs without them",
    )
    smoke: ConstantLoad = Field(description="short, every scenario, low rate: does everything answer?")
    steady: ConstantLoad = Field(description="a fixed rate for a while: the latency SLO")
    step: StepLoad = Field(description="rising load: the capacity within the SLO")
    spike: SpikeLoad = Field(description="a sudden burst and the recovery after it")
    soak: SoakLoad = Field(description="a fixed rate for long: memory growth")

    @model_validator(mode="before")
    @classmethod
    def _presets(cls, data):
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for name, preset in LOAD_PRESETS.items():
            value = data.get(name)
            if value is None or isinstance(value, dict):  # anything else is left for the schema to refuse by name
                data[name] = preset | (value if value is not None else {})
                if isinstance(weights := data[name].get("scenarios"), Overridden):
                    data[name]["scenarios"] = preset.get("scenarios", DEFAULT_SCENARIOS) | weights
        return data

    def profile(self, name: Profile) -> ConstantLoad | StepLoad | SpikeLoad:
        return getattr(self, name)
