"""What the meters of several instances share through Redis (live mode): the calibration and the
windows learned from overflow errors.

Each instance learns the ratio of reported to estimated tokens per route from the calls it makes
(``calibration.Calibrations``). With several instances behind a load balancer, each would learn its
own and two tabs of one session could show two meters. ``SharedCalibrations`` publishes a route's
state (ratio, observations) after every observation, into the hash ``meterchat:calibration`` (read
at start-up) and on the pub/sub channel of the same name; every instance adopts what it hears, so
the next observation on any instance continues the same average. Last writer wins: two calls that
finish in the same instant on two instances keep one of the two updates, which the next call
corrects. A window a provider named in its overflow error is stored by the instance that learned it
(every instance reads the store's windows at start) and announced on ``meterchat:windows``
(``SharedWindows``), so the instances already running trim to it before their next send too.
Windows discovered from a provider's metadata are not shared: each instance asks the same provider
and gets the same answer, once per model.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import anyio
from anyio.abc import TaskGroup
from redis.asyncio import Redis
from redis.exceptions import RedisError

from server.live.lease import PREFIX
from server.routing.calibration import DEFAULT_ALPHA, Calibration, Calibrations
from server.routing.resolver import WindowMemory

log = logging.getLogger(__name__)

CALIBRATION_KEY = PREFIX + "calibration"  # a hash (route -> state) and a pub/sub channel
WINDOWS_KEY = PREFIX + "windows"  # a pub/sub channel: {"provider", "model", "tokens", "from"}
RETRY_SECONDS = 0.5


class SharedCalibrations(Calibrations):
    def __init__(self, redis: Redis, tasks: TaskGroup, instance: str, alpha: float = DEFAULT_ALPHA) -> None:
        super().__init__(alpha)
        self.redis = redis
        self.tasks = tasks
        self.instance = instance
        self.changed = anyio.Event()  # set (and renewed) whenever another instance's state arrives
        self.listening = anyio.Event()  # set once subscribed
        self._alpha_value = alpha
        self.on_window: Callable[[str, str, int], None] = lambda provider, model, tokens: None

    def observe(self, route: object, estimate: int, reported: int) -> None:
        key = route if isinstance(route, str) else str(getattr(route, "name", route))
        super().observe(key, estimate, reported)
        learned = self._by_route.get(key)
        if learned is not None and learned.observations:
            state = json.dumps({"ratio": learned.ratio, "observations": learned.observations})
            self.tasks.start_soon(self._publish, key, state)

    def adopt(self, key: str, state: str) -> None:
        data = json.loads(state)
        learned = self._by_route.get(key) or Calibration(self._alpha_value)
        learned.ratio, learned.observations = float(data["ratio"]), int(data["observations"])
        self._by_route[key] = learned
        self.changed.set()
        self.changed = anyio.Event()

    async def _publish(self, key: str, state: str) -> None:
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hset(CALIBRATION_KEY, key, state)
                message = {"route": key, "state": state, "from": self.instance}
                pipe.publish(CALIBRATION_KEY, json.dumps(message))
                await pipe.execute()
        except RedisError as exc:  # the meter works on this instance's own ratio meanwhile
            log.warning("live: calibration of %s not shared: %s", key, exc)

    async def load(self) -> None:
        for key, state in (await self.redis.hgetall(CALIBRATION_KEY)).items():
            self.adopt(str(key), str(state))

    async def listen(self) -> None:
        while True:
            try:
                async with self.redis.pubsub() as pubsub:
                    await pubsub.subscribe(CALIBRATION_KEY, WINDOWS_KEY)
                    async for message in pubsub.listen():
                        if message.get("type") == "subscribe" and message.get("channel") == WINDOWS_KEY:
                            self.listening.set()  # Redis confirmed both: nothing is missed now
                        data = json.loads(message["data"]) if message.get("type") == "message" else {}
                        if data and data.get("from") != self.instance:  # not our own echo
                            self._heard(message["channel"], data)
            except RedisError as exc:
                log.warning("live: calibration listener lost Redis: %s", exc)
                await anyio.sleep(RETRY_SECONDS)

    def _heard(self, channel: str, data: dict[str, object]) -> None:
        if channel == WINDOWS_KEY:
            self.on_window(str(data["provider"]), str(data["model"]), int(str(data["tokens"])))
        else:
            self.adopt(str(data["route"]), str(data["state"]))


class SharedWindows:
    """The resolver's window memory in live mode: the store keeps a learned window, and every other
    running instance hears of it at once (``SharedCalibrations.listen`` adopts what it hears)."""

    def __init__(self, memory: WindowMemory | None, redis: Redis, instance: str) -> None:
        self.memory = memory
        self.redis = redis
        self.instance = instance

    async def load_windows(self) -> dict[tuple[str, str], int]:
        return await self.memory.load_windows() if self.memory is not None else {}

    async def save_window(self, provider: str, model: str, tokens: int) -> None:
        if self.memory is not None:
            await self.memory.save_window(provider, model, tokens)
        message = {"provider": provider, "model": model, "tokens": tokens, "from": self.instance}
        try:
            await self.redis.publish(WINDOWS_KEY, json.dumps(message))
        except RedisError as exc:  # stored all the same: the others read it when they next start
            log.warning("live: window of %s/%s not announced: %s", provider, model, exc)
