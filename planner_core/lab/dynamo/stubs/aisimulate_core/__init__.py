"""A stand-in for AISimulate's `aisimulate_core`, which the `ai-dynamo` 1.6.1 wheel imports but which installs only
from NVIDIA's vendor index (unreachable here).

Dynamo's planner and mocker import two names from it at module level (`sdk.ForwardPassPerfModelConfig`,
`sdk.RustForwardPassPerfModel`); this package provides them so those imports succeed. The stand-ins refuse to
run: `run_planner.py` replaces them with Dynamo's own Python forward-pass regressions before importing the planner
(`install_perf_model_shim`), and the mocker never calls them. Only the comparison scripts beside this folder put it
on `sys.path`, in the Dynamo comparison environment (`make dynamo-env`); the project's own environment never sees
it.
"""
