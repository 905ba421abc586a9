"""The two names Dynamo 1.6.1 imports from AISimulate's SDK, as stand-ins that say why they cannot run."""

from __future__ import annotations

_WHY = (
    "aisimulate_core is a stand-in (AISimulate installs only from NVIDIA's vendor index); "
    "run_planner.py installs Dynamo's own Python regressions in its place"
)


class ForwardPassPerfModelConfig:
    """Stand-in: replaced by `run_planner.install_perf_model_shim` before Dynamo's planner is imported."""

    def __init__(self, *_args: object, **_kwargs: object) -> None:
        raise NotImplementedError(_WHY)

    @classmethod
    def from_legacy_engine_config(cls, *_args: object, **_kwargs: object) -> ForwardPassPerfModelConfig:
        raise NotImplementedError(_WHY)


class RustForwardPassPerfModel:
    """Stand-in: replaced by `run_planner.install_perf_model_shim` before Dynamo's planner is imported."""

    def __init__(self, *_args: object, **_kwargs: object) -> None:
        raise NotImplementedError(_WHY)
