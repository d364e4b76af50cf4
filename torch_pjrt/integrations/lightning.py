"""PyTorch Lightning on pjrt: an Accelerator and a single-device Strategy, registered in
Lightning's registries as "pjrt" when this module is imported.

    import torch_pjrt.integrations.lightning  # noqa: F401  (registers "pjrt")
    trainer = lightning.pytorch.Trainer(accelerator="pjrt", strategy="pjrt")   # one device
    trainer = lightning.pytorch.Trainer(accelerator="pjrt", devices=2)         # DDP, pjrt group

Why a strategy too: for one device Lightning builds `SingleDeviceStrategy("cpu")` for every
accelerator it does not know by name (its accelerator connector's `_choose_strategy`), so
`accelerator="pjrt"` alone would put the model on the CPU; the accelerator refuses that
device at `fit` and names the strategy. Mixed precision: Lightning gives `torch.autocast`
the device "cuda" for such accelerators; the strategy hands it "pjrt" instead, and the
accelerator refuses an autocast device other than pjrt wherever it meets one.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.accelerators.registry import _AcceleratorRegistry
from lightning.pytorch.accelerators import Accelerator, AcceleratorRegistry
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy, StrategyRegistry
from lightning.pytorch.utilities.exceptions import MisconfigurationException

NAME = "pjrt"

__all__ = ["NAME", "PjrtAccelerator", "PjrtStrategy", "parse_devices"]


def parse_devices(devices: Any) -> list[int]:
    """Trainer's `devices` as pjrt device indices: a count (`2`, `"2"`), every device
    (`-1`, `"-1"`, `"auto"`), or the indices themselves (`[0, 1]`, `"0,1"`)."""
    count = torch.pjrt.device_count()
    given = devices
    if isinstance(devices, str):
        text = devices.strip()
        if text in ("auto", "-1"):
            devices = -1
        elif "," in text:
            devices = [int(i) for i in text.split(",") if i.strip()]
        elif text.lstrip("-").isdigit():
            devices = int(text)
    if isinstance(devices, int) and not isinstance(devices, bool):
        if devices == -1:
            return list(range(count))
        if devices <= 0:
            raise MisconfigurationException(
                f"Trainer(accelerator='pjrt', devices={given!r}): a count of pjrt devices must "
                f"be at least 1 (or -1 / 'auto' for all {count})")
        devices = list(range(devices))
    if not isinstance(devices, (list, tuple)) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in devices):
        raise MisconfigurationException(
            f"Trainer(accelerator='pjrt', devices={given!r}): expected a count, -1, 'auto', "
            "a list of device indices or a string such as '0,1'")
    bad = [i for i in devices if not 0 <= i < count]
    if bad or not devices:
        raise MisconfigurationException(
            f"Trainer(accelerator='pjrt', devices={given!r}): this process has {count} pjrt "
            f"device(s) (indices 0 to {count - 1}); {bad or 'none'} asked for")
    return list(devices)


def _check_autocast_device(precision: Precision) -> None:
    if isinstance(precision, MixedPrecision) and precision.device != NAME:
        raise MisconfigurationException(
            f"precision={precision.precision!r} on pjrt: Lightning built its MixedPrecision "
            f"plugin for autocast on {precision.device!r}, which would leave pjrt ops uncast; "
            "use strategy='pjrt' (one device) or plugins=[MixedPrecision("
            f"{precision.precision!r}, 'pjrt')]")


class PjrtAccelerator(Accelerator):
    """Lightning's Accelerator for the pjrt device (`Trainer(accelerator="pjrt")`)."""

    def setup_device(self, device: torch.device) -> None:
        device = torch.device(device)
        if device.type != NAME:
            raise MisconfigurationException(
                f"Trainer(accelerator='pjrt') was given the device {device}: for one device "
                "Lightning builds SingleDeviceStrategy('cpu') for accelerators it does not "
                "know; pass strategy='pjrt' (Trainer(accelerator='pjrt', strategy='pjrt'))")
        torch.pjrt.set_device(device)

    def setup(self, trainer: Any) -> None:
        _check_autocast_device(trainer.strategy.precision_plugin)

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        return torch.pjrt.memory_stats(device)

    def teardown(self) -> None:
        torch.pjrt.synchronize()

    @staticmethod
    def parse_devices(devices: Any) -> list[int]:
        return parse_devices(devices)

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        return [torch.device(NAME, i) for i in parse_devices(devices)]

    @staticmethod
    def auto_device_count() -> int:
        return torch.pjrt.device_count()

    @staticmethod
    def is_available() -> bool:
        return torch.pjrt.is_available()

    @staticmethod
    def name() -> str:
        return NAME

    @classmethod
    def register_accelerators(cls, accelerator_registry: _AcceleratorRegistry) -> None:
        accelerator_registry.register(NAME, cls, description=cls.__doc__, override=True)


class PjrtStrategy(SingleDeviceStrategy):
    """One pjrt device (`Trainer(accelerator="pjrt", strategy="pjrt")`), with mixed
    precision autocasting on pjrt."""

    strategy_name = NAME

    def __init__(self, device: Any = None, **kwargs: Any) -> None:
        if device is None:  # the current device, with its index (Lightning reads it)
            device = torch.device(NAME, torch.pjrt.current_device())
        super().__init__(device=device, **kwargs)

    @SingleDeviceStrategy.precision_plugin.setter
    def precision_plugin(self, precision_plugin: Precision | None) -> None:
        if isinstance(precision_plugin, MixedPrecision) and precision_plugin.device != NAME:
            scaler = (torch.amp.GradScaler(NAME) if precision_plugin.precision == "16-mixed"
                      else None)
            precision_plugin = MixedPrecision(precision_plugin.precision, NAME, scaler)
        self._precision_plugin = precision_plugin

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(NAME, cls, description=cls.__doc__, override=True)


class PjrtDDPStrategy(DDPStrategy):
    """DDP over pjrt devices, one per process, with the pjrt process group
    (`Trainer(accelerator="pjrt", strategy="pjrt_ddp", devices=N)` under torchrun)."""

    strategy_name = "pjrt_ddp"

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("process_group_backend", NAME)
        super().__init__(**kwargs)

    def determine_ddp_device_ids(self) -> None:
        # Lightning's DDP wraps every non-CPU device's model in a torch.cuda.Stream when
        # given device ids; without them DDP takes the module's own (one pjrt) device
        return None

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(cls.strategy_name, cls, description=cls.__doc__,
                                   override=True)


PjrtAccelerator.register_accelerators(AcceleratorRegistry)
PjrtDDPStrategy.register_strategies(StrategyRegistry)
PjrtStrategy.register_strategies(StrategyRegistry)
