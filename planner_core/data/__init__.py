"""The data the project ships: a measured engine profile, request traces, measured latencies, a perf table.

Every file here is a copy (or, for the ServeGen shape, a sum) of a public source; `README.md` names each one's
repository, commit, licence and checksum (`SHA256SUMS`, checked by the tests). The paths below are the only way
code reaches these files, so they resolve the same from a checkout and from an installed package.
"""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent

# Dynamo's planner profile of nvidia/Llama-3.1-8B-Instruct-FP8, TP1 prefill and TP1 decode, on H200.
H200_PROFILE_DIR = DATA_DIR / "profiles" / "H200_TP1P_TP1D"
TRACES_DIR = DATA_DIR / "traces"
AZURE_CONV_TRACE = TRACES_DIR / "AzureLLMInferenceTrace_conv.csv"
AZURE_CODE_TRACE = TRACES_DIR / "AzureLLMInferenceTrace_code.csv"
MOONCAKE_TRACE = TRACES_DIR / "synthetic_trace.jsonl"
# ServeGen's m-large language clients, their relative rates summed per 600 s window (14 days).
SERVEGEN_SHAPE = TRACES_DIR / "servegen-m-large-shape.csv"
AIC_SILICON_SAMPLE = DATA_DIR / "aiconfigurator" / "silicon_sample.csv"
H200_PERF_TABLE = DATA_DIR / "perf-tables" / "llama-3.1-8b-instruct-fp8_h200_sxm_vllm_tp1.json"
CHECKSUMS_FILE = DATA_DIR / "SHA256SUMS"

# The shipped planner configs (made by this project, not copied; they name the profile above relatively).
CONFIGS_DIR = DATA_DIR.parent / "configs"
# The scaling policies as config files: `planner bench --policies NAME` runs `NAME.yaml` from here.
POLICIES_DIR = CONFIGS_DIR / "policies"
RECOMMENDED_POLICY = "planner"
# What `planner serve` and `planner demo` run unless told otherwise: the recommended policy.
DEFAULT_CONFIG = POLICIES_DIR / f"{RECOMMENDED_POLICY}.yaml"
# What `planner chaos` runs: the recommended policy without its scale-down hold, so a short demo decides often.
CHAOS_CONFIG = CONFIGS_DIR / "chaos.yaml"
